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
BARRIER_KINDS = {"BAR": "bar.sync", "SYNCS": "mbarrier", "BSSY": "convergence", "BSYNC": "convergence",
                 "WARPSYNC": "convergence", "MEMBAR": "fence", "FENCE": "fence", "DEPBAR": "depbar"}


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
    under ``gemmlab/kernels``, which are on the include path). Compiler messages cite ``path``."""
    path = Path(path)
    if not path.is_file():
        raise CompileError(f"{path}: no such file")
    code = path.read_text()
    for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', code, re.MULTILINE):
        if not (KERNEL_ROOT / inc).is_file():
            raise CompileError(f"{path}: #include \"{inc}\" is not a header under {KERNEL_ROOT}; inline it "
                               "or include the gemmlab headers (e.g. \"common/tma.cuh\")")
    try:
        return compile_source(code, name_expression, arch, name=f"{path.name}:{name_expression}")
    except CompileError as e:
        raise CompileError(cite_source(str(e), str(path))) from None


_CACHED_SOURCE = re.compile(r"[^\s'\"()]*src_[0-9a-f]{20}\.cu")


def cite_source(text: str, name: str) -> str:
    """Compiler messages name the cached copy of a source string (``<cache>/sources/src_<hash>.cu``);
    name it ``name`` instead (the user's file, or ``source.cu``)."""
    return _CACHED_SOURCE.sub(name, text)


def kernels_in_source(code: str) -> list[tuple[str, bool]]:
    """The ``__global__`` functions of CUDA C++ source, in order: (name, whether it is a template, so its
    instantiation must be spelled). A reading of the text, not a parse: enough to pick the one kernel of
    a file."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", " ", code, flags=re.S)
    out = []
    for m in re.finditer(r"\b__global__\b", text):
        head = re.sub(r"__launch_bounds__\s*\([^)]*\)", " ", text[m.end():m.end() + 400])
        name = re.search(r"(\w+)\s*\(", head)
        if name is None:
            continue
        before = text[:m.start()].rstrip()
        template = re.search(r"\btemplate\s*<[^;{}]*>(\s*\b(static|inline)\b)*$", before) is not None
        out.append((name.group(1), template))
    return out


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
    """A loop in the SASS (all the back edges to one header, merged) and what its body holds."""

    index: int
    start: int  # the header's address
    end: int  # the highest address in the body
    instructions: int
    depth: int  # 0 = outermost
    innermost: bool
    mix: dict  # the whole body, nested loops included
    own: dict  # the body outside nested loops
    addresses: frozenset = frozenset()

    @property
    def compute(self) -> int:
        """Math instructions in the body outside nested loops."""
        return sum(self.own.get(c, 0) for c in COMPUTE_CLASSES)

    @property
    def unrolled(self) -> str:
        """What the body says about unrolling. SASS does not say how many source iterations one trip covers;
        several FFMA/HGMMA in one body means the compiler (or a pragma) replicated the loop's work."""
        parts = [f"{self.own[c]} {c.upper()}" for c in COMPUTE_CLASSES if self.own.get(c)]
        if not parts:
            if any(self.mix.get(c) for c in COMPUTE_CLASSES):
                return "math only in nested loops"
            rest = [f"{n} {c}" for c, n in self.own.items() if c not in ("other", "branch")]
            return "no math" + (f" ({', '.join(rest)})" if rest else "")
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

    def barrier_kinds(self) -> dict[str, int]:
        """The ``barrier`` class split by kind: bar.sync, mbarrier (SYNCS), convergence (BSSY/BSYNC/
        WARPSYNC: the compiler's reconvergence points, not memory barriers), fence, depbar."""
        out: Counter = Counter()
        for ins in self.summary.instructions:
            if sass.classify(ins) == "barrier":
                out[BARRIER_KINDS.get(ins.base, ins.base.lower())] += 1
        return dict(out.most_common())

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
            out.append(f"main loop (L{best.index}) {best.unrolled}")
        if s.class_counts.get("local") or r.stack_frame or r.spills:
            out.append(f"LOCAL MEMORY: {s.class_counts.get('local', 0)} LDL/STL, stack {r.stack_frame} B, "
                       f"spills {r.spill_stores}/{r.spill_loads} B")
        return out


def loops_of(summary: sass.SassSummary) -> list[LoopInfo]:
    """The loops of a summary, one per header (back edges to the same header merged), with nesting.

    Uses each loop's body addresses where ``gemmlab.sass`` gives them (natural loops of the control-flow
    graph), else its address range. Drops one-instruction bodies: nvdisasm's trap after the last EXIT
    (a ``BRA`` to itself)."""
    bodies: dict[int, set[int]] = {}
    for lp in summary.loops:
        body = set(getattr(lp, "addresses", ()) or
                   (i.address for i in summary.instructions if lp.start <= i.address <= lp.end))
        bodies.setdefault(lp.start, set()).update(body)
    heads = sorted(h for h, b in bodies.items() if len(b) > 1)
    out = []
    for idx, h in enumerate(heads):
        body = bodies[h]
        nested = set().union(*(bodies[o] for o in heads if o != h and bodies[o] < body))
        ins = [i for i in summary.instructions if i.address in body]
        depth = sum(1 for o in heads if o != h and bodies[o] > body)
        out.append(LoopInfo(index=idx, start=h, end=max(body), instructions=len(body), depth=depth,
                            innermost=not nested, mix=dict(Counter(sass.classify(i) for i in ins)),
                            own=dict(Counter(sass.classify(i) for i in ins if i.address not in nested)),
                            addresses=frozenset(body)))
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
        expect = spec.sass_expect(cfg)
        rep.checks = sass.check(expect, summary, compiled.resources)
        rep.claims = expect.describe()
    return rep


def inspect_step(name_or_spec, config: dict | None = None) -> Report:
    """A report on a registered step (``"k05"``, ``"hopper.h04_two_consumers"``) for ``config``."""
    from . import registry

    spec = registry.get(name_or_spec) if isinstance(name_or_spec, str) else name_or_spec
    return inspect_compiled(spec.compile(config), spec=spec, config=config)


# The annotated listing --------------------------------------------------------------------------------

# Instructions of the "other" class worth naming in the listing.
_OTHER_TAGS = {"WARPGROUP": "other.wgmma_sync", "USETMAXREG": "other.setmaxnreg", "ELECT": "other.elect"}


def tag(ins: sass.Instruction) -> str:
    """``global_load.128``-style tag: the class, and the access width for memory instructions or the kind
    of barrier (``barrier.mbarrier`` for the ``SYNCS`` ops that implement mbarriers)."""
    cls = sass.classify(ins)
    if cls in WIDTH_CLASSES:
        return f"{cls}.{sass._width(ins.opcode)}"
    if cls == "barrier":
        return f"barrier.{BARRIER_KINDS.get(ins.base, ins.base.lower())}"
    return _OTHER_TAGS.get(ins.base, cls)


def annotate(report: Report) -> list[str]:
    """The SASS, one line per instruction: address, the loops it belongs to, its class tag, the instruction.
    A line ``┌ loop i (...)`` precedes each loop header; a branch back to a header ends with ``↰ loop i``."""
    member = {}
    for lp in report.loops:
        for a in lp.addresses:
            member.setdefault(a, []).append(lp.index)
    heads = {lp.start: lp for lp in report.loops}
    label_of = {lab: ins.address for ins in report.summary.instructions for lab in ins.labels}
    tag_w = max((len(tag(i)) for i in report.summary.instructions), default=8)
    loop_w = max((len(",".join(f"L{x}" for x in v)) for v in member.values()), default=0)
    lines = []
    for ins in report.summary.instructions:
        lp = heads.get(ins.address)
        if lp is not None:
            what = lp.unrolled.split(": ", 1)[-1]
            lines.append(f"┌ loop L{lp.index}: {lp.instructions} instructions, {what}"
                         f"{', innermost' if lp.innermost else ''}, depth {lp.depth}")
        loops = ",".join(f"L{x}" for x in sorted(member.get(ins.address, [])))
        pred = f"{ins.predicate} " if ins.predicate else ""
        line = f"{ins.address:05x}  {loops:<{loop_w}}  {tag(ins):<{tag_w}}  {pred}{ins.opcode} {ins.operands}".rstrip()
        if ins.base == "BRA":
            m = re.search(r"(\.L_x_\d+)", ins.operands)
            target = heads.get(label_of.get(m.group(1))) if m else None
            if target is not None and ins.address in target.addresses:
                line += f"   ↰ loop L{target.index}"
        lines.append(line)
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
        "FFMA in the busiest loop": best.own.get("ffma", 0) if best else 0,
        "HGMMA in the busiest loop": best.own.get("hgmma", 0) if best else 0,
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
