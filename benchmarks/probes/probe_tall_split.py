"""Probe: tall swapped tiles with their k split, for the small-M weight streams (issue 14's shapes under 0.95x:
64x4096x3584, 77x5120x5120, 64x3072x3072, 1x5120x5120). The planner offers the NARROW_TALL swapped tiles
(128 / 256 weight rows x 16..48 tokens) data-parallel only, and only where their waves fill the SMs; a
weight of 3-5k rows gives 128-row tiles 24-40 tiles, far from filling 132 SMs, so those shapes run 64-row
tiles (one consumer, 45-53 B/clk an SM from L2) or plain 64 / 128-row tiles with the tokens on the tall side.
Split along K, a tall swapped tile fills the SMs while each CTA still streams 128-256 weight rows and re-reads
the tokens rarely, and its partial is small (128 x 16 fp32: 8 KB) where the plain 128-row split-K tile
reduces 128 x 64-80 (32-40 KB) over the SM-to-SM network.

Per shape: the model's pick, and for each tall height (128, 256) and token width (the tokens, or half of
them, rounded up to 16, at least 16) the swapped plans of every schedule (data-parallel, cluster split-K at
each split, stream-K, global split-K) whose grid is at most the SMs and (but data-parallel) at least 0.6 of
them, against torch.mm and the routed call (graph replay, interleaved; every result checked against an fp32
product first). One line per shape to argv[1].

    PYTHONPATH=src:benchmarks python3 benchmarks/probes/probe_tall_split.py OUT.jsonl
    PROBE_SHAPES="64,4096,3584;1,5120,5120" ... (instead of the default list)"""
import math
import os
import sys


sys.path.insert(0, "benchmarks")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemmlab import planner  # noqa: E402
from plans_vs_torch import profiled_probe, plan_tag as tag, shapes_from_env  # noqa: E402

SHAPES = [(64, 4096, 3584), (77, 5120, 5120), (64, 3072, 3072), (64, 5120, 5120), (1, 5120, 5120),
          (32, 896, 896), (32, 1024, 1024), (4, 5120, 4096), (2, 8192, 6144), (8, 28672, 4096),
          (4, 27648, 5120), (16, 16384, 3072), (32, 4096, 4096), (16, 4096, 14336), (1, 7680, 5120),
          (32, 8192, 8192), (256, 1536, 7168), (200, 1024, 2048), (256, 5120, 16384), (200, 4608, 36864),
          (128, 5120, 5120)]
SHAPES = shapes_from_env(SHAPES)  # PROBE_SHAPES="M,N,K;..." in its place


def tall_split_plans(M: int, N: int, K: int, prof) -> list:
    """The swapped plans of the tall tiles over one or two columns of tokens, every schedule, grid <= the SMs."""
    widths = {max(16, math.ceil(M / 16) * 16), max(16, math.ceil(M / 32) * 16)}  # one or two token columns
    out = []
    for bm, bn in ((bm, bn) for bm in (128, 256) for bn in sorted(widths)):
        if (bm, bn) not in planner.TILES:
            continue
        plans = planner._tile_plans(True, N, M, K, bm, bn, "bf16", "bf16", None, False, None, False, False, False,
                                    False, False, 2, prof, planner.SCHEDULES)
        out += [p for p in plans if p.schedule != "pingpong" and p.grid <= prof.sm_count]
    return out


def variants(M, N, K, prof):
    pick = planner.plan(M, N, K, profile=prof)
    out = {"pick " + tag(pick): pick}
    for p in sorted(tall_split_plans(M, N, K, prof), key=planner.plan_key):
        name = tag(p)
        if name not in out and (p.schedule == "data_parallel" or p.grid >= 0.6 * prof.sm_count) and len(out) < 12:
            out[name] = p
    return out


if __name__ == "__main__":
    profiled_probe("tall-split-probe", SHAPES, variants,
                   note=lambda M, N, K: f" ({N * K * 2 / 1e6:.0f} MB of weight)")
