"""Probe: is B multicast's loss on 64-row tiles the ring's round trip? With multicast a stage is refilled only
after both CTAs of the pair have released it (the peer's release is a remote arrive), so each slot's round
trip (release -> the producer's next load -> its bytes landing) is longer; a ring whose k-steps are short
(64-row tiles, L2-rate bound) covers less of that latency. Per shape: the model's best 64-row data-parallel
tile with and without multicast, at 9 stages and at the deepest ring that fits (planner.MAX_STAGES caps it at
9 today; the kernel takes more), graph replay against torch.mm, interleaved, through the prepared launch.
Prediction if so: the deeper ring narrows multicast's loss more than it speeds the plain tile."""
import dataclasses
import os
import sys

import torch

sys.path.insert(0, "benchmarks")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemmlab import engine2, planner  # noqa: E402
from plans_vs_torch import run_probe  # noqa: E402

SHAPES = [(128, 4096, 4096), (1024, 768, 3072), (640, 1024, 5120), (300, 1600, 6400), (200, 4096, 4096),
          (1000, 1152, 6912)]
DEEPEST = 16


def deepest(p: planner.Plan) -> int:
    return max(q for q in range(p.stages, DEEPEST + 1) if dataclasses.replace(p, stages=q).smem_bytes
               <= planner.SMEM_LIMIT)


def variants(M, N, K):
    prof = engine2._profile(torch.device("cuda"))
    cands = planner.candidates(M, N, K, profile=prof, mcast=True, swap_ab=False)
    dp = next(c for c in cands if c.bm == 64 and c.schedule == "data_parallel" and c.mcast == 1)
    mc = next((c for c in cands if (c.bm, c.bn, c.mcast) == (64, dp.bn, 2)), None)
    out = {}
    for name, p in (("dp", dp), ("mc", mc)):
        if p is None:
            continue
        for q in sorted({p.stages, deepest(p)}):
            out[f"{name} {p.bm}x{p.bn}/{q}"] = dataclasses.replace(p, stages=q)
    return out


def main():
    run_probe("mc-stages-probe", SHAPES, variants, sys.argv[1])


if __name__ == "__main__":
    main()
