"""Benchmark ladder steps against cuBLAS on the GPU and append JSON-line records.

    python benchmarks/ladder_run.py --ladder hopper --sizes 4096,8192 --out benchmarks/results/hopper.jsonl
"""

import argparse

from rich.console import Console
from rich.table import Table

from gemmlab import registry
from gemmlab.bench import append_records, bench_shape
from gemmlab.errors import UnsupportedProblem
from gemmlab.gpu import gpu_info


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ladder", required=True, choices=("sgemm", "hopper"))
    p.add_argument("--steps", default="", help="comma-separated step names (default: all)")
    p.add_argument("--sizes", default="4096", help="comma-separated square sizes")
    p.add_argument("--shapes", default="", help="semicolon-separated M,N,K shapes")
    p.add_argument("--configs", default="", help="semicolon-separated K=V,K=V configs tried for each step "
                   "that has those parameters (the default config is always included)")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--suite", default="ladder")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    steps = [registry.get(s) for s in args.steps.split(",") if s] or registry.all_kernels(args.ladder)
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes.split(";") if s]
    shapes += [(int(s),) * 3 for s in args.sizes.split(",") if s]
    table = Table(title=f"{args.ladder} vs cuBLAS")
    for col in ("shape", "kernel", "TFLOP/s", "cuBLAS", "ratio", "err", "SM MHz"):
        table.add_column(col)
    sm_count = gpu_info().sm_count
    for M, N, K in shapes:
        todo = []
        for s in steps:
            base = s.config_for(M, N, K, sm_count) if s.heuristic else None
            if s.why_unsupported(M, N, K, base):
                continue
            todo.append((s, base))
            for c in (c for c in args.configs.split(";") if c):
                extra = dict(kv.split("=") for kv in c.split(","))
                if not set(extra) <= set(s.param_names()):
                    continue
                cfg = {**(base or {}), **{k: int(v) for k, v in extra.items()}}
                try:
                    if s.resolve(cfg) != s.resolve(base) and not s.why_unsupported(M, N, K, cfg):
                        todo.append((s, cfg))
                except UnsupportedProblem:
                    pass  # a value this step does not offer
        if not todo:
            continue
        recs = bench_shape(args.ladder, M, N, K, todo, suite=args.suite, rounds=args.rounds)
        append_records(args.out, recs)
        for r in recs:
            table.add_row(f"{M}x{N}x{K}", r["kernel"], f"{r.get('tflops', float('nan')):.1f}",
                          f"{r['baseline_tflops']:.1f}", f"{r.get('ratio', float('nan')):.3f}",
                          f"{r['rel_error']:.1e}", f"{r['sm_clock_mhz']}")
            print(r["kernel"], r["config"], M, N, K, r.get("tflops"), r["baseline_tflops"], r.get("ratio"), r["rel_error"],
                  r["sm_clock_mhz"], flush=True)
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
