"""Probe: few tiles over a deep K (issue 14's shapes that lose with every offered schedule: the prefill
suite's 512x1024x8192 (0.73x) and 512x1024x4096 (0.86x), the broad set's 256x1536x7168 (0.92x),
200x4608x36864, 300x7168x16384, 256x5120x16384 (0.95-0.96x)). The pick is a 64-row data-parallel tile
(L2-bound: every CTA re-reads its A and B rows over all of K) or a cluster split-K plan; global split-K (the
partials through the L2, no clustered launch) is priced far below both but not offered (measured slower on
20 shapes, 3278dd1). What do the schedules measure at these shapes today?

Per shape: the model's pick, and the model's best plan of each (schedule, splits, tile height) over every
schedule the kernel has (data-parallel, cluster split-K, stream-K, global split-K; no ping-pong), grids of
at least 0.6 of the SMs for the split ones, cheapest first, up to 14; against torch.mm and the routed call
(graph replay, interleaved; every result checked against an fp32 product first). One line per shape to
argv[1].

    PYTHONPATH=src:benchmarks python3 benchmarks/probes/probe_deep_k.py OUT.jsonl
    PROBE_SHAPES="512,1024,8192;256,1536,7168" ... (instead of the default list)"""
import os
import sys

sys.path.insert(0, "benchmarks")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemmlab import planner  # noqa: E402
from plans_vs_torch import profiled_probe, plan_tag as tag, shapes_from_env  # noqa: E402

SHAPES = [(512, 1024, 8192), (512, 1024, 4096), (256, 1536, 7168), (200, 4608, 36864), (300, 7168, 16384),
          (256, 5120, 16384), (256, 2560, 9728), (640, 1024, 5120), (200, 1024, 2048), (1024, 768, 3072),
          (384, 2048, 8192), (512, 768, 12288), (320, 1280, 10240)]
SHAPES = shapes_from_env(SHAPES)  # PROBE_SHAPES="M,N,K;..." in its place


def variants(M, N, K, prof):
    pick = planner.plan(M, N, K, profile=prof)
    out = {"pick " + tag(pick): pick}
    seen = set()
    for p in planner.candidates(M, N, K, profile=prof, schedules=planner.SCHEDULES):
        key = (p.schedule, p.splits, p.bm, p.swap_ab)
        if p.schedule == "pingpong" or p.mcast > 1 or key in seen:
            continue
        if p.schedule != "data_parallel" and p.grid < 0.6 * prof.sm_count:
            continue
        seen.add(key)
        if tag(p) not in out and len(out) < 14:
            out[tag(p)] = p
    return out


if __name__ == "__main__":
    profiled_probe("deep-k", SHAPES, variants)
