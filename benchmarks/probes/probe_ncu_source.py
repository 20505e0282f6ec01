"""Probe for Nsight Compute's source page: where the warps of our 64-row mid tiles and of cuBLAS's kernel
for the same shape wait, instruction by instruction (warp-state samples per SASS line). One launch each of
torch.mm and of gemmlab's route per shape (ARGV[2:], "MxNxK"), or of one engine plan ("MxNxK:BMxBN:schedule",
the planner's cheapest candidate of that tile and schedule; "mcast": its data-parallel plan with B
multicast), warmed up first and profiled between
cudaProfilerStart / cudaProfilerStop; ARGV[1]: the file naming them in the report's order. Run as

    ncu --clock-control none --profile-from-start off --section SourceCounters --section WarpStateStats \\
        --sampling-interval 0 -o $OUT/src python3 probe_ncu_source.py ORDER 1024x768x3072
    ncu -i $OUT/src.ncu-rep --page source --csv --print-source sass > $OUT/src_sass.csv
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plans_vs_torch import profile_launches  # noqa: E402
import gemmlab  # noqa: E402
from gemmlab import engine, planner  # noqa: E402


def main():
    calls, plans = [], []
    for arg in sys.argv[2:]:
        shape, *forced = arg.split(":")
        M, N, K = map(int, shape.split("x"))
        a = torch.randn(M, K, device="cuda").bfloat16()
        w = torch.randn(N, K, device="cuda").bfloat16()
        out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        if forced:
            (bm, bn), schedule = map(int, forced[0].split("x")), forced[1]
            mc = schedule == "mcast"  # the data-parallel plan with B multicast to clusters of 2
            p = min((c for c in planner.candidates(M, N, K, mcast=mc) if (c.bm, c.bn) == (bm, bn) and (
                        c.mcast > 1 if mc else c.schedule == schedule and c.mcast == 1)),
                    key=lambda c: c.predicted_s)
            plans.append(p)
            calls.append((f"{shape} plan {p!r}", lambda a=a, w=w, out=out, p=p: engine.gemm(a, w.t(), out, plan=p)))
            continue
        calls.append((f"{shape} torch", lambda a=a, w=w, out=out: torch.mm(a, w.t(), out=out)))
        calls.append((f"{shape} ours {gemmlab.plan(M, N, K)!r}", lambda a=a, w=w, out=out: engine.gemm(a, w.t(), out)))
    profile_launches(calls, plans, sys.argv[1])
    print("\n".join(name for name, _ in calls))


if __name__ == "__main__":
    main()
