"""``gemmlab model`` and ``gemmlab explain``: the analytic model as tables (``reports.modelling``)."""

from __future__ import annotations

from .common import console, emit_json, fmt_bytes, has_gpu, num, table
from .parser import UsageError, parse_config


def run(args) -> int:
    return _explain(args) if args.command == "explain" else _model(args)


def _model(args) -> int:
    from ..reports import modelling

    M, N, K = args.shape
    if args.groups is not None:
        return _grouped(args)
    if args.layout is not None:
        raise UsageError("--layout goes with --groups (a grouped GEMM)")
    # The report is built before anything is printed: a bad name or config is an error, not half a table.
    res = modelling.model_report(M, N, K, kernel=args.kernel, config=parse_config(args.config), clock_mhz=args.clock,
                                 dtype=args.dtype, profile=args.profile, every=args.kernel is None)
    if args.json:
        emit_json(res)
        return 0
    out = console()
    _print_problem(out, res)
    if res.kernel is not None:
        _print_kernel(out, res.kernel, res.device)
    else:
        _print_steps(out, res)
    if res.matmul is not None:
        out.print(f"gemmlab.matmul runs: {res.matmul.summary}", markup=False, highlight=False)
    for plan in res.scaled_mm or ():
        _print_plan(out, plan)
    out.print(f"Model: {res.formula}.")
    return 0


def _grouped(args) -> int:
    from ..reports import modelling

    if args.kernel is not None or args.config:
        raise UsageError("--kernel / --config model a ladder step; a grouped GEMM (--groups) models the plan "
                         "gemmlab.grouped_mm runs")
    T, N, K = args.shape
    res = modelling.grouped_report(args.groups, T, N, K, layout=args.layout or "contiguous",
                                   dtype=args.dtype or "bf16", clock_mhz=args.clock, profile=args.profile)
    if args.json:
        emit_json(res)
        return 0
    out = console()
    p, d = res.problem, res.device
    rows = f"{p.rows} rows" if p.layout == "contiguous" else f"slabs of {p.rows} rows"
    _print_roofline(out, p, f"{p.groups} experts, {rows}, N={p.N}, K={p.K} ({p.layout}) {p.dtype} on {d.name} "
                            f"({d.sm_count} SMs)")
    _print_plan(out, res.plan)
    out.print(f"Model: {res.formula}.")
    return 0


def _print_plan(out, plan) -> None:
    """An EnginePlan: what the call runs, and the plan model's cheapest options."""
    t = table(f"{plan.runs}: the plan model's cheapest options (* the pick)")
    for col in ("tile", "schedule", "stages", "predicted"):
        t.add_column(col, justify="right" if col in ("stages", "predicted") else "left")
    for o in plan.candidates:
        pick = (o.tile, o.schedule, o.stages) == (plan.tile, plan.schedule, plan.stages)
        t.add_row(("* " if pick else "  ") + "x".join(map(str, o.tile)), o.schedule, str(o.stages),
                  f"{o.predicted_us:.1f} us")
    out.print(t)
    out.print(f"runs {plan.kernel}: {plan.summary}", markup=False, highlight=False)


def _print_problem(out, res) -> None:
    p, d = res.problem, res.device
    _print_roofline(out, p, f"{p.M}x{p.N}x{p.K} {p.dtype} on {d.name} ({d.sm_count} SMs, "
                            f"{'from the GPU' if d.source == 'gpu' else 'named profile'}) at {p.clock_mhz:.0f} MHz")


def _print_roofline(out, p, title: str) -> None:
    """A problem (ProblemModel or GroupedProblem) on the roofline, as one row."""
    t = table(title)
    for col in ("FLOPs", "min bytes", "FLOP/B", "speed of light", "roofline bound", "min time"):
        t.add_column(col)
    t.add_row(f"{p.flops:.3e}", fmt_bytes(p.min_bytes), f"{p.arithmetic_intensity:.1f}",
              f"{p.speed_of_light_tflops:.1f} TFLOP/s", f"{p.roofline_tflops:.1f} TFLOP/s ({p.roofline_bound})",
              f"{p.min_time_us:.1f} us")
    out.print(t)


def _print_kernel(out, k, device) -> None:
    t = table(f"{k.kernel} {k.config} ({k.config_source})", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    if not k.supported:
        t.add_row("[yellow]unsupported[/yellow]", f"[yellow]{k.unsupported_reason}; modelled anyway[/yellow]")
    bm, bn, bk = k.tile
    o, w = k.occupancy, k.waves
    t.add_row("tile (BM, BN, BK)", f"{bm} x {bn} x {bk}; intensity {k.tile_intensity:.1f} FLOP/B")
    t.add_row("threads, registers, smem", f"{k.threads}, {k.registers}, {fmt_bytes(k.smem_bytes)}")
    t.add_row("occupancy", f"{o.blocks_per_sm} blocks/SM ({o.warps_per_sm} warps, {o.fraction:.0%}), limited by "
                           f"{o.limiter} [threads {o.by_threads}, registers {o.by_registers}, smem {o.by_smem}]")
    if k.gpu_blocks_per_sm is not None:
        mark = "agrees" if k.gpu_blocks_per_sm == o.blocks_per_sm else "DIFFERS"
        t.add_row("occupancy (cuda-core)", f"{k.gpu_blocks_per_sm} blocks/SM ({mark})")
    t.add_row("tiles and waves", f"{w.tiles_m} x {w.tiles_n} = {w.tiles} tiles on {w.slots} slots: {w.waves:.2f} "
                                 f"waves, last wave {w.last_wave_tiles} tiles ({w.last_wave_utilization:.0%} full), "
                                 f"efficiency {w.efficiency:.1%}")
    t.add_row("tile quantization", f"{k.tile_quantization:.1%} of computed area is useful")
    t.add_row("global traffic", f"{fmt_bytes(k.traffic_bytes)} tile loads + C; with L2 hit {k.l2_hit:.0%}: "
                                f"{fmt_bytes(k.hbm_bytes)} from HBM")
    t.add_row("compute time", f"{k.compute_time_us:.1f} us at {k.efficiency:.0%} (efficiency: {k.efficiency_source})")
    t.add_row("memory time", f"{k.memory_time_us:.1f} us at {device.hbm_tb_per_s:.1f} TB/s")
    t.add_row("predicted", f"{k.predicted_time_us:.1f} us = {k.predicted_tflops:.1f} TFLOP/s ({k.sol_fraction:.0%} "
                           f"of speed of light), {k.bound} bound")
    out.print(t)


def _print_steps(out, res) -> None:
    p = res.problem
    t = table(f"predicted per step at {p.M}x{p.N}x{p.K}, {p.clock_mhz:.0f} MHz (default configs)")
    t.add_column("step", no_wrap=True)
    for col in ("tile", "blk/SM", "waves", "last wave", "eff.", "bound", "TFLOP/s", "% SOL"):
        t.add_column(col, justify="left" if col in ("tile", "bound") else "right")
    for s in res.steps:
        if s.predicted_tflops is None:
            note = "unsupported shape" if not s.supported else f"[red]{s.note}[/red]"
            t.add_row(s.step, "-", "-", "-", "-", "-", note, "-", "-")
            continue
        t.add_row(s.step, "x".join(map(str, s.tile)), str(s.blocks_per_sm), f"{s.waves:.2f}",
                  f"{s.last_wave_utilization:.0%}", f"{s.efficiency:.0%}", s.bound, f"{s.predicted_tflops:.1f}",
                  f"{s.sol_fraction:.0%}")
    out.print(t)


def _explain(args) -> int:
    from ..reports import modelling

    M, N, K = args.shape
    gap = modelling.explain(M, N, K, args.kernel, config=parse_config(args.config), clock_mhz=args.clock,
                            measure=not args.no_time and has_gpu())
    if args.json:
        emit_json(gap)
        return 0

    out = console()
    t = table(f"{gap.kernel} {gap.config} at {M}x{N}x{K}: the model's time over the speed of light "
                    f"({gap.speed_of_light_tflops:.1f} TFLOP/s)")
    for col in ("limiter", "factor", "evidence"):
        t.add_column(col, justify="right" if col == "factor" else "left")
    for lim in gap.limiters:
        t.add_row(lim.name, f"x{lim.factor:.2f}", lim.evidence)
    out.print(t)
    m = gap.measurement
    if m is not None:
        out.print(f"measured: {num(m.tflops, '.1f', 'wrong result')} TFLOP/s at {num(m.sm_clock_mhz, '.0f')} MHz, "
                  f"x{num(m.ratio_vs_cublas, '.3f')} cuBLAS, measured/model {num(gap.measured_over_model, '.2f')}")
    out.print(gap.verdict, markup=False, highlight=False)
    return 0
