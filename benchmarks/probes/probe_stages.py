"""Probe: deeper rings for the decode shapes' engine plans (planner.MAX_STAGES = 9 today; cuBLAS runs 64 x 16
tiles with 16 stages there). The routed plan with 9 / 12 / 16 stages, torch.mm, graph replay, interleaved."""
import dataclasses, os, sys
import torch
sys.path.insert(0, "benchmarks")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemmlab import engine, engine2, planner  # noqa: E402
from plans_vs_torch import run_probe  # noqa: E402

SHAPES = [(1, 14336, 4096), (8, 14336, 4096), (16, 14336, 4096), (32, 14336, 4096), (16, 8192, 8192),
          (32, 8192, 8192), (1, 16384, 16384), (16, 4096, 14336), (16, 11008, 4096), (128, 4096, 4096)]


def variants(M, N, K):
    prof = engine2._profile(torch.device("cuda"))
    out = {}
    for p in planner.candidates(M, N, K, profile=prof)[:3]:
        for q in (9, 12, 16):
            v = dataclasses.replace(p, stages=q)
            if v.smem_bytes <= planner.SMEM_LIMIT:
                tag = "swap " if p.swap_ab else ""
                out[f"{tag}{p.bm}x{p.bn} {p.schedule} s{p.splits} /{q}"] = v
    return out


def main():
    run_probe("stages-probe", SHAPES, variants, sys.argv[1], note=lambda M, N, K: f"; route {engine.plan(M, N, K)!r}")


if __name__ == "__main__":
    main()
