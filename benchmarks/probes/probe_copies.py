"""Probe: unaligned operands' copies in one PDL launch (``pad_copy_operands``) against the form before
(one plain ``pad_copy`` launch per operand, then the GEMM). Shapes whose A and weight rows are not 16-byte
aligned (K odd), small to large, bf16, nn.Linear-shaped (w: (N, K)). Per shape, graph replay interleaved
with torch.mm: "new" (what gemmlab.matmul runs now), "old" (the two copies as separate plain launches into
aligned buffers, then the same GEMM on them); and eager wall and host time of a gemmlab.matmul call against
torch.mm. Every result checked against an fp32 product (outputs poisoned first). Records one line per
shape under argv[1]."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemmlab  # noqa: E402
from gemmlab import engine  # noqa: E402
from gemmlab.gpu import gpu_info  # noqa: E402
from gemmlab.timer import eager_host_us, eager_wall_us, time_interleaved  # noqa: E402
from plans_vs_torch import bad_results  # noqa: E402

SHAPES = [(33, 257, 129), (1, 4097, 1025), (64, 1001, 999), (128, 3001, 2047), (1000, 1001, 999),
          (2050, 3000, 1001), (4095, 4095, 4095)]


def main():
    gpu = gpu_info().name
    with open(sys.argv[1], "a") as f:
        for M, N, K in SHAPES:
            sets = []
            for _ in range(3):
                a = torch.randn(M, K, device="cuda").bfloat16()
                w = torch.randn(N, K, device="cuda").bfloat16()
                ta, tw = engine._aligned_empty(M, K, a.dtype, a.device), engine._aligned_empty(N, K, a.dtype, a.device)
                sets.append((a, w, torch.empty(M, N, device="cuda", dtype=torch.bfloat16), ta, tw))

            def old(i):
                a, w, o, ta, tw = sets[i]
                engine.pad_copy(a, ta)
                engine.pad_copy(w, tw)
                engine.gemm(ta, tw.t(), o)

            cands = {"torch": lambda i: torch.mm(sets[i][0], sets[i][1].t(), out=sets[i][2]),
                     "new": lambda i: engine.gemm(sets[i][0], sets[i][1].t(), sets[i][2]),
                     "old": old}
            ref = sets[0][0].float() @ sets[0][1].float().t()
            bad = bad_results(cands, sets[0][2], ref)
            res = time_interleaved(cands, 3, rounds=5, replay_ms=3.0)
            ms = {k: t.median_ms for k, t in res.timings.items()}
            a, w = sets[0][0], sets[0][1]
            eager = {"gemmlab_host_us": eager_host_us(lambda: gemmlab.matmul(a, w.t())),
                     "torch_host_us": eager_host_us(lambda: torch.mm(a, w.t())),
                     "gemmlab_wall_us": eager_wall_us(lambda: gemmlab.matmul(a, w.t())),
                     "torch_wall_us": eager_wall_us(lambda: torch.mm(a, w.t()))}
            rec = {"suite": "copies-probe", "M": M, "N": N, "K": K, "torch_ms": ms["torch"],
                   "new_ms": ms["new"], "old_ms": ms["old"], "new_ratio": ms["torch"] / ms["new"],
                   "old_ratio": ms["torch"] / ms["old"], "new_over_old": ms["old"] / ms["new"], "bad": bad,
                   **{k: round(v, 2) for k, v in eager.items()}, "sm_clock_mhz": res.clocks.sm_mhz,
                   "route": repr(engine.plan(M, N, K)), "gpu": gpu, "git_sha": os.environ.get("GEMMLAB_GIT_SHA")}
            print(f"{M}x{N}x{K}: torch {ms['torch'] * 1e3:.1f} us, new {rec['new_ratio']:.3f}, old "
                  f"{rec['old_ratio']:.3f} (new/old x{rec['new_over_old']:.3f}); eager wall {eager['gemmlab_wall_us']:.1f}"
                  f" / {eager['torch_wall_us']:.1f} us, host {eager['gemmlab_host_us']:.1f} / "
                  f"{eager['torch_host_us']:.1f}; {res.clocks.sm_mhz} MHz; bad {bad}", flush=True)
            f.write(json.dumps(rec) + "\n")
            f.flush()


if __name__ == "__main__":
    main()
