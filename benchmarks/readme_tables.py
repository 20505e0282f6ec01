"""Regenerate the README's result tables from the committed records (no GPU needed).

    python benchmarks/readme_tables.py            # rewrites the blocks between <!-- results:NAME --> markers

Each block is built from benchmarks/results/*.jsonl only; numbers are never typed by hand.
"""

import json
import math
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def load(name: str) -> list[dict]:
    path = RESULTS / name
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def ladder_table(records: list[dict], sizes=(4096, 8192)) -> str:
    from gemmlab import registry

    by = defaultdict(dict)
    for r in records:
        if r.get("tflops") and r["M"] == r["N"] == r["K"] and r["M"] in sizes:
            by[r["kernel"]].setdefault(r["M"], r)  # first record per (kernel, size): the default config
    head = "| step | adds | " + " | ".join(f"{n}^3 TFLOP/s (x cuBLAS)" for n in sizes) + " |"
    rows = [head, "|---|---|" + "---|" * len(sizes)]
    for name in sorted(by, key=lambda k: registry.get(k).step):
        spec = registry.get(name)
        cells = []
        for n in sizes:
            r = by[name].get(n)
            cells.append(f"{r['tflops']:.{0 if r['tflops'] >= 10 else 1}f} ({r['ratio']:.2f}x)" if r else "")
        rows.append(f"| `{spec.short}` | {spec.technique} | " + " | ".join(cells) + " |")
    base = {n: next((r for r in records if r["M"] == n), None) for n in sizes}
    rows.append("| cuBLAS | `torch.mm` | " + " | ".join(
        f"{base[n]['baseline_tflops']:.0f} at {base[n]['sm_clock_mhz']:.0f} MHz" if base[n] else "" for n in sizes) + " |")
    sha = sorted({r["git_sha"] for r in records})
    return "\n".join(rows) + f"\n\nRecords: git {', '.join(sha)}; GPU {records[0]['gpu']} (SM clock as recorded).\n"


def sweep_table(records: list[dict]) -> str:
    rows = ["| size | config | TFLOP/s | cuBLAS TFLOP/s | x cuBLAS | SM MHz |", "|---|---|---|---|---|---|"]
    best = {}
    for r in records:
        if r.get("ratio") and r["M"] == r["N"] == r["K"]:
            best.setdefault(r["M"], r)  # the heuristic's config is the first record of each size
    for n in sorted(best):
        r = best[n]
        cfg = ", ".join(f"{k}={v}" for k, v in r["config"].items())
        rows.append(f"| {n}^3 | {cfg} | {r['tflops']:.0f} | {r['baseline_tflops']:.0f} | {r['ratio']:.3f} | "
                    f"{r['sm_clock_mhz']:.0f} |")
    big = [best[n]["ratio"] for n in best if n >= 4096]
    rows.append(f"\nGeomean 4096..16384: **{geomean(big):.3f}x**; minimum from 2048: "
                f"**{min(best[n]['ratio'] for n in best if n >= 2048):.3f}x**.")
    return "\n".join(rows) + "\n"


def matmul_table(records: list[dict]) -> str:
    suites = defaultdict(list)
    for r in records:
        suites[r["suite"]].append(r)
    rows = ["| suite | cases | geomean x torch | min | max | note |", "|---|---|---|---|---|---|"]
    for name, rs in suites.items():
        ratios = [r["ratio"] for r in rs]
        note = ""
        if name in ("decode", "llm"):
            dec = [r for r in rs if r["M"] <= 128]
            if dec:
                note = f"decode: {geomean([r['ratio'] for r in dec]):.2f}x, up to {max(r['gbps'] for r in dec):.0f} GB/s"
        rows.append(f"| {name} | {len(rs)} | {geomean(ratios):.3f} | {min(ratios):.3f} | {max(ratios):.3f} | {note} |")
    detail = ["", "| case | TFLOP/s | torch TFLOP/s | x torch |", "|---|---|---|---|"]
    for r in records:
        if r["suite"] in ("unaligned", "epilogue"):
            detail.append(f"| {r.get('case', r['M'])} | {r['tflops']:.0f} | {r['baseline_tflops']:.0f} | {r['ratio']:.2f} |")
    sha = sorted({r["git_sha"] for r in records})
    return "\n".join(rows + detail) + f"\n\nRecords: git {', '.join(sha)}.\n"


BLOCKS = {
    "hopper-ladder": lambda: ladder_table(load("hopper_ladder.jsonl")),
    "hopper-sweep": lambda: sweep_table(load("hopper_sweep.jsonl")),
    "sgemm-ladder": lambda: ladder_table(load("sgemm_ladder.jsonl")),
    "matmul": lambda: matmul_table(load("matmul.jsonl")),
}


def main() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    for name, build in BLOCKS.items():
        pat = re.compile(rf"(<!-- results:{name} -->\n)(.*?)(<!-- /results:{name} -->)", re.S)
        if pat.search(text):
            try:
                body = build()
            except (IndexError, KeyError, ValueError) as e:  # no records yet
                body = f"(no records yet: {e})\n"
            text = pat.sub(lambda m: m.group(1) + body + m.group(3), text)
    readme.write_text(text)


if __name__ == "__main__":
    main()
