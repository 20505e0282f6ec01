"""Probe: the grouped kernel against the dense engine on the same experts with the same tile. On the gate/up
projections of 8-expert models the grouped kernel runs 0.95-0.98x a loop of torch.mm while a loop of
gemmlab.matmul (the dense engine's plan per expert) beats that loop (session 27: Mixtral T = 4096, grouped
559 TFLOP/s, torch.mm loop 590, gemmlab.matmul loop 607), and the dense pick's tile measured in the grouped
kernel ran behind the grouped pick. Here, per shape (G experts of T / G rows each, even, so every loop runs
the same problem G times), one graph-replay run interleaves:
  grouped            gemmlab.grouped.run with grouped_mm's plan;
  grouped <tile>     the grouped kernel with the dense pick's tile and schedule, where it has it;
  dense loop         engine.gemm per expert with the dense planner's pick (what gemmlab.matmul runs);
  dense loop <tile>  engine.gemm per expert with the grouped pick's tile and schedule;
  torch loop         torch.mm per expert.
G = 1 compares the kernels on one problem (no group mixing), G = 8 the launch of all experts against eight.
One line per shape to argv[1].

    PYTHONPATH=src:benchmarks python3 benchmarks/probes/probe_grouped_vs_dense.py OUT.jsonl
    PROBE_SHAPES="G,T,N,K;..." (default: Mixtral 8x7B gate/up at T = 512 / 4096 with G = 1 and 8, DBRX's)"""
import json
import os
import sys

import torch

from gemmlab import engine, grouped, planner
from gemmlab.bench import git_sha, rel_error
from gemmlab.gpu import gpu_info
from gemmlab.timer import time_interleaved
from plans_vs_torch import shapes_from_env

SHAPES = [(1, 512, 28672, 4096), (8, 4096, 28672, 4096), (1, 1024, 21504, 6144), (8, 8192, 21504, 6144)]
SHAPES = shapes_from_env(SHAPES)  # PROBE_SHAPES="G,T,N,K;..." in its place


def tag(p) -> str:
    return f"{p.bm}x{p.bn} {p.schedule}"


def main():
    out_path = sys.argv[1]
    info = gpu_info()
    for G, T, N, K in SHAPES:
        rows = T // G
        a = torch.randn(T, K, device="cuda").bfloat16()
        b = (torch.randn(G, N, K, device="cuda") / K ** 0.5).bfloat16()
        out = torch.empty(T, N, device="cuda", dtype=torch.bfloat16)
        offs = torch.arange(0, T + 1, rows, device="cuda", dtype=torch.int32)
        ref = torch.cat([a[g * rows:(g + 1) * rows].float() @ b[g].float().t() for g in range(G)])
        gp = grouped.plan_for(a, b, offs)
        dp = planner.candidates(rows, N, K)[0]
        runs, plans = {"grouped": None, "torch loop": None}, {"grouped": repr(gp), "dense loop": repr(dp)}
        runs["grouped"] = lambda i, p=gp: grouped.run(a, b, offs, out=out, plan=p)
        same = next((c for c in grouped.candidates("contiguous", G, T, N, K)
                     if (c.bm, c.bn, c.schedule) == (dp.bm, dp.bn, dp.schedule)), None)
        if same is not None and tag(same) != tag(gp):
            runs[f"grouped {tag(same)}"] = lambda i, p=same: grouped.run(a, b, offs, out=out, plan=p)
            plans[f"grouped {tag(same)}"] = repr(same)

        def loop(mm):
            def run(i):
                for g in range(G):
                    r = slice(g * rows, (g + 1) * rows)
                    mm(a[r], b[g].t(), out[r])
                return out
            return run
        runs["dense loop"] = loop(lambda x, w, o, p=dp: engine.gemm(x, w, o, plan=p))
        twin = next((c for c in planner.candidates(rows, N, K, schedules=planner.SCHEDULES)
                     if (c.bm, c.bn, c.schedule, c.swap_ab, c.mcast) == (gp.bm, gp.bn, gp.schedule, False, 1)), None)
        if twin is not None and tag(twin) != tag(dp):
            runs[f"dense loop {tag(twin)}"] = loop(lambda x, w, o, p=twin: engine.gemm(x, w, o, plan=p))
            plans[f"dense loop {tag(twin)}"] = repr(twin)
        runs["torch loop"] = loop(lambda x, w, o: torch.mm(x, w, out=o))
        errors = {}
        for name, fn in list(runs.items()):
            out.fill_(float("nan"))
            fn(0)
            torch.cuda.synchronize()
            errors[name] = rel_error(out.double(), ref.double())
            if not errors[name] <= 1e-2:
                runs.pop(name)
        res = time_interleaved(runs, 1, rounds=9, replay_ms=20.0)
        base = res.timings["torch loop"].median_ms
        ratios = {k: round(base / t.median_ms, 4) for k, t in res.timings.items()}
        flop = 2.0 * T * N * K
        print(f"G={G} T={T} N={N} K={K} ({res.clocks.sm_mhz} MHz): " + ", ".join(
            f"{k} {flop / res.timings[k].median_ms / 1e9:.0f} TFLOP/s ({v:.3f})" for k, v in ratios.items()),
            flush=True)
        with open(out_path, "a") as f:
            f.write(json.dumps({"suite": "grouped-vs-dense", "groups": G, "T": T, "N": N, "K": K,
                                "torch_loop_ms": base, "ratios": ratios, "errors": errors, "plans": plans,
                                "sm_clock_mhz": res.clocks.sm_mhz, "gpu": info.name,
                                "git_sha": os.environ.get("GEMMLAB_GIT_SHA") or git_sha()}) + "\n")


if __name__ == "__main__":
    main()
