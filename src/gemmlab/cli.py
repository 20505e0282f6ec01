"""gemmlab: matmul kernels for NVIDIA GPUs, and the tools to inspect, model and time them.

Without a subcommand, 'gemmlab' walks both kernel ladders ('gemmlab ladder'). Everything except
'bench' and 'tune' (and the measured columns of 'ladder') works on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

EXAMPLES = """\
examples:
  gemmlab                                   walk both ladders (static view without a GPU)
  gemmlab inspect k06 --sass                annotated SASS of an fp32 step
  gemmlab inspect h03 --diff h04            what changed between two Hopper steps
  gemmlab inspect --file my.cu --expr 'my_kernel<128>'
  gemmlab model --shape 4096,4096,4096 --kernel h04 --clock 1320
  gemmlab bench --suite ladder              time every step against cuBLAS (GPU)
  gemmlab bench --suite matmul-llm          gemmlab.matmul against torch on LLM shapes (GPU)
  gemmlab tune k08 --shape 4096,4096,4096   autotune a step's config for a shape, saved per GPU (GPU)
  gemmlab plot benchmarks/results/ladder.jsonl --out benchmarks/plots
  gemmlab figures docs/figures
"""


# Argument helpers -------------------------------------------------------------------------------------

class UsageError(Exception):
    """Arguments that parse but do not make sense together (exit status 2, like argparse)."""


def parse_shape(text: str) -> tuple[int, int, int]:
    """``M,N,K`` (or ``MxNxK``; a single number means a cube)."""
    parts = [p for p in text.replace("x", ",").split(",") if p.strip()]
    try:
        vals = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape {text!r}: expected M,N,K integers") from None
    if len(vals) == 1:
        vals *= 3
    if len(vals) != 3 or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"shape {text!r}: expected three positive integers M,N,K")
    return vals[0], vals[1], vals[2]


def parse_config(items: list[str] | None, option: str = "--config") -> dict[str, int] | None:
    """``["BN=128", "QSIZE=3,BM=64"]`` -> ``{"BN": 128, "QSIZE": 3, "BM": 64}``."""
    if not items:
        return None
    cfg = {}
    for item in items:
        for kv in item.split(","):
            if not kv.strip():
                continue
            k, sep, v = kv.partition("=")
            if not sep:
                raise UsageError(f"{option} {kv!r}: expected NAME=VALUE")
            try:
                cfg[k.strip()] = int(v)
            except ValueError:
                raise UsageError(f"{option} {kv!r}: value must be an integer") from None
    return cfg


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """``"M,N,K;M,N,K"`` -> a list of shapes (each as ``parse_shape`` reads it)."""
    shapes = [parse_shape(s) for s in text.split(";") if s.strip()]
    if not shapes:
        raise argparse.ArgumentTypeError(f"shapes {text!r}: expected M,N,K;M,N,K")
    return shapes


def parse_sizes(text: str) -> list[tuple[int, int, int]]:
    """``"2048,4096"`` -> the cubes ``[(2048, 2048, 2048), (4096, 4096, 4096)]``."""
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"sizes {text!r}: expected comma-separated integers") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"sizes {text!r}: expected positive integers")
    return [(n, n, n) for n in sizes]


def parse_configs(text: str) -> list[dict[str, int]]:
    """``"WM=32,WN=64;BK=8"`` -> ``[{"WM": 32, "WN": 64}, {"BK": 8}]`` (one config per ';' group)."""
    try:
        return [parse_config([group], "--configs") for group in text.split(";") if group.strip()]
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _console():
    from rich.console import Console

    return Console()


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


MATMUL_PREFIX = "matmul-"

_LIMITER = {"registers": "(regs)", "shared memory": "(smem)", "threads": "(thr)", "blocks": "(blk)"}


def _shape_str(shape) -> str:
    return "x".join(str(int(v)) for v in shape)


# gemmlab ladder -----------------------------------------------------------------------------------------

def _config_at(spec, shape, sm_count: int) -> dict:
    """The config a step runs at ``shape`` (``KernelSpec.config_for``), or its defaults where the step
    cannot run that shape (the row then says so)."""
    from .errors import UnsupportedProblem

    if spec.why_unsupported(*shape) is not None:
        return spec.default_config()
    try:
        return spec.config_for(*shape, sm_count)
    except UnsupportedProblem:
        return spec.default_config()


def _cmd_ladder(args) -> int:
    from rich.progress import Progress
    from rich.table import Table

    from . import model, registry, sass
    from .errors import GemmlabError

    console = _console()
    has_gpu = _has_gpu()
    measure = has_gpu and not args.no_time
    shape = args.shape
    profile = model.device_profile()
    lads = {n: lad for n, lad in registry.ladders().items() if not args.ladder or n == args.ladder}
    specs = [s for n in lads for s in registry.all_kernels(n)]

    static, broken, configs = {}, {}, {}
    with Progress(console=console, transient=True) as prog:
        task = prog.add_task("compiling", total=len(specs))
        for spec in specs:
            prog.update(task, description=f"compiling {spec.short}")
            try:
                # The config the step runs at this shape (its heuristic, or a tuned one), as timing uses.
                configs[spec.name] = cfg = _config_at(spec, shape, profile.sm_count)
                ck = spec.compile(cfg)
                summ = sass.kernel_summary(ck)
                static[spec.name] = (ck, summ, sass.check(spec.sass_expect(cfg), summ, ck.resources))
            except GemmlabError as e:  # one broken step must not hide the others
                broken[spec.name] = str(e).splitlines()[0]
            prog.advance(task)

    measured: dict[str, dict] = {}
    if measure:
        from . import gpu, suites
        from .bench import append_records

        jobs = suites.ladder_suite([shape], list(lads), exclude=set(broken), sm_count=gpu.gpu_info().sm_count)
        with Progress(console=console, transient=True) as prog:
            task = prog.add_task("timing", total=len(jobs))
            for job in jobs:
                prog.update(task, description=f"timing {job.describe()}")
                recs = _run_job(job, "ladder", args.rounds, console)
                for r in recs:
                    _add_model(r)
                    measured[r["kernel"]] = r
                prog.advance(task)
        if args.out:
            append_records(args.out, list(measured.values()))

    clock_note = f"{args.clock or profile.sm_clock_mhz:.0f} MHz" if not measure else "the recorded SM clock"
    for lad_name, lad in lads.items():
        table = Table(title=f"{lad_name}: {lad.title} ({lad.layout}: {lad.layout_doc})\n"
                            f"model = predicted TFLOP/s at {_shape_str(shape)}, {clock_note}", expand=False)
        table.add_column("step", no_wrap=True)
        table.add_column("technique", ratio=1, min_width=24)
        for col in ("regs", "smem KB", "blocks /SM", "spills", "SASS", "model"):
            table.add_column(col, justify="right" if col != "SASS" else "left")
        if measure:
            for col in ("TFLOP/s", "x cuBLAS", "meas /model"):
                table.add_column(col, justify="right")
        cols = table.columns
        for spec in registry.all_kernels(lad_name):
            if spec.name in broken:
                table.add_row(spec.short, spec.technique, *["-"] * 4, f"[red]ERROR: {broken[spec.name]}[/red]",
                              *["-"] * (len(cols) - 7))
                continue
            ck, summ, fails = static[spec.name]
            cfg = configs[spec.name]
            smem = spec.smem_bytes(cfg) + ck.resources.static_shared
            rec = measured.get(spec.name)
            clock = rec.get("sm_clock_mhz") if rec else None
            mshape = shape if spec.why_unsupported(*shape) is None else None
            pred = model.predict_step(spec, *mshape, cfg, profile=profile, clock_mhz=clock or args.clock,
                                      compiled=ck, summary=summ) if mshape else None
            occ = model.occupancy(spec.threads(cfg), ck.resources.registers, smem, profile)
            row = [spec.short, spec.technique, str(ck.resources.registers), f"{smem / 1024:.1f}",
                   f"{occ.blocks_per_sm} {_LIMITER.get(occ.limiter, occ.limiter)}",
                   "yes" if ck.resources.spills else "no",
                   "ok" if not fails else "FAIL: " + "; ".join(fails),
                   f"{pred.tflops:.1f}" if pred else "n/a"]
            if measure:
                if rec and rec.get("tflops"):
                    row += [f"{rec['tflops']:.1f}", f"{rec['ratio']:.3f}",
                            f"{rec['tflops'] / pred.tflops:.2f}" if pred else "-"]
                elif rec:
                    row += [f"wrong (err {rec['rel_error']:.1e})", "-", "-"]
                else:
                    row += ["-", "-", "-"]
            table.add_row(*row)
        console.print(table)
    console.print(f"Model: {profile.name} profile ({profile.sm_count} SMs), speed of light at {clock_note}; "
                  "see `gemmlab model --help`.")
    if not has_gpu:
        console.print("[yellow]No GPU visible: timings (TFLOP/s, ratio to cuBLAS) need an NVIDIA GPU; "
                      "this is the static view (compile, resources, SASS checks, model).[/yellow]")
    elif measure and measured:
        from .plots import ladder_plot
        from .figures import save

        fig = ladder_plot(list(measured.values()))
        if fig is not None:
            paths = save(fig, args.plot_dir, "ladder")
            console.print(f"ladder plot: {', '.join(map(str, paths))}")
    return 0


# gemmlab inspect ----------------------------------------------------------------------------------------

def _report_for(args, kernel: str | None, config):
    from . import inspect as gi

    if args.file:
        if not args.expr:
            raise UsageError("--file needs --expr 'kernel_name<...>' (the kernel or template instantiation to build)")
        return gi.inspect_compiled(gi.compile_file(args.file, args.expr, args.arch))
    if not kernel:
        raise UsageError("name a kernel (e.g. k05, h04) or give --file and --expr")
    return gi.inspect_step(kernel, config)


def _widths_str(widths: dict) -> str:
    return ", ".join(f"{n} x {w}-bit" for w, n in sorted(widths.items(), reverse=True))


def _print_report(console, rep) -> None:
    from rich.table import Table

    from . import model
    from .inspect import CLASS_ORDER

    r = rep.resources
    facts = Table(title=f"{rep.name}  ({rep.arch}, {rep.name_expression})", show_header=False)
    facts.add_column("what", style="bold")
    facts.add_column("value")
    facts.add_row("registers / thread", str(r.registers))
    smem = f"{_fmt_bytes(r.static_shared)} static"
    if rep.dynamic_smem is not None:
        smem += f" + {_fmt_bytes(rep.dynamic_smem)} dynamic"
    facts.add_row("shared memory / block", smem)
    facts.add_row("stack frame", f"{r.stack_frame} B")
    facts.add_row("spills (stores / loads)", f"{r.spill_stores} B / {r.spill_loads} B")
    facts.add_row("named barriers", str(r.barriers))
    if rep.threads:
        occ = model.occupancy(rep.threads, r.registers, rep.smem_bytes)
        facts.add_row("threads / block", str(rep.threads))
        facts.add_row("occupancy (model, H200 limits)",
                      f"{occ.blocks_per_sm} blocks/SM ({occ.warps_per_sm} warps, {occ.fraction:.0%}), "
                      f"limited by {occ.limiter}")
    facts.add_row("instructions", str(len(rep.summary.instructions)))
    for h in rep.highlights():
        facts.add_row("highlight", h)
    console.print(facts)

    mix = Table(title="instruction mix")
    for col in ("class", "count", "detail"):
        mix.add_column(col)
    widths = rep.widths()
    for cls in CLASS_ORDER:
        n = rep.summary.class_counts.get(cls, 0)
        if n:
            detail = _widths_str(widths.get(cls, {}))
            if cls == "barrier":
                detail = ", ".join(f"{k} {v}" for k, v in rep.barrier_kinds().items())
            mix.add_row(cls, str(n), detail)
    console.print(mix)

    if rep.loops:
        lt = Table(title="loops (FFMA/HGMMA: in the body outside nested loops)")
        for col in ("loop", "header..last", "instructions", "depth", "FFMA", "HGMMA", "body"):
            lt.add_column(col)
        for lp in rep.loops:
            lt.add_row(f"L{lp.index}", f"{lp.start:05x}..{lp.end:05x}", str(lp.instructions),
                       str(lp.depth) + (" (innermost)" if lp.innermost else ""), str(lp.own.get("ffma", 0)),
                       str(lp.own.get("hgmma", 0)), lp.unrolled)
        console.print(lt)
    else:
        console.print("no loops")
    if rep.checks is not None:
        if rep.checks:
            console.print("[red]SASS claims failed:[/red] " + "; ".join(rep.checks))
        else:
            console.print("SASS claims met: " + "; ".join(rep.claims))


def _print_diff(console, d) -> None:
    from rich.table import Table

    t = Table(title=f"{d.a.name}  ->  {d.b.name}")
    for col in ("what", "A", "B", "change"):
        t.add_column(col)

    def delta(a, b):
        try:
            return f"{b - a:+d}"
        except TypeError:
            return ""

    for what, a, b in d.resources:
        t.add_row(what, str(a), str(b), delta(a, b))
    for cls, a, b in d.mix:
        t.add_row(f"{cls} instructions", str(a), str(b), delta(a, b))
    for cls, w, a, b in d.widths:
        t.add_row(f"{cls} {w}-bit", str(a), str(b), delta(a, b))
    for what, a, b in d.loops:
        t.add_row(what, str(a), str(b), delta(a, b))
    if d.empty:
        t.add_row("(no difference)", "", "", "")
    console.print(t)
    if d.opcodes_added:
        console.print("new opcodes: " + ", ".join(f"{op} x{n}" for op, n in d.opcodes_added.items()))
    if d.opcodes_removed:
        console.print("gone opcodes: " + ", ".join(f"{op} x{n}" for op, n in d.opcodes_removed.items()))


def _cmd_inspect(args) -> int:
    from . import inspect as gi

    console = _console()
    config = parse_config(args.config)
    rep = _report_for(args, args.kernel, config)
    if args.diff:
        other = gi.inspect_step(args.diff, parse_config(args.diff_config))
        _print_diff(console, gi.diff(rep, other))
    else:
        _print_report(console, rep)
    if args.sass:
        console.rule("annotated SASS")
        for line in gi.annotate(rep):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    if args.ptx:
        console.rule("PTX")
        if args.file:
            ptx = gi.ptx_for_source(Path(args.file).read_text(), args.expr, args.arch)
        else:
            from . import registry

            ptx = gi.ptx_for_step(registry.get(args.kernel), config)
        console.print(ptx, markup=False, highlight=False, soft_wrap=True)
    return 0


# gemmlab model ------------------------------------------------------------------------------------------

def _cmd_model(args) -> int:
    from rich.table import Table

    from . import model, registry
    from .errors import GemmlabError

    console = _console()
    M, N, K = args.shape
    profile = model.device_profile(args.profile)
    clock = args.clock or profile.sm_clock_mhz
    bw = profile.hbm_bytes_per_s

    prob = Table(title=f"{M}x{N}x{K} on {profile.name} ({profile.sm_count} SMs, "
                       f"{'from the GPU' if profile.source == 'gpu' else 'named profile'}) at {clock:.0f} MHz")
    for col in ("dtype", "FLOPs", "min bytes", "FLOP/B", "speed of light", "roofline bound", "min time"):
        prob.add_column(col)
    for dtype in ("bf16", "fp32"):
        peak = profile.peak_flops(dtype, clock)
        ai = model.arithmetic_intensity(M, N, K, dtype)
        bound = model.roofline(ai, peak, bw)
        prob.add_row(dtype, f"{model.flops(M, N, K):.3e}", _fmt_bytes(model.min_bytes(M, N, K, dtype)), f"{ai:.1f}",
                     f"{peak / 1e12:.1f} TFLOP/s", f"{bound / 1e12:.1f} TFLOP/s "
                     f"({'compute' if ai * bw >= peak else 'memory'})",
                     f"{model.flops(M, N, K) / bound * 1e6:.1f} us")
    console.print(prob)

    if args.kernel:
        spec = registry.get(args.kernel)
        cfg = spec.resolve(parse_config(args.config))
        why = spec.why_unsupported(M, N, K, cfg)
        if why:
            console.print(f"[yellow]{spec.name} does not support {M}x{N}x{K}: {why}; modelling it anyway.[/yellow]")
        ck = spec.compile(cfg)
        p = model.predict_step(spec, M, N, K, cfg, profile=profile, clock_mhz=clock, compiled=ck)
        t = Table(title=f"{spec.name} {cfg}", show_header=False)
        t.add_column("what", style="bold")
        t.add_column("value")
        bm, bn, bk = p.tile
        o, w = p.occupancy, p.waves
        t.add_row("tile (BM, BN, BK)", f"{bm} x {bn} x {bk}; intensity {p.tile_intensity:.1f} FLOP/B")
        t.add_row("threads, registers, smem", f"{spec.threads(cfg)}, {ck.resources.registers}, "
                                              f"{_fmt_bytes(spec.smem_bytes(cfg) + ck.resources.static_shared)}")
        t.add_row("occupancy", f"{o.blocks_per_sm} blocks/SM ({o.warps_per_sm} warps, {o.fraction:.0%}), limited "
                               f"by {o.limiter} [threads {o.by_threads}, registers {o.by_registers}, smem "
                               f"{o.by_smem}, blocks {o.by_blocks}]")
        gpu_occ = model.gpu_occupancy(ck, spec.threads(cfg), spec.smem_bytes(cfg))
        if gpu_occ is not None:
            mark = "agrees" if gpu_occ == o.blocks_per_sm else "DIFFERS"
            t.add_row("occupancy (cuda-core)", f"{gpu_occ} blocks/SM ({mark})")
        t.add_row("tiles and waves", f"{w.tiles_m} x {w.tiles_n} = {w.tiles} tiles on {w.slots} slots: "
                                     f"{w.waves:.2f} waves, last wave {w.last_wave_tiles} tiles "
                                     f"({w.last_wave_utilization:.0%} full), efficiency {w.efficiency:.1%}")
        t.add_row("tile quantization", f"{model.tile_quantization(M, N, bm, bn):.1%} of computed area is useful")
        t.add_row("global traffic", f"{_fmt_bytes(p.traffic_bytes)} tile loads + C; with L2 hit {p.l2_hit:.0%}: "
                                    f"{_fmt_bytes(p.hbm_bytes)} from HBM")
        t.add_row("compute time", f"{p.t_compute_s * 1e6:.1f} us at {p.efficiency:.0%} of "
                                  f"{p.peak_tflops:.1f} TFLOP/s (efficiency: {p.efficiency_source})")
        t.add_row("memory time", f"{p.t_memory_s * 1e6:.1f} us at {bw / 1e12:.1f} TB/s")
        t.add_row("predicted", f"{p.time_s * 1e6:.1f} us = {p.tflops:.1f} TFLOP/s ({p.sol_fraction:.0%} of speed "
                               f"of light), {p.bound} bound")
        console.print(t)
    else:
        t = Table(title=f"model: predicted per step at {M}x{N}x{K}, {clock:.0f} MHz (default configs)")
        t.add_column("step", no_wrap=True)
        for col in ("tile", "blk/SM", "waves", "last wave", "eff.", "bound", "TFLOP/s", "% SOL"):
            t.add_column(col, justify="left" if col in ("tile", "bound") else "right")
        for spec in registry.all_kernels():
            try:
                if spec.why_unsupported(M, N, K):
                    t.add_row(spec.short, "-", "-", "-", "-", "-", "unsupported shape", "-", "-")
                    continue
                p = model.predict_step(spec, M, N, K, profile=profile, clock_mhz=clock)
            except GemmlabError as e:  # one broken step must not hide the others
                t.add_row(spec.short, *["-"] * 5, f"[red]ERROR: {str(e).splitlines()[0]}[/red]", "-", "-")
                continue
            t.add_row(spec.short, "x".join(map(str, p.tile)), str(p.occupancy.blocks_per_sm), f"{p.waves.waves:.2f}",
                      f"{p.waves.last_wave_utilization:.0%}", f"{p.efficiency:.0%}", p.bound, f"{p.tflops:.1f}",
                      f"{p.sol_fraction:.0%}")
        console.print(t)
    console.print("Model, Hopper steps: per 64-deep k-slab the largest of tensor time (wgmma at the clock), the SM's "
                  "share of L2->SMEM bandwidth and the TMA latency left uncovered by the stages, plus an epilogue "
                  "per tile, in rounds over the SMs (gemmlab.model.predict_pipelined). fp32 steps: "
                  f"t = max(FLOPs / (SOL x efficiency), HBM bytes / {bw / 1e12:.1f} TB/s) / wave efficiency, capped "
                  "by the FFMA share of their main loop.")
    return 0


# gemmlab bench / plot -----------------------------------------------------------------------------------

def _add_model(rec: dict) -> dict:
    """Add the model's prediction and the speed of light at the record's SM clock to a bench record."""
    from . import model, registry

    try:
        spec = registry.get(rec["kernel"])
    except KeyError:
        return rec
    prof = model.device_profile()
    if rec.get("sm_count"):
        prof = dataclasses.replace(prof, sm_count=int(rec["sm_count"]))
    clock = rec.get("sm_clock_mhz") or prof.sm_clock_mhz
    try:
        p = model.predict_step(spec, rec["M"], rec["N"], rec["K"], rec.get("config"), profile=prof, clock_mhz=clock)
    except Exception:  # noqa: BLE001 - a record of a config that no longer resolves: no prediction
        return rec
    rec.update(model_tflops=p.tflops, model_time_ms=p.time_s * 1e3, model_clock_mhz=clock,
               sol_tflops=prof.peak_flops(rec.get("dtype", "bf16"), clock) / 1e12)
    return rec


def records_table(records: list[dict], title: str):
    from rich.table import Table

    from . import model

    t = Table(title=title)
    for col in ("kernel", "shape", "TFLOP/s", "cuBLAS", "x cuBLAS", "% SOL", "GB/s", "model", "meas/model", "SM MHz",
                "rel err"):
        t.add_column(col)
    for r in records:
        M, N, K = r["M"], r["N"], r["K"]
        tf = r.get("tflops")
        sol = r.get("sol_tflops")
        if sol is None and r.get("sm_clock_mhz"):
            prof = model.H200 if not r.get("sm_count") else model.DeviceProfile(
                **{**model.H200.__dict__, "sm_count": int(r["sm_count"])})
            sol = prof.peak_flops(r.get("dtype", "bf16"), r["sm_clock_mhz"]) / 1e12
        gbs = (model.min_bytes(M, N, K, r.get("dtype", "bf16")) / (r["time_ms"] * 1e-3) / 1e9
               if r.get("time_ms") else None)
        mt = r.get("model_tflops")
        t.add_row(str(r["kernel"]).split(".", 1)[-1], f"{M}x{N}x{K}",
                  f"{tf:.1f}" if tf else "[red]wrong[/red]" if not r.get("correct", True) else "-",
                  f"{r['baseline_tflops']:.1f}", f"{r['ratio']:.3f}" if r.get("ratio") else "-",
                  f"{tf / sol:.0%}" if tf and sol else "-", f"{gbs:.0f}" if gbs else "-",
                  f"{mt:.1f}" if mt else "-", f"{tf / mt:.2f}" if tf and mt else "-",
                  f"{r['sm_clock_mhz']:.0f}" if r.get("sm_clock_mhz") else "-", f"{r['rel_error']:.1e}")
    return t


def _run_job(job, suite: str, rounds: int, console) -> list[dict]:
    """``bench_shape`` for one job; if a step fails (launch error, ...), time the others one by one."""
    from .bench import bench_shape

    try:
        return bench_shape(job.ladder, *job.shape, job.steps, suite=suite, rounds=rounds)
    except Exception as e:  # noqa: BLE001 - reported, then the steps are retried alone
        if len(job.steps) == 1:
            console.print(f"[red]{job.steps[0][0].name} at {_shape_str(job.shape)} failed: {e}[/red]")
            return []
        console.print(f"[yellow]{job.describe()} failed ({type(e).__name__}); timing its steps one by one[/yellow]")
    out = []
    for step in job.steps:
        try:
            out += bench_shape(job.ladder, *job.shape, [step], suite=suite, rounds=rounds)
        except Exception as e:  # noqa: BLE001
            console.print(f"[red]{step[0].name} at {_shape_str(job.shape)} failed: {e}[/red]")
    return out


def _record_line(r: dict) -> str:
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


def _geomean(xs: list[float]) -> float:
    import math

    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _no_gpu() -> int:
    print("gemmlab bench: timing needs an NVIDIA GPU, and torch sees none. The static tools work without "
          "one: `gemmlab`, `gemmlab inspect`, `gemmlab model`, `gemmlab plot RECORDS.jsonl`.", file=sys.stderr)
    return 2


def _skipped(jobs, specs, shapes, sm_count: int, config: dict | None) -> list[str]:
    """Named steps left out at a shape (the suites skip what a step cannot run), with the reason.
    ``shapes`` empty: the ladder suite's own shape for each step."""
    from .suites import LADDER_SHAPE, base_config

    timed = {(s.name, job.shape) for job in jobs for s, _ in job.steps}
    notes = []
    for spec in specs:
        for shape in shapes or [tuple(spec.extra.get("bench_shape", LADDER_SHAPE))]:
            if (spec.name, shape) not in timed:
                why = spec.why_unsupported(*shape, base_config(spec, *shape, sm_count, config))
                notes.append(f"{spec.short} skipped at {_shape_str(shape)}: {why}")
    return notes


def _cmd_bench(args) -> int:
    from rich.progress import Progress

    from . import registry, suites

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
        if not _has_gpu():
            return _no_gpu()
        return _bench_matmul(args, args.suite[len(MATMUL_PREFIX):])

    specs = [registry.get(k) for k in kernels or []]
    for spec in specs:
        if args.ladder and spec.ladder != args.ladder:
            raise UsageError(f"--steps {spec.short}: not a step of the {args.ladder} ladder")
    if config and not kernels:
        raise UsageError("--config sets parameters of the named steps: add --steps STEP (or use --configs, "
                         "which every step that has the parameters tries)")
    if not _has_gpu():
        return _no_gpu()
    from . import gpu
    from .bench import append_records
    from .plots import plot_records

    console = _console()
    sm_count = gpu.gpu_info().sm_count
    ladders = [args.ladder] if args.ladder else None
    suite = args.suite or ("explicit" if shapes else "ladder")
    common = dict(ladders=ladders, configs=configs, sm_count=sm_count)
    if suite == "square":
        shapes = shapes or [(n, n, n) for n in suites.SQUARE_SIZES]
        jobs = suites.square_suite(shapes, kernels, config, **common)
    elif shapes:
        jobs = suites.explicit(shapes, kernels, config, **common)
    else:
        jobs = suites.ladder_suite(None, kernels=kernels, config=config, **common)
    for note in _skipped(jobs, specs, shapes, sm_count, config):
        console.print(f"[yellow]{note}[/yellow]")
    if not jobs:
        console.print("nothing to run: no registered step supports the requested shapes")
        return 1
    label = args.suite_name or suite
    out = Path(args.out or f"benchmarks/results/{label}.jsonl")
    records = []
    with Progress(console=console, transient=True) as prog:
        task = prog.add_task("bench", total=len(jobs))
        for job in jobs:
            prog.update(task, description=f"timing {job.describe()}")
            recs = [_add_model(r) for r in _run_job(job, label, args.rounds, console)]
            append_records(out, recs)
            for r in recs:
                console.print(_record_line(r), markup=False, highlight=False, soft_wrap=True)
            records += recs
            prog.advance(task)
    console.print(records_table(records, f"{label}: {len(records)} records appended to {out}"))
    if not args.no_plots:
        paths = plot_records(records, args.plots or f"benchmarks/plots/{label}")
        if paths:
            console.print("plots: " + ", ".join(str(p) for p in paths))
    return 0


def _bench_matmul(args, name: str) -> int:
    """Time ``gemmlab.matmul`` against torch on every case of a ``gemmlab.matmul_suites`` suite."""
    from rich.progress import Progress
    from rich.table import Table

    from .bench import append_records, bench_matmul
    from .matmul_suites import suite as matmul_suite

    console = _console()
    label = args.suite_name or name
    out = Path(args.out or "benchmarks/results/matmul.jsonl")
    cases = matmul_suite(name)
    records = []
    with Progress(console=console, transient=True) as prog:
        task = prog.add_task("bench", total=len(cases))
        for case in cases:
            prog.update(task, description=f"timing {case.name}")
            try:
                rec = bench_matmul(case.M, case.N, case.K, bias=case.bias, activation=case.activation,
                                   suite=label, rounds=args.rounds, extra={"case": case.name})
            except Exception as e:  # noqa: BLE001 - reported; the other cases still run
                console.print(f"[red]{case.name} failed: {e}[/red]")
            else:
                append_records(out, [rec])
                records.append(rec)
                console.print(_record_line(rec), markup=False, highlight=False, soft_wrap=True)
            prog.advance(task)
    if not records:
        console.print(f"{name}: no case ran")
        return 1
    t = Table(title=f"matmul {name}: {len(records)} records appended to {out}")
    for col in ("case", "TFLOP/s", "GB/s", "torch TFLOP/s", "x torch", "rel err", "SM MHz"):
        t.add_column(col)
    for r in records:
        t.add_row(r["case"], f"{r['tflops']:.1f}", f"{r['gbps']:.0f}", f"{r['baseline_tflops']:.1f}",
                  f"{r['ratio']:.3f}", f"{r['rel_error']:.1e}",
                  f"{r['sm_clock_mhz']:.0f}" if r.get("sm_clock_mhz") else "-")
    console.print(t)
    ratios = [r["ratio"] for r in records]
    console.print(f"{name}: geomean x{_geomean(ratios):.3f}, min x{min(ratios):.3f} over {len(ratios)} cases")
    return 0


def _cmd_plot(args) -> int:
    from .bench import load_records
    from .plots import plot_records

    console = _console()
    records = []
    for path in args.records:
        records += load_records(path)
    if not records:
        console.print(f"no records in {', '.join(args.records)}")
        return 1
    if not args.no_model:  # records written before the model existed: predict them now (compiles, no GPU)
        records = [r if r.get("model_tflops") else _add_model(dict(r)) for r in records]
    console.print(records_table(records, f"{len(records)} records from {', '.join(args.records)}"))
    paths = plot_records(records, args.out, formats=tuple(args.format))
    console.print("plots: " + (", ".join(str(p) for p in paths) or "none (no timed records)"))
    return 0


# gemmlab tune -------------------------------------------------------------------------------------------

def _cfg_str(cfg: dict | None) -> str:
    return ",".join(f"{k}={v}" for k, v in (cfg or {}).items()) or "-"


def _num(d: dict, key: str, fmt: str) -> str:
    import math

    v = d.get(key)
    return format(v, fmt) if isinstance(v, (int, float)) and not math.isnan(v) else "-"


def _cmd_tune(args) -> int:
    from rich.table import Table

    from . import autotune, registry

    console = _console()
    if args.show:
        return _show_tuned(console, args.kernel)
    if not args.kernel or not args.shape:
        raise UsageError("name a step and a shape (gemmlab tune k08 --shape 4096,4096,4096), or --show")
    if args.max_configs < 1 or args.rounds < 1:
        raise UsageError("--max-configs and --rounds must be at least 1")
    spec = registry.get(args.kernel)
    why = autotune.tunable(spec)
    if why:
        raise UsageError(f"{spec.name} cannot be tuned: {why}")
    if not _has_gpu():
        print("gemmlab tune: tuning times kernels and needs an NVIDIA GPU, and torch sees none. "
              "`gemmlab tune --show` lists saved results without one.", file=sys.stderr)
        return 2
    M, N, K = args.shape
    res = autotune.tune(spec, M, N, K, configs=args.configs, max_configs=args.max_configs, rounds=args.rounds,
                        budget_s=args.budget, log=lambda msg: console.print(msg, markup=False, highlight=False))
    t = Table(title=f"{spec.name} at {M}x{N}x{K} on {res.gpu.describe()}: {len(res.candidates)} candidates, "
                    f"{args.rounds} rounds (the final round's numbers where a candidate had one)")
    for col in ("config", "TFLOP/s", "x cuBLAS", "correct", "rel err", ""):
        t.add_column(col, justify="right" if col in ("TFLOP/s", "x cuBLAS", "rel err") else "left")
    rows = sorted(res.latest(), key=lambda r: (r.get("time_ms") is None, r.get("time_ms") or 0.0))
    for r in rows:
        note = []
        if r is res.winner:
            note.append("[bold green]winner[/bold green]")
        if r.get("config") == res.heuristic:
            note.append("the step's own choice")
        if r.get("error"):
            note.append(f"[red]{r['error']}[/red]")
        err = r.get("rel_error")
        t.add_row(_cfg_str(r.get("config")), _num(r, "tflops", ".1f"), _num(r, "ratio", ".3f"),
                  "yes" if r.get("correct") is True else "[red]no[/red]",
                  f"{err:.1e}" if isinstance(err, float) else "-", ", ".join(note))
    console.print(t)
    if res.winner is None:
        console.print("[red]no candidate was correct: nothing saved[/red]")
        return 1
    h = res.heuristic_record()
    if h is not None and h.get("time_ms") and h is not res.winner:
        console.print(f"winner {_cfg_str(res.config)}: x{h['time_ms'] / res.winner['time_ms']:.3f} over the step's "
                      f"own choice {_cfg_str(res.heuristic)}")
    console.print(f"saved to {res.saved_to} (KernelSpec.config_for now picks it for this shape on this GPU)",
                  markup=False, highlight=False, soft_wrap=True)
    return 0


def _show_tuned(console, kernel: str | None) -> int:
    from rich.table import Table

    from . import autotune, registry

    name = registry.get(kernel).name if kernel else None
    gpu = autotune.current_gpu() if _has_gpu() else None
    rows = [(ident, path, e) for ident, path, e in autotune.saved_entries(gpu) if name in (None, e["kernel"])]
    where = f"{gpu.describe()}, {autotune.tuned_path(gpu)}" if gpu else f"every GPU, {autotune.tune_dir()}"
    if not rows:
        console.print(f"no tuned results for {name or 'any step'} ({where})", markup=False, highlight=False)
        return 0
    t = Table(title=f"tuned results: {where}")
    cols = ("kernel", "shape", "config", "ms", "TFLOP/s", "x cuBLAS", "git sha", "when")
    for col in ((() if gpu else ("GPU",)) + cols):
        t.add_column(col, overflow="fold")

    def in_param_order(e: dict) -> dict:  # the file keeps keys sorted; show them as the step lists them
        try:
            names = registry.get(e["kernel"]).param_names()
        except KeyError:
            return e["config"]
        return {**{k: e["config"][k] for k in names if k in e["config"]}, **e["config"]}

    for ident, _path, e in rows:
        gpu_col = () if gpu else (
            f"{ident.get('name')} ({ident.get('sm_count')} SMs, driver {ident.get('driver_major')})",)
        t.add_row(*gpu_col, str(e["kernel"]).split(".", 1)[-1], f"{e['M']}x{e['N']}x{e['K']}", _cfg_str(in_param_order(e)),
                  _num(e, "time_ms", ".4f"), _num(e, "tflops", ".1f"), _num(e, "ratio", ".3f"),
                  str(e.get("git_sha", "-")), str(e.get("when", "-")))
    console.print(t)
    return 0


# gemmlab figures ----------------------------------------------------------------------------------------

def _cmd_figures(args) -> int:
    from .figures import make_figures

    paths = make_figures(args.out, args.only, formats=tuple(args.format))
    _console().print(f"{len(paths)} files: " + ", ".join(str(p) for p in paths))
    return 0


# gemmlab mcp --------------------------------------------------------------------------------------------

def _cmd_mcp(args) -> int:
    try:
        from .mcp.server import serve
    except ModuleNotFoundError as e:
        if not (e.name or "").startswith("mcp"):
            raise
        print("gemmlab mcp: the MCP server needs the `mcp` package: pip install 'gemmlab[mcp]'", file=sys.stderr)
        return 2
    serve(http=args.http, host=args.host, port=args.port)
    return 0


# The parser ---------------------------------------------------------------------------------------------

class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the hand-laid-out epilogs; shows a default only where it says something."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "%(default)" not in text and action.default not in (None, False, argparse.SUPPRESS) \
                and action.option_strings:
            text += " (default: %(default)s)"
        return text


def _para(text: str) -> str:
    """A description as paragraphs wrapped to 88 columns (the formatter keeps them as given)."""
    import textwrap

    return "\n\n".join(textwrap.fill(" ".join(p.split()), 88) for p in text.split("\n\n"))


def build_parser() -> argparse.ArgumentParser:
    from .figures import FIGURES
    from .matmul_suites import SUITES as MATMUL_SUITES

    p = argparse.ArgumentParser(prog="gemmlab", description=_para(__doc__), epilog=EXAMPLES,
                                formatter_class=_Formatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    lad = sub.add_parser(
        "ladder", formatter_class=_Formatter, help="walk the kernel ladders (the default command)",
        description=_para("Walk both ladders step by step: the technique each step adds, registers, shared memory, "
                          "occupancy, spills, whether its SASS meets the step's claims, and the model's predicted "
                          "TFLOP/s. On a GPU, also time every step against cuBLAS (one interleaved run per ladder, "
                          "the project's timer) and save a ladder plot."))
    lad.add_argument("--ladder", choices=("sgemm", "hopper"), help="only this ladder")
    lad.add_argument("--shape", type=parse_shape, default="4096,4096,4096", metavar="M,N,K",
                     help="problem for the model and the timings")
    lad.add_argument("--clock", type=float, metavar="MHZ",
                     help="SM clock for the model without a GPU (default: the profile's sustained clock)")
    lad.add_argument("--no-time", action="store_true", help="on a GPU, skip the timings")
    lad.add_argument("--rounds", type=int, default=7, help="timing rounds per step (median reported)")
    lad.add_argument("--out", metavar="RECORDS.jsonl", help="also append the timing records here")
    lad.add_argument("--plot-dir", default="benchmarks/plots", metavar="DIR", help="where the ladder plot goes")
    lad.set_defaults(func=_cmd_ladder)

    ins = sub.add_parser(
        "inspect", formatter_class=_Formatter, help="resources, instruction mix, loops, SASS/PTX of a kernel",
        description=_para("Compile a ladder step (or a .cu file) without a GPU and read what the compiler made: "
                          "registers, shared memory, stack and spills from ptxas; the SASS instruction mix by class "
                          "(global/shared loads and stores with their widths, FFMA, HGMMA, TMA, barriers, branches, "
                          "LDL/STL); every loop and how much math its body holds (unrolled or not); the step's SASS "
                          "claims. --sass prints the listing with each instruction tagged by class; --diff shows what "
                          "changed between two steps."),
        epilog="examples:\n  gemmlab inspect k05 --config BM=64,BN=64\n  gemmlab inspect h04 --sass\n"
               "  gemmlab inspect k05 --diff k06\n  gemmlab inspect --file my.cu --expr 'scale<4>' --arch sm_90 --ptx")
    ins.add_argument("kernel", nargs="?", metavar="KERNEL", help="step name: k05, h04, sgemm.k05_blocktile_2d, ...")
    ins.add_argument("--config", action="append", metavar="K=V", help="template parameters (repeat or comma-separate)")
    ins.add_argument("--sass", action="store_true", help="print the annotated SASS listing")
    ins.add_argument("--ptx", action="store_true", help="print the PTX")
    ins.add_argument("--diff", metavar="OTHER", help="compare with another step (KERNEL -> OTHER)")
    ins.add_argument("--diff-config", action="append", metavar="K=V", help="config of the --diff step")
    ins.add_argument("--file", metavar="PATH.cu", help="inspect a CUDA C++ file instead of a ladder step")
    ins.add_argument("--expr", metavar="NAME<...>", help="with --file: the kernel (template instantiation) to build")
    ins.add_argument("--arch", default="sm_90a", help="with --file: target architecture")
    ins.set_defaults(func=_cmd_inspect)

    mod = sub.add_parser(
        "model", formatter_class=_Formatter, help="FLOPs, roofline, waves, occupancy and predicted time",
        description=_para("Analytic model of a GEMM: FLOPs, minimum bytes, arithmetic intensity, the roofline bound "
                          "and speed of light at an SM clock; with --kernel, the step's tile intensity, occupancy "
                          "(from ptxas registers, cross-checked with cuda-core on a GPU), tiles, waves and last-wave "
                          "utilization, global traffic, and the predicted time and TFLOP/s. Without --kernel, a "
                          "prediction for every step. The device is the visible GPU, else the named profile."))
    mod.add_argument("--shape", type=parse_shape, required=True, metavar="M,N,K", help="problem size")
    mod.add_argument("--kernel", metavar="STEP", help="model this step in detail")
    mod.add_argument("--config", action="append", metavar="K=V", help="the step's template parameters")
    mod.add_argument("--clock", type=float, metavar="MHZ",
                     help="SM clock for the speed of light (default: the profile's sustained 1320 MHz)")
    mod.add_argument("--profile", choices=("H200",), help="use this device profile even when a GPU is visible")
    mod.set_defaults(func=_cmd_model)

    ben = sub.add_parser(
        "bench", formatter_class=_Formatter, help="time steps against cuBLAS on a GPU; JSON-line records",
        description=_para("Time ladder steps against cuBLAS with the project's one timer (rotating inputs over 2x L2, "
                          "CUDA-graph replays, candidates interleaved, correctness checked first, SM clock recorded), "
                          "or gemmlab.matmul against torch on a matmul suite. Appends JSON lines (one per step, "
                          "config and shape, with the model's prediction; one per case for matmul suites) to --out, "
                          "prints a line per record as it arrives, then a table (TFLOP/s, ratio to cuBLAS, % of "
                          "speed of light at the recorded clock, GB/s, model) and draws plots. Needs a GPU; exits "
                          "with status 2 without one."
                          "\n\n"
                          "Each job is one interleaved run of every (step, config) at one shape. A step with a shape "
                          "heuristic (h10) runs the config it picks for each shape (as gemmlab.matmul would), the "
                          "others their defaults; --config overrides parameters of that config for the named steps; "
                          "--configs adds variants to the same run, each tried by every step that has its "
                          "parameters and offers its values (the rest skip it)."),
        epilog="suites (--suite):\n"
               "  ladder            every step of both ladders at 4096^3 (the default)\n"
               "  square            1024..8192 cubes for the last step of each ladder (or --steps)\n"
               "  matmul-NAME       gemmlab.matmul against torch on a gemmlab.matmul_suites suite:\n"
               "                    " + ", ".join(MATMUL_SUITES) + "; records labelled NAME,\n"
               "                    appended to benchmarks/results/matmul.jsonl\n"
               "  --shape/--shapes/--sizes replace a suite's shapes; without --suite they mean every step\n"
               "  (or --steps) at those shapes, labelled 'explicit'\n\n"
               "examples:\n"
               "  gemmlab bench --suite ladder --ladder hopper --sizes 4096,8192 --rounds 10\n"
               "  gemmlab bench --steps h10 --sizes 2048,3072,4096 --suite-name sweep --out sweep.jsonl\n"
               "  gemmlab bench --ladder sgemm --shapes '4095,4097,1023' --sizes 4096 \\\n"
               "                --configs 'WM=32,WN=64;BK=8,WM=32,WN=64;BK=8'\n"
               "  gemmlab bench --shape 4096,4096,4096 --steps h10 --config BN=128\n"
               "  gemmlab bench --suite matmul-llm --rounds 5")
    ben.add_argument("--suite", choices=("ladder", "square", *(MATMUL_PREFIX + n for n in MATMUL_SUITES)),
                     metavar="SUITE", help="which suite: ladder, square or matmul-NAME (see below; default: "
                     "ladder, or 'explicit' with --shape/--shapes/--sizes)")
    ben.add_argument("--ladder", choices=("sgemm", "hopper"), help="only the steps of this ladder")
    ben.add_argument("--steps", "--kernel", dest="kernel", action="append", metavar="STEP[,STEP...]",
                     help="only these steps (comma-separated or repeated; --kernel is the same option)")
    ben.add_argument("--shape", type=parse_shape, metavar="M,N,K", help="one explicit shape")
    ben.add_argument("--shapes", type=parse_shapes, metavar="M,N,K;M,N,K", help="explicit shapes")
    ben.add_argument("--sizes", type=parse_sizes, metavar="N,N,...", help="square sizes (after --shapes)")
    ben.add_argument("--config", action="append", metavar="K=V",
                     help="parameters of the named steps, over their default or heuristic config")
    ben.add_argument("--configs", type=parse_configs, metavar="K=V,K=V;K=V",
                     help="more configs in the same run, ';'-separated, each over every step's base config; "
                          "skipped where a step lacks a parameter or value")
    ben.add_argument("--rounds", type=int, default=15, help="timing rounds (median reported)")
    ben.add_argument("--suite-name", metavar="LABEL", help="the records' 'suite' field (default: the suite's "
                     "name; NAME for matmul-NAME)")
    ben.add_argument("--out", metavar="RECORDS.jsonl", help="append records here (default: "
                     "benchmarks/results/<label>.jsonl; benchmarks/results/matmul.jsonl for matmul suites)")
    ben.add_argument("--plots", metavar="DIR", help="plots go here (default: benchmarks/plots/<label>)")
    ben.add_argument("--no-plots", action="store_true", help="draw no plots (matmul suites never do)")
    ben.set_defaults(func=_cmd_bench)

    plo = sub.add_parser(
        "plot", formatter_class=_Formatter, help="table and plots from benchmark records (no GPU needed)",
        description=_para("Read JSON-line benchmark records, print the table (TFLOP/s, ratio to cuBLAS, % of speed of "
                          "light at each record's SM clock, the model's prediction at that clock and measured/model) "
                          "and draw the ladder plot (TFLOP/s per step, cuBLAS as a line, the model as markers), "
                          "TFLOP/s against size, and the roofline with the measured points."))
    plo.add_argument("records", nargs="+", metavar="RECORDS.jsonl", help="benchmark records (JSON lines)")
    plo.add_argument("--out", default="benchmarks/plots", metavar="DIR", help="output folder")
    plo.add_argument("--format", nargs="+", default=["png", "svg"], choices=("png", "svg", "pdf"),
                     help="file formats")
    plo.add_argument("--no-model", action="store_true",
                     help="do not add the model's prediction to records that lack one")
    plo.set_defaults(func=_cmd_plot)

    fig = sub.add_parser(
        "figures", formatter_class=_Formatter, help="the subject's figures (swizzle, tile order, roofline...)",
        description=_para("Draw the figures of the subject from the same functions the kernels and models use: "
                          + ", ".join(FIGURES) + ". Each is written as OUT/<name>.png and .svg."))
    fig.add_argument("out", metavar="OUT", help="output folder")
    fig.add_argument("--only", nargs="+", choices=list(FIGURES), metavar="NAME", help="only these figures")
    fig.add_argument("--format", nargs="+", default=["png", "svg"], choices=("png", "svg", "pdf"),
                     help="file formats")
    fig.set_defaults(func=_cmd_figures)

    tun = sub.add_parser(
        "tune", formatter_class=_Formatter, help="autotune a step's config for a shape on this GPU; saved per GPU",
        description=_para("Time a step's configs at one shape with the project's one timer (groups of candidates "
                          "per interleaved run with cuBLAS, correctness checked first, the best few re-timed "
                          "together), print every candidate and save the fastest correct one for this GPU under "
                          "the cache folder (GEMMLAB_CACHE_DIR/autotune). From then on KernelSpec.config_for (the "
                          "benchmarks, gemmlab.matmul's fp32 path) picks it for that step and shape on this GPU; "
                          "h11's config is the Hopper engine's plan (BN, SPLITS), which gemmlab.matmul then runs "
                          "for bf16/fp16 at that shape. "
                          "Candidates: the step's own choice (heuristic or defaults) plus an even spread over its "
                          "valid configs, or --configs. Needs a GPU (exits with status 2 without one); --show "
                          "lists the saved results, without a GPU those of every GPU."),
        epilog="examples:\n  gemmlab tune k08 --shape 4096,4096,4096\n"
               "  gemmlab tune h10 --shape 3072,3072,3072 --max-configs 16 --rounds 7\n"
               "  gemmlab tune h11 --shape 200,1024,4096   (the plan gemmlab.matmul runs at that shape)\n"
               "  gemmlab tune k10 --shape 4095,4097,1023 --configs 'WM=32,WN=64;BK=8'\n"
               "  gemmlab tune --show\n  gemmlab tune k08 --show")
    tun.add_argument("kernel", nargs="?", metavar="KERNEL", help="step name: k08, h10, sgemm.k10_double_buffered, ...")
    tun.add_argument("--shape", type=parse_shape, metavar="M,N,K", help="the problem to tune for")
    tun.add_argument("--max-configs", type=int, default=32, metavar="N", help="at most this many candidates")
    tun.add_argument("--rounds", type=int, default=5, help="timing rounds per call (median per candidate)")
    tun.add_argument("--configs", type=parse_configs, metavar="K=V,K=V;K=V",
                     help="time these configs (each over the defaults) instead of a spread over the step's space")
    tun.add_argument("--budget", type=float, metavar="SECONDS", help="start no new group of candidates after this")
    tun.add_argument("--show", action="store_true", help="list the saved results (KERNEL: only that step's)")
    tun.set_defaults(func=_cmd_tune)

    mcp = sub.add_parser(
        "mcp", formatter_class=_Formatter, help="serve the tools to coding agents over MCP (stdio or HTTP)",
        description=_para("Run gemmlab's MCP server (the `mcp` extra) for agents in VS Code, Cursor or Claude "
                          "Desktop: list_kernels, inspect_kernel, model_gemm, benchmark_gemm (GPU) and explain_gap, "
                          "plus the gemmlab://brief and gemmlab://ladders resources. Speaks stdio by default (what "
                          "editors launch); --http serves streamable HTTP at http://HOST:PORT/mcp, bound to "
                          "127.0.0.1 unless --host says otherwise. See the README's MCP section."))
    mcp.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
    mcp.add_argument("--host", default="127.0.0.1", help="with --http: the address to bind")
    mcp.add_argument("--port", type=int, default=8000, help="with --http: the port")
    mcp.set_defaults(func=_cmd_mcp)
    return p


def main(argv: list[str] | None = None) -> int:
    from .errors import GemmlabError

    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["ladder"] + argv
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except UsageError as e:
        print(f"gemmlab {args.command}: {e}", file=sys.stderr)
        return 2
    except GemmlabError as e:
        print(f"gemmlab {args.command}: {e}", file=sys.stderr)
        return 1
    except KeyError as e:  # registry.get: an unknown step name
        if not (e.args and str(e.args[0]).startswith("no kernel named")):
            raise
        print(f"gemmlab {args.command}: {e.args[0]}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
