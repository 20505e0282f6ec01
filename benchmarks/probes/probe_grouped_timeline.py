"""Probe: how evenly the grouped kernel's CTAs finish (issue 18's loop bar). Under the profiler (session 17's
ncu_grouped_raw.csv.gz) the grouped pick at Mixtral 8x22B gate/up T = 512 read the experts' weights at 3.67
TB/s where each expert's own dense launch streamed at 4.0-4.1; with tiles of very different cost (groups of
2 to 231 rows, weight tiles shared by 1 to 4 m-tiles) and a static stride over them, the CTAs may finish
far apart, the DRAM idling in the tail. A per-CTA timeline (kernels/common/timeline.cuh: %globaltimer at the
CTA's entry after pdl_wait, and at each consumer's exit) of each plan: the launch's span, the CTAs' busy
time, and when they finish (10th / 50th / 90th percentile and last, from the first entry). Eager launches,
20 after 10 warm-ups, medians over launches. Results checked against an fp32 reference first. One line per
(shape, plan) to argv[1].

    PYTHONPATH=src:benchmarks python3 benchmarks/probes/probe_grouped_timeline.py OUT.jsonl
    PROBE_GROUPED="mixtral22b:512,mixtral:4096" (grouped_bench's model:T, gate/up, its routing)
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, "benchmarks")
import probe_mc_parts as parts  # noqa: E402
from gemmlab import grouped  # noqa: E402
from gemmlab.jit import compiler  # noqa: E402
from grouped_bench import shape_seed, shapes, uneven_offsets  # noqa: E402

EV = 8
TILES = [(64, 256, "pingpong"), (128, 128, "pingpong"), (128, 256, "data_parallel"), (128, 176, "pingpong")]


def patches(addr: int) -> list:
    src = "engine/gemm_grouped.cu"
    return [
        (src, '#include "common/fp8_traits.cuh"',
         f'#define TIMELINE_BUF {addr:#x}ull\n#include "common/timeline.cuh"\n#include "common/fp8_traits.cuh"'),
        (src, "    pdl_wait();", "    pdl_wait();\n    " + parts.timeline_mark("threadIdx.x == 0", 0)),
        (src, "    pdl_trigger_late();", "    pdl_trigger_late();\n    " + parts.timeline_mark("t == 0", "1 + consumer")),
    ]


def stats(runs, consumers: int) -> dict:
    """runs: per launch a (CTAs, EV, 3) int64 tensor (ns, clock, smid)."""
    def med(xs):
        return sorted(xs)[len(xs) // 2]
    out = {"span_us": [], "busy_us": [], "end_p10_us": [], "end_p50_us": [], "end_p90_us": [], "end_last_us": []}
    for r in runs:
        start = r[:, 0, 0]
        end = r[:, 1:1 + consumers, 0].max(dim=1).values
        t0 = start.min()
        ends = ((end - t0).double() / 1e3).sort().values
        n = len(ends)
        out["span_us"].append(ends[-1].item())
        out["busy_us"].append(((end - start).double() / 1e3).median().item())
        for q, k in ((0.1, "end_p10_us"), (0.5, "end_p50_us"), (0.9, "end_p90_us")):
            out[k].append(ends[min(n - 1, int(q * n))].item())
        out["end_last_us"].append(ends[-1].item())
    return {k: round(med(v), 2) for k, v in out.items()}


def main():
    buf = torch.zeros(132 * EV * 3, dtype=torch.int64, device="cuda")
    parts.PATCHES["gtl"] = patches(buf.data_ptr())
    compiler.KERNEL_ROOT = parts.patched_root("gtl")
    from gemmlab.gpu import gpu_info, sample_clocks
    wanted = os.environ.get("PROBE_GROUPED", "mixtral22b:512,mixtral:4096").split(",")
    full = [sh for pair in wanted for sh in shapes([pair.split(":")[0]], [int(pair.split(":")[1])])]
    out = open(sys.argv[1], "a")
    for n, (model, proj, G, N, K, T) in enumerate(full):
        if proj != "gate_up":
            continue
        offs, sizes = uneven_offsets(G, T, seed=shape_seed(model, proj, T, n))
        a = torch.randn(T, K, device="cuda").bfloat16()
        b = (torch.randn(G, N, K, device="cuda") / K ** 0.5).bfloat16()
        ref = grouped.reference_grouped_mm(a, b, offs, dtype=torch.float32)
        pick = grouped.plan_for(a, b, offs)
        plans = {"pick": pick}
        for c in grouped.candidates("contiguous", G, T, N, K):
            if (c.bm, c.bn, c.schedule) in TILES and (c.bm, c.bn, c.schedule) != (pick.bm, pick.bn, pick.schedule):
                plans[f"{c.bm}x{c.bn} {c.schedule}"] = c
        for name, p in plans.items():
            o = torch.full((T, N), float("nan"), device="cuda", dtype=torch.bfloat16)
            runs = []
            for i in range(30):
                buf.zero_()
                grouped.run(a, b, offs, out=o, plan=p)
                torch.cuda.synchronize()
                if i >= 10:
                    runs.append(buf.view(132, EV, 3)[: p.grid].cpu())
            err = ((o.float() - ref).norm() / ref.norm()).item()
            s = stats(runs, 2 if p.schedule == "pingpong" or p.bm > 64 else 1)
            rec = {"suite": "grouped-timeline", "model": model, "proj": proj, "G": G, "N": N, "K": K, "T": T,
                   "sizes": sizes, "candidate": name, "plan": repr(p), "rel_error": err, **s,
                   "sm_clock_mhz": sample_clocks().sm_mhz, "gpu": gpu_info().name,
                   "git_sha": os.environ.get("GEMMLAB_GIT_SHA")}
            print(f"{model} T={T} {name}: span {s['span_us']:.1f} us, CTA busy {s['busy_us']:.1f}, ends p10 "
                  f"{s['end_p10_us']:.1f} p50 {s['end_p50_us']:.1f} p90 {s['end_p90_us']:.1f} last "
                  f"{s['end_last_us']:.1f} (err {err:.1e})", flush=True)
            out.write(json.dumps(rec) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
