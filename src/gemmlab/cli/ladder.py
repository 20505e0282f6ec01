"""``gemmlab`` / ``gemmlab ladder``: both ladders step by step (``reports.compiled.ladder_rows``), timed
against cuBLAS on a GPU."""

from __future__ import annotations

from pathlib import Path

from .common import console, emit_json, has_gpu, num, output_dir, progress, shape_str, table

_LIMITER = {"registers": "regs", "shared memory": "smem", "threads": "thr", "blocks": "blk"}


def _sass_cell(row) -> str:
    if row.sass_claims_failed:
        return "FAIL: " + "; ".join(row.sass_claims_failed)
    return ", ".join(row.sass_new) or "-"


def run(args) -> int:
    from .. import model, registry
    from ..reports import compiled, records
    from .bench import run_job

    out = console(stderr=args.json)  # with --json, stdout holds only the JSON
    measure = has_gpu() and not args.no_time
    shape = args.shape
    profile = model.device_profile()
    lads = {n: lad for n, lad in registry.ladders().items() if not args.ladder or n == args.ladder}
    specs = [s for n in lads for s in registry.all_kernels(n)]

    with progress("compiling", len(specs)) as step:
        rows = compiled.ladder_rows(specs, shape, profile, args.clock, progress=lambda s: step(f"compiling {s.short}"))

    measured: list[dict] = []
    if measure:
        from .. import gpu, suites
        from ..bench import append_records

        broken = {r.kernel for r in rows if r.error}
        jobs = suites.ladder_suite([shape], list(lads), exclude=broken, sm_count=gpu.gpu_info().sm_count)
        with progress("timing", len(jobs)) as step:
            for job in jobs:
                step(f"timing {job.describe()}")
                measured += [records.add_model(r) for r in run_job(job, "ladder", args.rounds, out)]
        compiled.attach_measurements(rows, measured)
        if args.out:
            append_records(args.out, measured)

    clock = args.clock or profile.sm_clock_mhz
    if args.json:
        emit_json({"shape": list(shape), "profile": profile.name, "sm_count": profile.sm_count,
                   "clock_mhz": None if measure else clock, "measured": measure, "rows": rows})
        return 0
    _print_tables(out, lads, rows, shape, measure, "the recorded SM clock" if measure else f"{clock:.0f} MHz")
    out.print(f"Model: {profile.name} profile ({profile.sm_count} SMs); SASS: the features each step's SASS shows "
              "that the step before it lacks, or FAIL and the claims it misses; see `gemmlab inspect STEP`.")
    if not has_gpu():
        out.print("[yellow]No GPU visible: timings (TFLOP/s, ratio to cuBLAS) need an NVIDIA GPU; "
                  "this is the static view (compile, resources, SASS checks, model).[/yellow]")
    elif measured:
        from ..figures import save
        from ..plots import ladder_plot

        fig = ladder_plot(measured)
        if fig is not None:
            paths = save(fig, Path(args.plot_dir or output_dir() / "plots"), "ladder")
            out.print(f"ladder plot: {', '.join(map(str, paths))}", markup=False, highlight=False)
    return 0


def _print_tables(out, lads, rows, shape, measure: bool, clock_note: str) -> None:
    for lad_name, lad in lads.items():
        t = table(f"{lad_name}: {lad.title} ({lad.layout}: {lad.layout_doc})\n"
                  f"model = predicted TFLOP/s at {shape_str(shape)}, {clock_note}", expand=False)
        t.add_column("step", no_wrap=True)
        t.add_column("technique", ratio=1, min_width=24)
        for col in ("regs", "smem KB", "blocks /SM", "spills", "SASS", "model"):
            t.add_column(col, justify="left" if col == "SASS" else "right", min_width=16 if col == "SASS" else None)
        if measure:
            for col in ("TFLOP/s", "x cuBLAS", "meas /model"):
                t.add_column(col, justify="right")
        for row in (r for r in rows if r.kernel.split(".")[0] == lad_name):
            if row.error:
                cells = [row.step, row.technique, "-", "-", "-", "-", f"[red]ERROR: {row.error}[/red]", "-"]
            else:
                cells = [row.step, row.technique, str(row.registers), f"{row.smem_bytes / 1024:.1f}",
                         f"{row.blocks_per_sm} ({_LIMITER.get(row.limiter, row.limiter)})",
                         "yes" if row.spills else "no", _sass_cell(row), num(row.model_tflops, ".1f", "n/a")]
            if measure:
                if row.tflops:
                    cells += [f"{row.tflops:.1f}", num(row.ratio_vs_cublas, ".3f"),
                              f"{row.tflops / row.model_tflops:.2f}" if row.model_tflops else "-"]
                elif row.rel_error is not None:
                    cells += [f"wrong (err {row.rel_error:.1e})", "-", "-"]
                else:
                    cells += ["-", "-", "-"]
            t.add_row(*cells)
        out.print(t)
