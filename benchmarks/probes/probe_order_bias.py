"""Probe: does a candidate's place in gemmlab.timer.time_interleaved's order bias its time? The rounds rotate
the candidates' order, so each candidate always follows the same one (cyclically): under the power cap the
one before may leave the clock higher or lower for the next. In probe_big_tiles.py the model's pick, timed
right after torch.mm, ran 2-2.5% faster than the same plan timed later in the list. Here one plan is listed
four times beside torch.mm (torch, A1, A2, A3, A4; graph replay, 20 ms replays, 15 rounds), on shapes that
run at the cap and one that does not: identical plans should time within the noise, whatever their place.
One line per shape to argv[1].

    PYTHONPATH=src:benchmarks python3 benchmarks/probes/probe_order_bias.py OUT.jsonl [PROBE_SHAPES=...]
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, "benchmarks")
from gemmlab import engine, planner  # noqa: E402
from gemmlab.gpu import gpu_info  # noqa: E402
from gemmlab.timer import sets_for, time_interleaved  # noqa: E402
from plans_vs_torch import shapes_from_env  # noqa: E402

SHAPES = [(2306, 32768, 6144), (8192, 6144, 6144), (4096, 14336, 4096), (1024, 768, 3072)]
SHAPES = shapes_from_env(SHAPES)  # PROBE_SHAPES="M,N,K;..." in its place


def main():
    info = gpu_info()
    with open(sys.argv[1], "a") as f:
        for M, N, K in SHAPES:
            p = planner.plan(M, N, K)
            n = max(2, min(sets_for(2 * (M * K + N * K + M * N), info.l2_bytes), 4))
            sets = [(torch.randn(M, K, device="cuda").bfloat16(), torch.randn(N, K, device="cuda").bfloat16(),
                     torch.empty(M, N, device="cuda", dtype=torch.bfloat16)) for _ in range(n)]
            cands = {"torch": lambda i: torch.mm(sets[i][0], sets[i][1].t(), out=sets[i][2])}
            for k in range(1, 5):
                cands[f"A{k}"] = lambda i: engine.gemm(sets[i][0], sets[i][1].t(), sets[i][2], plan=p)
            res = time_interleaved(cands, n, rounds=15, replay_ms=20.0)
            base = res.timings["torch"].median_ms
            ratios = {k: round(base / t.median_ms, 4) for k, t in res.timings.items()}
            clocks = {k: c.sm_mhz for k, c in res.clocks_by_name.items()}
            print(f"{M}x{N}x{K} {p.bm}x{p.bn} {p.schedule}: " + ", ".join(
                f"{k} {v:.3f} ({clocks.get(k)} MHz)" for k, v in ratios.items()), flush=True)
            f.write(json.dumps({"suite": "order-bias", "M": M, "N": N, "K": K, "plan": repr(p), "ratios": ratios,
                                "clocks_mhz": clocks,
                                "samples_ms": {k: t.samples_ms for k, t in res.timings.items()},
                                "gpu": info.name, "git_sha": os.environ.get("GEMMLAB_GIT_SHA")}) + "\n")
            f.flush()


if __name__ == "__main__":
    main()
