"""A training step's grouped GEMM: forward and backward of ``gemmlab.grouped_mm`` against ``torch._grouped_mm``
(bf16, contiguous layout, uneven routed groups as ``grouped_bench.py`` draws them), eager, wall time per
step with the project's eager timer (``gemmlab.timer.eager_wall_us``), the two candidates interleaved round by
round. Each step: y = grouped_mm(a, b, offsets); y.backward(dy) with a and b requiring gradients (da, db).

    PYTHONPATH=src:benchmarks python benchmarks/grouped_backward.py [--shapes mixtral:4096,...] [--out PATH]

JSON lines (kind "grouped_backward"): shape, both times (ms), ratio (torch / ours, > 1: we win), the SM clock.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch

import gemmlab
from gemmlab.bench import git_sha
from gemmlab.gpu import gpu_info, sample_clocks
from gemmlab.timer import eager_wall_us
from gemmlab import grouped
from grouped_bench import shape_seed, shapes, uneven_offsets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "benchmarks/results"),
                                                  "grouped_backward.jsonl"))
    ap.add_argument("--shapes", default="mixtral:4096,dsv2lite:4096,qwen_moe:16384")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--mn-major-b", choices=("off", "on", "both"), default="on",
                    help="da on the grouped kernel with w read MN-major (grouped.MN_MAJOR_B_OFFERED; 'on', the "
                         "default, is what the library ships); 'both' times the two backward forms, one record each")
    args = ap.parse_args()
    info, sha = gpu_info(), git_sha()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    ratios = []
    for pair in args.shapes.split(","):
        model, T = pair.split(":")
        for n, (m, proj, G, N, K, T) in enumerate(shapes([model], [int(T)])):
            offs, _ = uneven_offsets(G, T, seed=shape_seed(m, proj, T, n))
            a = torch.randn(T, K, device="cuda").bfloat16().requires_grad_(True)
            b = (torch.randn(G, N, K, device="cuda") / K ** 0.5).bfloat16().requires_grad_(True)
            dy = torch.randn(T, N, device="cuda").bfloat16()

            def ours():
                a.grad = b.grad = None
                gemmlab.grouped_mm(a, b, offs).backward(dy)

            def theirs():
                a.grad = b.grad = None
                torch._grouped_mm(a, b.transpose(-2, -1), offs=offs[1:]).backward(dy)

            for mn_b in {"off": (False,), "on": (True,), "both": (False, True)}[args.mn_major_b]:
                grouped.MN_MAJOR_B_OFFERED = mn_b
                ours(), theirs()  # compile, warm
                times = {"ours": [], "torch_grouped_mm": []}
                for _ in range(args.rounds):
                    for name, fn in (("ours", ours), ("torch_grouped_mm", theirs)):
                        times[name].append(eager_wall_us(fn, calls=args.calls, rounds=1) / 1e3)
                t_ours, t_torch = (statistics.median(times[k]) for k in ("ours", "torch_grouped_mm"))
                ratio = t_torch / t_ours
                ratios.append(ratio)
                clock = sample_clocks().sm_mhz
                flops = 3 * 2 * T * N * K
                rec = dict(kind="grouped_backward", model=m, proj=proj, groups=G, T=T, N=N, K=K, mn_major_b=mn_b,
                           ours_ms=t_ours, torch_ms=t_torch, ratio=ratio, ours_tflops=flops / t_ours / 1e9,
                           sm_clock_mhz=clock, gpu=info.name, git_sha=sha, torch=torch.__version__)
                with open(args.out, "a") as f:
                    f.write(json.dumps(rec) + "\n")
                print(f"{m} {proj} G={G} T={T} N={N} K={K} mn_b={mn_b}: ours {t_ours:.3f} ms "
                      f"({rec['ours_tflops']:.0f} TFLOP/s), torch._grouped_mm {t_torch:.3f} ms: {ratio:.3f}x",
                      flush=True)
    print(f"geomean {statistics.geometric_mean(ratios):.3f}x over {len(ratios)} shapes")


if __name__ == "__main__":
    main()
