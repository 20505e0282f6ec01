"""Probe: B multicast (Plan.mcast = 2) against the same tile without it, the model's pick (no multicast) and
torch.mm, graph replay, interleaved. Records one line per shape under argv[1]."""
import os, sys, time
import torch
sys.path.insert(0, "benchmarks")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_broad import precompile  # noqa: E402
from gemmlab import engine2, planner  # noqa: E402
from plans_vs_torch import report, time_plans, shapes_from_env  # noqa: E402
from gemmlab.gpu import gpu_info  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False
SHAPES = [(3000, 3000, 3000), (2050, 3000, 1000), (3000, 5000, 1000), (1000, 1000, 1000), (1536, 1024, 4096),
          (256, 5120, 5120), (200, 4096, 4096), (1024, 768, 3072), (300, 5120, 27648), (512, 3072, 3072),
          (640, 2048, 2048), (3072, 1024, 4096), (2040, 5120, 5120), (1000, 1152, 6912), (5000, 896, 4864),
          (4096, 4096, 4096), (8192, 8192, 8192), (2040, 3584, 3584), (6000, 6000, 6000), (1024, 1024, 1024)]
SHAPES = shapes_from_env(SHAPES)  # PROBE_SHAPES="M,N,K;..." in its place


prof = None


def plans_for(M, N, K):
    cands = planner.candidates(M, N, K, profile=prof, mcast=True)
    pick = planner.plan(M, N, K, profile=prof)
    out = {"pick": pick}
    mc = [c for c in cands if c.mcast > 1]
    seen = set()
    for c in mc:
        if len(seen) == 3:
            break
        if (c.bm, c.bn) in seen:
            continue
        seen.add((c.bm, c.bn))
        out[f"mc {c.bm}x{c.bn}/{c.stages}"] = c
        dp = [d for d in cands if d.mcast == 1 and d.schedule == "data_parallel" and (d.bm, d.bn) == (c.bm, c.bn)]
        if dp:
            out[f"dp {c.bm}x{c.bn}/{dp[0].stages}"] = dp[0]
    if pick.schedule == "data_parallel" and pick.swap_ab is False:
        m = [c for c in mc if (c.bm, c.bn) == (pick.bm, pick.bn)]
        if m:
            out[f"mc pick {pick.bm}x{pick.bn}"] = m[0]
    return out




def main():
    info = gpu_info()
    global prof
    prof = engine2._profile(torch.device("cuda"))
    all_plans = {s: plans_for(*s) for s in SHAPES}
    precompile([p for d in all_plans.values() for p in d.values()], 16)
    out = open(sys.argv[1], "a")
    t0 = time.perf_counter()
    for (M, N, K), plans in all_plans.items():
        if time.perf_counter() - t0 > float(os.environ.get("BUDGET_S", 240)):
            break
        r = time_plans(M, N, K, plans)
        report(out, "mcast-probe", M, N, K, plans, r, info.name)


if __name__ == "__main__":
    main()
