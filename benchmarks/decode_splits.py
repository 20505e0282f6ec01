"""Time the decode kernel's splits of one shape (``decode.plan_time``'s CTA shapes and split counts) against
the one ``decode.plan`` picks, torch.mm and gemmlab.matmul's own route, interleaved: is a small call's time
the kernel's latency or the split's?

    PYTHONPATH=src python3 benchmarks/decode_splits.py --shapes "1,897,515;32,896,896" --out splits.jsonl

Per shape: the default variant for its operands (``decode.variant_for``: aligned or not, strided by size),
every (rw, splits) ``plan_time`` allows, the ``--top`` best by its model plus every unsplit CTA shape and the
pick; with ``--short-pieces`` also each unsplit one with the shortest k piece that still covers K
(``decode.MIN_WARP_K`` not applied: does a tiny K's call want fewer serial iterations a warp?). Each plan is
checked against a float64 reference before it is timed. Records carry
``suite = "decode-splits"``, the plan, its ``plan_time`` and ``cost_s`` (the router's price of the pick),
the SM clock and the git sha.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math

import torch
from decode_variants import operand_sets

import gemmlab
from gemmlab import decode, engine
from gemmlab.bench import git_sha, rel_error
from gemmlab.devices import H200
from gemmlab.gpu import gpu_info
from gemmlab.timer import time_interleaved


def splits_of(M: int, N: int, K: int, sm: int, v: decode.Variant, top: int) -> list[tuple[float, decode.DecodePlan]]:
    """(plan_time, plan) of the ``top`` best (rw, splits) by the model, every unsplit CTA shape and the pick."""
    every = [got for rw in (8, 4, 2, 1) for s in range(1, decode.MAX_SPLITS + 1)
             if (got := decode.plan_time(M, N, K, sm, rw, s, v)) is not None]
    every.sort(key=lambda g: g[0])
    pick = decode.plan(M, N, K, sm, v)
    keep = every[:top] + [g for g in every if g[1].splits == 1] + [g for g in every if g[1] == pick]
    return list({g[1]: g for g in keep}.values())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", required=True, help="M,N,K;M,N,K;...")
    p.add_argument("--top", type=int, default=8, help="the best this many plans by the model, besides the pick")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=None)
    p.add_argument("--short-pieces", action="store_true",
                   help="also time every unsplit plan with its k piece cut to the shortest that covers K")
    args = p.parse_args()
    info = gpu_info()
    for shape in args.shapes.split(";"):
        M, N, K = (int(x) for x in shape.split(","))
        _, n_sets, sets = operand_sets(M, N, K, info.l2_bytes)
        v = decode.variant_for(*sets[0][:2])
        pick = decode.plan(M, N, K, info.sm_count, v)
        plans = {f"{dp}" + (" (pick)" if dp == pick else ""): (t, dp)
                 for t, dp in splits_of(M, N, K, info.sm_count, v, args.top)}
        if args.short_pieces:
            for _, dp in list(plans.values()):
                short = math.ceil(math.ceil(K / dp.kw) / decode.CHUNK_K) * decode.CHUNK_K
                if dp.splits == 1 and short < dp.piece:
                    cut = dataclasses.replace(dp, piece=short)
                    plans[f"{cut} (short)"] = (None, cut)
        own = "engine (" + gemmlab.plan(M, N, K).kernel + ")"
        cands = {"torch": lambda i: torch.mm(sets[i][0], sets[i][1], out=sets[i][2]),
                 own: lambda i: engine.gemm(*sets[i])}
        ref = sets[0][0].double() @ sets[0][1].double()
        errors = {}
        for name, (_, dp) in plans.items():
            sets[0][2].fill_(float("nan"))
            try:
                decode.run_variant(*sets[0], v, split=dp)
                torch.cuda.synchronize()
            except ValueError as e:  # a plan the launch refuses: say so, time the others (a CUDA fault stops)
                print(f"{M}x{N}x{K} {name}: refused ({e})", flush=True)
                errors[name] = float("inf")
                continue
            errors[name] = rel_error(sets[0][2], ref)
            if errors[name] <= 1e-2:
                cands[name] = lambda i, dp=dp: decode.run_variant(*sets[i], v, split=dp)
        res = time_interleaved(cands, n_sets, rounds=args.rounds, replay_ms=10.0)
        base = res.timings["torch"].median_ms
        price = decode.cost_s(M, N, K, info.sm_count, H200, aligned=v.aligned)
        for name in [own, *plans]:
            t = res.timings.get(name)
            print(f"{M}x{N}x{K} {name:>60s}: " + (f"{t.median_ms * 1e3:7.2f} us  x{base / t.median_ms:.3f}" if t else
                                                  f"WRONG (error {errors[name]:.2e})")
                  + f"  (torch {base * 1e3:.2f} us, {res.clocks.sm_mhz} MHz)", flush=True)
            if args.out and t:
                model_s, dp = plans.get(name, (None, None))
                with open(args.out, "a") as f:
                    f.write(json.dumps({"suite": "decode-splits", "M": M, "N": N, "K": K, "config": name,
                                        "variant": v.__dict__, "plan": str(dp) if dp else None,
                                        "pick": dp == pick if dp else None, "plan_time_s": model_s,
                                        "cost_s": price, "time_ms": t.median_ms, "baseline_ms": base,
                                        "ratio": base / t.median_ms, "rel_error": errors.get(name),
                                        "sm_clock_mhz": res.clocks.sm_mhz, "gpu": info.name,
                                        "git_sha": git_sha()}) + "\n")


if __name__ == "__main__":
    main()
