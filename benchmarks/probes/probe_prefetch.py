"""Probe: the engine kernel's L2 prefetch (Plan.prefetch, GemmTraits::PREFETCH: with the loads of k-step kt the
producer asks the L2 for the boxes of k-step kt + d). Where a weight streams from HBM (decode shapes, swapped or
not; mid shapes with deep K) more requests in flight than the ring holds should stream it faster; where the
operands sit in L2 it should cost nothing. Each shape: the model's pick and its two runners-up at d = 0, 4, 8,
16, against torch.mm and the routed call (graph replay, interleaved). Records one line per shape to argv[1]."""
import dataclasses, os, sys
sys.path.insert(0, "benchmarks")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemmlab import planner  # noqa: E402
from plans_vs_torch import profiled_probe, shapes_from_env  # noqa: E402

SHAPES = [(1, 14336, 4096), (16, 14336, 4096), (32, 14336, 4096), (16, 8192, 8192), (1, 16384, 16384),
          (8, 28672, 4096), (16, 4096, 4096), (128, 4096, 4096), (300, 5120, 27648), (200, 8192, 5376),
          (64, 4096, 3584), (4096, 4096, 4096)]
SHAPES = shapes_from_env(SHAPES)  # PROBE_SHAPES="M,N,K;..." in its place
DISTANCES = (4, 8, 16)


def variants(M, N, K, prof):
    out = {}
    for p in planner.candidates(M, N, K, profile=prof)[:3]:
        if p.mcast > 1 or p.a_mn or p.b_mn:
            continue
        tag = f"{'swap ' if p.swap_ab else ''}{p.bm}x{p.bn} {p.schedule} s{p.splits}/{p.stages}"
        out[tag] = p
        for d in DISTANCES:
            out[f"{tag} pf{d}"] = dataclasses.replace(p, prefetch=d)
    return out


if __name__ == "__main__":
    profiled_probe("prefetch-probe", SHAPES, variants)
