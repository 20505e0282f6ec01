"""Probe: swapped plans (out^T = W @ A^T: the weight's rows on the wgmma's M side, the tokens on its N side,
in widths of 16) past planner.SWAP_MAX_M = 64 tokens. With M = 77 or 200 a 64- or 128-row tile pads the
tokens to 128 / 256 rows (40% / 22% of the MMAs wasted); a swapped tile pads them to 80 / 208. Each shape:
the model's two best plain plans, its four best swapped ones (SWAP_MAX_M raised to 256 here only) and the
swapped 64-row tile as wide as the tokens, against torch.mm and the routed call (graph replay, interleaved;
every result checked against an fp32 product first). Records one line per shape to argv[1]."""
import math, os, sys
sys.path.insert(0, "benchmarks")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemmlab import planner  # noqa: E402
from plans_vs_torch import profiled_probe, plan_tag as tag, shapes_from_env  # noqa: E402

SHAPES = [(77, 5120, 5120), (77, 12288, 4096), (77, 6144, 4096), (77, 2560, 10240), (200, 8192, 5376),
          (200, 8192, 3072), (200, 4096, 4096), (200, 1024, 2048), (200, 4608, 36864), (200, 5376, 4096),
          (150, 14336, 4096), (100, 4096, 4096), (96, 8192, 4096), (160, 5120, 5120), (120, 11008, 4096),
          (250, 3584, 3584), (128, 5120, 5120), (256, 5120, 5120), (256, 1536, 7168), (180, 2048, 8192)]
SHAPES = shapes_from_env(SHAPES)  # PROBE_SHAPES="M,N,K;..." in its place


def variants(M, N, K, prof):
    out = {}
    planner.SWAP_MAX_M = 256
    planner._CACHE.clear()
    cands = planner.candidates(M, N, K, profile=prof, swap_ab=True)
    plain = [p for p in cands if not p.swap_ab][:2]
    swapped = [p for p in cands if p.swap_ab][:4]
    width = math.ceil(M / 16) * 16
    exact = [p for p in cands if p.swap_ab and p.bm == 64 and p.bn == width and p.schedule == "data_parallel"][:1]
    for p in plain + swapped + exact:
        out[tag(p)] = p
    return out


if __name__ == "__main__":
    profiled_probe("swap-mid-probe", SHAPES, variants)
