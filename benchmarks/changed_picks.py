"""Random shapes whose plan-model pick a change moves (CPU only): the held-out set for a change.

    PYTHONPATH=src python3 benchmarks/changed_picks.py --set tile64_l2_factor=1.0 --m 65,3000 --count 36 --seed 2512
    PYTHONPATH=src python3 benchmarks/changed_picks.py --swap-twin --m 129,4096 --count 32 --seed 5252
    PYTHONPATH=src python3 benchmarks/changed_picks.py --set SWAP_PAD_SPAN=none --fresh --m 129,4096 --seed 5501
    PYTHONPATH=src python3 benchmarks/changed_picks.py --base stream_k_offered=0 \
        --set SWAP_PREFER_WAVES_MARGIN=1.35 --m 1,32 --seed 5701
    PYTHONPATH=src python3 benchmarks/changed_picks.py --set DEEP_RING_STAGES=9 --stages --m 1,192 --seed 5901

Draws M uniformly from the --m range (inclusive) and N, K from common model dimensions (``--fresh``: the
projections of fresh_draw.py's held-out model families and vocabulary heads, M log-uniform), and keeps the
shapes where ``planner.candidates``' first plan with the --set constants differs from the current one in
tile, schedule, splits, swap AB or multicast (stages alone count with ``--stages`` only). A --set NAME in capitals is a
``gemmlab.planner`` constant (``none`` for None), any other a device-profile field. Prints how many it drew
and the kept shapes as one ``--shapes`` argument for ``engine_broad.py --lean --alt NAME=VALUE``, which then
times both picks beside torch.mm (session 25: ``tile64_l2_probe.jsonl``). ``--base``: device-profile fields
of the GPU the shapes are for, on both sides (``stream_k_offered=0``: an H100's plans, ``engine.plan_profile``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import random

from gemmlab import planner
from gemmlab.broad_shapes import projections
from gemmlab.devices import H200

DIMS = (512, 768, 896, 1024, 1152, 1280, 1408, 1536, 1600, 2048, 2304, 2560, 2816, 3072, 3584, 3840, 4096,
        4608, 5120, 5376, 6144, 6912, 7168, 8192, 9216, 9728, 10240, 11008, 12288, 13824, 14336, 18432, 27648)


def pick_key(p: planner.Plan, stages: bool = False) -> tuple:
    return (p.bm, p.bn, p.schedule, p.splits, p.swap_ab, p.mcast) + ((p.stages,) if stages else ())


def constants(pairs, prof=H200):
    """(``prof`` with the device-profile fields among ``pairs`` ("NAME=VALUE") replaced, {planner constant:
    value} for the NAMEs in capitals)."""
    fields, consts = {}, {}
    for pair in pairs:
        name, value = pair.split("=")
        if name.isupper():
            if not hasattr(planner, name):
                raise ValueError(f"gemmlab.planner has no constant {name}")
            now = getattr(planner, name)
            consts[name] = (None if value.lower() == "none" else value.lower() == "true" if isinstance(now, bool)
                            else type(now)(float(value)) if now is not None else float(value))
        else:
            fields[name] = type(getattr(prof, name))(float(value))
    return dataclasses.replace(prof, **fields) if fields else prof, consts


@contextlib.contextmanager
def planner_constants(values: dict):
    """``gemmlab.planner``'s constants set to ``values`` (and its plan cache cleared) inside the block."""
    old = {k: getattr(planner, k) for k in values}
    planner._CACHE.clear()
    try:
        for k, v in values.items():
            setattr(planner, k, v)
        yield
    finally:
        for k, v in old.items():
            setattr(planner, k, v)
        planner._CACHE.clear()


def fresh_pairs() -> list[tuple[int, int]]:
    """(N, K) of fresh_draw.py's held-out families' projections and vocabulary heads."""
    from fresh_draw import HEADS, HELD_OUT
    return sorted({nk for dims in HELD_OUT.values() for nk in projections(*dims).values()} | set(HEADS.values()))


def changed(other, m_range: tuple[int, int], count: int, seed: int, tries: int = 5000, prof=H200,
            swap_twin: bool = False, consts: dict | None = None, pairs=None, stages: bool = False):
    """(shapes drawn, [(M, N, K) whose pick under ``other`` (and the planner ``consts``) differs from the one
    under ``prof``]); with ``swap_twin``, whose pick planner.SWAP_TWIN's rule (``candidates(swap_twin=True)``)
    moves; ``pairs``: draw (N, K) from these, M log-uniform (else N and K from DIMS, M uniform); ``stages``: a
    pick that differs in its ring's depth alone counts too."""
    rnd = random.Random(seed)
    out, drawn = [], 0
    lo, hi = math.log(m_range[0]), math.log(m_range[1] + 1)
    while len(out) < count and drawn < tries:
        drawn += 1
        if pairs:
            N, K = rnd.choice(pairs)
            s = min(m_range[1], int(math.exp(rnd.uniform(lo, hi)))), N, K
        else:
            s = rnd.randint(*m_range), rnd.choice(DIMS), rnd.choice(DIMS)
        if s in out:
            continue
        with planner_constants(consts or {}):
            new = pick_key(planner.candidates(*s, profile=other, swap_twin=swap_twin or None)[0], stages)
        if new != pick_key(planner.candidates(*s, profile=prof)[0], stages):
            out.append(s)
    return drawn, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--set", nargs="+", default=[], metavar="NAME=VALUE",
                   help="the other profile's constants (NAME in capitals: a gemmlab.planner constant)")
    p.add_argument("--base", nargs="+", default=[], metavar="NAME=VALUE",
                   help="device-profile fields of the GPU planned for, both sides (stream_k_offered=0: an H100)")
    p.add_argument("--fresh", action="store_true", help="N, K of fresh_draw.py's held-out families")
    p.add_argument("--swap-twin", action="store_true", help="the shapes whose pick planner.SWAP_TWIN moves "
                   "(then time them with engine_broad.py --lean --swap-twin)")
    p.add_argument("--stages", action="store_true", help="count a pick whose ring depth alone differs")
    p.add_argument("--m", default="65,3000", help="M's range, lo,hi")
    p.add_argument("--count", type=int, default=36)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if not args.set and not args.swap_twin:
        p.error("name a change: --set NAME=VALUE ... and / or --swap-twin")
    base, base_consts = constants(args.base)
    if base_consts:
        p.error("--base takes device-profile fields only")
    other, consts = constants(args.set, base)
    drawn, shapes = changed(other, tuple(map(int, args.m.split(","))), args.count, args.seed, prof=base,
                            swap_twin=args.swap_twin, consts=consts, pairs=fresh_pairs() if args.fresh else None,
                            stages=args.stages)
    print(f"{len(shapes)} of {drawn} drawn shapes change pick")
    print(";".join(f"{m},{n},{k}" for m, n, k in shapes))


if __name__ == "__main__":
    main()
