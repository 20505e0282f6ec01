"""Regenerate what the README and docs/ show from the committed records (no GPU needed).

    python benchmarks/readme_tables.py           # rewrite every <!-- results:NAME --> block, redraw benchmarks/plots
    python benchmarks/readme_tables.py --check   # exit 1 when a block or a plot is not what the records give
    python benchmarks/readme_tables.py --cli     # also rerun the commands of the <!-- cli: ARGS --> blocks

Tables and plots are built from benchmarks/results/*.jsonl (and *.jsonl.gz) only; numbers are never typed by
hand. A plot is current when its fingerprint (``gemmlab.figures.fingerprint``: what it draws, not its pixels)
matches benchmarks/plots/figures.json. The cli blocks hold a command's output on this machine (without a GPU:
the static view); ``--check`` leaves them alone, since registers and timings move with the toolchain.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import re
import shlex
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PLOTS = ROOT / "benchmarks" / "plots"
DOCS = (ROOT / "README.md", ROOT / "docs" / "results.md", ROOT / "docs" / "cli.md")
SIZES = (4096, 8192)
CLI_COLUMNS = 140  # the width of the command outputs shown in docs/


def load(name: str) -> list[dict]:
    """The records of ``results/NAME`` (``X.jsonl`` reads ``X.jsonl.gz`` where only that exists); none if
    neither is there."""
    from gemmlab.record_files import load_records

    try:
        return load_records(RESULTS / name)
    except FileNotFoundError:
        return []


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


def _spec(kernel: str):
    from gemmlab import registry

    try:
        return registry.get(kernel)
    except KeyError:
        return None


def _step_config(kernel: str, M: int, N: int, K: int) -> dict | None:
    """The config a registered step picks for a shape today (its heuristic over the defaults), or None
    for a step that is no longer registered."""
    spec = _spec(kernel)
    return spec.config_for(M, N, K, 132, tuned=False) if spec else None


# The selections: one record per (step, size), the same for a table and its plot ---------------------------------

def ladder_records(records: list[dict], sizes=SIZES) -> dict[tuple[str, int], dict]:
    """(step, n) -> the newest record at n^3 of the config the step picks today (not the A/B variants)."""
    return latest(records, lambda r: (r["kernel"], r["M"]) if (
        r.get("tflops") and r["M"] == r["N"] == r["K"] and r["M"] in sizes and _spec(r["kernel"])
        and r.get("config") == _step_config(r["kernel"], r["M"], r["N"], r["K"])) else None)


def sweep_records(records: list[dict]) -> dict[tuple[str, int], dict]:
    """(step, n) -> the newest run's record at n^3 (the heuristic's config of each size)."""
    run = records[-1]["git_sha"]
    return latest(records, lambda r: (r["kernel"], r["M"]) if (
        r["git_sha"] == run and r.get("ratio") and r["M"] == r["N"] == r["K"] and _spec(r["kernel"])
        and r.get("config") == _step_config(r["kernel"], r["M"], r["N"], r["K"])) else None)


def _steps(selected) -> list[str]:
    return sorted({k for k, _ in selected}, key=lambda k: _spec(k).step)


def _shas(records, short: bool = False) -> str:
    return ", ".join(sorted({r["git_sha"][:7] if short else r["git_sha"] for r in records}))


# Tables -------------------------------------------------------------------------------------------------------

def ladder_table(records: list[dict], sizes=SIZES) -> str:
    """Every step: what it adds, TFLOP/s and the ratio to cuBLAS at each size; cuBLAS of the newest run."""
    sel = ladder_records(records, sizes)
    head = "| step | adds | " + " | ".join(f"{n}^3 TFLOP/s (x cuBLAS)" for n in sizes) + " |"
    rows = [head, "|---|---|" + "---|" * len(sizes)]
    for name in _steps(sel):
        cells = []
        for n in sizes:
            r = sel.get((name, n))
            cells.append(f"{r['tflops']:.{0 if r['tflops'] >= 10 else 1}f} ({r['ratio']:.2f}x)" if r else "")
        rows.append(f"| `{_spec(name).short}` | {_spec(name).technique} | " + " | ".join(cells) + " |")
    base = latest(list(sel.values()), lambda r: r["M"])  # cuBLAS of the newest run at each size
    rows.append("| cuBLAS | `torch.mm` | " + " | ".join(
        f"{base[n]['baseline_tflops']:.0f} at {base[n]['sm_clock_mhz']:.0f} MHz (newest run)" if n in base else ""
        for n in sizes) + " |")
    recs = list(sel.values())
    return "\n".join(rows) + f"\n\nRecords: git {_shas(recs)}; GPU {recs[0]['gpu']} (SM clock as recorded).\n"


def ladder_compact(records: list[dict], sizes=SIZES) -> str:
    """The README's ladder table: each step, what it adds, and its ratio to cuBLAS at each size."""
    sel = ladder_records(records, sizes)
    rows = ["| step | adds | " + " | ".join(f"x cuBLAS {n}^3" for n in sizes) + " |", "|---|---|" + "---|" * len(sizes)]
    for name in _steps(sel):
        cells = [f"{sel[(name, n)]['ratio']:.2f}" if (name, n) in sel else "" for n in sizes]
        rows.append(f"| `{_spec(name).short}` | {_spec(name).technique} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def sweep_table(records: list[dict]) -> str:
    """The newest run's sweep, one column group per step in it (the heuristic's config of each size)."""
    sel = sweep_records(records)
    steps = _steps(sel)
    sizes = sorted({n for _, n in sel})
    rows = ["| size | cuBLAS TFLOP/s | " + " | ".join(f"{k.split('.')[-1]} TFLOP/s (x cuBLAS)" for k in steps)
            + " | SM MHz |", "|---|---|" + "---|" * len(steps) + "---|"]
    for n in sizes:
        rs = [sel.get((k, n)) for k in steps]
        first = next(r for r in rs if r)
        rows.append(f"| {n}^3 | {first['baseline_tflops']:.0f} | " + " | ".join(
            f"{r['tflops']:.0f} ({r['ratio']:.3f}x)" if r else "" for r in rs) + f" | {first['sm_clock_mhz']:.0f} |")
    rows.append("")
    for k in steps:
        ratio = {n: sel[(k, n)]["ratio"] for n in sizes if (k, n) in sel}
        rows.append(f"{k.split('.')[-1]}: geomean 4096..16384 **{geomean([v for n, v in ratio.items() if n >= 4096]):.3f}x**, "
                    f"minimum from 2048 **{min(v for n, v in ratio.items() if n >= 2048):.3f}x**.  ")
    return "\n".join(rows) + f"\nRecords: git {records[-1]['git_sha']} (one interleaved run).\n"


def matmul_suites(records: list[dict]) -> dict[str, list[dict]]:
    """suite -> the newest record of each of its cases. `prefill` and `decode` are the halves of `llm`: a
    separate run of one is kept only while it is newer, and `llm` only while one of them is not."""
    records = list(latest(records, lambda r: (r["suite"], r.get("case"), r["M"], r["N"], r["K"])).values())
    suites = defaultdict(list)
    for r in records:
        suites[r["suite"]].append(r)
    llm_time = max((r["time"] for r in suites.get("llm", [])), default="")
    for half in ("prefill", "decode"):
        if half in suites and max(r["time"] for r in suites[half]) < llm_time:
            del suites[half]
    if "llm" in suites and all(half in suites for half in ("prefill", "decode")):
        del suites["llm"]  # both halves ran since: its cases are timed anew there
    return dict(suites)


def matmul_table(records: list[dict]) -> str:
    suites = matmul_suites(records)
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
        rows.append(f"| {name} | {len(rs)} | {geomean(ratios):.3f} | {min(ratios):.3f} | {max(ratios):.3f} | "
                    f"{'; '.join(notes)} | {_shas(rs, short=True)} |")
    kept = [r for rs in suites.values() for r in rs]
    detail = ["", "| case | TFLOP/s | torch TFLOP/s | x torch |", "|---|---|---|---|"]
    for r in kept:
        if r["suite"] in ("unaligned", "epilogue"):
            detail.append(f"| {r.get('case', r['M'])} | {r['tflops']:.0f} | {r['baseline_tflops']:.0f} | {r['ratio']:.2f} |")
    return "\n".join(rows + detail) + f"\n\nRecords: git {_shas(kept)}.\n"


def eager_runs(records: list[dict]) -> dict[str, dict[str, list[dict]]]:
    """git sha -> {"per_call": [...], "stack": [...]} of the eager records (``gemmlab bench --suite
    matmul-eager``, benchmarks/eager_host.py), in file order. Runs with programmatic dependent launch
    turned off (``GEMMLAB_PDL=0``, an A/B's other side: ``"pdl": false``) are not the library's default."""
    runs: dict[str, dict[str, list[dict]]] = {}
    for r in records:
        if r.get("kind") in ("per_call", "stack") and "baseline_host_us" in r and r.get("pdl", True):
            runs.setdefault(r["git_sha"], {"per_call": [], "stack": []})[r["kind"]].append(r)
    return runs


def _wall_ratio(r: dict) -> float:
    return r["ratio"] if "ratio" in r else r["wall_ratio"]  # early records named it wall_ratio


def eager_table(records: list[dict]) -> str:
    """Per run and dtype: host time of one eager call against torch's, and the eager wall-time ratio."""
    rows = ["| run | dtype | calls | host us, median (torch) | host over torch: median, max | eager wall x torch: "
            "geomean (min, max) | 7B layer stack x torch (batch 1, 16) | SM MHz |", "|---|---|---|---|---|---|---|---|"]
    for sha, kinds in eager_runs(records).items():
        for dtype in sorted({r["dtype"] for r in kinds["per_call"] + kinds["stack"]}):
            rs = [r for r in kinds["per_call"] if r["dtype"] == dtype]
            stack_rs = [r for r in kinds["stack"] if r["dtype"] == dtype]
            stack: dict[int, list[float]] = {}
            for r in stack_rs:  # a run may repeat the stack (separate processes): the median, and how many
                stack.setdefault(r["M"], []).append(_wall_ratio(r))
            stack_cell = ", ".join(f"{statistics.median(stack[m]):.2f}x" for m in sorted(stack)) or "-"
            if any(len(v) > 1 for v in stack.values()):
                stack_cell += f" (median of {max(map(len, stack.values()))})"
            clock = (rs or stack_rs)[0].get("sm_clock_mhz") or "-"
            if not rs:  # a stack-only run (eager_host.py --stack-only)
                rows.append(f"| {sha[:7]} | {dtype} | - | - | - | - | {stack_cell} | {clock} |")
                continue
            host = sorted(r["host_us"] for r in rs)
            base = sorted(r["baseline_host_us"] for r in rs)
            excess = sorted(r["host_us"] - r["baseline_host_us"] for r in rs)
            ratios = [_wall_ratio(r) for r in rs]
            rows.append(f"| {sha[:7]} | {dtype} | {len(rs)} | {host[len(host) // 2]:.1f} ({base[len(base) // 2]:.1f}) | "
                        f"{excess[len(excess) // 2]:+.1f}, {excess[-1]:+.1f} | {geomean(ratios):.3f} "
                        f"({min(ratios):.2f}, {max(ratios):.2f}) | {stack_cell} | {clock} |")
    return "\n".join(rows) + "\n"


def summary_table(hopper: list[dict], sweep: list[dict], sgemm: list[dict], matmul: list[dict],
                  eager: list[dict] | None = None) -> str:
    """The README's results: the last step of each ladder, the sweep, and gemmlab.matmul per suite."""
    rows = ["| what (H200, interleaved with the baseline in one run) | result |", "|---|---|"]
    for recs, what in ((hopper, "Hopper ladder, last step"), (sgemm, "fp32 ladder, last step")):
        sel = ladder_records(recs)
        last = _steps(sel)[-1]
        cells = ", ".join(f"{sel[(last, n)]['ratio']:.2f}x at {n}^3" for n in SIZES if (last, n) in sel)
        rows.append(f"| {what} (`{_spec(last).short}`) against cuBLAS | {cells} |")
    sel = sweep_records(sweep)
    for k in _steps(sel):
        ratios = [r["ratio"] for (step, n), r in sel.items() if step == k and n >= 4096]
        rows.append(f"| `{k.split('.')[-1]}` on squares 4096^3..16384^3 against cuBLAS | {geomean(ratios):.3f}x geomean "
                    f"({len(ratios)} sizes) |")
    for name, rs in matmul_suites(matmul).items():
        ratios = [r["ratio"] for r in rs]
        rows.append(f"| `gemmlab.matmul`, suite `{name}` ({len(rs)} cases, run {_shas(rs, short=True)}) "
                    f"against torch | {geomean(ratios):.3f}x geomean ({min(ratios):.2f}x to {max(ratios):.2f}x) |")
    runs = {sha: kinds for sha, kinds in eager_runs(eager or []).items() if kinds["per_call"]}
    if runs:
        sha, kinds = list(runs.items())[-1]
        rs = kinds["per_call"]
        excess = sorted(r["host_us"] - r["baseline_host_us"] for r in rs)
        rows.append(f"| `gemmlab.matmul` eager (no graphs; {len(rs)} decode and small prefill calls, run {sha[:7]}) "
                    f"against torch.mm | host time per call {excess[len(excess) // 2]:+.1f} us over torch's (median), "
                    f"wall time {geomean([_wall_ratio(r) for r in rs]):.3f}x geomean |")
    return "\n".join(rows) + "\n"


def broad_run(records: list[dict], candidate: str = "engine", min_shapes: int = 150) -> list[dict]:
    """The newest run (git sha) of ``benchmarks/engine_broad.py`` that timed ``candidate`` (what
    gemmlab.matmul runs) on at least ``min_shapes`` shapes of the broad set (half of it: the script runs
    the shapes in a fixed shuffled order, so a run its time budget cut short still samples every class):
    one record per shape."""
    runs: dict[str, dict] = defaultdict(dict)
    for r in records:
        if r.get("candidate") == candidate and r.get("correct") and r.get("ratio"):
            runs[r["git_sha"]][(r["M"], r["N"], r["K"])] = r
    full = [sha for sha, shapes in runs.items() if len(shapes) >= min_shapes]
    return list(runs[full[-1]].values()) if full else []


def broad_table(records: list[dict], min_shapes: int = 150) -> str:
    rs = broad_run(records, min_shapes=min_shapes)
    if not rs:
        return "(no full run of benchmarks/engine_broad.py recorded)\n"
    rows = ["| class | shapes | geomean | >= 1.0x | min | max |", "|---|---|---|---|---|---|"]
    from gemmlab.plots import CLASS_ORDER

    for cls in [c for c in CLASS_ORDER if any(r["cls"] == c for r in rs)] + ["all"]:
        sel = [r["ratio"] for r in rs if cls in ("all", r["cls"])]
        rows.append(f"| {cls} | {len(sel)} | {geomean(sel):.3f}x | {sum(x >= 1.0 for x in sel) / len(sel):.0%} "
                    f"| {min(sel):.2f}x | {max(sel):.2f}x |")
    total = len(json.loads((ROOT / "benchmarks" / "shapes" / "broad.json").read_text())["cases"])
    cut = "" if len(rs) >= total else f"; {len(rs)} of the {total} shapes, the rest cut by the run's time budget"
    return (f"`gemmlab.matmul`'s route on the broad set (run {rs[0]['git_sha'][:7]}, {rs[0]['gpu']}, "
            f"`benchmarks/engine_broad.py`{cut}), ratio to torch.mm:\n\n" + "\n".join(rows) + "\n")


def _blocks() -> dict:
    hopper, sweep = load("hopper_ladder.jsonl"), load("hopper_sweep.jsonl")
    sgemm, matmul, eager = load("sgemm_ladder.jsonl"), load("matmul.jsonl"), load("eager.jsonl")
    broad = load("engine_broad.jsonl.gz")
    return {
        "broad": lambda: broad_table(broad),
        "summary": lambda: summary_table(hopper, sweep, sgemm, matmul, eager),
        "eager": lambda: eager_table(eager),
        "hopper-compact": lambda: ladder_compact(hopper),
        "sgemm-compact": lambda: ladder_compact(sgemm),
        "hopper-ladder": lambda: ladder_table(hopper),
        "hopper-sweep": lambda: sweep_table(sweep),
        "sgemm-ladder": lambda: ladder_table(sgemm),
        "matmul": lambda: matmul_table(matmul),
    }


# Plots ------------------------------------------------------------------------------------------------------------

def plots() -> dict:
    """name -> a function drawing that plot from the same selection as its table."""
    from gemmlab import plots as gp

    hopper, sweep, sgemm = load("hopper_ladder.jsonl"), load("hopper_sweep.jsonl"), load("sgemm_ladder.jsonl")
    broad = broad_run(load("engine_broad.jsonl.gz"))

    def at(sel, n):
        return [r for (_, size), r in sorted(sel.items(), key=lambda kv: _spec(kv[0][0]).step) if size == n]

    return {
        "hopper_ladder": lambda: gp.ladder_plot(at(ladder_records(hopper), 4096)),
        "sgemm_ladder": lambda: gp.ladder_plot(at(ladder_records(sgemm), 4096)),
        "hopper_sweep": lambda: gp.size_plot(list(sweep_records(sweep).values())),
        "hopper_roofline": lambda: gp.roofline_plot(list(ladder_records(hopper).values())),
        "broad_classes": lambda: gp.class_plot(broad, f"gemmlab.matmul on the broad set, run {broad[0]['git_sha'][:7]}"
                                               if broad else ""),
    }


# Rewriting --------------------------------------------------------------------------------------------------------

_RESULTS_BLOCK = re.compile(r"(<!-- results:([\w-]+) -->\n)(.*?)(<!-- /results:\2 -->)", re.S)
_CLI_BLOCK = re.compile(r"(<!-- cli: (.+?) -->\n```text\n)(.*?)(```\n<!-- /cli -->)", re.S)


def cli_output(args: str) -> str:
    """``gemmlab ARGS`` run here, its output as a reader's terminal would show it (CLI_COLUMNS wide)."""
    from gemmlab import cli

    os.environ["COLUMNS"] = str(CLI_COLUMNS)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        cli.main(shlex.split(args))
    lines = [line.rstrip() for line in buf.getvalue().splitlines()]
    return f"$ gemmlab {args}\n" + "\n".join(lines) + "\n"


def render(text: str, blocks: dict, with_cli: bool) -> str:
    text = _RESULTS_BLOCK.sub(lambda m: m.group(1) + blocks[m.group(2)]() + m.group(4), text)
    if with_cli:
        text = _CLI_BLOCK.sub(lambda m: m.group(1) + cli_output(m.group(2)) + m.group(4), text)
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if something is not current")
    ap.add_argument("--cli", action="store_true", help="also rerun the commands of the cli blocks")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    from gemmlab.figures import fingerprint, plt, read_manifest, save, write_manifest

    stale = []
    blocks = _blocks()
    for path in DOCS:
        if not path.exists():
            continue
        text = path.read_text()
        new = render(text, blocks, args.cli and not args.check)
        if new != text:
            stale.append(str(path.relative_to(ROOT)))
            if not args.check:
                path.write_text(new)
    recorded = read_manifest(PLOTS)
    prints = {}
    for name, draw in plots().items():
        fig = draw()
        prints[name] = fingerprint(fig)
        if prints[name] != recorded.get(name) or not (PLOTS / f"{name}.png").is_file():
            stale.append(f"benchmarks/plots/{name}.png")
            if not args.check:
                save(fig, PLOTS, name, ("png",))
        plt.close(fig)
    if not args.check:
        write_manifest(PLOTS, prints)
    if args.check and stale:
        print("not current (run python benchmarks/readme_tables.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
