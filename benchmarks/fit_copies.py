"""Fit the operand copies' price (``engine.copies_s``) to the broad records (CPU only).

    PYTHONPATH=src python3 benchmarks/fit_copies.py [--sha 90e1bea edda661] [--file engine_broad.jsonl.gz]

A call whose operand TMA cannot read (K odd, say) copies it into aligned rows before the engine kernel runs.
The router weighs that path against the decode kernel, which reads such rows in place
(``engine.decode_runs``), so what the copies cost decides the route of every unaligned call of up to 32
tokens. The broad runs of those shapes (``shapes/unaligned_decode*.txt``) time the engine kernel's model plan
with its copies (candidate ``model``); the router prices that path as ``Route.engine_s`` (the engine
kernel's plan, on the rows as they are: ``engine.route`` on meta tensors at HEAD) plus ``copies_s``, so the
measured time less ``engine_s`` is what the copies have to be priced at. Fitted per shape, as

    copies = fixed + 2 x (bytes up to C) / resident rate + 2 x (bytes past C) / rate,  C = share x L2

(the copy reads and writes each byte; what it writes last is still in L2 when the GEMM reads it, up to
some share of the L2). The knot's share is scanned, the three others are a weighted least-squares fit (the
weight: 1 / the measured time, so the residual is relative). The fit half is the even positions of the
sorted shapes, the odd half held out; the last line fits all of them (what ``devices.H200`` holds).
``--changed N``: instead, draws N unaligned shapes of up to 32 tokens (``random.Random(--seed)``: M from
1..32, N and K from model widths plus a few, K odd) and prints those whose route the fitted price moves
from the single-rate one (before this fit), as one ``--shapes`` argument for ``engine_broad.py``, which
times both paths (the routed kernel and the engine kernel's plan with its copies).

Prints the mean |log measured / priced| of the whole call (engine_s + copies) under the profile's price and
the fitted one, per half, and on the H100 records where given (``--h100``: their plans are priced with the
H200 profile, as the router does on any 132-SM GPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
from collections import defaultdict
from pathlib import Path

import numpy as np
from pick_vs_oracle import router

from gemmlab import engine
from gemmlab.record_files import load_records
from gemmlab.devices import H200

RESULTS = Path(__file__).resolve().parent / "results"


def engine_s(M: int, N: int, K: int) -> float:
    """The router's price of the engine kernel for a contiguous bf16 (M, K) x (N, K)^T call."""
    r = router((M, N, K), engine.plan_profile(H200.sm_count))
    if r.engine_s is None:  # priced only where the decode kernel may run (up to 32 tokens)
        raise ValueError(f"{M}x{N}x{K}: the router prices no engine path against the decode kernel")
    return r.engine_s


def points(path: Path, shas) -> list[tuple]:
    """(copied bytes, measured s, the router's engine_s, shape) per record of the ``model`` candidate: the
    engine kernel with copies of both operands (the unaligned decode shapes copy A and the weight)."""
    runs = defaultdict(dict)
    for r in load_records(path):
        if any(r.get("git_sha", "").startswith(s) for s in shas) and r.get("candidate") == "model" \
                and r.get("predicted_ms") and r.get("time_ms"):
            runs[(r["git_sha"], r["M"], r["N"], r["K"])] = r
    out = []
    for (_, M, N, K), r in sorted(runs.items()):
        out.append((2 * (M * K + N * K), r["time_ms"] * 1e-3, engine_s(M, N, K), (M, N, K)))
    return out


def price(n: float, fixed: float, resident: float, resident_rate: float, rate: float) -> float:
    """``engine.copies_s``'s form for ``n`` copied bytes."""
    return fixed + 2.0 * (min(n, resident) / resident_rate + max(0.0, n - resident) / rate)


def fit(pts, share: float, l2: int) -> tuple[float, float, float]:
    """(fixed, resident rate, rate) for the knot at ``share`` x ``l2`` bytes."""
    c = share * l2
    X = np.array([[1.0, min(n, c), max(0.0, n - c)] for n, *_ in pts])
    y = np.array([m - p for _, m, p, _ in pts])
    w = 1.0 / np.array([m for _, m, _, _ in pts])
    f, a, b = np.linalg.lstsq(X * w[:, None], y * w, rcond=None)[0]
    return float(f), 2.0 / a, 2.0 / b


def error(pts, copies) -> float:
    """Mean |log measured / (engine_s + copies(bytes))| over ``pts``."""
    return sum(abs(math.log(m / (p + copies(n)))) for n, m, p, _ in pts) / len(pts)


def single_rate(n: float) -> float:
    """The price before this fit: 1.5 us and every byte read and written at ``hbm_bytes_per_s``."""
    return 1.5e-6 + 2.0 * n / H200.hbm_bytes_per_s


def current(n: float) -> float:
    return price(n, H200.copy_fixed_s, H200.copy_resident_share * H200.l2_bytes, H200.copy_resident_bytes_per_s,
                 H200.copy_bytes_per_s)


DIMS = (512, 768, 896, 1024, 1152, 1280, 1408, 1536, 2048, 2304, 2560, 3072, 3584, 4096, 4608, 5120, 6144, 7168,
        8192, 11008, 14336)


def route_kernel(M: int, N: int, K: int, prof) -> str:
    """``engine.route``'s kernel for a contiguous bf16 (M, K) x (N, K)^T call planned with ``prof``."""
    return router((M, N, K), prof).kernel


def changed_routes(count: int, seed: int) -> list[tuple[int, int, int]]:
    """Of ``count`` drawn unaligned shapes, those whose route differs under the single-rate copies price."""
    before = dataclasses.replace(H200, copy_fixed_s=1.5e-6, copy_resident_share=0.0,
                                 copy_bytes_per_s=H200.hbm_bytes_per_s)
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        M = rng.choice((1, 2, 4, 8, 12, 16, 24, 32, rng.randint(1, 32)))
        N = rng.choice(DIMS) + rng.choice((-3, -1, 0, 1, 3, 5))
        K = rng.choice(DIMS) + rng.choice((-3, -1, 1, 3, 5))
        if route_kernel(M, N, K, before) != route_kernel(M, N, K, H200):
            out.append((M, N, K))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--file", default="engine_broad.jsonl.gz")
    p.add_argument("--sha", nargs="+", default=["90e1bea", "edda661"])
    p.add_argument("--h100", nargs="*", default=["90e1bea", "eec817f", "b3fbf21"],
                   help="shas of h100_engine_broad.jsonl to check the fit on (none: skip)")
    p.add_argument("--changed", type=int, default=0, help="draw this many shapes and print those whose route moves")
    p.add_argument("--seed", type=int, default=2512)
    args = p.parse_args()
    if args.changed:
        moved = changed_routes(args.changed, args.seed)
        print(f"{len(moved)} of {args.changed} drawn shapes change route:")
        print(";".join(",".join(map(str, s)) for s in moved))
        return
    pts = points(RESULTS / args.file, args.sha)
    if not pts:
        raise SystemExit(f"no 'model' records of {args.sha} in {args.file}")
    shapes = sorted({s for *_, s in pts})
    even = {s for i, s in enumerate(shapes) if i % 2 == 0}
    halves = {"fit": [q for q in pts if q[3] in even], "held-out": [q for q in pts if q[3] not in even]}
    h100 = points(RESULTS / "h100_engine_broad.jsonl", args.h100) if args.h100 else []
    l2 = H200.l2_bytes
    for name, fn in (("one rate (before)", single_rate), ("the profile's", current)):
        print(f"{len(pts)} records, {len(shapes)} shapes; {name} price: "
              + ", ".join(f"{k} {error(v, fn):.3f}" for k, v in halves.items())
              + (f", H100 {error(h100, fn):.3f}" if h100 else ""))
    for share in (0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6):
        f, rr, r = fit(halves["fit"], share, l2)
        fn = (lambda n, f=f, c=share * l2, rr=rr, r=r: price(n, f, c, rr, r))
        print(f"share {share:.2f}: fixed {f * 1e6:5.2f} us, resident {rr / 1e12:5.2f} TB/s, past it {r / 1e12:5.2f} TB/s"
              f" (read + write) | fit {error(halves['fit'], fn):.3f} held-out {error(halves['held-out'], fn):.3f}"
              + (f" H100 {error(h100, fn):.3f}" if h100 else ""))
    best = min((0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6),
               key=lambda s: error(halves["fit"], lambda n, s=s, q=fit(halves["fit"], s, l2): price(n, q[0], s * l2, *q[1:])))
    f, rr, r = fit(pts, best, l2)
    print(f"all shapes, share {best}: copy_fixed_s {f:.3g}, copy_resident_share {best}, "
          f"copy_resident_bytes_per_s {rr:.3g}, copy_bytes_per_s {r:.3g}")


if __name__ == "__main__":
    main()
