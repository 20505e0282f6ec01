"""Where gemmlab.matmul's time goes on a shape whose leading dimensions break TMA's 16-byte rule.

    PYTHONPATH=src python3 benchmarks/unaligned_breakdown.py --shape 4095,4095,4095

Times, interleaved with the one timer: torch.mm; gemmlab.matmul (the whole path); the aligned copy of one
operand (what the engine does to A and to B); the engine on already-aligned operands writing an aligned
output (TMA store) and writing the unaligned output (stored from the epilogue's slab row by row, DIRECT).
The differences say what the copies and the DIRECT output cost.
"""

from __future__ import annotations

import argparse

import torch

from gemmlab import engine, matmul
from gemmlab.gpu import gpu_info
from gemmlab.timer import sets_for, time_interleaved


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="4095,4095,4095")
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    M, N, K = (int(x) for x in args.shape.split(","))
    info = gpu_info()
    n_sets = max(1, min(sets_for(2 * (M * K + N * K + M * N), info.l2_bytes), 16))
    sets = []
    for _ in range(n_sets):
        a = torch.randn(M, K, device="cuda").bfloat16()
        w = torch.randn(N, K, device="cuda").bfloat16()
        out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        out_al = engine._aligned_copy(out)
        sets.append((a, w.t(), out, engine._aligned_copy(a), engine._aligned_copy(w).t(), out_al))
    cands = {
        "torch.mm": lambda i: torch.mm(sets[i][0], sets[i][1], out=sets[i][2]),
        "gemmlab.matmul": lambda i: matmul(sets[i][0], sets[i][1], out=sets[i][2]),
        "copy of A": lambda i: engine._aligned_copy(sets[i][0]),
        "engine, aligned in, TMA out": lambda i: engine.gemm(sets[i][3], sets[i][4], sets[i][5]),
        "engine, aligned in, DIRECT out": lambda i: engine.gemm(sets[i][3], sets[i][4], sets[i][2]),
    }
    res = time_interleaved(cands, n_sets, rounds=args.rounds, replay_ms=10.0)
    base = res.timings["torch.mm"].median_ms
    for name, t in res.timings.items():
        print(f"{M}x{N}x{K} {name:>32s}: {t.median_ms * 1e3:8.1f} us  (torch.mm / this = {base / t.median_ms:.3f})")
    print(f"SM clock {res.clocks.sm_mhz} MHz")


if __name__ == "__main__":
    main()
