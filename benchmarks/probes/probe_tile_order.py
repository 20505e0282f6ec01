"""Probe: how the tile order the persistent engine kernel reads (``schedule.device_order_table``) moves the
L2's work and the time of the mid-size 64-row tiles, with and without B multicast.

Session 19's Nsight Compute counters on 1024x768x3072 (64 x 96 tiles, 128 CTAs, one wave): every kernel
delivers the same 126 MB to the SMs (l1tex__m_xbar2l1tex_read_bytes), but the L2 served it with 1.27 M
sectors for our plain launch, 1.69 M for cuBLAS's 1 x 2 multicast kernel and 2.48 M for our multicast one
(lts__t_sectors_srcunit_tex): reads of the same lines at about the same time are served once, and how
often that happens depends on which tiles run side by side. This probe builds each plan once per order
(hilbert: the engine's; row_major, column_major, grouped) and

    python benchmarks/probes/probe_tile_order.py time OUT.jsonl   # graph replay against torch.mm
    ncu ... --metrics ... python benchmarks/probes/probe_tile_order.py ncu ORDER_FILE   # one launch each

Dense plans only (Engine2Launch directly, its order table replaced after it is built). 300b7cd had a
"computed" variant (no table: the kernel computed its tiles, so no global load preceded the first TMA) and
a `route` mode timing it on 40 of the broad set's one-wave plans: x1.0002 (tile_order_route.jsonl), reverted.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemmlab import engine, planner, schedule  # noqa: E402
from gemmlab.gpu import sample_clocks  # noqa: E402
from gemmlab.timer import sets_for, time_interleaved  # noqa: E402
from probe_row_skip import checked_runs  # noqa: E402

ORDERS = ("hilbert", "row_major", "column_major", "grouped")
# (M, N, K, bm, bn, multicast): the broad set's mid class, 64-row tiles in one wave, and a 128-row one.
CASES = [(1024, 768, 3072, 64, 96, False), (1024, 768, 3072, 64, 96, True), (640, 1024, 5120, 64, 80, False),
         (640, 1024, 5120, 64, 80, True), (128, 4096, 4096, 64, 64, False), (1536, 1024, 4096, 128, 96, False)]


def plan_for(M, N, K, bm, bn, mc):
    return min((c for c in planner.candidates(M, N, K, mcast=mc) if (c.bm, c.bn) == (bm, bn) and not c.swap_ab
                and c.schedule == "data_parallel" and (c.mcast > 1) == mc), key=lambda c: c.predicted_s)


def launch_with_order(order, a, w, out, p):
    """Engine2Launch for plan p reading its tiles from the table of ``order``."""
    L = engine.Engine2Launch(a, w.t(), out, bias=None, c=None, plan=p)
    L.order = schedule.device_order_table(order, p.tiles_m, p.tiles_n, 8, a.device, pair_m=p.mcast)
    L.launcher.set_ptr(5, L.order.data_ptr())
    return L


def build(M, N, K, bm, bn, mc, n_sets):
    p = plan_for(M, N, K, bm, bn, mc)
    xs = [torch.randn(M, K, device="cuda").bfloat16() for _ in range(n_sets)]
    ws = [torch.randn(N, K, device="cuda").bfloat16() for _ in range(n_sets)]
    outs = {o: [torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(n_sets)]
            for o in ORDERS}
    launches = {o: launch_with_order(o, xs[0], ws[0], outs[o][0], p) for o in ORDERS}
    runs, errs = checked_runs(launches, xs, ws, outs)
    return p, xs, ws, runs, errs


def time_all(path):
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    with open(path, "a") as out:
        for M, N, K, bm, bn, mc in CASES:
            n = sets_for(2 * (M * K + N * K + M * N), l2)
            p, xs, ws, runs, errs = build(M, N, K, bm, bn, mc, n)
            res = time_interleaved({"torch": lambda i: torch.mm(xs[i], ws[i].t()), **runs}, n)
            t = {k: v.median_ms for k, v in res.timings.items()}
            line = " ".join(f"{o} {t['torch'] / t[o]:.3f}" for o in ORDERS)
            print(f"{M}x{N}x{K} {bm}x{bn}{' mc' if mc else ''}: torch {t['torch'] * 1e3:.2f} us; ratio {line}",
                  flush=True)
            out.write(json.dumps({"suite": "tile-order-probe", "M": M, "N": N, "K": K, "bm": bm, "bn": bn,
                                  "mcast": mc, "plan": repr(p), "ms": t, "ratio": {o: t["torch"] / t[o] for o in ORDERS},
                                  "rel_error": errs, "sm_clock_mhz": sample_clocks().sm_mhz,
                                  "git_sha": os.environ.get("GEMMLAB_GIT_SHA"), "baseline": "torch.mm"}) + "\n")


def profile(order_file):
    from plans_vs_torch import profile_launches

    calls = []
    for M, N, K, bm, bn, mc in CASES[:2]:
        p, xs, ws, runs, _ = build(M, N, K, bm, bn, mc, 1)
        if not mc:
            calls.append((f"{M}x{N}x{K} torch", lambda xs=xs, ws=ws: torch.mm(xs[0], ws[0].t())))
        calls += [(f"{M}x{N}x{K} {bm}x{bn}{' mc' if mc else ''} {o}", lambda f=f: f(0)) for o, f in runs.items()]
    profile_launches(calls, [], order_file)


if __name__ == "__main__":
    {"time": time_all, "ncu": profile}[sys.argv[1]](sys.argv[2])
