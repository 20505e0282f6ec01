"""Run the FP8 kernel once per tile height and scale mode on small ragged problems, for compute-sanitizer.

    compute-sanitizer --tool memcheck  python3 benchmarks/fp8_sanitize.py
    compute-sanitizer --tool racecheck python3 benchmarks/fp8_sanitize.py --shape 300,1000,1024
    compute-sanitizer --tool synccheck python3 benchmarks/fp8_sanitize.py

Each run prints the plan and its relative error against the float64 reference (``gemmlab.fp8``); a
run whose output is wrong or not fully written (NaN-poisoned) says so and the script exits 1.
"""

import argparse
import sys

import torch

from gemmlab import engine2, fp8, planner
from gemmlab.bench import rel_error

# (bm, bn) per tile height, with a width that straddles B's 128-column scale blocks (80) and a tail piece.
TILES = ((64, 80), (128, 208), (256, 96))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="200,300,512", help="M,N,K (K % 128 == 0 for block scales)")
    args = ap.parse_args()
    M, N, K = (int(x) for x in args.shape.split(","))
    prof = engine2._profile(torch.device("cuda"))
    failed = 0
    for scale in planner.FP8_SCALES:
        x, w = torch.randn(M, K, device="cuda"), torch.randn(N, K, device="cuda")
        if scale == "block":
            (a, sa), (q, sb) = fp8.quantize_blocks(x, 1), fp8.quantize_blocks(w, 128)
        else:
            (a, sa), (q, sb) = fp8.quantize_per_tensor(x), fp8.quantize_per_tensor(w)
        ref = fp8.reference_scaled_mm(a, q.t(), sa, sb)
        for bm, bn in TILES:
            p = next((c for c in planner.fp8_candidates(M, N, K, scale=scale, profile=prof)
                      if (c.bm, c.bn) == (bm, bn)), None)
            if p is None:
                print(f"{scale} {bm}x{bn}: not offered for {M}x{N}x{K}")
                continue
            out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
            engine2.launch_fp8(p, a, q, sa, sb, out)
            torch.cuda.synchronize()
            err = rel_error(out, ref)
            ok = err < 8e-3
            failed += not ok
            print(f"{p}: rel error {err:.2e}{'' if ok else '  FAILED'}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
