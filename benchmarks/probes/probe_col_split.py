"""Probe: 64-row tiles with two consumers of half the columns each (Plan.col_split, GemmTraits::COL_SPLIT)
against the same tile with one consumer. The planner prices a lone consumer's k-step at
``one_consumer_efficiency`` (0.68) of the MMA rate, and 64-row plain tiles are many of the broad set's
losers (1024x768x3072 64 x 96 0.837x torch.mm, where cuBLAS runs the same tile with three warpgroups).
Shapes: the broad set's whose model plan is a 64-row data-parallel plain tile, and held-out ones. Per shape
the model's plan, and for its width and the widths around it that split into whole 16-column halves (a
multiple of 32), the one-consumer plan and its column-split twin (graph replay, interleaved with torch.mm;
every result checked against an fp32 product first). One line per shape to argv[1]."""
import dataclasses
import os
import sys

import torch

sys.path.insert(0, "benchmarks")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemmlab import broad_shapes, engine2, planner  # noqa: E402
from plans_vs_torch import plan_tag, run_probe  # noqa: E402

HELD_OUT = [(1024, 768, 3072), (768, 2048, 2048), (400, 1536, 4096), (600, 3072, 1024), (1500, 1024, 2816),
            (256, 2560, 2560), (96, 6144, 2048), (2048, 512, 4096)]


def tag(p) -> str:
    return plan_tag(p) + (" split" if p.col_split else "")


def _sixty_four(M, N, K, prof):
    p = planner.plan(M, N, K, profile=prof)
    return p if p.bm == 64 and p.schedule == "data_parallel" and not p.swap_ab and p.mcast == 1 else None


def shapes(prof):
    broad = sorted({(c.M, c.N, c.K) for c in broad_shapes.broad_cases() if _sixty_four(c.M, c.N, c.K, prof)})
    return broad + [s for s in HELD_OUT if s not in broad]


def variants(M, N, K, prof):
    pick = planner.plan(M, N, K, profile=prof)
    out = {f"model {tag(pick)}": pick}
    cands = [c for c in planner.candidates(M, N, K, profile=prof)
             if c.bm == 64 and c.schedule == "data_parallel" and not c.swap_ab and c.mcast == 1]
    for bn in sorted({w for w in (pick.bn - 16, pick.bn, pick.bn + 16, pick.bn + 32) if 32 <= w <= 256 and w % 32 == 0}):
        one = next((c for c in cands if c.bn == bn), None)
        if one is None:
            continue
        two = dataclasses.replace(one, col_split=True, stages=planner.stages_for(64, bn, "data_parallel", one.dtype,
                                                                                  True))
        for p in (one, two):
            if p not in out.values():
                out[tag(p)] = p
    return out


def main():
    prof = engine2._profile(torch.device("cuda"))
    run_probe("col-split-probe", shapes(prof), lambda M, N, K: variants(M, N, K, prof), sys.argv[1])


if __name__ == "__main__":
    main()
