"""Probe: the fixed cost of a split schedule, from the same tile and split count at several depths. At
512x1024x8192 (the prefill suite's worst shape, 0.73x) global split-K 128 x 128 x 4 was the best plan
measured (0.94x) yet ran ~8 us over its price at K = 4096, its k-loop on price (probe_deep_k.py). Per K of
PROBE_KS at M x N (PROBE_MN, default 512,1024): data-parallel 64 x 64, cluster split-K and global split-K
128 x 128 at 2, 3 and 4 splits, stream-K's best; time = fixed + k-steps a CTA x per-step, read off the
records (one line per shape to argv[1]).

    PYTHONPATH=src:benchmarks python3 benchmarks/probes/probe_split_fixed.py OUT.jsonl"""
import os
import sys

sys.path.insert(0, "benchmarks")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemmlab import planner  # noqa: E402
from plans_vs_torch import profiled_probe, plan_tag as tag  # noqa: E402

M, N = (int(x) for x in os.environ.get("PROBE_MN", "512,1024").split(","))
KS = [int(x) for x in os.environ.get("PROBE_KS", "1024,2048,4096,8192,16384").split(",")]
WANT = [(64, 64, "data_parallel", 1)] + [(128, 128, s, k) for s in ("split_k", "split_k_global") for k in (2, 3, 4)]


def variants(M, N, K, prof):
    cands = planner.candidates(M, N, K, profile=prof, schedules=planner.SCHEDULES)
    out = {}
    for bm, bn, sched, splits in WANT:
        p = next((c for c in cands if (c.bm, c.bn, c.schedule, c.splits, c.swap_ab, c.mcast)
                  == (bm, bn, sched, splits, False, 1)), None)
        if p is not None:
            out[tag(p)] = p
    sk = next((c for c in cands if c.schedule == "stream_k" and not c.swap_ab), None)
    if sk is not None:
        out[tag(sk)] = sk
    return out


if __name__ == "__main__":
    profiled_probe("split-fixed", [(M, N, K) for K in KS], variants)
