"""Probe: swapped plans with more than one column of token tiles at M = 100..256 (the planner offers one
column only past SWAP_MAX_M). Session 11's probe timed some at 0.46-0.70x torch.mm where a one-column plan of
nearly the same width ran 0.86-1.02x (200x4096x4096: 64 x 112 1.023, 64 x 128 0.704; 200x5376x4096: 128 x 80
1.087, 128 x 96 0.698; 100x4096x4096 64 x 96 0.455), and cuBLAS runs such tiles there (64 x 104 over two
token columns at 200x4096x4096, Nsight Compute). Per shape, each swapped data-parallel tile named below
in the Hilbert order the engine uses and, for some, in row-major / column-major order (to see whether the
order of tiles on the SMs is what costs), against torch.mm and the routed call (graph replay, interleaved;
every result checked against an fp32 product first).

    python3 probe_swap_cols.py OUT.jsonl           # time them
    python3 probe_swap_cols.py --ncu ORDER.txt     # launch each once inside cudaProfilerStart / Stop
"""
import os
import sys

import torch

sys.path.insert(0, "benchmarks")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemmlab import engine2, planner, schedule  # noqa: E402
from plans_vs_torch import plan_tag as tag, profile_launches, run_probe  # noqa: E402

# (M, N, K): the swapped (bm, bn) tiles to run ("p" before one: the plain tile); "r" / "c" after a tile: also
# in row- / column-major order.
SHAPES = {
    (100, 4096, 4096): ["64x64", "64x80", "64x96", "64x112", "128x112"],
    (200, 4096, 4096): ["64x64", "64x80", "64x96", "64x112rc", "64x128rc", "64x208"],
    (128, 4096, 4096): ["64x128", "64x64"],
    (256, 4096, 4096): ["64x128", "64x256"],
    (200, 5376, 4096): ["128x80", "128x96rc", "128x112", "128x128", "64x112"],
    (256, 5120, 5120): ["64x128", "128x96", "128x128", "128x256"],
    (1000, 1152, 6912): ["p128x80", "p128x96", "p128x128"],  # plain tiles over a ragged last column
}
# Orders other than Hilbert travel in predicted_s (a launch never reads it): the probe's own lookup below.
_ORDER_TAG = {-1.0: "row_major", -2.0: "column_major"}


def _plan_order(p, device):
    name = _ORDER_TAG.get(p.predicted_s, "hilbert")
    return schedule.device_order_table(name, p.tiles_m, p.tiles_n, 8, device, pair_m=p.mcast)


def variants(M, N, K, prof):
    import dataclasses

    planner.SWAP_MAX_M = 512
    planner.SWAP_PAD_MAX_M = 512
    planner._CACHE.clear()
    cands = [p for p in planner.candidates(M, N, K, profile=prof, swap_ab=True) if p.schedule == "data_parallel"]
    out = {}
    for spec in SHAPES[(M, N, K)]:
        size = spec.rstrip("rc")
        swap = not size.startswith("p")
        bm, bn = (int(x) for x in size.lstrip("p").split("x"))
        p = next((c for c in cands if (c.bm, c.bn, c.swap_ab, c.mcast) == (bm, bn, swap, 1)), None)
        if p is None:
            print(f"{M}x{N}x{K}: no data-parallel {size} plan", flush=True)
            continue
        out[tag(p)] = p
        for flag, mark in (("r", -1.0), ("c", -2.0)):
            if flag in spec[len(size):]:
                out[f"{tag(p)} {_ORDER_TAG[mark]}"] = dataclasses.replace(p, predicted_s=mark)
    return out


def main():
    engine2.plan_order = _plan_order
    prof = engine2._profile(torch.device("cuda"))
    if sys.argv[1] != "--ncu":
        run_probe("swap-cols-probe", list(SHAPES), lambda M, N, K: variants(M, N, K, prof), sys.argv[1])
        return
    calls, plans = [], []
    for M, N, K in SHAPES:
        a = torch.randn(M, K, device="cuda").bfloat16()
        w = torch.randn(N, K, device="cuda").bfloat16()
        out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        calls.append((f"{M}x{N}x{K} torch", lambda a=a, w=w, out=out: torch.mm(a, w.t(), out=out)))
        for name, p in variants(M, N, K, prof).items():
            plans.append(p)
            calls.append((f"{M}x{N}x{K} {name}", lambda a=a, w=w, out=out, p=p: engine2.launch(p, a, w.t(), out)))
    profile_launches(calls, plans, sys.argv[2])


if __name__ == "__main__":
    main()
