"""Time every decode-kernel variant (gemmlab.decode.VARIANTS) against torch.mm and gemmlab.matmul's own
choice (the decode default up to decode.MAX_M, h11 past it), interleaved.

    PYTHONPATH=src python3 benchmarks/decode_variants.py --out decode_variants.jsonl

Default shapes: M = 1, 16, 32, 64 against the Llama-3 8B/70B projections. A shape whose K is not a multiple of
8 times the unaligned variants (``decode.UNALIGNED_VARIANTS``, ``STRIDED_VARIANTS`` and ``UNALIGNED_TRIALS``)
instead. Records carry ``suite = "decode-variants"``, the variant in ``config``, GB/s over weight + X + out
bytes and the git sha.
``--default-only`` times the default variant alone beside gemmlab.matmul's own route (the decode kernel or
the engine kernel with its copies: both paths of a routing decision).
"""

from __future__ import annotations

import argparse
import json

import torch

import gemmlab
from gemmlab import decode, engine
from gemmlab.bench import git_sha, rel_error
from gemmlab.gpu import gpu_info
from gemmlab.timer import sets_for, time_interleaved

NK = ((4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (8192, 8192), (1024, 8192), (28672, 8192),
      (8192, 28672))
DEFAULT_SHAPES = ";".join(f"{m},{n},{k}" for m in (1, 16, 32, 64) for n, k in NK)


def operand_sets(M: int, N: int, K: int, l2_bytes: int) -> tuple[int, int, list[tuple]]:
    """(bytes of one call, how many sets, the sets): bf16 (a, w.t(), out) of fresh randn, as many as rotate
    through twice the L2 (``timer.sets_for``, at most 64)."""
    nbytes = 2 * (M * K + N * K + M * N)
    n_sets = max(1, min(sets_for(nbytes, l2_bytes), 64))
    sets = [(torch.randn(M, K, device="cuda").bfloat16(), torch.randn(N, K, device="cuda").bfloat16().t(),
             torch.empty(M, N, device="cuda", dtype=torch.bfloat16)) for _ in range(n_sets)]
    return nbytes, n_sets, sets


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=DEFAULT_SHAPES, help="M,N,K;M,N,K;...")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out", default=None)
    p.add_argument("--default-only", action="store_true",
                   help="time the default variant only (against torch.mm and gemmlab.matmul's own route)")
    args = p.parse_args()
    info = gpu_info()
    for shape in args.shapes.split(";"):
        M, N, K = (int(x) for x in shape.split(","))
        nbytes, n_sets, sets = operand_sets(M, N, K, info.l2_bytes)
        nt = decode.token_tiles(M)
        fits = decode.aligned(*sets[0][:2])  # K % 8 (contiguous operands): the unaligned variants and trials
        default = decode.default_variant(nt, fits)
        trials = () if args.default_only else decode.VARIANTS[nt] if fits else (
            decode.UNALIGNED_VARIANTS[nt], decode.STRIDED_VARIANTS[nt], *decode.UNALIGNED_TRIALS[nt])
        variants = {f"decode {v}" + (" (default)" if v == default else ""): v for v in dict.fromkeys((default,) + trials)}
        own = "engine (" + gemmlab.plan(M, N, K).kernel + ")"
        cands = {"torch": lambda i: torch.mm(sets[i][0], sets[i][1], out=sets[i][2]),
                 own: lambda i: engine.gemm(*sets[i])}
        ref = sets[0][0].double() @ sets[0][1].double()
        errors = {}
        for name, v in variants.items():
            sets[0][2].fill_(float("nan"))
            decode.run_variant(*sets[0], v)
            torch.cuda.synchronize()
            errors[name] = rel_error(sets[0][2], ref)
            if errors[name] <= 1e-2:
                cands[name] = lambda i, v=v: decode.run_variant(*sets[i], v)
        res = time_interleaved(cands, n_sets, rounds=args.rounds, replay_ms=10.0)
        base = res.timings["torch"].median_ms
        for name in [own, *variants]:
            t = res.timings.get(name)
            line = f"{M}x{N}x{K} {name:>52s}: " + (
                f"{t.median_ms * 1e3:8.1f} us  x{base / t.median_ms:.3f}  {nbytes / t.median_ms / 1e6:6.0f} GB/s"
                if t else f"WRONG (error {errors[name]:.2e})")
            print(line + f"  (torch {base * 1e3:.1f} us, {nbytes / base / 1e6:.0f} GB/s, {res.clocks.sm_mhz} MHz)",
                  flush=True)
            if args.out and t:
                v = variants.get(name)
                with open(args.out, "a") as f:
                    f.write(json.dumps({"suite": "decode-variants", "M": M, "N": N, "K": K, "config": name,
                                        "variant": v.__dict__ if v else None, "plan": str(decode.plan(
                                            M, N, K, info.sm_count, v)) if v else None,
                                        "time_ms": t.median_ms, "baseline_ms": base, "ratio": base / t.median_ms,
                                        "gb_per_s": nbytes / t.median_ms / 1e6, "rel_error": errors.get(name),
                                        "sm_clock_mhz": res.clocks.sm_mhz, "gpu": info.name,
                                        "git_sha": git_sha()}) + "\n")


if __name__ == "__main__":
    main()
