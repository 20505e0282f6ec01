"""Probe: does a clustered launch alone slow the engine kernel? Sessions 10-11 found the multicast plans'
CTAs 1-20% slower even with nothing crossing CTAs, but that build (probe_mc_parts.py's ``launch``) was still
the MCAST = 2 instantiation: its own tile order (pairs), rows padded to pairs. Here the *same compiled
kernel* (the model's plain data-parallel plan, MCAST = 1: no cluster instruction in it) runs through two
prepared launches that differ only in the launch attribute: ``plain`` and ``cluster2`` (clusters of two
CTAs, ``Launcher(cluster=2)``; ``cluster4`` where the grid allows). Same SASS, same tile order, same
grid: any difference is the clustered launch itself. Graph replay against torch.mm, interleaved; one JSON
line per shape to argv[1]. With ``--ncu ORDER``: one launch of each (plain / cluster2) per shape for
Nsight Compute instead, as probe_ncu.py:

    ncu --clock-control none --profile-from-start off --set full -o $OUT/r python3 probe_cluster_launch.py --ncu ORDER
"""
import functools
import json
import os
import sys

import torch

sys.path.insert(0, "benchmarks")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plans_vs_torch import bad_results, plan_tag, profile_launches  # noqa: E402
from gemmlab import engine, engine2, planner  # noqa: E402
from gemmlab.jit import launch  # noqa: E402
from gemmlab.timer import time_interleaved  # noqa: E402

# Mid shapes with 64- and 128-row tiles (the class multicast should help), a prefill square.
SHAPES = [(128, 4096, 4096), (1024, 768, 3072), (1000, 1152, 6912), (256, 5120, 5120), (200, 4096, 4096),
          (1536, 1024, 4096), (640, 2048, 2048), (4096, 4096, 4096)]
NCU_SHAPES = [(1024, 768, 3072), (128, 4096, 4096)]


def plain_plan(M: int, N: int, K: int) -> planner.Plan:
    """The model's best plain (not swapped) data-parallel plan without multicast, on an even grid."""
    prof = engine2._profile(torch.device("cuda"))
    for c in planner.candidates(M, N, K, profile=prof, swap_ab=False):
        if c.schedule == "data_parallel" and c.mcast == 1 and not c.swap_ab and c.grid % 2 == 0:
            return c
    raise LookupError(f"no plain data-parallel plan on an even grid at {M}x{N}x{K}")


def prepared(a, b, out, p: planner.Plan, cluster: int | None):
    """``engine.Engine2Launch`` for plan ``p``, its launcher built with ``cluster`` (the kernel unchanged)."""
    if cluster is None:
        return engine.Engine2Launch(a, b, out, bias=None, c=None, plan=p)
    real = engine.Launcher
    engine.Launcher = lambda *args, **kw: real(*args, **{**kw, "cluster": cluster})
    try:
        return engine.Engine2Launch(a, b, out, bias=None, c=None, plan=p)
    finally:
        engine.Launcher = real


def runs_for(M: int, N: int, K: int, sets):
    p = plain_plan(M, N, K)
    a, w, out = sets[0]
    variants = {"plain": None, "cluster2": 2}
    if p.grid % 4 == 0:
        variants["cluster4"] = 4
    calls = {}
    for name, cl in variants.items():
        L = prepared(a, w.t(), out, p, cl)
        calls[name] = functools.partial(
            lambda L, i: L.run(launch.raw_stream(0), sets[i][0], sets[i][1].t(), sets[i][2], None, None, 1.0, 0.0), L)
    return p, calls


def main():
    if sys.argv[1] == "--ncu":
        calls, plans = [], []
        for M, N, K in NCU_SHAPES:
            sets = [(torch.randn(M, K, device="cuda").bfloat16(), torch.randn(N, K, device="cuda").bfloat16(),
                     torch.empty(M, N, device="cuda", dtype=torch.bfloat16))]
            p, fns = runs_for(M, N, K, sets)
            plans.append(p)
            calls += [(f"{M}x{N}x{K} {name} {plan_tag(p)}", functools.partial(fn, 0)) for name, fn in fns.items()
                      if name != "cluster4"]
        profile_launches(calls, plans, sys.argv[2])
        return
    with open(sys.argv[1], "a") as f:
        for M, N, K in SHAPES:
            sets = [(torch.randn(M, K, device="cuda").bfloat16(), torch.randn(N, K, device="cuda").bfloat16(),
                     torch.empty(M, N, device="cuda", dtype=torch.bfloat16)) for _ in range(3)]
            p, fns = runs_for(M, N, K, sets)
            bad = dict(bad_results(fns, sets[0][2], sets[0][0].float() @ sets[0][1].float().t()))
            cands = {"torch": lambda i: torch.mm(sets[i][0], sets[i][1].t(), out=sets[i][2]), **fns}
            res = time_interleaved(cands, 3, rounds=7, replay_ms=3.0)
            base = res.timings["torch"].median_ms
            ratios = {k: base / t.median_ms for k, t in res.timings.items() if k != "torch"}
            rec = {"suite": "cluster-launch-probe", "M": M, "N": N, "K": K, "plan": repr(p), "tag": plan_tag(p),
                   "grid": p.grid, "torch_ms": base, "ratios": ratios, "bad": bad, "pdl": launch.PDL,
                   "sm_clock_mhz": res.clocks.sm_mhz,
                   "clocks_by_name": {k: v.sm_mhz for k, v in res.clocks_by_name.items()},
                   "git_sha": os.environ.get("GEMMLAB_GIT_SHA")}
            print(f"{M}x{N}x{K} {plan_tag(p)} grid {p.grid}: " +
                  "  ".join(f"{k} {v:.3f}" for k, v in ratios.items()) + (f"  BAD {bad}" if bad else ""), flush=True)
            f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
