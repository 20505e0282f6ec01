"""Read what the compiler made of a kernel: resources, instruction mix, loops, annotated SASS, PTX, diffs.

Works on a registered ladder step (``inspect_step("h04", {"QSIZE": 3})``) or on any CUDA C++ source
(``compile_source(code, "my_kernel<128>", "sm_90a")`` then ``inspect_compiled``). Everything runs
without a GPU: NVRTC compiles, ptxas reports resources, nvdisasm prints the SASS, and
``gemmlab.sass`` classifies it.

- ``Report``: registers, shared memory, spills and stack (from ptxas), the instruction mix by class with
  access widths, the loops and what each body holds, and the step's SASS claims checked.
- ``annotate``: the SASS listing, each instruction tagged with its class (and width), loops marked.
- ``ptx_for_step`` / ``ptx_for_source``: the PTX NVRTC generates for the same source and options.
- ``diff``: what changed between two reports in those terms.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from . import sass
from .errors import CompileError
from .jit.compiler import KERNEL_ROOT, CompiledKernel, Resources, collect_sources, compile_kernel

# Classes in the order the tables list them.
CLASS_ORDER = ("global_load", "global_store", "shared_load", "shared_store", "local", "ffma", "hgmma", "hmma",
               "tma", "barrier", "branch", "other")
WIDTH_CLASSES = ("global_load", "global_store", "shared_load", "shared_store", "local")
COMPUTE_CLASSES = ("ffma", "hgmma", "hmma")


# Compiling a source string -------------------------------------------------------------------------

def _source_dir() -> Path:
    from .jit.cache import cache_dir

    return cache_dir() / "sources"


def compile_source(code: str, name_expression: str, arch: str = "sm_90a", *, name: str | None = None,
                   **kwargs) -> CompiledKernel:
    """Compile CUDA C++ ``code`` (a string) and instantiate ``name_expression`` for ``arch``. No GPU needed.

    The code may ``#include "common/..."`` headers from ``gemmlab/kernels`` and the CUDA headers. It is
    written once to a file named by its hash under the cache folder, so the JIT's disk cache applies.
    """
    digest = hashlib.sha256(code.encode()).hexdigest()[:20]
    folder = _source_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"src_{digest}.cu"
    if not path.is_file() or path.read_text() != code:
        tmp = path.with_suffix(f".tmp{digest}")
        tmp.write_text(code)
        tmp.replace(path)
    # An absolute path joins onto kernels/ as itself, so the JIT compiles it like a kernel file.
    return compile_kernel(str(path), name_expression, arch=arch, name=name or name_expression, **kwargs)


def compile_file(path: str | Path, name_expression: str, arch: str = "sm_90a") -> CompiledKernel:
    """Compile a user's ``.cu`` file (see ``compile_source``; its own ``#include "..."`` must be headers
    under ``gemmlab/kernels``, which are on the include path)."""
    path = Path(path)
    if not path.is_file():
        raise CompileError(f"{path}: no such file")
    code = path.read_text()
    for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', code, re.MULTILINE):
        if not (KERNEL_ROOT / inc).is_file():
            raise CompileError(f"{path}: #include \"{inc}\" is not a header under {KERNEL_ROOT}; inline it "
                               "or include the gemmlab headers (e.g. \"common/tma.cuh\")")
    return compile_source(code, name_expression, arch, name=f"{path.name}:{name_expression}")


def _ptx(code: str, name: str, name_expression: str, arch: str, include_dirs: list[str]) -> str:
    """PTX through NVRTC's own bindings. (cuda-core's ``Program.compile("ptx")`` first asks the driver
    whether it could load the PTX, which fails on a machine without a driver; the cubin path does not.)"""
    from cuda.bindings import nvrtc

    from .jit.toolchain import cuda_include_dir

    def ok(res, what):
        err, *rest = res
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(f"{name_expression}: {what} failed: {err}")
        return rest

    (prog,) = ok(nvrtc.nvrtcCreateProgram(code.encode(), name.encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        ok(nvrtc.nvrtcAddNameExpression(prog, name_expression.encode()), "nvrtcAddNameExpression")
        opts = [f"--gpu-architecture={arch}", "-std=c++17"]
        opts += [f"--include-path={d}" for d in (str(KERNEL_ROOT), *include_dirs, cuda_include_dir())]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            (size,) = ok(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
            log = b" " * size
            ok(nvrtc.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
            raise CompileError(f"{name_expression}: NVRTC (PTX) failed for {arch}:\n"
                               f"{log.decode(errors='replace').rstrip(chr(0))}")
        (size,) = ok(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
        buf = b" " * size
        ok(nvrtc.nvrtcGetPTX(prog, buf), "nvrtcGetPTX")
        return buf.decode().rstrip("\x00")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def ptx_for_source(code: str, name_expression: str, arch: str = "sm_90a") -> str:
    """The PTX NVRTC makes of ``code`` for ``name_expression`` (same options as the cubin build)."""
    return _ptx(code, "source.cu", name_expression, arch, [])


def ptx_for_step(spec, config: dict | None = None) -> str:
    """The PTX of a registered step for ``config`` (the same source, headers and options as its cubin)."""
    sources = collect_sources(spec.source)
    return _ptx(sources[spec.source], spec.source, spec.name_expression(config), spec.arch,
                [str((KERNEL_ROOT / spec.source).parent)])


# Reports ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LoopInfo:
    """A loop in the SASS (a backward branch) and what its body holds."""

    index: int
    start: int
    end: int
    instructions: int
    depth: int  # 0 = outermost
    innermost: bool
    mix: dict

    @property
    def compute(self) -> int:
        return sum(self.mix.get(c, 0) for c in COMPUTE_CLASSES)

    @property
    def unrolled(self) -> str:
        """What the body says about unrolling. SASS does not say how many source iterations one trip covers;
        several FFMA/HGMMA in one body means the compiler (or a pragma) replicated the loop's work."""
        parts = [f"{self.mix[c]} {c.upper()}" for c in COMPUTE_CLASSES if self.mix.get(c)]
        if not parts:
            return "no math"
        return ("unrolled: " if self.compute > 1 else "not unrolled: ") + ", ".join(parts) + " per trip"


@dataclass
class Report:
    name: str
    arch: str
    name_expression: str
    resources: Resources
    summary: sass.SassSummary
    sass_text: str
    loops: list[LoopInfo]
    dynamic_smem: int | None = None  # from the registry, for registered steps
    threads: int | None = None
    checks: list[str] | None = None  # failed SASS claims (None: no claims, e.g. a user file)
    claims: list[str] = field(default_factory=list)

    @property
    def smem_bytes(self) -> int:
        return self.resources.static_shared + (self.dynamic_smem or 0)

    def mix(self) -> dict[str, int]:
        return {c: self.summary.class_counts.get(c, 0) for c in CLASS_ORDER if self.summary.class_counts.get(c, 0)}

    def widths(self) -> dict[str, dict[int, int]]:
        return {c: dict(sorted(self.summary.widths[c].items())) for c in WIDTH_CLASSES if c in self.summary.widths}

    def highlights(self) -> list[str]:
        """One-line facts a reader looks for first."""
        s, r = self.summary, self.resources
        out = []
        gl = self.summary.widths.get("global_load", Counter())
        if gl:
            out.append("global loads " + ", ".join(f"{n}x{w}-bit" for w, n in sorted(gl.items(), reverse=True)))
        sl = self.summary.widths.get("shared_load", Counter())
        if sl:
            out.append("shared loads " + ", ".join(f"{n}x{w}-bit" for w, n in sorted(sl.items(), reverse=True)))
        for cls, what in (("hgmma", "HGMMA"), ("hmma", "HMMA"), ("tma", "TMA")):
            if s.class_counts.get(cls):
                out.append(f"{s.class_counts[cls]} {what}")
        best = max(self.loops, key=lambda lp: lp.compute, default=None)
        if best is not None and best.compute:
            out.append(f"main loop {best.unrolled}")
        if s.class_counts.get("local") or r.stack_frame or r.spills:
            out.append(f"LOCAL MEMORY: {s.class_counts.get('local', 0)} LDL/STL, stack {r.stack_frame} B, "
                       f"spills {r.spill_stores}/{r.spill_loads} B")
        return out


def loops_of(summary: sass.SassSummary) -> list[LoopInfo]:
    """The loops with nesting depth; drops nvdisasm's one-instruction trap (``BRA`` to itself after EXIT)."""
    loops = sorted((lp for lp in summary.loops if lp.instructions > 1), key=lambda lp: (lp.start, -lp.end))
    out = []
    for i, lp in enumerate(loops):
        depth = sum(1 for o in loops if o is not lp and o.start <= lp.start and lp.end <= o.end)
        inner = not any(o is not lp and lp.start <= o.start and o.end <= lp.end for o in loops)
        out.append(LoopInfo(index=i, start=lp.start, end=lp.end, instructions=lp.instructions, depth=depth,
                            innermost=inner, mix=dict(lp.mix)))
    return out


def inspect_compiled(compiled: CompiledKernel, *, spec=None, config: dict | None = None) -> Report:
    """A report on one compiled kernel (``spec`` adds its smem, threads and SASS claims)."""
    text = sass.disassemble(compiled.cubin, compiled.mangled_name)
    summary = sass.summarize(sass.parse(text))
    rep = Report(name=compiled.name, arch=compiled.arch, name_expression=compiled.name_expression,
                 resources=compiled.resources, summary=summary, sass_text=text, loops=loops_of(summary))
    if spec is not None:
        cfg = spec.resolve(config)
        rep.dynamic_smem = spec.smem_bytes(cfg)
        rep.threads = spec.threads(cfg)
        rep.checks = sass.check(spec.sass, summary, compiled.resources)
        rep.claims = spec.sass.describe()
    return rep


def inspect_step(name_or_spec, config: dict | None = None) -> Report:
    """A report on a registered step (``"k05"``, ``"hopper.h04_two_consumers"``) for ``config``."""
    from . import registry

    spec = registry.get(name_or_spec) if isinstance(name_or_spec, str) else name_or_spec
    return inspect_compiled(spec.compile(config), spec=spec, config=config)


# The annotated listing --------------------------------------------------------------------------------

def tag(ins: sass.Instruction) -> str:
    """``global_load.128``-style tag: the class, and the access width for memory instructions
    (``barrier.mbarrier`` for the ``SYNCS`` ops that implement mbarriers)."""
    cls = sass.classify(ins)
    if cls in WIDTH_CLASSES:
        return f"{cls}.{sass._width(ins.opcode)}"
    if cls == "barrier" and ins.base == "SYNCS":
        return "barrier.mbarrier"
    return cls


def annotate(report: Report) -> list[str]:
    """The SASS, one line per instruction: address, class tag, the instruction; loop starts and ends marked
    (``┌ loop 2 (innermost, 16 FFMA)`` ... ``└ loop 2``)."""
    width = max((len(tag(i)) for i in report.summary.instructions), default=8)
    lines = []
    depth = 0
    for ins in report.summary.instructions:
        # Outer loops open first (the longer body), inner ones close first.
        for lp in sorted((lp for lp in report.loops if lp.start == ins.address), key=lambda lp: -lp.instructions):
            what = ", ".join(f"{lp.mix[c]} {c.upper()}" for c in COMPUTE_CLASSES if lp.mix.get(c)) or "no math"
            lines.append(f"{'│ ' * depth}┌ loop {lp.index} ({lp.instructions} instructions, {what}"
                         f"{', innermost' if lp.innermost else ''})")
            depth += 1
        pred = f"{ins.predicate} " if ins.predicate else ""
        lines.append(f"{'│ ' * depth}{ins.address:05x}  {tag(ins):<{width}}  {pred}{ins.opcode} {ins.operands}".rstrip())
        for lp in sorted((lp for lp in report.loops if lp.end == ins.address), key=lambda lp: lp.instructions):
            depth = max(0, depth - 1)
            lines.append(f"{'│ ' * depth}└ loop {lp.index}")
    return lines


# Diffs ------------------------------------------------------------------------------------------------

@dataclass
class Diff:
    a: Report
    b: Report
    resources: list[tuple[str, object, object]]  # (what, a, b) where they differ
    mix: list[tuple[str, int, int]]  # (class, a, b) where counts differ
    widths: list[tuple[str, int, int, int]]  # (class, width, a, b) where counts differ
    loops: list[tuple[str, object, object]]
    opcodes_added: dict[str, int]
    opcodes_removed: dict[str, int]

    @property
    def empty(self) -> bool:
        return not (self.resources or self.mix or self.widths or self.loops or self.opcodes_added
                    or self.opcodes_removed)


def _loop_facts(rep: Report) -> dict[str, object]:
    inner = [lp for lp in rep.loops if lp.innermost]
    best = max(rep.loops, key=lambda lp: lp.compute, default=None)
    return {
        "loops": len(rep.loops),
        "max nesting": 1 + max((lp.depth for lp in rep.loops), default=-1),
        "FFMA in the busiest loop": best.mix.get("ffma", 0) if best else 0,
        "HGMMA in the busiest loop": best.mix.get("hgmma", 0) if best else 0,
        "instructions in the busiest loop": best.instructions if best else 0,
        "innermost loops": len(inner),
    }


def diff(a: Report, b: Report) -> Diff:
    """What changed from ``a`` to ``b``: resources, the class mix, access widths, loops, opcodes."""
    res = []
    for fld in ("registers", "static_shared", "stack_frame", "spill_stores", "spill_loads", "barriers"):
        va, vb = getattr(a.resources, fld), getattr(b.resources, fld)
        if va != vb:
            res.append((fld.replace("_", " "), va, vb))
    if (a.dynamic_smem or 0) != (b.dynamic_smem or 0):
        res.append(("dynamic smem", a.dynamic_smem or 0, b.dynamic_smem or 0))
    if a.threads != b.threads and a.threads and b.threads:
        res.append(("threads", a.threads, b.threads))
    mix = [(c, a.summary.class_counts.get(c, 0), b.summary.class_counts.get(c, 0)) for c in CLASS_ORDER]
    mix = [m for m in mix if m[1] != m[2]]
    widths = []
    for c in WIDTH_CLASSES:
        wa, wb = a.summary.widths.get(c, Counter()), b.summary.widths.get(c, Counter())
        for w in sorted(set(wa) | set(wb)):
            if wa.get(w, 0) != wb.get(w, 0):
                widths.append((c, w, wa.get(w, 0), wb.get(w, 0)))
    la, lb = _loop_facts(a), _loop_facts(b)
    loops = [(k, la[k], lb[k]) for k in la if la[k] != lb[k]]
    oa, ob = a.summary.opcode_counts, b.summary.opcode_counts
    added = {op: ob[op] for op in sorted(set(ob) - set(oa))}
    removed = {op: oa[op] for op in sorted(set(oa) - set(ob))}
    return Diff(a=a, b=b, resources=res, mix=mix, widths=widths, loops=loops, opcodes_added=added,
                opcodes_removed=removed)
