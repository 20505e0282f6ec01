"""Probe: taller swapped tiles for the decode weight streams. Until c996141 the planner's swapped plans at
M <= 64 tokens used 64 weight rows a tile (one consumer); cuBLAS runs 128 x 8, 128 x 32 and 192 x 32 tiles
there (Nsight Compute, probe_ncu.py): fewer tiles, fewer waves and fewer re-reads of the tokens. The first
run (swap_tall_probe.jsonl) widened the tile space in its own process; the planner now has those tiles
(NARROW_TALL, where they fill the SMs). Per shape: the model's best plain plan and its best swapped plan of
each height and schedule (data-parallel, stream-K), against torch.mm and the routed call (graph replay,
interleaved; every result checked against an fp32 product first). One line per shape to argv[1]."""
import os
import sys


sys.path.insert(0, "benchmarks")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemmlab import planner  # noqa: E402
from plans_vs_torch import profiled_probe, plan_tag as tag, shapes_from_env  # noqa: E402

SHAPES = [(1, 14336, 4096), (16, 14336, 4096), (32, 14336, 4096), (8, 28672, 4096), (32, 28672, 4096),
          (32, 43008, 5376), (16, 4096, 14336), (32, 8192, 8192), (1, 16384, 16384), (16, 16384, 16384),
          (1, 5120, 5120), (4, 5120, 4096), (2, 18432, 2304), (32, 1024, 1024), (16, 1152, 1024),
          (64, 14336, 4096)]
SHAPES = shapes_from_env(SHAPES)  # PROBE_SHAPES="M,N,K;..." in its place


def variants(M, N, K, prof):
    every = planner.candidates(M, N, K, profile=prof, swap_ab=True)
    cands = [p for p in every if p.swap_ab]
    plain = next((p for p in every if not p.swap_ab), None)
    out = {tag(plain): plain} if plain is not None else {}  # the model's best plain plan, for the router's choice
    for bm in (64, 128, 256):
        for sched in ("data_parallel", "stream_k"):
            best = next((p for p in cands if p.bm == bm and p.schedule == sched), None)
            if best is not None:
                out[tag(best)] = best
    return out


if __name__ == "__main__":
    profiled_probe("swap-tall-probe", SHAPES, variants)
