"""Probe: what bounds a small tile's k-step when each SM runs one tile. At 512x1024x8192 (the prefill suite's
worst shape) the 64 x 64 data-parallel plan runs 0.160 us a 64-deep k-step where cuBLAS's 64 x 64 kernel
runs 0.107 (probe_split_fixed.py), and 128 x 128 tiles do four times the work in twice the time. One build
a process (PROBE_VARIANT), patching a copy of the kernel sources (probe_mc_parts.patched_root):
  asis   the kernel as it is;
  half   each consumer issues two of its four k16 wgmma steps a k-step (the loads unchanged);
  none   no wgmma at all: the ring's loads and releases alone, the memory side's rate;
  launch, launchnone: probe_mc_parts's `launch` build (clusters of two launched, each CTA loading all of its
         own B, nothing crossing CTAs), with and without the wgmmas; each tile's multicast plan joins the
         plain ones (tagged "cl"): where a clustered launch's cost lies, in the load stream or elsewhere.
  cl1, cl1none: each plain plan also launched as clusters of one CTA (the launch attribute set, shape 1),
         tagged "cl1", with and without wgmmas: whether a cluster launch as such costs the load stream, or
         only the pairs' placement.
  cl1spread: as cl1, the cl1 copies with each GPC's CTAs given tiles from eight places of the order
         (probe_mc_parts.spread_pairs over pairs of CTAs: a clustered grid fills the GPCs in turn, a plain one
         deals pairs of CTAs round the GPCs), plus the plain launch with that order ("spread").
  cl1static: every plan as asis but with a compile-time cluster shape of one CTA (__cluster_dims__(1, 1, 1),
         PTX .reqnctapercluster; launched with no cluster attribute): against cl1 (the attribute) and asis in
         other processes, whether the cluster of one's cost is the launch attribute's or the cluster launch's.
  cl1cs: as cl1, with each 64-row tile also in its column-split form (two consumers of half the columns,
         384 threads, "cs"): whether the cluster launch's cost follows the CTA's warpgroups.
The results of half and none are wrong by design (the probe reports them as bad). If half runs near none,
the k-step is bound by its loads, not by the wgmma chain; if half runs near twice asis's rate, the chain
of dependent wgmmas of one consumer is the bound and splitting K over two consumers would pay.

    PROBE_VARIANT=half PYTHONPATH=src:benchmarks python3 benchmarks/probes/probe_kstep_bound.py OUT.jsonl
    PROBE_SHAPES="512,1024,8192;..." PROBE_TILES="64,64;64,128;128,128" """
import os
import sys

sys.path.insert(0, "benchmarks")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import probe_mc_parts as parts  # noqa: E402
from gemmlab import planner  # noqa: E402
from plans_vs_torch import shapes_from_env  # noqa: E402

SHAPES = [(512, 1024, 4096), (512, 1024, 8192), (300, 1600, 6400), (1024, 768, 3072)]
SHAPES = shapes_from_env(SHAPES)  # PROBE_SHAPES="M,N,K;..." in its place
TILES = [(64, 64), (64, 128), (128, 64), (128, 128)]
if os.environ.get("PROBE_TILES"):
    TILES = [tuple(int(x) for x in s.split(",")) for s in os.environ["PROBE_TILES"].split(";")]
LOOP = "        wgmma_fence();\n#pragma unroll\n        for (int k = 0; k < 4; ++k) {"
PATCHES = {
    "asis": [],
    "half": [("common/mainloop.cuh", LOOP, LOOP.replace("k < 4", "k < 2"))],
    "none": [("common/mainloop.cuh", LOOP, LOOP.replace("k < 4", "k < 0"))],
}
PATCHES["launch"] = parts.PATCHES["launch"]
PATCHES["launchnone"] = parts.PATCHES["launch"] + PATCHES["none"]
PATCHES["cl1"] = []
PATCHES["cl1none"] = PATCHES["none"]
PATCHES["cl1spread"] = []
PATCHES["cl1cs"] = []
PATCHES["cl1static"] = parts.static_cluster("1")


def cluster_of_one(engine2, plans: dict, spread: bool = False) -> dict:
    """Each plan twice: as it is, and (a distinct equal-compiling copy, "cl1") launched with a cluster shape of
    one CTA (engine2.launch's launcher wrapped: the copies' launches pass cluster=1). spread: the cl1 copy's
    tiles in spread_pairs' order, and a third copy ("spread") launched plainly in that order."""
    import dataclasses
    ones, spreads, inner = set(), set(), engine2._launch
    plain_order, tables = engine2.plan_order, {}

    def order(p, device):
        t = plain_order(p, device)
        if id(p) not in spreads:
            return t
        if id(p) not in tables:  # built before the graph captures (bad_results runs each plan once first)
            tables[id(p)] = parts.spread_pairs(t, p.grid // 2, 2, 8)
        return tables[id(p)]
    engine2.plan_order = order

    def launch_fn(compiled, **kw):
        if launch_fn.one and kw.get("cluster") is None:
            kw["cluster"] = 1
        return inner(compiled, **kw)
    launch_fn.one = False
    engine2._launch = launch_fn
    plain_launch = engine2.launch

    def launch(p, *args, **kw):
        launch_fn.one = id(p) in ones
        try:
            return plain_launch(p, *args, **kw)
        finally:
            launch_fn.one = False
    engine2.launch = launch
    out = {}
    for name, p in plans.items():
        out[name] = p
        q = dataclasses.replace(p, tie_s=p.tie_s + 1e-12)
        ones.add(id(q))
        out[name + " cl1"] = q
        if spread:
            spreads.add(id(q))
            r = dataclasses.replace(p, tie_s=p.tie_s + 2e-12)
            spreads.add(id(r))
            out[name + " spread"] = r
    return out


def plan_label(p) -> str:
    return f"{p.bm}x{p.bn} {p.schedule}" + (f" x{p.splits}" if p.splits > 1 else "") + (" swap" if p.swap_ab else "")


def variants(M, N, K, prof, clustered=False, col_split=False):
    import dataclasses
    cands = planner.candidates(M, N, K, profile=prof, schedules=planner.SCHEDULES, mcast=clustered)
    out = {}
    for bm, bn in TILES:
        for mc in (1, 2) if clustered else (1,):
            p = next((c for c in cands if (c.bm, c.bn, c.schedule, c.swap_ab, c.mcast, c.col_split)
                      == (bm, bn, "data_parallel", False, mc, False)), None)
            if p is not None:
                out[f"{bm}x{bn} data_parallel/{p.stages}" + (" cl" if mc > 1 else "")] = p
                if col_split and mc == 1 and planner.col_split_problem(bm, bn, p.schedule, False, False) is None:
                    q = dataclasses.replace(p, col_split=True,
                                            stages=planner.stages_for(bm, bn, p.schedule, p.dtype, True))
                    out[f"{bm}x{bn} data_parallel/{q.stages} cs"] = q
    return out


def main():
    variant = os.environ.get("PROBE_VARIANT", "asis")
    root, engine2, prof = parts.patched_engine(variant, PATCHES)
    plans = {s: variants(*s, prof, clustered=variant.startswith("launch"), col_split=variant == "cl1cs")
             for s in SHAPES}
    if variant.startswith("cl1"):
        plans = {s: cluster_of_one(engine2, vs, spread=variant == "cl1spread") for s, vs in plans.items()}
    parts.precompile([p for d in plans.values() for p in d.values()], root)
    parts.time_all(plans, f"kstep-bound-{variant}", sys.argv[1])


if __name__ == "__main__":
    main()
