"""Time gemmlab.matmul against torch on a suite of gemmlab.matmul_suites and append JSON-line records.

    python benchmarks/matmul_run.py --suite unaligned --out benchmarks/results/matmul.jsonl
"""

import argparse
import math

from gemmlab.bench import append_records, bench_matmul
from gemmlab.matmul_suites import suite


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--suite", required=True, help="square, llm, decode, unaligned, epilogue")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    ratios = []
    for case in suite(args.suite):
        rec = bench_matmul(case.M, case.N, case.K, bias=case.bias, activation=case.activation,
                           suite=args.suite, rounds=args.rounds, extra={"case": case.name})
        append_records(args.out, [rec])
        ratios.append(rec["ratio"])
        print(f"{case.name:52s} {rec['tflops']:7.1f} TF {rec['gbps']:6.0f} GB/s | torch {rec['baseline_tflops']:7.1f} "
              f"TF | x{rec['ratio']:.3f} | err {rec['rel_error']:.1e} | {rec['sm_clock_mhz']} MHz", flush=True)
    geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    print(f"{args.suite}: geomean x{geo:.3f}, min x{min(ratios):.3f} over {len(ratios)} cases")


if __name__ == "__main__":
    main()
