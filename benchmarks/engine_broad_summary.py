"""Summarize the broad set's records of one or two runs (CPU only).

    python3 benchmarks/engine_broad_summary.py --sha f55b3b567247 [--before ac16df0070a2]

Per candidate: geomean ratio to torch.mm, share of shapes >= 1.0, min, per shape class; the model's
pick against the best measured plan of the new kernel, and the routed call (what gemmlab.matmul runs: the
decode kernel where the router chose it) against the same; the oracle (best of everything measured); and,
with ``--before``, ``engine`` of both runs over the shapes both timed (what gemmlab.matmul ran then and
now), and the router's kernel choice against the alternatives timed beside it in the same run (``h11``,
``decode``, or the engine kernel's ``model`` plan where the decode kernel ran).

    python3 benchmarks/engine_broad_summary.py --runs 0a9a13b 933513a bb0d0cc
    python3 benchmarks/engine_broad_summary.py --file benchmarks/results/h100_span_heldout.jsonl --sha 492ccca \
        --pair model alt

``--runs``: what ``gemmlab.matmul`` ran (``engine``) over several runs of the set, shape by shape: each
run's bars (geomean, share >= 1.0, shapes under 0.95) and those of the per-shape median over the runs,
with the shapes whose median is under 1.0 and their range: a shape one run puts under a bar and the
others do not is the run's noise, not the class's.

``--pair A B``: a held-out check's verdict, candidate A against B (``model`` against ``alt``, ``plain``, ``no
evict``) over the shapes the run timed both, every pass counted: per shape the geomean of B's time over
torch.mm's in each pass against A's, so > 1 means A ran faster; the geomean over the shapes, how many moved
by more than 2% either way, and the extremes.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

from gemmlab.broad_shapes import classify  # noqa: E402
from gemmlab.record_files import load_records  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "engine_broad.jsonl.gz"


def gm(xs) -> float:
    return math.exp(statistics.fmean(map(math.log, xs)))


def line(name: str, xs: list[float]) -> str:
    return (f"  {name:28s} {gm(xs):.3f}  >=1.0: {sum(x >= 1 for x in xs) / len(xs):4.0%}  min {min(xs):.3f}  "
            f"({len(xs)} shapes)")


def load(path: Path, sha: str) -> dict:
    by = defaultdict(dict)
    for r in load_records(path):
        if str(r.get("git_sha", "")).startswith(sha) and r.get("ratio"):
            if r.get("cls") == "adhoc":  # engine_broad.py --shapes before session 54: the class its size gives
                r = {**r, "cls": classify(r["M"], r["N"], r["K"])}
            by[(r["M"], r["N"], r["K"])][r["candidate"]] = r
    return by


def pair(path: Path, sha: str, a: str, b: str) -> None:
    """``--pair``: candidate ``a`` against ``b`` shape by shape, every pass of the run (the docstring)."""
    times = defaultdict(lambda: defaultdict(list))
    for r in load_records(path):
        if str(r.get("git_sha", "")).startswith(sha) and r.get("candidate") in (a, b) and r.get("baseline_ms"):
            times[(r["M"], r["N"], r["K"])][r["candidate"]].append(r["time_ms"] / r["baseline_ms"])
    gains = sorted((gm(d[b]) / gm(d[a]), s) for s, d in times.items() if a in d and b in d)
    if not gains:
        print(f"no shape of {sha} has both {a!r} and {b!r}")
        return
    xs = [g for g, _ in gains]
    print(f"{a} against {b} over {len(xs)} shapes (run {sha}): x{gm(xs):.4f}, {a} faster by more than 2% on "
          f"{sum(x > 1.02 for x in xs)}, slower by more than 2% on {sum(x < 0.98 for x in xs)}")
    for g, s in gains if len(gains) <= 6 else gains[:3] + gains[-3:]:
        print(f"  {'x'.join(map(str, s)):18s} x{g:.3f}")


def bars(xs: list[float]) -> str:
    return f"{gm(xs):.3f}  >=1.0: {sum(x >= 1 for x in xs) / len(xs):5.1%}  under 0.95: {sum(x < 0.95 for x in xs)}"


def across(path: Path, shas: list[str]) -> None:
    """``--runs``: the routed call's ratio per shape over the runs ``shas`` (the shapes every run timed)."""
    runs = {sha: load(path, sha) for sha in shas}
    shapes = set.intersection(*({s for s, d in run.items() if "engine" in d} for run in runs.values()))
    if not shapes:
        print("no shape has an engine record in every run (are the shas' prefixes right?)")
        return
    for sha, run in runs.items():
        print(f"  {sha:12s} {bars([run[s]['engine']['ratio'] for s in shapes])}")
    per = {s: sorted(run[s]["engine"]["ratio"] for run in runs.values()) for s in shapes}
    med = {s: statistics.median(xs) for s, xs in per.items()}
    print(f"  {'median':12s} {bars(list(med.values()))}  ({len(shapes)} shapes, {len(runs)} runs)")
    first = next(iter(runs.values()))
    for cls in sorted({first[s]["engine"]["cls"] for s in shapes}):
        cs = [s for s in shapes if first[s]["engine"]["cls"] == cls]
        print(f"  {'  ' + cls:12s} {bars([med[s] for s in cs])}  ({len(cs)} shapes)")
    print("shapes whose median is under 1.0 (median [min - max] over the runs):")
    for s in sorted((s for s in shapes if med[s] < 1.0), key=med.get):
        print(f"  {med[s]:.3f} [{per[s][0]:.3f} - {per[s][-1]:.3f}] {s} {first[s]['engine']['cls']}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sha", help="a run's git sha, or a prefix of it")
    p.add_argument("--before", default=None, help="an earlier run's sha, compared over the shapes both timed")
    p.add_argument("--runs", nargs="+", default=None, metavar="SHA",
                   help="several runs' shas: the routed call over them")
    p.add_argument("--file", type=Path, default=RESULTS)
    p.add_argument("--pair", nargs=2, metavar=("A", "B"), help="with --sha: candidate A against B, shape by shape")
    args = p.parse_args()
    if args.pair:
        if not args.sha:
            p.error("--pair needs --sha")
        pair(args.file, args.sha, *args.pair)
        return
    if args.runs:
        across(args.file, args.runs)
        return
    if not args.sha:
        p.error("give --sha (one run) or --runs (several)")
    now = load(args.file, args.sha)
    print(f"{args.sha}: {len(now)} shapes")
    cands = sorted({c for d in now.values() for c in d})
    for c in cands:
        print(line(c, [d[c]["ratio"] for d in now.values() if c in d]))
    new = lambda d: [r["ratio"] for k, r in d.items() if k not in ("engine", "h11", "decode")]  # noqa: E731
    loss = [max(new(d)) / d["model"]["ratio"] for d in now.values() if "model" in d]
    print(f"  model pick / best measured new-kernel plan: geomean {gm(loss):.3f}, worst {max(loss):.3f}")
    # What users run: the routed call ("engine": the model's plan, or the decode kernel or h11 where the router
    # priced those ahead) against the best engine-kernel plan timed beside it. The decode-routed shapes' own
    # engine-kernel picks above are plans gemmlab.matmul never runs.
    routed = [max(new(d)) / d["engine"]["ratio"] for d in now.values() if "engine" in d and new(d)]
    if routed:
        print(f"  routed call / best measured new-kernel plan ({len(routed)} shapes): geomean {gm(routed):.3f}, "
              f"worst {max(routed):.3f}")
    # The run's own noise: where the router ran the engine kernel, "engine" and "model" are the same plan
    # timed twice in one interleaved run (through gemmlab.matmul and with the plan given).
    twice = sorted((abs(math.log(d["engine"]["time_ms"] / d["model"]["time_ms"])), s) for s, d in now.items()
                   if "model" in d and d.get("engine", {}).get("kernel") == "engine")
    if twice:
        logs = [x for x, _ in twice]
        print(f"  the same plan timed twice (engine / model, {len(twice)} shapes): |log| median "
              f"{logs[len(logs) // 2]:.3f}, 90th percentile {logs[int(0.9 * (len(logs) - 1))]:.3f}, max "
              f"{logs[-1]:.3f} at {twice[-1][1]}")
    print(line("oracle (best of all)", [max(r["ratio"] for r in d.values()) for d in now.values()]))
    kinds = defaultdict(list)
    for d in now.values():
        e = d.get("engine")
        if e and "kernel" in e:
            kinds[e["kernel"]].append(d)
    for kind, ds in sorted(kinds.items()):
        print(f"router ran {kind} on {len(ds)} shapes:")
        print(line("engine (routed)", [d["engine"]["ratio"] for d in ds]))
        # The alternatives timed beside the routed kernel: h11 where the engine kernel ran, the decode
        # kernel where it was priced out, the engine kernel's best plan ("model") where the decode kernel ran.
        for other in {"engine": ("h11", "decode"), "decode": ("model",), "h11": ()}.get(kind, ()):
            both = [d for d in ds if other in d]
            if both:
                print(line(f"{other} on {len(both)} of them", [d[other]["ratio"] for d in both]))
                print(line(f"routed / {other}", [d["engine"]["ratio"] / d[other]["ratio"] for d in both]))
    classes = sorted({next(iter(d.values()))["cls"] for d in now.values()})
    for cls in classes:
        ds = [d for d in now.values() if next(iter(d.values()))["cls"] == cls]
        print(f"class {cls}:")
        print(line("engine (routed)", [d["engine"]["ratio"] for d in ds if "engine" in d]))
    if args.before:
        old = load(args.file, args.before)
        common = [s for s in now if s in old and "engine" in now[s] and "engine" in old[s]]
        print(f"engine then ({args.before}) and now ({args.sha}) over the {len(common)} shapes both timed:")
        if not common:
            print("  none (is the earlier sha's prefix right? records carry the sha they were run at)")
            return
        print(line("then", [old[s]["engine"]["ratio"] for s in common]))
        print(line("now", [now[s]["engine"]["ratio"] for s in common]))
        print(line("oracle then (all candidates)", [max(r["ratio"] for r in old[s].values()) for s in common]))
        for cls in classes:
            cs = [s for s in common if now[s]["engine"]["cls"] == cls]
            if cs:
                print(f"  {cls:10s} then {gm([old[s]['engine']['ratio'] for s in cs]):.3f}  now "
                      f"{gm([now[s]['engine']['ratio'] for s in cs]):.3f}  ({len(cs)} shapes)")
        worse = sorted(common, key=lambda s: now[s]["engine"]["ratio"] / old[s]["engine"]["ratio"])[:8]
        print("largest losses now / then:")
        for s in worse:
            print(f"  {s} {now[s]['engine'].get('kernel')}: {old[s]['engine']['ratio']:.3f} -> "
                  f"{now[s]['engine']['ratio']:.3f}")


if __name__ == "__main__":
    main()
