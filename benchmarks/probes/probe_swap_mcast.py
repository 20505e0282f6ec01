"""Probe: swapped data-parallel tiles with the tokens multicast in clusters of two, cuBLAS's form at the small-M
weight streams. torch.profiler names what torch.mm runs there (cublas_names.py, session 26): 64 weight rows a
tile over a narrow token width, one k-range a CTA (no split-K), in clusters of 4 x 1 .. 2 x 4 that multicast
an operand: `nvjet_sm90_tst_64x64_64x13_4x1` at 64x5120x5120 (80 CTAs), `64x80_64x11_4x1` at 77x5120x5120,
`64x8_64x16_4x1` at 1x5120x5120, `64x32_64x16_1x2` at 64x4096x3584. Our picks there are cluster split-K
plans (0.91-0.95x torch.mm) and the swapped tiles run without multicast (mcast_problem: "swapped plans do not
multicast"). The engine kernel's B multicast shares the kernel's B tile between vertically adjacent tiles;
swapped, B is the tokens, so a pair of CTAs on adjacent weight rows loads the tokens once from the L2.

Per shape: the model's pick, and for the swapped 64- and 128-row tiles over the tokens in one or two columns,
data-parallel, with and without multicast, against torch.mm and the routed call (graph replay, interleaved;
every result checked against an fp32 product first). One line per shape to argv[1].

    PYTHONPATH=src:benchmarks python3 benchmarks/probes/probe_swap_mcast.py OUT.jsonl"""
import dataclasses
import math
import os
import sys


sys.path.insert(0, "benchmarks")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemmlab import planner  # noqa: E402
from plans_vs_torch import profiled_probe, plan_tag, shapes_from_env  # noqa: E402

SHAPES = [(64, 4096, 3584), (77, 5120, 5120), (64, 3072, 3072), (64, 5120, 5120), (1, 5120, 5120),
          (32, 896, 896), (32, 1024, 1024), (4, 5120, 4096), (16, 4096, 4096), (32, 4096, 4096),
          (8, 14336, 4096), (32, 14336, 4096), (256, 1536, 7168), (200, 1024, 2048), (128, 5120, 5120)]
SHAPES = shapes_from_env(SHAPES)  # PROBE_SHAPES="M,N,K;..." in its place


def tag(p) -> str:
    return plan_tag(p) + (f" mc{p.mcast}" if p.mcast > 1 else "")


def with_mcast(p, prof):
    """The swapped data-parallel plan ``p`` with its B (the tokens) multicast in pairs: the weight's rows of
    tiles padded to whole pairs, the grid as many CTAs as pairs of SMs the GPU holds."""
    tiles = math.ceil(math.ceil(p.kernel_m / p.bm) / 2) * 2 * math.ceil(p.kernel_n / p.bn)
    return dataclasses.replace(p, mcast=2, grid=min(2 * prof.clusters(2), tiles))


def variants(M, N, K, prof):
    pick = planner.plan(M, N, K, profile=prof)
    out = {"pick " + tag(pick): pick}
    widths = sorted({max(16, math.ceil(M / 16) * 16), max(16, math.ceil(M / 32) * 16)})
    for bm in (64, 128):
        for bn in widths:
            if (bm, bn) not in planner.TILES:
                continue
            dp = planner._tile_plans(True, N, M, K, bm, bn, "bf16", "bf16", None, False, None, False, False, False,
                                     False, False, 2, prof, ("data_parallel",))
            if not dp or math.ceil(N / bm) < 2:
                continue
            out[tag(dp[0])] = dp[0]
            mc = with_mcast(dp[0], prof)
            out[tag(mc)] = mc
    return out


if __name__ == "__main__":
    profiled_probe("swap-mcast-probe", SHAPES, variants)
