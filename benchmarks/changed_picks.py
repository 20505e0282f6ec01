"""Random shapes whose plan-model pick a profile change moves (CPU only): the held-out set for a change.

    PYTHONPATH=src python3 benchmarks/changed_picks.py --set tile64_l2_factor=1.0 --m 65,3000 --count 36 --seed 2512
    PYTHONPATH=src python3 benchmarks/changed_picks.py --swap-twin --m 129,4096 --count 32 --seed 5252

Draws M uniformly from the --m range (inclusive) and N, K from common model dimensions, and keeps the shapes
where ``planner.candidates``' first plan under the profile with --set differs from the current profile's in
tile, schedule, splits, swap AB or multicast (stages alone do not count). Prints how many it drew and the
kept shapes as one ``--shapes`` argument for ``engine_broad.py --lean --alt NAME=VALUE``, which then times
both picks beside torch.mm (session 25: ``tile64_l2_probe.jsonl``).
"""

from __future__ import annotations

import argparse
import dataclasses
import random

from gemmlab import planner
from gemmlab.devices import H200

DIMS = (512, 768, 896, 1024, 1152, 1280, 1408, 1536, 1600, 2048, 2304, 2560, 2816, 3072, 3584, 3840, 4096,
        4608, 5120, 5376, 6144, 6912, 7168, 8192, 9216, 9728, 10240, 11008, 12288, 13824, 14336, 18432, 27648)


def pick_key(p: planner.Plan) -> tuple:
    return p.bm, p.bn, p.schedule, p.splits, p.swap_ab, p.mcast


def changed(other, m_range: tuple[int, int], count: int, seed: int, tries: int = 5000, prof=H200,
            swap_twin: bool = False):
    """(shapes drawn, [(M, N, K) whose pick under ``other`` differs from the one under ``prof``]); with
    ``swap_twin``, whose pick planner.SWAP_TWIN's rule (``candidates(swap_twin=True)``) moves."""
    rnd = random.Random(seed)
    out, drawn = [], 0
    while len(out) < count and drawn < tries:
        drawn += 1
        s = rnd.randint(*m_range), rnd.choice(DIMS), rnd.choice(DIMS)
        if pick_key(planner.candidates(*s, profile=other, swap_twin=swap_twin or None)[0]) != \
                pick_key(planner.candidates(*s, profile=prof)[0]):
            out.append(s)
    return drawn, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--set", nargs="+", default=[], metavar="NAME=VALUE", help="the other profile's constants")
    p.add_argument("--swap-twin", action="store_true", help="the shapes whose pick planner.SWAP_TWIN moves "
                   "(then time them with engine_broad.py --lean --swap-twin)")
    p.add_argument("--m", default="65,3000", help="M's range, lo,hi")
    p.add_argument("--count", type=int, default=36)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if not args.set and not args.swap_twin:
        p.error("name a change: --set NAME=VALUE ... and / or --swap-twin")
    pairs = (a.split("=") for a in args.set)
    other = dataclasses.replace(H200, **{k: type(getattr(H200, k))(float(v)) for k, v in pairs})
    drawn, shapes = changed(other, tuple(map(int, args.m.split(","))), args.count, args.seed,
                            swap_twin=args.swap_twin)
    print(f"{len(shapes)} of {drawn} drawn shapes change pick")
    print(";".join(f"{m},{n},{k}" for m, n, k in shapes))


if __name__ == "__main__":
    main()
