"""``gemmlab inspect``: what the compiler made of a step or a ``.cu`` file (``reports.compiled``)."""

from __future__ import annotations

from pathlib import Path

from .common import console, emit_json, fmt_bytes, table
from .parser import UsageError, parse_config


def _is_file(target: str | None) -> bool:
    return target is not None and (target.endswith((".cu", ".cuh")) or "/" in target or Path(target).is_file())


def run(args) -> int:
    from .. import inspect as gi
    from ..reports import compiled

    if args.file and args.kernel:
        raise UsageError("give a step or a file, not both (a file can be the first argument: gemmlab inspect my.cu)")
    path = args.file or (args.kernel if _is_file(args.kernel) else None)
    if args.json and args.sass and args.ptx:
        raise UsageError("with --json, choose one listing: --sass or --ptx")
    config = parse_config(args.config)
    planned_only = {"--shape": args.shape, "--groups": args.groups, "--layout": args.layout, "--dtype": args.dtype,
                    "--scale": args.scale}
    if args.kernel in compiled.PLANNED:
        return _planned(args, config)
    for flag, value in planned_only.items():
        if value is not None:
            raise UsageError(f"{flag} goes with a planned kernel ({', '.join(compiled.PLANNED)})")
    if path is not None:
        if config:
            raise UsageError("--config is for ladder steps; for a file, spell the template arguments in --expr")
        rep, expr = compiled.file_report(path, args.expr, args.arch)
        ptx = (lambda: gi.ptx_for_source(Path(path).read_text(), expr, args.arch))
    elif args.kernel:
        if args.expr:
            raise UsageError("--expr goes with a file; a step builds its own instantiation (use --config)")
        rep, spec, cfg = compiled.step_report(args.kernel, config)
        ptx = (lambda: gi.ptx_for_step(spec, cfg))
    else:
        raise UsageError("name a step (e.g. k05, h4) or a .cu file")

    out = console()
    if args.diff:
        other, _, _ = compiled.step_report(args.diff, parse_config(args.diff_config, "--diff-config"))
        d = compiled.diff_result(rep, other)
        if args.json:
            emit_json(d)
        else:
            _print_diff(out, d)
        return 0

    return _report(args, rep, ptx, lambda: out)


def _report(args, rep, ptx, console_of, head: str | None = None) -> int:
    """The inspect report of one compiled kernel (``--json``, else the table, ``head`` above it), with
    its annotated SASS (``--sass``) and PTX (``--ptx``) after it."""
    from ..reports import compiled

    listing = "ptx" if args.ptx and not args.sass else "sass" if args.sass else "none"
    result = compiled.inspect_result(rep, listing=listing, ptx=ptx() if listing == "ptx" else None)
    if args.json:
        emit_json(result)
        return 0
    out = console_of()
    if head is not None:
        out.print(head, markup=False, highlight=False)
    _print_report(out, result)
    if args.sass:
        out.rule("annotated SASS")
        for line in result.listing.lines:
            out.print(line, markup=False, highlight=False, soft_wrap=True)
    if args.ptx:
        out.rule("PTX")
        out.print(ptx(), markup=False, highlight=False, soft_wrap=True)
    return 0


def _planned(args, config) -> int:
    """``gemmlab inspect engine|fp8|grouped --shape ...``: the instantiation the call would run."""
    from ..reports import compiled

    if args.shape is None:
        raise UsageError(f"{args.kernel} needs --shape M,N,K (the kernel is the one planned for it)")
    if config or args.diff or args.file or args.expr:
        raise UsageError("--config, --diff, --file and --expr go with ladder steps and files; a planned kernel "
                         "takes --shape (and --groups, --layout, --dtype, --scale)")
    if args.layout is not None and args.kernel != "grouped":
        raise UsageError("--layout goes with grouped")
    M, N, K = args.shape
    rep, plan, ptx = compiled.plan_report(args.kernel, M, N, K, groups=args.groups, layout=args.layout or "contiguous",
                                          dtype=args.dtype or "bf16", scale=args.scale or "tensor")
    return _report(args, rep, ptx, console, head=repr(plan))


def _widths_str(widths: dict) -> str:
    return ", ".join(f"{n} x {w}-bit" for w, n in sorted(widths.items(), reverse=True))


def _print_report(out, r) -> None:
    facts = table(f"{r.name}  ({r.arch}, {r.name_expression})", show_header=False)
    facts.add_column("what", style="bold")
    facts.add_column("value")
    facts.add_row("registers / thread", str(r.registers))
    smem = f"{fmt_bytes(r.static_smem_bytes)} static"
    if r.dynamic_smem_bytes is not None:
        smem += f" + {fmt_bytes(r.dynamic_smem_bytes)} dynamic"
    facts.add_row("shared memory / block", smem)
    facts.add_row("stack frame", f"{r.stack_frame_bytes} B")
    facts.add_row("spills (stores / loads)", f"{r.spill_store_bytes} B / {r.spill_load_bytes} B")
    facts.add_row("named barriers", str(r.named_barriers))
    if r.occupancy is not None:
        o = r.occupancy
        facts.add_row("threads / block", str(r.threads_per_block))
        facts.add_row("occupancy (model, H200 limits)",
                      f"{o.blocks_per_sm} blocks/SM ({o.warps_per_sm} warps, {o.fraction:.0%}), limited by {o.limiter}")
    facts.add_row("instructions", str(r.instructions))
    if r.features:
        facts.add_row("SASS features", ", ".join(r.features))
    for h in r.highlights:
        facts.add_row("highlight", h)
    out.print(facts)

    mix = table("instruction mix")
    for col in ("class", "count", "detail"):
        mix.add_column(col)
    for c in r.mix:
        mix.add_row(c.cls, str(c.count), c.detail or _widths_str(c.widths_bits))
    out.print(mix)

    if r.loops:
        lt = table("loops (FFMA/HGMMA: in the body outside nested loops)")
        for col in ("loop", "header..last", "instructions", "depth", "FFMA", "HGMMA", "body"):
            lt.add_column(col)
        for lp in r.loops:
            lt.add_row(f"L{lp.index}", f"{lp.start}..{lp.end}", str(lp.instructions),
                       str(lp.depth) + (" (innermost)" if lp.innermost else ""), str(lp.ffma), str(lp.hgmma), lp.body)
        out.print(lt)
    else:
        out.print("no loops")
    if r.sass_claims_failed is not None:
        if r.sass_claims_failed:
            out.print("[red]SASS claims failed:[/red] " + "; ".join(r.sass_claims_failed))
        else:
            out.print("SASS claims met: " + "; ".join(r.sass_claims))


def _print_diff(out, d) -> None:
    t = table(f"{d.a}  ->  {d.b}")
    for col in ("what", "A", "B", "change"):
        t.add_column(col)
    for row in d.rows:
        t.add_row(row.what, row.a, row.b, row.change)
    if not (d.rows or d.opcodes_added or d.opcodes_removed):
        t.add_row("(no difference)", "", "", "")
    out.print(t)
    if d.opcodes_added:
        out.print("new opcodes: " + ", ".join(f"{op} x{n}" for op, n in d.opcodes_added.items()))
    if d.opcodes_removed:
        out.print("gone opcodes: " + ", ".join(f"{op} x{n}" for op, n in d.opcodes_removed.items()))
