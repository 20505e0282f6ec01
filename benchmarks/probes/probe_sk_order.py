"""Probe: the engine kernel's stream-K on deep K, with its streamed range run before or after the
data-parallel tiles. On an H100 SXM (f83af88, h100_stream_k_recheck.jsonl) the stream-K plan of 128 x 256
tiles ran +9% / +21% / +42% / +58-104% over the data-parallel plan of the same tile at 8192 x 8192 and K
8192 / 14336 / 20480 / 28672, where on the H200 it ran 1-2.5% ahead of it. Then each CTA ran its streamed
k-range (about half a tile, at a k-offset no other CTA shares) before its data-parallel tiles, so the
data-parallel waves could start out of step; global split-K, which runs its split unit after them, measured
even with data-parallel on the same H100 runs. One build a process (PROBE_VARIANT):
  shipped     the kernel as it is: since session 40, TileScheduler::next gives STREAM_K the data-parallel
              tiles first, then the streamed range (as SPLIT_K_GLOBAL); the owner still adds its
              contributors' partials in CTA order, so the results stay deterministic;
  rangefirst  the order before: each CTA's streamed range first, then its data-parallel tiles (the
              records before session 40 call these builds dpfirst and asis).
Each shape: the stream-K plan of the tile, the data-parallel and ping-pong plans (stream-K offered in the
profile whatever the GPU's memory), against torch.mm, graph replay interleaved (probe_mc_parts.time_all).
Compare the two builds' stream-K ratios, each against its own data-parallel plan.

    PROBE_VARIANT=rangefirst PYTHONPATH=src:benchmarks python3 benchmarks/probes/probe_sk_order.py OUT.jsonl
    PROBE_SHAPES="8192,8192,28672;..." """
import dataclasses
import os
import sys

sys.path.insert(0, "benchmarks")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import probe_mc_parts as parts  # noqa: E402
from gemmlab import planner  # noqa: E402
from plans_vs_torch import shapes_from_env  # noqa: E402

SHAPES = [(8192, 8192, 8192), (8192, 8192, 14336), (8192, 8192, 28672), (4096, 4096, 28672),
          (16384, 4544, 18176), (5000, 5376, 21504)]
SHAPES = shapes_from_env(SHAPES)  # PROBE_SHAPES="M,N,K;..." in its place
SHIPPED = ("            if constexpr (STREAMED) {  // the data-parallel tiles first, then the streamed range\n"
           "                if (next_dp < dp_tiles()) return whole_tile(u);\n")
RANGE_FIRST = ("            if constexpr (STREAMED) {  // stream-K: the streamed range first\n"
               "                if (SCHED == SPLIT_K_GLOBAL && next_dp < dp_tiles()) return whole_tile(u);\n")
PATCHES = {"shipped": [], "rangefirst": [("common/tile_scheduler.cuh", SHIPPED, RANGE_FIRST)]}


def plans_for(M, N, K, prof) -> dict:
    """The model's best stream-K plan, the data-parallel plan of its tile and the best ping-pong plan."""
    cands = planner.candidates(M, N, K, profile=prof)
    out = {}
    sk = next((c for c in cands if c.schedule == "stream_k"), None)
    if sk is not None:
        out[f"{sk.bm}x{sk.bn} stream_k {sk.sk_tiles}/{sk.sk_ctas}"] = sk
        dp = next((c for c in cands if c.schedule == "data_parallel" and (c.bm, c.bn) == (sk.bm, sk.bn)
                   and not c.swap_ab and c.mcast == 1), None)
        if dp is not None:
            out[f"{dp.bm}x{dp.bn} data_parallel"] = dp
    pp = next((c for c in cands if c.schedule == "pingpong"), None)
    if pp is not None:
        out[f"{pp.bm}x{pp.bn} pingpong"] = pp
    return out


def main():
    variant = os.environ.get("PROBE_VARIANT", "shipped")
    root, _, prof = parts.patched_engine(variant, PATCHES)
    prof = dataclasses.replace(prof, stream_k_offered=True)  # whatever the GPU's memory
    plans = {s: plans_for(*s, prof) for s in SHAPES}
    parts.precompile([p for d in plans.values() for p in d.values()], root)
    parts.time_all(plans, f"sk-order-{variant}", sys.argv[1])


if __name__ == "__main__":
    main()
