"""``gemmlab bench`` (time steps or ``gemmlab.matmul`` on a GPU, append JSON-line records) and ``gemmlab plot``
(records back as a table and plots; no GPU)."""

from __future__ import annotations

import math
from pathlib import Path

from .common import console, emit_json, num, output_dir, progress, require_gpu, shape_str, table
from .parser import MATMUL_PREFIX, UsageError, parse_config


def run(args) -> int:
    return _plot(args) if args.command == "plot" else _bench(args)


# Timing ---------------------------------------------------------------------------------------------------------

def run_job(job, suite: str, rounds: int, out) -> list[dict]:
    """``bench_shape`` for one job; if a step fails (launch error, ...), time the others one by one."""
    from .. import bench

    try:
        return bench.bench_shape(job.ladder, *job.shape, job.steps, suite=suite, rounds=rounds)
    except Exception as e:  # noqa: BLE001 - reported, then the steps are retried alone
        if len(job.steps) == 1:
            out.print(f"[red]{job.steps[0][0].name} at {shape_str(job.shape)} failed: {e}[/red]")
            return []
        out.print(f"[yellow]{job.describe()} failed ({type(e).__name__}); timing its steps one by one[/yellow]")
    done = []
    for step in job.steps:
        try:
            done += bench.bench_shape(job.ladder, *job.shape, [step], suite=suite, rounds=rounds)
        except Exception as e:  # noqa: BLE001
            out.print(f"[red]{step[0].name} at {shape_str(job.shape)} failed: {e}[/red]")
    return done


def record_line(r: dict) -> str:
    """One plain line per record as it arrives (logs of a run cut by a time limit still show it)."""
    name = r.get("case") or str(r["kernel"]).split(".", 1)[-1]
    cfg = ",".join(f"{k}={v}" for k, v in (r.get("config") or {}).items())
    head = f"{name}{f' [{cfg}]' if cfg else ''} {r['M']}x{r['N']}x{r['K']}:"
    clock = f"{r['sm_clock_mhz']:.0f} MHz" if r.get("sm_clock_mhz") else "clock unknown"
    base = "torch" if r["kernel"] == "gemmlab.matmul" else "cuBLAS"
    if not r.get("tflops"):
        return f"{head} wrong (err {r['rel_error']:.1e}), {base} {r['baseline_tflops']:.1f} TFLOP/s"
    gbps = f" ({r['gbps']:.0f} GB/s)" if r.get("gbps") else ""
    return (f"{head} {r['tflops']:.1f} TFLOP/s{gbps}, {base} {r['baseline_tflops']:.1f}, x{r['ratio']:.3f}, "
            f"err {r['rel_error']:.1e}, {clock}")


def _skipped(jobs, specs, shapes, sm_count: int, config: dict | None) -> list[str]:
    """Named steps left out at a shape (the suites skip what a step cannot run), with the reason.
    ``shapes`` empty: the ladder suite's own shape for each step."""
    from ..suites import LADDER_SHAPE, base_config

    timed = {(s.name, job.shape) for job in jobs for s, _ in job.steps}
    notes = []
    for spec in specs:
        for shape in shapes or [tuple(spec.extra.get("bench_shape", LADDER_SHAPE))]:
            if (spec.name, shape) not in timed:
                why = spec.why_unsupported(*shape, base_config(spec, *shape, sm_count, config))
                notes.append(f"{spec.short} skipped at {shape_str(shape)}: {why}")
    return notes


def _bench(args) -> int:
    from ..reports import find_step

    shapes = ([args.shape] if args.shape else []) + (args.shapes or []) + (args.sizes or [])
    kernels = [k.strip() for item in args.kernel or [] for k in item.split(",") if k.strip()] or None
    config = parse_config(args.config)
    configs = args.configs or []
    if args.suite and args.suite.startswith(MATMUL_PREFIX):
        given = [opt for opt, val in (("--shape/--shapes/--sizes", shapes), ("--steps", kernels),
                                      ("--ladder", args.ladder), ("--config", config), ("--configs", configs)) if val]
        if given:
            raise UsageError(f"{', '.join(given)}: not for --suite {args.suite} (its cases are fixed "
                             "gemmlab.matmul problems; see gemmlab.matmul_suites)")
        require_gpu("timing")
        return _bench_matmul(args, args.suite[len(MATMUL_PREFIX):])

    specs = [find_step(k) for k in kernels or []]
    for spec in specs:
        if args.ladder and spec.ladder != args.ladder:
            raise UsageError(f"--steps {spec.short}: not a step of the {args.ladder} ladder")
    if config and not kernels:
        raise UsageError("--config sets parameters of the named steps: add --steps STEP (or use --configs, "
                         "which every step that has the parameters tries)")
    require_gpu("timing")
    from .. import gpu, suites
    from ..bench import append_records
    from ..reports import records as rec_reports

    out = console(stderr=args.json)  # with --json, stdout holds only the JSON
    sm_count = gpu.gpu_info().sm_count
    names = [s.name for s in specs] or None
    ladders = [args.ladder] if args.ladder else None
    suite = args.suite or ("explicit" if shapes else "ladder")
    common = dict(ladders=ladders, configs=configs, sm_count=sm_count)
    if suite == "square":
        shapes = shapes or [(n, n, n) for n in suites.SQUARE_SIZES]
        jobs = suites.square_suite(shapes, names, config, **common)
    elif shapes:
        jobs = suites.explicit(shapes, names, config, **common)
    else:
        jobs = suites.ladder_suite(None, kernels=names, config=config, **common)
    for note in _skipped(jobs, specs, shapes, sm_count, config):
        out.print(f"[yellow]{note}[/yellow]")
    if not jobs:
        out.print("nothing to run: no registered step supports the requested shapes")
        return 1
    label = args.suite_name or suite
    path = Path(args.out) if args.out else output_dir() / "results" / f"{label}.jsonl"
    records = []
    with progress("bench", len(jobs)) as step:
        for job in jobs:
            step(f"timing {job.describe()}")
            recs = [rec_reports.add_model(r) for r in run_job(job, label, args.rounds, out)]
            append_records(path, recs)
            for r in recs:
                out.print(record_line(r), markup=False, highlight=False, soft_wrap=True)
            records += recs
    if args.json:
        emit_json(records)
        return 0
    _print_records(out, records, f"{label}: {len(records)} records appended to {path}")
    if not args.no_plots:
        from ..plots import plot_records

        paths = plot_records(records, Path(args.plots) if args.plots else output_dir() / "plots" / label)
        if paths:
            out.print("plots: " + ", ".join(str(p) for p in paths), markup=False, highlight=False)
    return 0


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _bench_matmul(args, name: str) -> int:
    """Time ``gemmlab.matmul`` against torch on every case of a ``gemmlab.matmul_suites`` suite."""
    if name == "eager":
        return _bench_eager(args)

    from .. import bench
    from ..matmul_suites import suite as matmul_suite

    out = console(stderr=args.json)  # with --json, stdout holds only the JSON
    label = args.suite_name or name
    path = Path(args.out) if args.out else output_dir() / "results" / "matmul.jsonl"
    cases = matmul_suite(name)
    records = []
    with progress("bench", len(cases)) as step:
        for case in cases:
            step(f"timing {case.name}")
            try:
                rec = bench.bench_matmul(case.M, case.N, case.K, bias=case.bias, activation=case.activation,
                                         suite=label, rounds=args.rounds, extra={"case": case.name})
            except Exception as e:  # noqa: BLE001 - reported; the other cases still run
                out.print(f"[red]{case.name} failed: {e}[/red]")
            else:
                bench.append_records(path, [rec])
                records.append(rec)
                out.print(record_line(rec), markup=False, highlight=False, soft_wrap=True)
    if not records:
        out.print(f"{name}: no case ran")
        return 1
    if args.json:
        emit_json(records)
        return 0
    t = table(f"matmul {name}: {len(records)} records appended to {path}")
    for col in ("case", "TFLOP/s", "GB/s", "torch TFLOP/s", "x torch", "rel err", "SM MHz"):
        t.add_column(col)
    for r in records:
        t.add_row(r["case"], f"{r['tflops']:.1f}", f"{r['gbps']:.0f}", f"{r['baseline_tflops']:.1f}",
                  f"{r['ratio']:.3f}", f"{r['rel_error']:.1e}", num(r.get("sm_clock_mhz"), ".0f"))
    out.print(t)
    ratios = [r["ratio"] for r in records]
    out.print(f"{name}: geomean x{_geomean(ratios):.3f}, min x{min(ratios):.3f} over {len(ratios)} cases")
    return 0


def _bench_eager(args) -> int:
    """The eager suite: per call (host and wall time) on every ``matmul_suites.EAGER`` case in bf16 and
    fp16, then the 7B layer stack at batch 1 and 16."""
    import torch

    from .. import bench
    from ..matmul_suites import EAGER

    out = console(stderr=args.json)
    path = Path(args.out) if args.out else output_dir() / "results" / "eager.jsonl"
    jobs = [("case", c, dt) for dt in (torch.bfloat16, torch.float16) for c in EAGER]
    jobs += [("stack", m, dt) for dt in (torch.bfloat16, torch.float16) for m in (1, 16)]
    records = []
    with progress("bench", len(jobs)) as step:
        for kind, what, dtype in jobs:
            label = f"{what.name} {dtype}" if kind == "case" else f"7B layer stack M={what} {dtype}"
            step(f"timing {label}")
            try:
                rec = (bench.bench_eager(what.M, what.N, what.K, dtype=dtype, extra={"case": what.name})
                       if kind == "case" else bench.bench_eager_stack(what, dtype=dtype))
            except Exception as e:  # noqa: BLE001 - reported; the other cases still run
                out.print(f"[red]{label} failed: {e}[/red]")
                continue
            bench.append_records(path, [rec])
            records.append(rec)
            out.print(f"{label}: host {rec['host_us']:.1f} us (torch {rec['baseline_host_us']:.1f}), wall "
                      f"{rec['wall_us']:.1f} us (torch {rec['baseline_wall_us']:.1f}), x{rec['ratio']:.3f}",
                      markup=False, highlight=False)
    if not records:
        out.print("eager: no case ran")
        return 1
    if args.json:
        emit_json(records)
        return 0
    excess = [r["host_excess_us"] for r in records]
    out.print(f"eager: {len(records)} records appended to {path}; host time over torch's: median "
              f"{sorted(excess)[len(excess) // 2]:+.1f} us, largest {max(excess):+.1f} us; wall time x torch: "
              f"geomean {_geomean([r['ratio'] for r in records]):.3f}")
    return 0


# Records back ---------------------------------------------------------------------------------------------------

def _print_records(out, records: list[dict], title: str) -> None:
    from ..reports.records import record_rows

    t = table(title)
    for col in ("kernel", "shape", "TFLOP/s", "baseline", "ratio", "% SOL", "GB/s", "model", "meas/model", "SM MHz",
                "rel err"):
        t.add_column(col)
    for r in record_rows(records):
        t.add_row(r.kernel, r.shape, num(r.tflops, ".1f", "[red]wrong[/red]" if not r.correct else "-"),
                  num(r.baseline_tflops, ".1f"), num(r.ratio, ".3f"), num(r.sol_fraction, ".0%"), num(r.gbps, ".0f"),
                  num(r.model_tflops, ".1f"), num(r.measured_over_model, ".2f"), num(r.sm_clock_mhz, ".0f"),
                  num(r.rel_error, ".1e"))
    out.print(t)


def _plot(args) -> int:
    from ..reports import records as rec_reports

    records, notes = rec_reports.read_records(args.records)
    if not args.no_model:  # records written before the model existed: predict them now (compiles, no GPU)
        records = [r if r.get("model_tflops") else rec_reports.add_model(dict(r)) for r in records]
    if args.json:
        emit_json({"rows": rec_reports.record_rows(records), "notes": notes})
        return 0
    out = console(stderr=args.json)  # with --json, stdout holds only the JSON
    for note in notes:
        out.print(f"[yellow]{note}[/yellow]")
    _print_records(out, records, f"{len(records)} records from {', '.join(args.records)}")
    if args.no_plots:
        return 0
    from ..plots import plot_records

    paths = plot_records(records, Path(args.out) if args.out else output_dir() / "plots", formats=tuple(args.format))
    out.print("plots: " + (", ".join(str(p) for p in paths) or "none (no timed records)"), markup=False,
              highlight=False)
    return 0
