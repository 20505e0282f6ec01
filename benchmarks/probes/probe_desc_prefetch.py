"""Probe: the engine kernel's descriptor prefetch (``tma_prefetch_descriptors`` before ``pdl_wait``,
kernels/common/tma.cuh). Per shape, the model's engine-kernel plan built twice in one process: as shipped
("on") and compiled with NO_DESC_PREFETCH=1 ("off"), both through the prepared launch (PDL), timed with
torch.mm interleaved by the project's timer (graph replay, inputs rotating over 2x the L2). Checks both
outputs against torch.mm first. One JSON line per shape appended to argv[1].

    python benchmarks/probes/probe_desc_prefetch.py OUT.jsonl
"""
import json
import os
import sys

import torch

from gemmlab import engine, planner
from gemmlab.jit.launch import raw_stream
from gemmlab.timer import sets_for, time_interleaved

# Short kernels first (where a start-up latency is a visible share), then two long controls.
SHAPES = [(256, 512, 2048), (200, 1024, 2048), (32, 896, 896), (32, 1024, 1024), (16, 1152, 1024),
          (512, 1152, 1024), (1024, 768, 3072), (64, 3072, 3072), (64, 4096, 3584), (300, 1600, 6400),
          (640, 1024, 5120), (3072, 768, 768), (1000, 1152, 6912), (64, 5120, 5120), (256, 5120, 5120),
          (2050, 3000, 1000), (8, 14336, 4096), (4096, 4096, 4096), (8192, 8192, 8192)]


def launch_for(p, a, b, out, defines):
    plain = engine.compile_kernel

    def compile_kernel(*args, **kw):
        return plain(*args, defines={**(kw.pop("defines", None) or {}), **defines}, **kw)

    engine.compile_kernel = compile_kernel
    try:
        return engine.Engine2Launch(a, b, out, bias=None, c=None, plan=p)
    finally:
        engine.compile_kernel = plain


def main():
    out_file = open(sys.argv[1], "a")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    stream = lambda: raw_stream(torch.cuda.current_device())  # noqa: E731
    for M, N, K in SHAPES:
        p = planner.plan(M, N, K)
        n = sets_for(2 * (M * K + N * K + M * N), l2)
        xs = [torch.randn(M, K, device="cuda").bfloat16() for _ in range(n)]
        ws = [torch.randn(N, K, device="cuda").bfloat16() for _ in range(n)]
        outs = {v: [torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(n)]
                for v in ("on", "off")}
        launches = {"on": launch_for(p, xs[0], ws[0].t(), outs["on"][0], {}),
                    "off": launch_for(p, xs[0], ws[0].t(), outs["off"][0], {"NO_DESC_PREFETCH": "1"})}
        ref = torch.mm(xs[0].float(), ws[0].t().float())
        errs = {}
        for v, L in launches.items():
            L.run(stream(), xs[0], ws[0].t(), outs[v][0], None, None, 1.0, 0.0)
            torch.cuda.synchronize()
            errs[v] = ((outs[v][0].float() - ref).norm() / ref.norm()).item()
            assert errs[v] < 2e-2, (v, errs[v])

        def run(v):
            L = launches[v]
            return lambda i: L.run(stream(), xs[i], ws[i].t(), outs[v][i], None, None, 1.0, 0.0)

        res = time_interleaved({"torch": lambda i: torch.mm(xs[i], ws[i].t()), "on": run("on"), "off": run("off")}, n)
        t = {k: v.median_ms for k, v in res.timings.items()}
        rec = {"suite": "desc-prefetch-probe", "M": M, "N": N, "K": K, "plan": repr(p),
               "on_ms": t["on"], "off_ms": t["off"], "baseline": "torch.mm", "baseline_ms": t["torch"],
               "ratio_on": t["torch"] / t["on"], "ratio_off": t["torch"] / t["off"], "on_over_off": t["off"] / t["on"],
               "rel_error": errs, "sm_clock_mhz": res.clocks.sm_mhz, "git_sha": os.environ.get("GEMMLAB_GIT_SHA")}
        print(f"{M:5d}x{N:5d}x{K:5d} on {t['on'] * 1e3:8.2f} off {t['off'] * 1e3:8.2f} torch {t['torch'] * 1e3:8.2f} us"
              f"  on/off speed x{t['off'] / t['on']:.3f}  ({p.bm}x{p.bn} {p.schedule})", flush=True)
        out_file.write(json.dumps(rec) + "\n")
        out_file.flush()


if __name__ == "__main__":
    main()
