"""Run every registered step once on a small problem, for compute-sanitizer (memcheck, racecheck, synccheck).

    compute-sanitizer --tool memcheck python3 benchmarks/sanitize.py --ladder hopper
    compute-sanitizer --tool racecheck python3 benchmarks/sanitize.py --steps hopper.h11_general \
        --shape 100,4096,4096 --config BN=128,SPLITS=3
"""

import argparse

import torch

from gemmlab import registry
from gemmlab.bench import poison_, rel_error


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ladder", default="hopper")
    p.add_argument("--steps", default="")
    p.add_argument("--shape", default="512,512,512")
    p.add_argument("--config", default="", help="K=V,K=V: the steps' config (default: each step's own)")
    args = p.parse_args()
    M, N, K = (int(x) for x in args.shape.split(","))
    lad = registry.ladders()[args.ladder]
    steps = [registry.get(s) for s in args.steps.split(",") if s] or registry.all_kernels(args.ladder)
    config = dict((k, int(v)) for k, v in (kv.split("=") for kv in args.config.split(",") if kv)) or None
    for spec in steps:
        if spec.why_unsupported(M, N, K, config):
            print(f"{spec.name}: skipped ({spec.why_unsupported(M, N, K, config)})")
            continue
        a, b, c = lad.make_inputs(M, N, K, "cuda")
        out = poison_(torch.empty_like(c))
        spec.run(a, b, out, config=config)
        torch.cuda.synchronize()
        err = rel_error(out, lad.reference(a, b, c, 1.0, 0.0))
        print(f"{spec.name}: ran, rel error {err:.2e}", flush=True)


if __name__ == "__main__":
    main()
