"""Probe for Nsight Compute: one launch each of torch.mm (cuBLAS) and what gemmlab runs, on the broad set's
losers (mid, prefill, decode), plus our 2 x 1 multicast plan where the planner has one, and FP8 per-tensor /
block / torch._scaled_mm at one square. Everything is compiled and warmed up first; only the launches
between cudaProfilerStart and cudaProfilerStop are profiled, so run it as

    ncu --clock-control none --profile-from-start off --set full -o $OUT/ncu python3 probe_ncu.py LIST

and read the report's kernels in the order LIST (a text file this script writes) gives them."""
import os
import sys

import torch

sys.path.insert(0, "benchmarks")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plans_vs_torch import profile_launches  # noqa: E402
import gemmlab  # noqa: E402
from gemmlab import engine, engine2, fp8, planner  # noqa: E402

MID = [(1024, 768, 3072), (1000, 1152, 6912), (300, 11008, 2048), (300, 7168, 16384), (256, 5120, 5120),
       (200, 4096, 4096), (2050, 3000, 1000), (5000, 1152, 896), (5000, 5120, 14336)]
DECODE = [(32, 14336, 4096), (8, 28672, 4096), (32, 43008, 5376)]
FP8 = [(4096, 4096, 4096)]


def main():
    prof = engine2._profile(torch.device("cuda"))
    calls, plans = [], []
    for M, N, K in MID + DECODE:
        a = torch.randn(M, K, device="cuda").bfloat16()
        w = torch.randn(N, K, device="cuda").bfloat16()
        out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        calls.append((f"{M}x{N}x{K} torch", lambda a=a, w=w, out=out: torch.mm(a, w.t(), out=out)))
        calls.append((f"{M}x{N}x{K} ours {gemmlab.plan(M, N, K)!r}",
                      lambda a=a, w=w, out=out: engine.gemm(a, w.t(), out)))
        pick = planner.plan(M, N, K, profile=prof)
        plans.append(pick)
        mc = [c for c in planner.candidates(M, N, K, profile=prof, mcast=True)
              if c.mcast > 1 and (c.bm, c.bn) == (pick.bm, pick.bn) and c.schedule == "data_parallel"]
        if mc and not pick.swap_ab:
            plans.append(mc[0])
            calls.append((f"{M}x{N}x{K} mcast {mc[0]!r}",
                          lambda a=a, w=w, out=out, p=mc[0]: engine2.launch(p, a, w.t(), out)))
    for M, N, K in FP8:
        a = torch.randn(M, K, device="cuda")
        b = torch.randn(N, K, device="cuda")
        qa, sa = fp8.quantize_per_tensor(a)
        qb, sb = fp8.quantize_per_tensor(b)
        ba, bsa = fp8.quantize_blocks(a, 1)
        bb, bsb = fp8.quantize_blocks(b, 128)
        calls.append((f"{M}x{N}x{K} fp8 torch._scaled_mm",
                      lambda: torch._scaled_mm(qa, qb.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)))
        calls.append((f"{M}x{N}x{K} fp8 ours tensor", lambda: fp8.scaled_mm(qa, qb.t(), sa, sb)))
        calls.append((f"{M}x{N}x{K} fp8 ours block", lambda: fp8.scaled_mm(ba, bb.t(), bsa, bsb)))
    profile_launches(calls, plans, sys.argv[1])
    print("\n".join(name for name, _ in calls))

if __name__ == "__main__":
    main()
