"""Time gemmlab.engine under other tile-width / split-K choices than its own, interleaved with torch.mm.

    PYTHONPATH=src python3 benchmarks/engine_policies.py --shapes 1024,1024,1024;512,1024,4096 --out r.jsonl

Each candidate runs ``engine.gemm`` with a forced plan (tile width, split count; ``gemm(plan=)`` runs h11 even
where the engine would take the decode kernel), so the engine's heuristics can be checked against the
alternatives on the shapes where they matter. An experiment, not a suite: records carry
``suite = "engine-policies"`` and the variant in ``config``.
"""

from __future__ import annotations

import argparse
import json
import math

import torch

from gemmlab import engine
from gemmlab.bench import git_sha, rel_error
from gemmlab.gpu import gpu_info
from gemmlab.timer import sets_for, time_interleaved


def variants(M: int, N: int, K: int, sm: int) -> dict[str, dict]:
    """name -> {"BN": width or None (the engine's), "splits": count or None}. Where the engine would take
    the decode kernel (M <= decode.MAX_M), the BN / splits variants run h11 instead."""
    out = {"engine": {"BN": None, "splits": None}}
    for bn in (64, 128, 256):
        tiles = math.ceil(M / engine.BM) * math.ceil(N / bn)
        k_iters = math.ceil(K / engine.BK)
        cap = engine.cluster_capacity(torch.device("cuda"))
        for s in range(1, engine.MAX_CLUSTER + 1):
            if s <= k_iters and (s == 1 or (tiles <= cap[s] and math.ceil(k_iters / s) * (s - 1) < k_iters)):
                out[f"BN={bn},splits={s}"] = {"BN": bn, "splits": s}
    return out


def run_variant(v: dict, a, b, out) -> None:
    engine.gemm(a, b, out, plan=None if v["BN"] is None else (v["BN"], v["splits"]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", required=True, help="M,N,K;M,N,K;...")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    info = gpu_info()
    for shape in args.shapes.split(";"):
        M, N, K = (int(x) for x in shape.split(","))
        per_set = 2 * (M * K + N * K + M * N)
        n_sets = max(1, min(sets_for(per_set, info.l2_bytes), 64))
        sets = [(torch.randn(M, K, device="cuda").bfloat16(), torch.randn(N, K, device="cuda").bfloat16().t(),
                 torch.empty(M, N, device="cuda", dtype=torch.bfloat16)) for _ in range(n_sets)]
        vs = variants(M, N, K, info.sm_count)
        cands = {"torch": lambda i: torch.mm(sets[i][0], sets[i][1], out=sets[i][2])}
        ref = sets[0][0].double() @ sets[0][1].double()
        errors = {}
        for name, v in vs.items():
            sets[0][2].fill_(float("nan"))
            run_variant(v, *sets[0])
            torch.cuda.synchronize()
            errors[name] = rel_error(sets[0][2], ref)
            if errors[name] <= 1e-2:
                cands[name] = lambda i, v=v: run_variant(v, *sets[i])
        res = time_interleaved(cands, n_sets, rounds=args.rounds, replay_ms=10.0)
        base = res.timings["torch"].median_ms
        for name, v in vs.items():
            t = res.timings.get(name)
            line = f"{M}x{N}x{K} {name:>18s}: " + (f"{t.median_ms * 1e3:8.1f} us  x{base / t.median_ms:.3f}"
                                                   if t else f"WRONG (error {errors[name]:.2e})")
            print(line + f"  (torch {base * 1e3:.1f} us, {res.clocks.sm_mhz} MHz)", flush=True)
            if args.out and t:
                with open(args.out, "a") as f:
                    f.write(json.dumps({"suite": "engine-policies", "M": M, "N": N, "K": K, "config": name,
                                        "time_ms": t.median_ms, "baseline_ms": base, "ratio": base / t.median_ms,
                                        "rel_error": errors[name], "sm_clock_mhz": res.clocks.sm_mhz,
                                        "gpu": info.name, "git_sha": git_sha()}) + "\n")


if __name__ == "__main__":
    main()
