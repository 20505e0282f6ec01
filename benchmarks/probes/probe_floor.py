"""Probe: what a small launch of the engine kernel costs beyond its loads and MMAs. Session 22 found that
pulling the first k-steps into the L2 before pdl_wait made small kernels slower, not faster
(warm_probe.jsonl), so the first loads' latency is not their gap to cuBLAS. Here the same plan with fewer
stages (less shared memory a CTA; 2 and 4 against the plan's) and the next two plans the model ranks, on
small shapes (a few us: a tile or a few k-steps a CTA), each against torch.mm, graph replay, interleaved.
If a shallower ring is as fast, the ring's depth (and the shared memory it takes) is not what a small
kernel pays for either. Records one line per shape under argv[1]."""
import dataclasses, os, sys
import torch
sys.path.insert(0, "benchmarks")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemmlab import engine, engine2, planner  # noqa: E402
from plans_vs_torch import run_probe  # noqa: E402

SHAPES = [(64, 64, 64), (64, 256, 128), (128, 1024, 256), (32, 1024, 1024), (16, 1152, 1024), (32, 896, 896),
          (256, 512, 2048), (512, 1152, 1024), (1000, 768, 768), (200, 1024, 2048), (64, 3072, 3072),
          (1024, 1024, 1024)]


def variants(M, N, K):
    prof = engine2._profile(torch.device("cuda"))
    route = engine.plan(M, N, K)
    out = {}
    first = route.plan if route.kernel == "engine" and route.plan is not None else None
    ranked = planner.candidates(M, N, K, profile=prof, swap_ab=True)
    for i, p in enumerate(([first] if first else []) + [c for c in ranked if c != first][:2]):
        tag = ("swap " if p.swap_ab else "") + f"{p.bm}x{p.bn} {p.schedule} s{p.splits}"
        for q in sorted({p.stages, 4, 2}):
            v = dataclasses.replace(p, stages=q)
            if q <= p.stages and (p.schedule != "split_k" or planner.split_rows_fit(v.bm, v.bm, v.bn, q, v.dtype)):
                out[f"{'pick' if i == 0 and first else f'#{i}'} {tag} /{q}"] = v
    return out


def main():
    run_probe("floor-probe", SHAPES, variants, sys.argv[1], note=lambda M, N, K: f"; route {engine.plan(M, N, K)!r}")


if __name__ == "__main__":
    main()
