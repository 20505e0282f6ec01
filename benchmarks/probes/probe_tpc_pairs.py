"""Probe: do the two SMs of a TPC fetch faster when they read the same panel at the same time?

Session 38 (`h100_smid_map.jsonl`): a plain launch puts CTAs 2i and 2i + 1 on the two SMs of one TPC, and
in the engine's Hilbert order those are neighbouring tiles that share a panel of A or B; a clustered launch
(even a cluster of one) puts consecutive CTAs one per TPC, and the same 64 x 64 tiles ran 25% slower
(512x1024x8192: 22.0 -> 27.1 us a CTA). Two ways to test that lead, each the same kernel with one thing
changed, timed interleaved with torch.mm (graph replay, the project's timer):

  dp    one-wave data-parallel plans, the tile order table only: `hilbert` (as shipped), `apart` (CTAs 2i
        and 2i + 1 take Hilbert tiles i and i + T/2: the same tiles in flight, partners that share nothing);
        PROBE_ORDERS adds schedule.ORDERS' others (column_major: a column's tiles, which share B, side by side)
  gsk   global split-K plans, whose CTAs 2i and 2i + 1 are two k-ranges of one tile (nothing shared):
        `gsk` as shipped, `paired` (GSK_PAIRED=1: CTAs 2i and 2i + 1 run the same k-range of two
        neighbouring tiles); beside them the cluster split-K plan of the same tile (`cluster`). The two
        global forms add the same partials in the same order: their outputs must be bitwise equal.

    PYTHONPATH=src:benchmarks python3 benchmarks/probes/probe_tpc_pairs.py OUT.jsonl [dp|gsk ...]
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemmlab import engine, planner, schedule  # noqa: E402
from gemmlab.gpu import gpu_info, sample_clocks  # noqa: E402
from gemmlab.timer import sets_for, time_interleaved  # noqa: E402
from probe_row_skip import Defines, checked_runs  # noqa: E402

# (M, N, K, bm, bn): one wave of data-parallel tiles (grid = tiles <= 132).
DP = [(512, 1024, 8192, 64, 64), (512, 1024, 4096, 64, 64), (1024, 768, 3072, 64, 96), (200, 4608, 36864, 64, 144),
      (2048, 1024, 4096, 128, 128), (640, 1024, 5120, 64, 80)]
# PROBE_DEEP=1: weight streams from HBM (deep K, a few rows of tiles), in place of DP.
DEEP = [(200, 4608, 36864, 64, 144), (256, 5120, 16384, 64, 160), (300, 5120, 27648, 64, 208),
        (128, 8192, 28672, 64, 128), (640, 1024, 5120, 64, 80), (250, 4096, 16384, 64, 128)]
ORDERS = os.environ.get("PROBE_ORDERS", "hilbert,apart").split(",")
# (M, N, K, bm, bn, splits): global split-K tiles with a cluster split-K twin.
GSK = [(64, 4096, 3584, 64, 64, 2), (77, 5120, 5120, 128, 80, 2), (64, 5120, 5120, 64, 80, 2),
       (200, 1024, 2048, 64, 64, 2), (128, 4096, 4096, 64, 128, 2), (256, 1536, 7168, 128, 112, 4),
       (512, 1024, 8192, 128, 128, 4), (200, 4608, 36864, 128, 144, 2), (32, 4096, 4096, 64, 64, 2)]


def apart(order: list) -> list:
    """CTAs 2i and 2i + 1 take tiles i and i + ceil(T / 2) of ``order`` (an odd last tile stays last)."""
    h = (len(order) + 1) // 2
    out = []
    for i in range(h):
        out.append(order[i])
        if i + h < len(order):
            out.append(order[i + h])
    return out


def plan_of(M, N, K, bm, bn, schedule_, splits=1):
    cands = planner.candidates(M, N, K, schedules=(schedule_,))
    return min((c for c in cands if (c.bm, c.bn) == (bm, bn) and not c.swap_ab and c.mcast == 1
                and (splits == 1 or c.splits == splits)), key=lambda c: c.predicted_s)


def operands(M, N, K, names):
    n = sets_for(2 * (M * K + N * K + M * N), torch.cuda.get_device_properties(0).L2_cache_size)
    xs = [torch.randn(M, K, device="cuda").bfloat16() for _ in range(n)]
    ws = [torch.randn(N, K, device="cuda").bfloat16() for _ in range(n)]
    outs = {v: [torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(n)]
            for v in names}
    return n, xs, ws, outs


def timed(out, mode, M, N, K, plans, launches, n, xs, ws, outs, extra):
    runs, errs = checked_runs(launches, xs, ws, outs)
    res = time_interleaved({"torch": lambda i: torch.mm(xs[i], ws[i].t()), **runs}, n)
    t = {k: v.median_ms for k, v in res.timings.items()}
    ratio = {v: t["torch"] / t[v] for v in launches}
    rec = {"suite": "tpc-pairs-probe", "mode": mode, "M": M, "N": N, "K": K, "ms": t, "ratio": ratio,
           "plans": {v: repr(p) for v, p in plans.items()}, "rel_error": errs, "sm_clock_mhz": sample_clocks().sm_mhz,
           "gpu": gpu_info().name, "git_sha": os.environ.get("GEMMLAB_GIT_SHA"), "baseline": "torch.mm", **extra}
    out.write(json.dumps(rec) + "\n")
    out.flush()
    print(f"{mode} {M}x{N}x{K}: torch {t['torch'] * 1e3:.2f} us; "
          + " ".join(f"{v} {t[v] * 1e3:.2f} us ({ratio[v]:.3f})" for v in launches) + f" {extra}", flush=True)


def dp(out):
    for M, N, K, bm, bn in DEEP if os.environ.get("PROBE_DEEP") == "1" else DP:
        p = plan_of(M, N, K, bm, bn, "data_parallel")
        assert p.grid == p.tiles_m * p.tiles_n <= 132, p
        names = tuple(ORDERS)
        n, xs, ws, outs = operands(M, N, K, names)
        launches = {}
        for v in names:
            L = engine.Engine2Launch(xs[0], ws[0].t(), outs[v][0], bias=None, c=None, plan=p)
            if v != "hilbert":
                order = (apart(schedule.tile_order("hilbert", p.tiles_m, p.tiles_n)) if v == "apart"
                         else schedule.tile_order(v, p.tiles_m, p.tiles_n))
                L.order = torch.from_numpy(schedule.order_table(order)).to(xs[0].device)
                L.launcher.set_ptr(5, L.order.data_ptr())
            launches[v] = L
        timed(out, "dp", M, N, K, {v: p for v in names}, launches, n, xs, ws, outs, {"tiles": p.grid})


def gsk(out):
    for M, N, K, bm, bn, s in GSK:
        plans = {"cluster": plan_of(M, N, K, bm, bn, "split_k", s),
                 "gsk": plan_of(M, N, K, bm, bn, "split_k_global", s)}
        plans["paired"] = plans["gsk"]
        n, xs, ws, outs = operands(M, N, K, plans)
        launches = {}
        for v, p in plans.items():
            with Defines({"GSK_PAIRED": "1" if v == "paired" else "0"}):
                launches[v] = engine.Engine2Launch(xs[0], ws[0].t(), outs[v][0], bias=None, c=None, plan=p)
        timed(out, "gsk", M, N, K, plans, launches, n, xs, ws, outs, {"splits": s})
        same = torch.equal(outs["gsk"][0], outs["paired"][0])
        print(f"   gsk and paired outputs bitwise equal: {same}", flush=True)
        assert same


if __name__ == "__main__":
    with open(sys.argv[1], "a") as f:
        for m in sys.argv[2:] or ["dp", "gsk"]:
            {"dp": dp, "gsk": gsk}[m](f)
