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


def latest(records: list[dict], key) -> dict:
    """key(record) -> the last record with that key (the files are appended to, so the newest run wins)."""
    out = {}
    for r in records:
        k = key(r)
        if k is not None:
            out[k] = r
    return out


def _step_config(kernel: str, M: int, N: int, K: int) -> dict | None:
    """The config a registered step picks for a shape today (its heuristic over the defaults), or None
    for a step that is no longer registered."""
    from gemmlab import registry

    try:
        spec = registry.get(kernel)
    except KeyError:
        return None
    return spec.config_for(M, N, K, 132, tuned=False)


def ladder_table(records: list[dict], sizes=(4096, 8192)) -> str:
    from gemmlab import registry

    # Per (step, size): the newest record of the config the step picks today (not the A/B variants).
    newest = latest(records, lambda r: (r["kernel"], r["M"]) if (
        r.get("tflops") and r["M"] == r["N"] == r["K"] and r["M"] in sizes
        and r.get("config") == _step_config(r["kernel"], r["M"], r["N"], r["K"])) else None)
    by = defaultdict(dict)
    for (kernel, n), r in newest.items():
        by[kernel][n] = r
    records = list(newest.values())
    head = "| step | adds | " + " | ".join(f"{n}^3 TFLOP/s (x cuBLAS)" for n in sizes) + " |"
    rows = [head, "|---|---|" + "---|" * len(sizes)]
    for name in sorted(by, key=lambda k: registry.get(k).step):
        spec = registry.get(name)
        cells = []
        for n in sizes:
            r = by[name].get(n)
            cells.append(f"{r['tflops']:.{0 if r['tflops'] >= 10 else 1}f} ({r['ratio']:.2f}x)" if r else "")
        rows.append(f"| `{spec.short}` | {spec.technique} | " + " | ".join(cells) + " |")
    base = latest(records, lambda r: r["M"])  # cuBLAS of the newest run at each size
    rows.append("| cuBLAS | `torch.mm` | " + " | ".join(
        f"{base[n]['baseline_tflops']:.0f} at {base[n]['sm_clock_mhz']:.0f} MHz (newest run)" if n in base else ""
        for n in sizes) + " |")
    sha = sorted({r["git_sha"] for r in records})
    return "\n".join(rows) + f"\n\nRecords: git {', '.join(sha)}; GPU {records[0]['gpu']} (SM clock as recorded).\n"


def sweep_table(records: list[dict]) -> str:
    """The newest run's sweep, one column group per step in it (the heuristic's config of each size)."""
    run = records[-1]["git_sha"]
    newest = latest(records, lambda r: (r["kernel"], r["M"]) if (
        r["git_sha"] == run and r.get("ratio") and r["M"] == r["N"] == r["K"]
        and r.get("config") == _step_config(r["kernel"], r["M"], r["N"], r["K"])) else None)
    steps = sorted({k for k, _ in newest}, key=lambda k: _short_step(k))
    sizes = sorted({n for _, n in newest})
    rows = ["| size | cuBLAS TFLOP/s | " + " | ".join(f"{k.split('.')[-1]} TFLOP/s (x cuBLAS)" for k in steps)
            + " | SM MHz |", "|---|---|" + "---|" * len(steps) + "---|"]
    for n in sizes:
        rs = [newest.get((k, n)) for k in steps]
        first = next(r for r in rs if r)
        rows.append(f"| {n}^3 | {first['baseline_tflops']:.0f} | " + " | ".join(
            f"{r['tflops']:.0f} ({r['ratio']:.3f}x)" if r else "" for r in rs) + f" | {first['sm_clock_mhz']:.0f} |")
    rows.append("")
    for k in steps:
        ratio = {n: newest[(k, n)]["ratio"] for n in sizes if (k, n) in newest}
        rows.append(f"{k.split('.')[-1]}: geomean 4096..16384 **{geomean([v for n, v in ratio.items() if n >= 4096]):.3f}x**, "
                    f"minimum from 2048 **{min(v for n, v in ratio.items() if n >= 2048):.3f}x**.  ")
    return "\n".join(rows) + f"\nRecords: git {run} (one interleaved run).\n"


def _short_step(kernel: str) -> int:
    from gemmlab import registry

    return registry.get(kernel).step


def matmul_table(records: list[dict]) -> str:
    # The newest record of each case (per suite): an earlier run's number of a case is history.
    records = list(latest(records, lambda r: (r["suite"], r.get("case"), r["M"], r["N"], r["K"])).values())
    suites = defaultdict(list)
    for r in records:
        suites[r["suite"]].append(r)
    # `prefill` and `decode` are the halves of `llm`: a separate run of one is shown only while it is newer.
    llm_time = max((r["time"] for r in suites.get("llm", [])), default="")
    for half in ("prefill", "decode"):
        if half in suites and max(r["time"] for r in suites[half]) < llm_time:
            del suites[half]
    rows = ["| suite | cases | geomean x torch | min | max | note | run |", "|---|---|---|---|---|---|---|"]
    for name, rs in suites.items():
        ratios = [r["ratio"] for r in rs]
        notes = []
        pre = [r["ratio"] for r in rs if r["M"] > 128]
        dec = [r for r in rs if r["M"] <= 128]
        if name == "llm" and pre:
            notes.append(f"prefill {geomean(pre):.3f}x (min {min(pre):.3f})")
        if name in ("decode", "llm") and dec:
            notes.append(f"decode {geomean([r['ratio'] for r in dec]):.3f}x, up to {max(r['gbps'] for r in dec):.0f} GB/s")
        runs = sorted({r["git_sha"][:7] for r in rs})
        rows.append(f"| {name} | {len(rs)} | {geomean(ratios):.3f} | {min(ratios):.3f} | {max(ratios):.3f} | "
                    f"{'; '.join(notes)} | {', '.join(runs)} |")
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
