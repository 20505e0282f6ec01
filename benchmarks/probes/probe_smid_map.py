"""Probe: where each CTA of the engine kernel runs, and how long, by how it is launched. probe_kstep_bound.py
found the 64 x 64 plan at 512x1024x8192 25-30% slower launched as clusters of one CTA (the attribute set,
nothing shared) than launched plainly, loads alone too, and its two-consumer column split (384 threads) as
slow plainly launched as clustered. A per-CTA timeline (kernels/common/timeline.cuh: %globaltimer, clock64,
%smid at the entry and the exit) of each plan, plain and cluster-of-one: the CTAs' median time and which SM
each ran on, and how often CTAs 2k and 2k + 1 (tiles next to each other in the order) share a TPC (SMs 2t and
2t + 1). Eager launches, 30 after 10 warm-ups. Then each plan's time a launch when launched back to back:
eagerly (100 launches between two events, no synchronization) and replayed from a CUDA graph of 20
launches (10 replays): a cost of the launch itself shows there and not in the CTAs' own times. One line per
(plan, launch) to argv[1].

    PYTHONPATH=src:benchmarks python3 benchmarks/probes/probe_smid_map.py OUT.jsonl
    PROBE_SHAPES="512,1024,8192;..." PROBE_TILES="64,64;..." PROBE_MCAST=1 (the multicast plans too)
    PROBE_BETWEEN=1 (a one-element fill between the graph's launches)
    PROBE_PICKS=1 (the model's pick and its data-parallel alternative instead of the tiles)
    PROBE_STATIC=1 (every plan compiled with a cluster shape of one, __cluster_dims__(1, 1, 1), launched with
                    no cluster attribute; no cl1 copies): the compiled cluster of one against the attribute's
Each plan is also timed back to back through engine.gemm's prepared launch (programmatic dependent launch).
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, "benchmarks")
import probe_kstep_bound as kb  # noqa: E402
import probe_mc_parts as parts  # noqa: E402
from gemmlab.jit import compiler  # noqa: E402
from plans_vs_torch import shapes_from_env  # noqa: E402

SHAPES = [(512, 1024, 8192), (1024, 768, 3072)]
SHAPES = shapes_from_env(SHAPES)  # PROBE_SHAPES="M,N,K;..." in its place
EV = 8


def back_to_back_us(launch, n: int = 100) -> tuple[float, float]:
    """(eager, graph) microseconds a launch of ``launch()`` back to back, medians of 5 samples each (with
    PROBE_BETWEEN=1 the graph puts a one-element fill between the launches, timed alone and taken off)."""
    for _ in range(10):
        launch()
    torch.cuda.synchronize()
    eager = []
    for _ in range(5):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(n):
            launch()
        e.record()
        torch.cuda.synchronize()
        eager.append(s.elapsed_time(e) * 1e3 / n)
    tiny = torch.zeros(1, device="cuda")

    def graph_us(fn):
        g, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            with torch.cuda.graph(g, stream=side):
                for _ in range(20):
                    fn()
        torch.cuda.current_stream().wait_stream(side)
        g.replay()
        torch.cuda.synchronize()
        out = []
        for _ in range(5):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(10):
                g.replay()
            e.record()
            torch.cuda.synchronize()
            out.append(s.elapsed_time(e) * 1e3 / 200)
        return sorted(out)[2]
    graph = graph_us(launch)
    if os.environ.get("PROBE_BETWEEN") == "1":

        def both():
            launch()
            tiny.fill_(1.0)
        graph = graph_us(both) - graph_us(lambda: tiny.fill_(1.0))
    return sorted(eager)[2], graph


def main():
    buf = torch.zeros(132 * EV * 3, dtype=torch.int64, device="cuda")
    parts.PATCHES["smid"] = parts.timeline_common_patches(buf.data_ptr(), EV)
    static = os.environ.get("PROBE_STATIC") == "1"
    if static:
        parts.PATCHES["smid"] += parts.static_cluster("1")
    compiler.KERNEL_ROOT = root = parts.patched_root("smid")
    from gemmlab import engine2
    from gemmlab.gpu import gpu_info
    prof = engine2._profile(torch.device("cuda"))
    clustered = os.environ.get("PROBE_MCAST") == "1"  # the multicast plans (clusters of two) beside them
    if os.environ.get("PROBE_PICKS") == "1":  # the model's pick and its best data-parallel plan, no cl1 copies
        from gemmlab import planner
        plans = {}
        for s in SHAPES:
            cands = planner.candidates(*s, profile=prof)
            dp = next(c for c in cands if c.schedule == "data_parallel" and c.mcast == 1 and not c.swap_ab)
            plans[s] = {"pick " + kb.plan_label(cands[0]): cands[0], "dp " + kb.plan_label(dp): dp}
    elif static:  # each plan once: it is a compiled cluster of one already
        plans = {s: kb.variants(*s, prof, clustered=clustered) for s in SHAPES}
    else:
        plans = {s: kb.cluster_of_one(engine2, kb.variants(*s, prof, clustered=clustered, col_split=not clustered))
                 for s in SHAPES}
    parts.precompile([p for d in plans.values() for p in d.values()], root)
    with open(sys.argv[1], "a") as out:
        for (M, N, K), vs in plans.items():
            for name, p in vs.items():
                runs, err = parts.traced_plan(engine2, p, M, N, K, buf, EV)
                cta_us = parts.median([((r[:, 1, 0] - r[:, 0, 0]) / 1e3).median().item() for r in runs])
                span = parts.median([((r[:, 1, 0].max() - r[:, 0, 0].min()) / 1e3).item() for r in runs])
                sm = runs[0][:, 0, 2].long()
                pairs = sm[: len(sm) // 2 * 2].view(-1, 2) // 2
                same_tpc = (pairs[:, 0] == pairs[:, 1]).double().mean().item()
                moved = sum(int(not torch.equal(r[:, 0, 2].long(), sm)) for r in runs)
                a = torch.randn(M, K, device="cuda").bfloat16()
                w = torch.randn(N, K, device="cuda").bfloat16()
                o = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
                eager_us, graph_us = back_to_back_us(lambda: engine2.launch(p, a, w.t(), o))
                from gemmlab import engine  # the prepared launch gemmlab.matmul runs (programmatic dependent launch)
                _, prepared_us = back_to_back_us(lambda: engine.gemm(a, w.t(), o, plan=p), n=10)
                rec = {"suite": "smid-map", "M": M, "N": N, "K": K, "plan": name, "grid": p.grid, "cta_us": cta_us,
                       "back_to_back_eager_us": eager_us, "back_to_back_graph_us": graph_us,
                       "back_to_back_graph_prepared_us": prepared_us,
                       "between": os.environ.get("PROBE_BETWEEN") == "1",
                       "span_us": span, "same_tpc_pairs": same_tpc, "runs_with_other_smids": moved,
                       "smid": sm.tolist(), "rel_error": err, "gpu": gpu_info().name,
                       "git_sha": os.environ.get("GEMMLAB_GIT_SHA")}
                out.write(json.dumps(rec) + "\n")
                print(f"{M}x{N}x{K} {name:30s} grid {p.grid:3d}: CTA {cta_us:6.2f} us, span {span:6.2f}; pairs on "
                      f"one TPC {same_tpc:.2f}; smid moved {moved}/{len(runs)}; first SMs "
                      f"{sm[:8].tolist()}; back to back {eager_us:.2f} us eager, {graph_us:.2f} graph, "
                      f"{prepared_us:.2f} "
                      f"prepared (err {err:.1e})",
                      flush=True)


if __name__ == "__main__":
    main()
