"""Issue 18's grouped bars on the committed records, and what the 2x bar asks of the hardware (CPU only).

    python3 benchmarks/grouped_summary.py [--file benchmarks/results/grouped.jsonl] [--bar 2.0]

Per shape (model, projection, T) the newest run that timed ``ours`` (``grouped_bench.py``: what
``grouped_mm`` picked) against ``torch._grouped_mm`` and, where timed in the same run, the loop of
``torch.mm``: the two ratios, and for the shapes with 64 to 256 experts what the bar's ratio (``--bar``)
over ``torch._grouped_mm`` would need: a time of ``torch_ms / bar``, so a rate of

* HBM: the bytes the launch must move at least (A, every non-empty expert's weight read once, out written
  once; 16-bit operands) over that time, against the H200's copy rate (``devices.H200.hbm_bytes_per_s``,
  4.3 TB/s read + written), the fastest weight stream the engine reached (``hbm_read_bytes_per_s``, 3.9)
  and the data sheet's 4.8 TB/s;
* tensor: the FLOP of the rows routed over that time, against the fastest dense bf16 GEMM measured on
  this H200 (``BEST_DENSE_TFLOPS``) and the data sheet's 989 TFLOP/s.

A shape needs both rates at once (the two overlap at best), so the bar is out of reach where either
exceeds what the GPU has been measured to do. Also the bars with 8 or 16 experts: >= 1.05x
``torch._grouped_mm`` and >= 1.0x the loop.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

from gemmlab.devices import H200  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "grouped.jsonl"
# The fastest dense bf16 GEMM measured on this H200: the worklog's kernel 12 at 8192^3 in short bursts at
# 1980 MHz (cuBLAS 808 beside it; sustained runs hold 650-700 under the power limit): ../shared/brief.md.
BEST_DENSE_TFLOPS = 826.0
SHEET_TBS, SHEET_TFLOPS = 4.8, 989.0


def min_bytes(r: dict) -> float:
    """What the launch must move through HBM at least (16-bit operands and output)."""
    G, N, K, T = r["groups"], r["N"], r["K"], r["T"]
    return 2.0 * (T * K + (G - r["empty_groups"]) * N * K + T * N)


def needs(r: dict, bar: float) -> tuple[float, float]:
    """(TB/s, TFLOP/s) a kernel must reach to run ``bar`` x ``torch._grouped_mm`` on this record's shape."""
    t = r["baseline_ms"] * 1e-3 / bar
    return min_bytes(r) / t / 1e12, 2.0 * r["T"] * r["N"] * r["K"] / t / 1e12


def newest(path: Path) -> dict:
    """Per (model, proj, T): the candidates' records of the newest run that timed ``ours`` there."""
    runs: dict = {}
    for r in map(json.loads, open(path)):
        if r.get("suite") != "grouped" or not r.get("time_ms"):
            continue
        key = (r["model"], r["proj"], r["T"])
        run = runs.setdefault(key, {})
        if r["candidate"] == "ours" and run.get("_sha") != r["git_sha"]:
            run.clear()
            run["_sha"] = r["git_sha"]
        if run.get("_sha") == r["git_sha"]:
            run[r["candidate"]] = r
    return {k: v for k, v in runs.items() if "ours" in v}


def gm(xs) -> float:
    return math.exp(statistics.fmean(map(math.log, xs)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file", default=str(RESULTS))
    ap.add_argument("--bar", type=float, default=2.0, help="the ratio over torch._grouped_mm asked of 64-256 experts")
    args = ap.parse_args(argv)
    hbm_tbs = H200.hbm_bytes_per_s / 1e12
    stream_tbs = H200.hbm_read_bytes_per_s / 1e12
    few, many, reach, reach_stream = [], [], [], []
    print(f"{'shape':30s} {'G':>4s} {'ours/tgm':>8s} {'ours/loop':>9s}  needs for {args.bar:g}x: TB/s, TFLOP/s")
    for (model, proj, T), run in sorted(newest(Path(args.file)).items()):
        o, loop = run["ours"], run.get("torch_mm_loop")
        if o.get("baseline") != "torch_grouped_mm" or not o.get("ratio"):
            continue
        vs_loop = loop["time_ms"] / o["time_ms"] if loop else None
        line = f"{model + ' ' + proj + ' T=' + str(T):30s} {o['groups']:4d} {o['ratio']:8.3f} " + \
               (f"{vs_loop:9.3f}" if vs_loop else f"{'-':>9s}")
        if o["groups"] <= 16:
            few.append((o["ratio"], vs_loop))
        elif 64 <= o["groups"] <= 256:
            tbs, tflops = needs(o, args.bar)
            ok = tbs <= hbm_tbs and tflops <= BEST_DENSE_TFLOPS
            many.append(o["ratio"])
            reach.append(ok)
            reach_stream.append(ok and tbs <= stream_tbs)
            line += (f"  {tbs:4.2f} ({tbs / hbm_tbs:4.0%} of {hbm_tbs:g}), {tflops:4.0f} "
                     f"({tflops / BEST_DENSE_TFLOPS:4.0%} of {BEST_DENSE_TFLOPS:g})" + ("" if ok else "  out of reach"))
        print(line)
    if few:
        rs = [r for r, _ in few]
        ls = [x for _, x in few if x]
        print(f"8-16 experts, {len(few)} shapes: ours / torch._grouped_mm {gm(rs):.3f} (min {min(rs):.3f}; bar 1.05: "
              f"{sum(r >= 1.05 for r in rs)} meet it); ours / torch.mm loop {gm(ls):.3f} on {len(ls)} (min "
              f"{min(ls):.3f}; bar 1.0: {sum(x >= 1.0 for x in ls)} meet it)")
    if many:
        print(f"64-256 experts, {len(many)} shapes: ours / torch._grouped_mm {gm(many):.3f} ({min(many):.3f} to "
              f"{max(many):.3f}); {sum(r >= args.bar for r in many)} at {args.bar:g}x; {sum(reach)} of {len(many)} "
              f"where {args.bar:g}x needs no more than {hbm_tbs:g} TB/s and {BEST_DENSE_TFLOPS:g} TFLOP/s, "
              f"{sum(reach_stream)} within {stream_tbs:.2g} TB/s (the fastest weight stream measured here)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
