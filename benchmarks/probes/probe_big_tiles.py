"""Probe: tall tiles and clusters under the power cap. On the MoE experts' own shapes (and the prefill class
they belong to) cuBLAS runs 192-256-row tiles in clusters of two with multicast, 4 stages
(`cublas_names_moe_experts.txt`), where our planner picks 128-row tiles without clusters; these shapes run at
the power cap (1300-1450 MHz), where a plan's bytes out of the L2 per FLOP may decide its clock. Per shape:
the model's pick, and its best plan of each listed tile (data-parallel or ping-pong, with and without
B multicast where the kernel has it), against torch.mm, timed as the suites time (graph replay, interleaved,
20 ms replays so the clock settles under the cap), each plan's SM clock sampled while it runs. Results
checked against an fp32 product first. One line per shape to argv[1].

    PYTHONPATH=src:benchmarks python3 benchmarks/probes/probe_big_tiles.py OUT.jsonl
    PROBE_SHAPES="M,N,K;..."  PROBE_TILES="bm,bn,schedule,mcast;..."
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, "benchmarks")
from engine_broad import precompile  # noqa: E402
from gemmlab import engine, engine2, planner  # noqa: E402
from gemmlab.gpu import gpu_info  # noqa: E402
from gemmlab.timer import sets_for, time_interleaved  # noqa: E402
from plans_vs_torch import bad_results, plan_tag, shapes_from_env  # noqa: E402

SHAPES = [(1837, 32768, 6144), (2306, 32768, 6144), (1669, 21504, 6144), (1115, 28672, 4096), (4096, 14336, 4096)]
SHAPES = shapes_from_env(SHAPES)  # PROBE_SHAPES="M,N,K;..." in its place
TILES = [(128, 176, "pingpong", 1), (128, 256, "data_parallel", 1), (128, 256, "data_parallel", 2),
         (256, 128, "data_parallel", 1), (256, 128, "data_parallel", 2), (256, 160, "data_parallel", 1),
         (256, 160, "data_parallel", 2), (256, 192, "data_parallel", 1), (256, 192, "data_parallel", 2)]
if os.environ.get("PROBE_TILES"):
    TILES = [(int(a), int(b), c, int(d)) for a, b, c, d in (s.split(",") for s in os.environ["PROBE_TILES"].split(";"))]


def plans_for(M, N, K, prof) -> dict:
    cands = planner.candidates(M, N, K, profile=prof, schedules=planner.SCHEDULES, mcast=True, swap_ab=False)
    out = {"pick": planner.plan(M, N, K, profile=prof)}
    for bm, bn, sched, mc in TILES:
        p = next((c for c in cands if (c.bm, c.bn, c.schedule, c.mcast) == (bm, bn, sched, mc)), None)
        if p is not None:
            out[f"{plan_tag(p)}{' mc2' if mc > 1 else ''}"] = p
    return out


def main():
    prof = engine2._profile(torch.device("cuda"))
    info = gpu_info()
    plans = {s: plans_for(*s, prof) for s in SHAPES}
    precompile([p for d in plans.values() for p in d.values() if p is not None], 16)
    with open(sys.argv[1], "a") as f:
        for (M, N, K), vs in plans.items():
            n = max(2, min(sets_for(2 * (M * K + N * K + M * N), info.l2_bytes), 4))
            sets = [(torch.randn(M, K, device="cuda").bfloat16(), torch.randn(N, K, device="cuda").bfloat16(),
                     torch.empty(M, N, device="cuda", dtype=torch.bfloat16)) for _ in range(n)]
            ref = sets[0][0].float() @ sets[0][1].float().t()
            cands = {"torch": lambda i: torch.mm(sets[i][0], sets[i][1].t(), out=sets[i][2])}
            for name, p in vs.items():
                if p is not None:
                    cands[name] = (lambda p: lambda i: engine.gemm(sets[i][0], sets[i][1].t(), sets[i][2], plan=p))(p)
            bad = bad_results(cands, sets[0][2], ref)
            for name, _ in bad:
                cands.pop(name)
            res = time_interleaved(cands, n, rounds=9, replay_ms=20.0)
            base = res.timings["torch"].median_ms
            ratios = {k: round(base / t.median_ms, 4) for k, t in res.timings.items()}
            clocks = {k: c.sm_mhz for k, c in res.clocks_by_name.items()}
            print(f"{M}x{N}x{K} torch {base * 1e3:.1f} us at {clocks.get('torch')} MHz, bad {bad}: " + ", ".join(
                f"{k} {v:.3f} ({clocks.get(k)} MHz)" for k, v in sorted(ratios.items(), key=lambda kv: -kv[1])),
                flush=True)
            f.write(json.dumps({"suite": "big-tiles", "M": M, "N": N, "K": K, "torch_ms": base, "ratios": ratios,
                                "clocks_mhz": clocks, "bad": bad,
                                "plans": {k: repr(p) for k, p in vs.items()}, "gpu": info.name,
                                "git_sha": os.environ.get("GEMMLAB_GIT_SHA")}) + "\n")
            f.flush()


if __name__ == "__main__":
    main()
