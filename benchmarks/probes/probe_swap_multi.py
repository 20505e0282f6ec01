"""Probe: swapped plans over several columns of token tiles at M = 65..512, now that the last column loads
only the tokens it has (short B boxes, d769bef). The broad set's shapes of that M (56) and held-out ones of
other M: per shape the router's plan, the model's best plain plan, the model's best swapped plan (every
swapped data-parallel / split-K / stream-K plan offered, SWAP_MAX_M (and SWAP_ONE_TILE_MAX_M, now SWAP_PAD_MAX_M) raised to 512
in this process only) and, per tile height, the model's best swapped data-parallel plan that pads the tokens
by at most 8% over at most four columns, against torch.mm (graph replay, interleaved; every result checked against an fp32
product first). One line per shape to argv[1]."""
import math
import os
import sys


sys.path.insert(0, "benchmarks")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemmlab import broad_shapes, planner  # noqa: E402
from plans_vs_torch import profiled_probe, plan_tag as tag, shapes_from_env  # noqa: E402

HELD_OUT = [(96, 8192, 4096), (150, 14336, 4096), (180, 2048, 8192), (250, 3584, 3584), (384, 4096, 11008),
            (400, 3072, 3072), (100, 4096, 4096), (200, 5376, 4096), (320, 6144, 4096), (448, 2560, 10240)]
SHAPES = sorted({(c.M, c.N, c.K) for c in broad_shapes.broad_cases() if 64 < c.M <= 512}) + HELD_OUT
SHAPES = shapes_from_env(SHAPES)  # PROBE_SHAPES="M,N,K;..." in its place


def padded(p) -> int:
    """Rows of tokens the plan's tiles cover: plain tiles pad M to whole bm, swapped ones to whole bn."""
    return math.ceil(p.M / p.bn) * p.bn if p.swap_ab else math.ceil(p.M / p.bm) * p.bm


def variants(M, N, K, prof):
    planner.SWAP_MAX_M = planner.SWAP_PAD_MAX_M = 512
    planner._CACHE.clear()
    cands = planner.candidates(M, N, K, profile=prof, swap_ab=True)
    plain = next((p for p in cands if not p.swap_ab), None)
    swapped = [p for p in cands if p.swap_ab]
    out = {}

    def add(kind, p):
        if p is not None and p not in out.values():
            out[f"{kind} {tag(p)}"] = p

    add("plain", plain)
    add("swap-model", swapped[0] if swapped else None)
    for bm in (64, 128, 256):  # the model's best that pads the tokens by at most 8%, over at most 4 columns
        add(f"swap-pad{bm}", next((p for p in swapped if p.schedule == "data_parallel" and p.bm == bm
                                   and padded(p) <= 1.08 * M and p.tiles_n <= 4), None))
    return out


if __name__ == "__main__":
    profiled_probe("swap-multi-probe", SHAPES, variants)
