"""What the compiler made, as reports: one kernel (``inspect_result``), two compared (``diff_result``), and
the ladder's static rows (``ladder_rows``: registers, smem, occupancy, spills, the SASS each step
introduces, the model). Everything compiles with NVRTC and reads nvdisasm's SASS; no GPU needed.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Literal

from . import doc
from .modelling import Occupancy, occupancy_report

ListingKind = Literal["none", "main_loop", "sass", "ptx"]


@dataclass
class ClassCount:
    cls: str = doc("global_load, global_store, shared_load, shared_store, local, ffma, hgmma, hmma, tma, barrier, "
                   "branch, other")
    count: int
    widths_bits: dict[int, int] = doc("access width in bits -> count")
    detail: str = ""


@dataclass
class LoopSummary:
    index: int
    start: str = doc("header address (hex)")
    end: str
    instructions: int
    depth: int
    innermost: bool
    ffma: int = doc("FFMA in the body outside nested loops")
    hgmma: int
    body: str = doc("unrolled or not, and what math one trip holds")


@dataclass
class Listing:
    kind: ListingKind
    lines: list[str]
    total_lines: int
    truncated: bool


@dataclass
class InspectResult:
    name: str
    arch: str
    name_expression: str
    registers: int
    static_smem_bytes: int
    dynamic_smem_bytes: int | None
    stack_frame_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    named_barriers: int
    threads_per_block: int | None
    occupancy: Occupancy | None = doc("the model's, with H200 limits; needs threads per block")
    instructions: int
    mix: list[ClassCount]
    loops: list[LoopSummary]
    highlights: list[str]
    features: list[str] = doc("SASS features: HGMMA shape, TMA load/multicast/store, mbarriers, STSM, 128-bit "
                              "accesses, spills, ...")
    sass_claims: list[str] = doc("the step's SASS expectations (registered steps)")
    sass_claims_failed: list[str] | None = doc("claims not met; None for user source")
    ptx_opcodes: dict[str, int] | None = doc("most common PTX opcodes (listing='ptx')")
    listing: Listing


@dataclass
class DiffRow:
    what: str
    a: str
    b: str
    change: str = doc("b - a where both are numbers")


@dataclass
class DiffResult:
    a: str
    b: str
    rows: list[DiffRow] = doc("what differs: resources, instruction classes, access widths, loops")
    opcodes_added: dict[str, int]
    opcodes_removed: dict[str, int]


@dataclass
class LadderRow:
    step: str
    kernel: str
    technique: str
    config: dict[str, int] = doc("the config the step runs at the shape (tuned, heuristic or defaults)")
    registers: int | None
    smem_bytes: int | None = doc("static + dynamic shared memory per block")
    blocks_per_sm: int | None
    limiter: str | None
    spills: bool | None
    sass_new: list[str] = doc("SASS features this step shows that the step before it does not")
    sass_claims_failed: list[str] = doc("the step's SASS claims that do not hold (empty: all met)")
    model_tflops: float | None = doc("predicted at the shape and clock (None: the step cannot run the shape); "
                                     "at the measured SM clock where the step was timed")
    error: str | None = doc("why the step could not be compiled or checked")
    tflops: float | None = doc("measured on a GPU (None: not timed, or wrong)")
    ratio_vs_cublas: float | None = None
    rel_error: float | None = None


# One kernel -------------------------------------------------------------------------------------------------

def features(summary) -> list[str]:
    """``gemmlab.sass.features`` and the math one trip of the main loop holds (``main loop 2 HGMMA``):
    what a reader compares between two steps."""
    from .. import inspect as gi
    from .. import sass

    best = max(gi.loops_of(summary), key=lambda lp: lp.compute, default=None)
    loop = []
    if best is not None and best.compute:
        loop = ["main loop " + ", ".join(f"{best.own[c]} {c.upper()}" for c in gi.COMPUTE_CLASSES if best.own.get(c))]
    return sass.features(summary) + loop


def _cap(lines: list[str], kind: str, max_lines: int | None) -> Listing:
    n = len(lines) if max_lines is None else max_lines
    return Listing(kind=kind, lines=lines[:n], total_lines=len(lines), truncated=len(lines) > n)


def main_loop_lines(rep, lines: list[str]) -> list[str] | None:
    """The annotated lines of the loop holding the most math (None when there is none)."""
    best = max(rep.loops, key=lambda lp: lp.compute, default=None)
    if best is None or not best.compute:
        return None
    out = []
    for line in lines:
        if line.startswith("┌"):
            if line.startswith(f"┌ loop L{best.index}:"):
                out.append(line)
            continue
        try:
            addr = int(line.split()[0], 16)
        except (ValueError, IndexError):
            continue
        if addr in best.addresses:
            out.append(line)
    return out


_PTX_OP = re.compile(r"^\s*(?:@!?%\w+\s+)?([a-z][a-z0-9_]*(?:\.[a-z0-9_:]+)*)\b")


def ptx_opcodes(ptx: str, top: int = 30) -> dict[str, int]:
    """The most common PTX instructions (with their modifiers) of a listing."""
    ops: Counter = Counter()
    for line in ptx.splitlines():
        s = line.strip()
        if not s or s.startswith(("//", ".", "}", "{", "$")) or s.endswith(":"):
            continue
        m = _PTX_OP.match(s)
        if m:
            ops[m.group(1)] += 1
    return dict(ops.most_common(top))


def inspect_result(rep, *, listing: ListingKind = "none", max_lines: int | None = None,
                   ptx: str | None = None) -> InspectResult:
    """A ``gemmlab.inspect.Report`` as a report, with a listing: ``main_loop`` (the annotated SASS of the loop
    with the most math; the whole SASS when there is none), ``sass``, ``ptx`` (give ``ptx``) or ``none``;
    at most ``max_lines`` lines."""
    from .. import inspect as gi
    from .. import model

    r = rep.resources
    occ = occupancy_report(model.occupancy(rep.threads, r.registers, rep.smem_bytes)) if rep.threads else None
    widths = rep.widths()
    kinds = rep.barrier_kinds()
    mix = [ClassCount(cls=c, count=n, widths_bits=widths.get(c, {}),
                      detail=", ".join(f"{k} {v}" for k, v in kinds.items()) if c == "barrier" else "")
           for c in gi.CLASS_ORDER if (n := rep.summary.class_counts.get(c, 0))]
    loops = [LoopSummary(index=lp.index, start=f"{lp.start:05x}", end=f"{lp.end:05x}", instructions=lp.instructions,
                         depth=lp.depth, innermost=lp.innermost, ffma=lp.own.get("ffma", 0),
                         hgmma=lp.own.get("hgmma", 0), body=lp.unrolled) for lp in rep.loops]
    if listing == "none":
        lst = Listing(kind="none", lines=[], total_lines=0, truncated=False)
    elif listing == "ptx":
        lst = _cap([ln for ln in (ptx or "").splitlines() if ln.strip() and not ln.lstrip().startswith("//")],
                   "ptx", max_lines)
    else:
        lines = gi.annotate(rep)
        main = main_loop_lines(rep, lines) if listing == "main_loop" else None
        lst = _cap(main, "main_loop", max_lines) if main is not None else _cap(lines, "sass", max_lines)
    return InspectResult(
        name=rep.name, arch=rep.arch, name_expression=rep.name_expression, registers=r.registers,
        static_smem_bytes=r.static_shared, dynamic_smem_bytes=rep.dynamic_smem, stack_frame_bytes=r.stack_frame,
        spill_store_bytes=r.spill_stores, spill_load_bytes=r.spill_loads, named_barriers=r.barriers,
        threads_per_block=rep.threads, occupancy=occ, instructions=len(rep.summary.instructions), mix=mix,
        loops=loops, highlights=rep.highlights(), features=features(rep.summary), sass_claims=rep.claims,
        sass_claims_failed=rep.checks, ptx_opcodes=ptx_opcodes(ptx) if ptx else None, listing=lst)


def step_report(kernel: str, config: dict | None = None):
    """Compile a registered step (``k06``, ``hopper.h04_two_consumers``) at ``config`` and read it: the
    ``gemmlab.inspect.Report``, the spec and the resolved config."""
    from .. import inspect as gi
    from . import find_step
    from .modelling import resolve_config

    spec = find_step(kernel)
    cfg = resolve_config(spec, config)
    return gi.inspect_compiled(spec.compile(cfg), spec=spec, config=cfg), spec, cfg


def inspect_step(kernel: str, config: dict | None = None, *, listing: ListingKind = "none",
                 max_lines: int | None = None) -> InspectResult:
    """``inspect_result`` of a registered step at ``config``."""
    from .. import inspect as gi

    rep, spec, cfg = step_report(kernel, config)
    ptx = gi.ptx_for_step(spec, cfg) if listing == "ptx" else None
    return inspect_result(rep, listing=listing, max_lines=max_lines, ptx=ptx)


def diff_result(a, b) -> DiffResult:
    """What changed from report ``a`` to report ``b`` (``gemmlab.inspect.diff``), as rows."""
    from .. import inspect as gi

    d = gi.diff(a, b)

    def row(what, va, vb) -> DiffRow:
        change = f"{vb - va:+d}" if isinstance(va, int) and isinstance(vb, int) else ""
        return DiffRow(what=what, a=str(va), b=str(vb), change=change)

    rows = [row(what, va, vb) for what, va, vb in d.resources]
    rows += [row(f"{cls} instructions", va, vb) for cls, va, vb in d.mix]
    rows += [row(f"{cls} {w}-bit", va, vb) for cls, w, va, vb in d.widths]
    rows += [row(what, va, vb) for what, va, vb in d.loops]
    return DiffResult(a=a.name, b=b.name, rows=rows, opcodes_added=d.opcodes_added, opcodes_removed=d.opcodes_removed)


# The ladder's static view -----------------------------------------------------------------------------------------

def config_at(spec, shape, sm_count: int) -> dict:
    """The config a step runs at ``shape`` (``KernelSpec.config_for``: tuned, else its heuristic), or its
    defaults where it cannot run that shape."""
    from ..errors import UnsupportedProblem

    if spec.why_unsupported(*shape) is not None:
        return spec.default_config()
    try:
        return spec.config_for(*shape, sm_count)
    except UnsupportedProblem:
        return spec.default_config()


def ladder_rows(specs, shape: tuple[int, int, int], profile, clock_mhz: float | None, *,
                progress=None) -> list[LadderRow]:
    """One row per step: compiled at the config it runs for ``shape``, its SASS checked against its claims
    and compared with the step before it, its occupancy and the model's TFLOP/s at ``clock_mhz``. A step
    that fails to compile gets a row with ``error`` (one broken step does not hide the others).
    ``progress(spec)`` is called before each step."""
    from .. import model, sass
    from ..errors import GemmlabError

    rows, previous = [], {}
    for spec in specs:
        if progress is not None:
            progress(spec)
        cfg = config_at(spec, shape, profile.sm_count)
        try:
            ck = spec.compile(cfg)
            summ = sass.kernel_summary(ck)
        except GemmlabError as e:
            rows.append(LadderRow(step=spec.short, kernel=spec.name, technique=spec.technique, config=cfg,
                                  registers=None, smem_bytes=None, blocks_per_sm=None, limiter=None, spills=None,
                                  sass_new=[], sass_claims_failed=[], model_tflops=None,
                                  error=str(e).splitlines()[0], tflops=None))
            continue
        feats = features(summ)
        before = previous.get(spec.ladder)
        previous[spec.ladder] = feats
        smem = spec.smem_bytes(cfg) + ck.resources.static_shared
        occ = model.occupancy(spec.threads(cfg), ck.resources.registers, smem, profile)
        pred = None
        if spec.why_unsupported(*shape) is None:
            pred = model.predict_step(spec, *shape, cfg, profile=profile, clock_mhz=clock_mhz, compiled=ck,
                                      summary=summ).tflops
        rows.append(LadderRow(step=spec.short, kernel=spec.name, technique=spec.technique, config=cfg,
                              registers=ck.resources.registers, smem_bytes=smem, blocks_per_sm=occ.blocks_per_sm,
                              limiter=occ.limiter, spills=ck.resources.spills,
                              sass_new=[f for f in feats if before is None or f not in before],
                              sass_claims_failed=sass.check(spec.sass_expect(cfg), summ, ck.resources),
                              model_tflops=pred, error=None, tflops=None))
    return rows


def attach_measurements(rows: list[LadderRow], records: list[dict]) -> None:
    """Put timing records (``gemmlab.bench`` records with the model added, ``records.add_model``) into the
    rows of their steps: TFLOP/s, ratio to cuBLAS, error, and the model at the measured clock."""
    by_name = {r["kernel"]: r for r in records}
    for row in rows:
        rec = by_name.get(row.kernel)
        if rec is None:
            continue
        row.tflops, row.ratio_vs_cublas, row.rel_error = rec.get("tflops"), rec.get("ratio"), rec.get("rel_error")
        row.model_tflops = rec.get("model_tflops", row.model_tflops)


def file_report(path, expr: str | None = None, arch: str = "sm_90a"):
    """Compile a user's ``.cu`` file and read it (``gemmlab.inspect.Report``); without ``expr``, its one
    ``__global__`` function. Returns the report and the name expression built."""
    from pathlib import Path

    from .. import inspect as gi
    from . import BadRequest

    path = Path(path)
    try:
        code = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise BadRequest(f"{path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    if expr is None:
        found = gi.kernels_in_source(code)
        if not found:
            raise BadRequest(f"{path}: no __global__ function found; name the kernel with --expr")
        if len(found) > 1:
            raise BadRequest(f"{path} holds {len(found)} kernels ({', '.join(n for n, _ in found)}); "
                             "pick one with --expr NAME")
        name, template = found[0]
        if template:
            raise BadRequest(f"{path}: {name} is a template; give the instantiation to build, e.g. "
                             f"--expr '{name}<128>'")
        expr = name
    return gi.inspect_compiled(gi.compile_file(path, expr, arch)), expr


# The engine's planned kernels ---------------------------------------------------------------------------------

# What `gemmlab inspect` / inspect_plan compile besides the ladder steps: the instantiation a call would run.
PLANNED = {"engine": "gemmlab.matmul's engine kernel (gemmlab.planner.plan)",
           "fp8": "gemmlab.scaled_mm's FP8 kernel (gemmlab.planner.plan_fp8)",
           "grouped": "gemmlab.grouped_mm's kernel (gemmlab.grouped.plan)"}


def planned(kind: str, M: int, N: int, K: int, *, groups: int | None = None, layout: str = "contiguous",
            dtype: str = "bf16", scale: str = "tensor"):
    """The plan of ``kind`` (``PLANNED``) for an (M, K) x (K, N) problem (grouped: M = T or C rows, ``groups``
    experts, ``layout``; dtype bf16 / fp16, or fp8 for grouped), with its source and compile function."""
    from .. import engine2, grouped, planner
    from . import BadRequest, check_dims

    check_dims(M, N, K)
    if kind not in PLANNED:
        raise BadRequest(f"unknown planned kernel {kind!r}; one of {', '.join(PLANNED)}")
    if kind == "grouped" and groups is None:
        raise BadRequest("the grouped kernel needs groups (the number of experts)")
    if kind != "grouped" and groups is not None:
        raise BadRequest(f"groups go with the grouped kernel, not {kind!r}")
    if scale != "tensor" and not (kind == "fp8" or (kind == "grouped" and dtype == "fp8")):
        raise BadRequest("scale 'block' goes with fp8 operands (kernel 'fp8', or 'grouped' with dtype fp8)")
    try:
        if kind == "engine":
            if dtype not in ("bf16", "fp16"):
                raise BadRequest(f"the engine kernel takes bf16 or fp16 operands, not {dtype!r} (fp8: 'fp8')")
            p = planner.plan(M, N, K, dtype=dtype)
            return p, planner.SOURCE, engine2.compile_plan, engine2.sass_expect
        if kind == "fp8":
            p = planner.plan_fp8(M, N, K, scale=scale)
            return p, planner.FP8_SOURCE, engine2.compile_fp8_plan, engine2.sass_expect_fp8
        if dtype not in ("bf16", "fp16", "fp8"):
            raise BadRequest(f"grouped_mm takes bf16, fp16 or fp8 operands, not {dtype!r}")
        p = grouped.plan(layout, groups, M, N, K, dtype="e4m3" if dtype == "fp8" else dtype,
                         scale=scale if dtype == "fp8" else "tensor")
        return p, grouped.SOURCE, grouped.compile_plan, grouped.sass_expect
    except ValueError as e:
        if isinstance(e, BadRequest):
            raise
        raise BadRequest(str(e)) from None


def plan_report(kind: str, M: int, N: int, K: int, **kw):
    """Compile the kernel a call would run at the shape (``planned``) and read it: the
    ``gemmlab.inspect.Report`` (threads, dynamic shared memory and the plan's SASS claims checked), and a
    function that returns its PTX."""
    from .. import inspect as gi
    from .. import sass
    from ..jit.compiler import collect_sources

    p, source, compile_fn, expect_fn = planned(kind, M, N, K, **kw)
    ck = compile_fn(p)
    rep = gi.inspect_compiled(ck)
    rep.name = f"{kind}: {p.compiled_name}"
    rep.threads = p.threads
    rep.dynamic_smem = p.smem_bytes
    expect = expect_fn(p)
    rep.checks = sass.check(expect, rep.summary, ck.resources)
    rep.claims = expect.describe()

    def ptx() -> str:
        return gi._ptx(collect_sources(source)[source], source, p.name_expression, "sm_90a",
                       [str((gi.KERNEL_ROOT / source).parent)])

    return rep, p, ptx


def inspect_plan(kind: str, M: int, N: int, K: int, *, listing: ListingKind = "none", max_lines: int | None = None,
                 **kw) -> InspectResult:
    """``inspect_result`` of the kernel a call would run at the shape (``plan_report``)."""
    rep, _, ptx = plan_report(kind, M, N, K, **kw)
    return inspect_result(rep, listing=listing, max_lines=max_lines, ptx=ptx() if listing == "ptx" else None)
