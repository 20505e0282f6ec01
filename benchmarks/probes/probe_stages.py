"""Probe: deeper rings than planner.MAX_STAGES (9). cuBLAS runs 64 x 16 tiles with 16 stages at the decode
shapes and 64 x 64 tiles with 13 stages (2 x 1 clusters) at the few-tile L2-bound ones (512x1024x8192,
512x1024x4096, 256x1536x7168: cublas_names.py). The model's best few plans, each at every depth of
PROBE_DEPTHS that fits, against torch.mm, graph replay, interleaved.

    PYTHONPATH=src:benchmarks python3 benchmarks/probes/probe_stages.py OUT.jsonl
    PROBE_SHAPES="512,1024,8192;..." PROBE_DEPTHS="9,13,16" PROBE_TOP=3 (defaults: the decode shapes, 9 / 12 /
    16, the best 3); PROBE_BM=64: only plans of that tile height; PROBE_SCHEDULE=data_parallel: only plans of
    that schedule (the weight streams' unclustered plans: cuBLAS streams 77x5120x5120 with 64 x 80 tiles and
    11 stages on 80 CTAs, ours stop at 9)."""
import dataclasses, os, sys
import torch
sys.path.insert(0, "benchmarks")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemmlab import engine, engine2, planner  # noqa: E402
from plans_vs_torch import run_probe, shapes_from_env  # noqa: E402

SHAPES = [(1, 14336, 4096), (8, 14336, 4096), (16, 14336, 4096), (32, 14336, 4096), (16, 8192, 8192),
          (32, 8192, 8192), (1, 16384, 16384), (16, 4096, 14336), (16, 11008, 4096), (128, 4096, 4096)]
SHAPES = shapes_from_env(SHAPES)  # PROBE_SHAPES="M,N,K;..." in its place
DEPTHS = tuple(int(x) for x in os.environ.get("PROBE_DEPTHS", "9,12,16").split(","))
TOP = int(os.environ.get("PROBE_TOP", "3"))
BM = int(os.environ.get("PROBE_BM", "0"))
SCHEDULE = os.environ.get("PROBE_SCHEDULE", "")


def variants(M, N, K):
    prof = engine2._profile(torch.device("cuda"))
    out = {}
    cands = [p for p in planner.candidates(M, N, K, profile=prof)
             if (not BM or p.bm == BM) and (not SCHEDULE or p.schedule == SCHEDULE)]
    for p in cands[:TOP]:
        for q in DEPTHS:
            v = dataclasses.replace(p, stages=q)
            if v.smem_bytes <= planner.SMEM_LIMIT:
                tag = "swap " if p.swap_ab else ""
                out[f"{tag}{p.bm}x{p.bn} {p.schedule} s{p.splits} /{q}"] = v
    return out


def main():
    run_probe("stages-probe", SHAPES, variants, sys.argv[1], note=lambda M, N, K: f"; route {engine.plan(M, N, K)!r}")


if __name__ == "__main__":
    main()
