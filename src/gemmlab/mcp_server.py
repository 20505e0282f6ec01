"""gemmlab as an MCP server: typed, read-only tools that let a coding agent inspect, model and time GEMM kernels.

``gemmlab mcp`` serves over stdio (what editors launch); ``gemmlab mcp --http`` serves streamable HTTP on
127.0.0.1. Built on the official SDK's ``mcp.server.MCPServer`` (the ``mcp`` extra). The tools:

- ``list_kernels``: the registry (ladder steps, techniques, constraints, parameters, SASS claims).
- ``inspect_kernel``: registers, smem, spills, instruction mix with widths, loops and unrolling, a capped
  SASS/PTX listing; of a ladder step, or of CUDA C++ source that is compiled and disassembled, never run.
- ``model_gemm``: roofline, speed of light at a clock, waves, occupancy, predicted time (``gemmlab.model``).
- ``benchmark_gemm``: a step or ``gemmlab.matmul`` against cuBLAS with the one timer (GPU only).
- ``explain_gap``: which limiter the model says dominates, with the numbers; and the measurement on a GPU.

Safety: no tool runs a shell or host code. Every argument is validated by its schema (names by a strict pattern
and then against the registry, integers bounded, source at most 64 KB, architectures from an allowlist) and again
where it is used. User source may include only gemmlab's headers and an allowlist of CUDA headers, and compiles
in a child Python process under CPU, memory and wall-clock limits, so no ``#include`` reads a host file and no
template bomb hangs the server. Failures come back as tool errors (``is_error``); the server keeps answering.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Annotated, Literal, get_args

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import BaseModel, Field, StringConstraints, field_validator

from . import __version__
from .errors import GemmlabError

# Bounds ---------------------------------------------------------------------------------------------------

MAX_DIM = 131072  # each of M, N, K
MAX_BENCH_VOLUME = 2**36  # M * N * K a benchmark may time (4096^3 is 2^36)
MAX_BENCH_SET_BYTES = 2 * 2**30  # A + B + C of one input set
MAX_SOURCE_BYTES = 64 * 1024
MAX_LISTING_LINES = 2000
MAX_ERROR_CHARS = 6000
USER_COMPILE_CPU_S = 60  # CPU seconds a user-source compile may take (child process)
USER_COMPILE_WALL_S = 120
USER_COMPILE_MEMORY = 16 * 2**30  # address space of that child

_NAME_RE = r"^[a-z][a-z0-9_]{0,47}(\.[a-z][a-z0-9_]{0,47})?$"
# A kernel name or a template instantiation with literal arguments: integers, true/false, (qualified) type
# names. No parentheses, quotes, operators or semicolons, so nothing but an instantiation can be spelled.
_TARG = r"(-?[0-9]+[uUlL]{0,3}|true|false|[A-Za-z_][A-Za-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)*)"
_EXPR_RE = rf"^[A-Za-z_][A-Za-z0-9_]{{0,63}}(<\s*{_TARG}(\s*,\s*{_TARG}){{0,15}}\s*>)?$"

KernelName = Annotated[str, StringConstraints(pattern=_NAME_RE, max_length=97)]
ParamName = Annotated[str, StringConstraints(pattern=r"^[A-Z][A-Z0-9_]{0,31}$")]
Config = Annotated[dict[ParamName, Annotated[int, Field(ge=0, le=1_000_000)]], Field(max_length=16)]
Dim = Annotated[int, Field(ge=1, le=MAX_DIM)]
ClockMHz = Annotated[float, Field(ge=100.0, le=3000.0)]
Arch = Literal["sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"]
SourceText = Annotated[str, StringConstraints(min_length=1, max_length=MAX_SOURCE_BYTES)]
NameExpression = Annotated[str, StringConstraints(pattern=_EXPR_RE, max_length=256)]

_READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                             open_world_hint=False)


def _fail(msg: str) -> ToolError:
    return ToolError(msg if len(msg) <= MAX_ERROR_CHARS else msg[:MAX_ERROR_CHARS] + "\n... (truncated)")


def _tool(fn):
    """Turn gemmlab's own errors (and the registry's unknown-name KeyError) into tool errors with their text."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ToolError:
            raise
        except (GemmlabError, ValueError) as e:
            raise _fail(f"{type(e).__name__}: {_scrub(str(e))}") from e
        except KeyError as e:
            raise _fail(str(e.args[0]) if e.args else "unknown name") from e

    return wrapper


_SRC_PATH_RE = re.compile(r"[^\s'\"()]*src_[0-9a-f]{20}\.cu")


def _scrub(text: str) -> str:
    """Compiler messages name the cached copy of user source by its host path; call it ``source.cu``."""
    return _SRC_PATH_RE.sub("source.cu", text)


# Validation -------------------------------------------------------------------------------------------------

def _spec(name: str):
    """A registered step by full or short name. Checked against the name pattern here too (defence in depth)."""
    from . import registry

    if not isinstance(name, str) or not re.fullmatch(_NAME_RE, name):
        raise _fail(f"invalid kernel name {name!r}: use a registry name such as 'h04' or 'sgemm.k05_blocktile_2d' "
                    "(list_kernels lists them)")
    try:
        return registry.get(name)
    except KeyError as e:
        raise _fail(str(e.args[0])) from None


def _shape_config(spec, config: dict | None, M: int, N: int, K: int, sm_count: int) -> tuple[dict[str, int], str]:
    """The config to model or time a step with: the one given, else the one tuned for this GPU and shape,
    else what the step's heuristic picks for the shape, else the defaults; and which of those it is."""
    if config is not None:
        return _resolve(spec, config), "given"
    from .autotune import best_config

    tuned = best_config(spec, M, N, K, sm_count)
    if tuned is not None:
        return tuned, "tuned on this GPU"
    if spec.heuristic is not None:
        return spec.config_for(M, N, K, sm_count, tuned=False), "heuristic for this shape"
    return spec.default_config(), "defaults"


def _resolve(spec, config: dict | None) -> dict[str, int]:
    from .errors import UnsupportedProblem

    try:
        return spec.resolve(config)
    except UnsupportedProblem as e:
        raise _fail(f"{e}. Parameters of {spec.name}: " + "; ".join(
            f"{p.name} in {list(p.choices)}" for p in spec.params)) from None


# Only gemmlab's headers (quoted, under gemmlab/kernels) and these CUDA headers may be included.
ALLOWED_SYSTEM_HEADERS = frozenset({
    "cuda_bf16.h", "cuda_fp16.h", "cuda_fp8.h", "mma.h", "cuda_pipeline.h", "cuda_awbarrier.h",
    "cooperative_groups.h", "cooperative_groups/memcpy_async.h", "cooperative_groups/reduce.h",
    "cuda/barrier", "cuda/pipeline", "cuda/ptx", "cuda/std/cstdint", "cuda/std/type_traits", "cuda/std/utility",
    "cuda/std/array", "cuda/std/limits",
})
_INCLUDE_LINE = re.compile(r'^\s*#\s*include\s*(?:"([A-Za-z0-9_]+/[A-Za-z0-9_]+\.cuh)"|<([A-Za-z0-9_/.]+)>)\s*$')
_DIRECTIVE_WORD = re.compile(r"(#|%:)\s*(embed|import|include_next)\b")


def check_source(code: str) -> None:
    """Refuse source that could make the compiler read a host file or that is too large.

    Every line that mentions ``include`` (after joining backslash-continued lines, as the preprocessor does)
    must be a plain ``#include "dir/name.cuh"`` of a gemmlab header or ``#include <name>`` of an allowed CUDA
    header: computed includes (``#include MACRO``), ``__has_include``, absolute or ``..`` paths, digraph and
    trigraph spellings, token pasting (which could assemble those names), ``#embed``, ``#import`` and
    ``#pragma GCC dependency`` are refused."""
    from .jit.compiler import KERNEL_ROOT

    if len(code.encode("utf-8", errors="replace")) > MAX_SOURCE_BYTES:
        raise _fail(f"source is larger than {MAX_SOURCE_BYTES} bytes")
    if "\x00" in code:
        raise _fail("source contains a NUL byte")
    if "??=" in code or "??/" in code:
        raise _fail("source contains a trigraph (??= or ??/); spell # and \\ directly")
    # Without token pasting and digraphs, `__has_include` and friends can only be spelled literally (and are
    # then caught below).
    if "##" in code or "%:" in code:
        raise _fail("token pasting (##) and the %: digraph are not allowed in source passed to the server")
    if re.search(r"\bdependency\b", code):
        raise _fail("'dependency' is not allowed (#pragma GCC dependency reads a host file's date)")
    joined = re.sub(r"\\\r?\n", "", code)
    root = KERNEL_ROOT.resolve()
    for n, line in enumerate(joined.splitlines(), 1):
        if _DIRECTIVE_WORD.search(line):
            raise _fail(f"line {n}: #embed, #import and #include_next are not allowed")
        if "include" not in line:
            continue
        m = _INCLUDE_LINE.match(line)
        if m is None:
            raise _fail(f"line {n}: only plain '#include \"common/<name>.cuh\"' (gemmlab headers) and "
                        f"'#include <header>' of {sorted(ALLOWED_SYSTEM_HEADERS)} are allowed, one per line, and "
                        "'include' may not appear elsewhere (no computed includes, no __has_include)")
        quoted, system = m.groups()
        if quoted is not None:
            path = (root / quoted).resolve()
            if root not in path.parents or not path.is_file():
                raise _fail(f"line {n}: {quoted!r} is not a gemmlab header (e.g. \"common/tma.cuh\", "
                            "\"common/wgmma.cuh\", \"sgemm/vec_io.cuh\")")
        elif system not in ALLOWED_SYSTEM_HEADERS:
            raise _fail(f"line {n}: <{system}> is not an allowed header; allowed: {sorted(ALLOWED_SYSTEM_HEADERS)}")


# The child that compiles user source: fixed code, the request on stdin, limits set before anything is imported.
_COMPILE_CHILD = r"""
import json, sys
cpu, mem = int(sys.argv[1]), int(sys.argv[2])
try:
    import resource
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
except ImportError:  # not POSIX: the parent's wall-clock limit still applies
    pass
req = json.loads(sys.stdin.read())
from gemmlab import inspect as gi
from gemmlab.errors import GemmlabError
try:
    gi.compile_source(req["code"], req["expr"], req["arch"])
    ptx = gi.ptx_for_source(req["code"], req["expr"], req["arch"])[:4 << 20] if req["ptx"] else None
    out = {"ok": True, "ptx": ptx}
except GemmlabError as e:
    out = {"ok": False, "error": str(e)}
sys.stdout.write(json.dumps(out))
"""


def _compile_user_source(code: str, expr: str, arch: str, want_ptx: bool):
    """Compile in a child process under limits (it fills the disk cache), then load the result here from the
    cache. Returns (CompiledKernel, PTX text or None)."""
    from . import inspect as gi

    pkg_parent = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join([pkg_parent, *filter(None, [os.environ.get("PYTHONPATH")])]))
    try:
        proc = subprocess.run([sys.executable, "-c", _COMPILE_CHILD, str(USER_COMPILE_CPU_S), str(USER_COMPILE_MEMORY)],
                              input=json.dumps({"code": code, "expr": expr, "arch": arch, "ptx": want_ptx}),
                              capture_output=True, text=True, timeout=USER_COMPILE_WALL_S, env=env)
    except subprocess.TimeoutExpired:
        raise _fail(f"compiling the source took longer than {USER_COMPILE_WALL_S} s; it was stopped") from None
    try:
        out = json.loads(proc.stdout)
    except ValueError:
        why = "it ran out of CPU time or memory" if proc.returncode < 0 else proc.stderr.strip()[-2000:]
        raise _fail(f"the compiler process failed (status {proc.returncode}): {_scrub(why)}") from None
    if not out["ok"]:
        raise _fail("CompileError: " + _scrub(out["error"]))
    return gi.compile_source(code, expr, arch), out["ptx"]


# Output models ------------------------------------------------------------------------------------------------

class _Out(BaseModel):
    """Floats to 5 significant digits: the answers are read by a model, not fed to a solver."""

    @field_validator("*", mode="after")
    @classmethod
    def _round(cls, v):
        return float(f"{v:.5g}") if isinstance(v, float) and v == v and abs(v) != float("inf") else v


class ParamInfo(_Out):
    name: str
    choices: list[int]
    default: int
    doc: str
    template: bool = Field(description="True: a template parameter (recompiles); False: a launch-time option")


class KernelInfo(_Out):
    name: str = Field(description="full registry name, e.g. 'hopper.h04_two_consumers'")
    short: str
    ladder: str
    step: int
    technique: str = Field(description="what this step adds over the one before")
    arch: str
    source: str = Field(description="file under gemmlab/kernels")
    template: str
    constraints: str = Field(description="the problems (shapes, alignment) it accepts")
    params: list[ParamInfo]
    configs: int = Field(description="valid parameter combinations")
    sass_expectations: list[str] = Field(description="claims the CI checks on its SASS")
    notes: str = ""


class LadderInfo(_Out):
    name: str
    title: str
    dtype: str
    layout: str
    layout_doc: str
    rel_tolerance: float


class KernelList(_Out):
    ladders: list[LadderInfo]
    kernels: list[KernelInfo]


class Occupancy(_Out):
    blocks_per_sm: int
    limiter: str
    by_threads: int
    by_registers: int
    by_smem: int
    warps_per_sm: int
    fraction: float = Field(description="active warps / the SM's maximum")


class ClassCount(_Out):
    cls: str = Field(description="global_load, global_store, shared_load, shared_store, local, ffma, hgmma, hmma, "
                                 "tma, barrier, branch, other")
    count: int
    widths_bits: dict[int, int] = Field(default_factory=dict, description="access width in bits -> count")
    detail: str = ""


class LoopSummary(_Out):
    index: int
    start: str = Field(description="header address (hex)")
    end: str
    instructions: int
    depth: int
    innermost: bool
    ffma: int = Field(description="FFMA in the body outside nested loops")
    hgmma: int
    body: str = Field(description="unrolled or not, and what math one trip holds")


class Listing(_Out):
    kind: Literal["none", "main_loop", "sass", "ptx"]
    lines: list[str]
    total_lines: int
    truncated: bool


class InspectResult(_Out):
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
    occupancy: Occupancy | None = Field(description="the model's, with H200 limits; needs threads per block")
    instructions: int
    mix: list[ClassCount]
    loops: list[LoopSummary]
    highlights: list[str]
    sass_claims: list[str] = Field(description="the step's SASS expectations (registered steps)")
    sass_claims_failed: list[str] | None = Field(description="claims not met; None for user source")
    ptx_opcodes: dict[str, int] | None = Field(None, description="most common PTX opcodes (listing='ptx')")
    listing: Listing


class Device(_Out):
    name: str
    sm_count: int
    source: str = Field(description="'gpu' (read from the visible GPU) or 'profile' (named profile)")
    hbm_tb_per_s: float


class ProblemModel(_Out):
    M: int
    N: int
    K: int
    dtype: str
    flops: float
    min_bytes: int
    arithmetic_intensity: float = Field(description="FLOP per byte at minimum traffic")
    clock_mhz: float
    speed_of_light_tflops: float
    ridge_flop_per_byte: float
    roofline_tflops: float
    roofline_bound: Literal["compute", "memory"]
    min_time_us: float


class Waves(_Out):
    tiles_m: int
    tiles_n: int
    tiles: int
    slots: int = Field(description="tiles that run at once: SMs x blocks per SM")
    waves: float
    last_wave_tiles: int
    last_wave_utilization: float
    efficiency: float = Field(description="waves / ceil(waves)")


class KernelModel(_Out):
    kernel: str
    config: dict[str, int]
    config_source: str = Field(description="'given', 'tuned on this GPU' (gemmlab tune), 'heuristic for this "
                                           "shape' (the step's own choice) or 'defaults'")
    supported: bool
    unsupported_reason: str | None
    tile: list[int] = Field(description="BM, BN, BK")
    threads: int
    registers: int
    smem_bytes: int
    spill_bytes: int
    tile_intensity: float
    occupancy: Occupancy
    waves: Waves
    tile_quantization: float = Field(description="useful fraction of the computed tile area")
    traffic_bytes: int = Field(description="tile loads + C before the L2 hit")
    hbm_bytes: float
    l2_hit: float
    efficiency: float
    efficiency_source: str
    compute_time_us: float
    memory_time_us: float
    predicted_time_us: float
    predicted_tflops: float
    sol_fraction: float
    bound: Literal["compute", "memory"]


class ModelResult(_Out):
    device: Device
    problem: ProblemModel
    kernel: KernelModel | None
    formula: str


class Measurement(_Out):
    kernel: str
    config: dict[str, int] | None
    M: int
    N: int
    K: int
    dtype: str
    layout: str
    gpu: str
    sm_count: int
    sm_clock_mhz: float | None
    correct: bool
    rel_error: float | None = Field(description="||out - ref|| / ||ref||; None when the output held NaN or Inf")
    time_ms: float | None
    tflops: float | None
    cublas_time_ms: float
    cublas_tflops: float
    ratio_vs_cublas: float | None = Field(description="> 1: faster than cuBLAS")
    spread: float | None = Field(description="(max - min) / median over the rounds")
    model_tflops: float | None = Field(description="the model at the recorded clock")
    sol_tflops: float | None
    rounds: int
    git_sha: str


class Limiter(_Out):
    name: str
    factor: float = Field(description="how many times slower than the speed of light this alone makes it "
                                      "(1.0 = no loss)")
    evidence: str


class GapResult(_Out):
    kernel: str
    config: dict[str, int]
    M: int
    N: int
    K: int
    model: KernelModel
    speed_of_light_tflops: float
    limiters: list[Limiter] = Field(description="largest factor first; their product is predicted / ideal time")
    dominant: str
    risks: list[str] = Field(description="what the model does not price in (spills, narrow loads, ...)")
    gpu_available: bool
    measurement: Measurement | None
    measured_over_model: float | None
    verdict: str


# Tools ----------------------------------------------------------------------------------------------------------

@_tool
def list_kernels(
    ladder: Annotated[KernelName | None, Field(description="only this ladder ('sgemm' or 'hopper')")] = None,
) -> KernelList:
    """List the registered GEMM kernels: two ladders of numbered steps (sgemm: fp32 on CUDA cores, k01..;
    hopper: bf16 with TMA + wgmma, h01..), each with the technique it adds, its constraints on shapes, its
    tunable parameters with their allowed values (pass them as `config` to the other tools) and the SASS claims
    the CI checks. Start here; use the `name` (or the short form like 'h04') in the other tools."""
    from . import registry

    lads = registry.ladders()
    if ladder is not None and ladder not in lads:
        raise _fail(f"no ladder {ladder!r}; ladders: {sorted(lads)}")
    kernels = [KernelInfo(name=s.name, short=s.short, ladder=s.ladder, step=s.step, technique=s.technique,
                          arch=s.arch, source=s.source, template=s.template, constraints=s.constraints,
                          params=[ParamInfo(name=p.name, choices=list(p.choices), default=p.value, doc=p.doc,
                                            template=p.template) for p in s.params],
                          configs=len(s.configs()), sass_expectations=s.sass.describe(), notes=s.notes)
               for s in registry.all_kernels(ladder)]
    return KernelList(ladders=[LadderInfo(name=l.name, title=l.title, dtype=l.dtype, layout=l.layout,
                                          layout_doc=l.layout_doc, rel_tolerance=l.rel_tolerance)
                               for n, l in lads.items() if ladder is None or n == ladder],
                      kernels=kernels)


def _occupancy(o) -> Occupancy:
    return Occupancy(blocks_per_sm=o.blocks_per_sm, limiter=o.limiter, by_threads=o.by_threads,
                     by_registers=o.by_registers, by_smem=o.by_smem, warps_per_sm=o.warps_per_sm,
                     fraction=round(o.fraction, 4))


def _cap(lines: list[str], kind: str, max_lines: int) -> Listing:
    return Listing(kind=kind, lines=lines[:max_lines], total_lines=len(lines), truncated=len(lines) > max_lines)


def _main_loop_lines(rep, lines: list[str]) -> list[str] | None:
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


def _ptx_opcodes(ptx: str, top: int = 30) -> dict[str, int]:
    from collections import Counter

    ops = Counter()
    for line in ptx.splitlines():
        s = line.strip()
        if not s or s.startswith(("//", ".", "}", "{", "$")) or s.endswith(":"):
            continue
        m = _PTX_OP.match(s)
        if m:
            ops[m.group(1)] += 1
    return dict(ops.most_common(top))


@_tool
def inspect_kernel(
    kernel: Annotated[KernelName | None, Field(description="a registered step, e.g. 'k06' or 'hopper.h04_two_consumers'"
                                               "; give this or `source`")] = None,
    config: Annotated[Config | None, Field(description="the step's parameters, e.g. {'BM': 64}")] = None,
    source: Annotated[SourceText | None, Field(description="CUDA C++ to compile and disassemble (never run), at "
                                               "most 64 KB; may include gemmlab headers like \"common/tma.cuh\" and "
                                               "CUDA headers like <cuda_bf16.h>")] = None,
    name_expression: Annotated[NameExpression | None, Field(description="with `source`: the __global__ function or "
                                                            "template instantiation to build, e.g. 'scale<4>'")] = None,
    arch: Annotated[Arch | None, Field(description="with `source`: target (default sm_90a; wgmma and setmaxnreg "
                                       "need sm_90a)")] = None,
    threads_per_block: Annotated[int | None, Field(ge=1, le=1024, description="with `source`: for the occupancy")]
    = None,
    listing: Annotated[Literal["none", "main_loop", "sass", "ptx"], Field(
        description="main_loop: the annotated SASS of the loop with the most math; sass: the whole annotated "
                    "SASS; ptx: the PTX (and its opcode counts); none: the summary only")] = "main_loop",
    max_lines: Annotated[int, Field(ge=1, le=MAX_LISTING_LINES, description="cap on listing lines")] = 120,
) -> InspectResult:
    """What the compiler made of a kernel, without a GPU: registers, shared memory, stack and spills (ptxas);
    the SASS instruction mix by class with access widths (is it LDG.E.128? LDS.128? LDL/STL spills? HGMMA?
    UTMALDG?), every loop and how much math one trip holds (unrolled or not), the step's SASS claims checked,
    and a capped listing (each SASS line tagged with its class and loop). Give a registered `kernel` (+ optional
    `config`), or `source` + `name_expression` (+ `arch`) for your own CUDA C++."""
    from . import inspect as gi
    from . import model
    from .inspect import CLASS_ORDER

    if (kernel is None) == (source is None):
        raise _fail("give exactly one of `kernel` (a registered step) or `source` (CUDA C++)")
    if arch is not None and arch not in get_args(Arch):
        raise _fail(f"invalid arch {arch!r}; one of {get_args(Arch)}")
    ptx = None
    if kernel is not None:
        if name_expression is not None or threads_per_block is not None:
            raise _fail("`name_expression` and `threads_per_block` go with `source`; a step has its own")
        spec = _spec(kernel)
        if arch is not None and arch != spec.arch:
            raise _fail(f"{spec.name} compiles for {spec.arch} only (omit `arch`)")
        cfg = _resolve(spec, config)
        rep = gi.inspect_compiled(spec.compile(cfg), spec=spec, config=cfg)
        if listing == "ptx":
            ptx = gi.ptx_for_step(spec, cfg)
    else:
        if config is not None:
            raise _fail("`config` goes with a registered `kernel`; for source, spell the template arguments in "
                        "`name_expression`")
        if name_expression is None:
            raise _fail("`source` needs `name_expression`: the kernel (or template instantiation) to build")
        if not re.fullmatch(_EXPR_RE, name_expression):
            raise _fail(f"invalid name_expression {name_expression!r}")
        check_source(source)
        ck, ptx = _compile_user_source(source, name_expression, arch or "sm_90a", listing == "ptx")
        rep = gi.inspect_compiled(ck)
        rep.name = f"source:{name_expression}"
        rep.threads = threads_per_block

    r = rep.resources
    occ = _occupancy(model.occupancy(rep.threads, r.registers, rep.smem_bytes)) if rep.threads else None
    widths = rep.widths()
    kinds = rep.barrier_kinds()
    mix = [ClassCount(cls=c, count=n, widths_bits=widths.get(c, {}),
                      detail=", ".join(f"{k} {v}" for k, v in kinds.items()) if c == "barrier" else "")
           for c in CLASS_ORDER if (n := rep.summary.class_counts.get(c, 0))]
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
        main = _main_loop_lines(rep, lines) if listing == "main_loop" else None
        lst = _cap(main, "main_loop", max_lines) if main is not None else _cap(lines, "sass", max_lines)
    return InspectResult(
        name=rep.name, arch=rep.arch, name_expression=rep.name_expression, registers=r.registers,
        static_smem_bytes=r.static_shared, dynamic_smem_bytes=rep.dynamic_smem, stack_frame_bytes=r.stack_frame,
        spill_store_bytes=r.spill_stores, spill_load_bytes=r.spill_loads, named_barriers=r.barriers,
        threads_per_block=rep.threads, occupancy=occ, instructions=len(rep.summary.instructions), mix=mix,
        loops=loops, highlights=rep.highlights(), sass_claims=rep.claims, sass_claims_failed=rep.checks,
        ptx_opcodes=_ptx_opcodes(ptx) if ptx else None, listing=lst)


def _device(profile) -> Device:
    return Device(name=profile.name, sm_count=profile.sm_count, source=profile.source,
                  hbm_tb_per_s=profile.hbm_bytes_per_s / 1e12)


def _kernel_model(spec, cfg, M, N, K, profile, clock, compiled=None, config_source="given") -> KernelModel:
    from . import model

    ck = compiled or spec.compile(cfg)
    p = model.predict_step(spec, M, N, K, cfg, profile=profile, clock_mhz=clock, compiled=ck)
    w = p.waves
    why = spec.why_unsupported(M, N, K, cfg)
    return KernelModel(
        kernel=spec.name, config=cfg, config_source=config_source, supported=why is None, unsupported_reason=why, tile=list(p.tile),
        threads=spec.threads(cfg), registers=ck.resources.registers,
        smem_bytes=spec.smem_bytes(cfg) + ck.resources.static_shared,
        spill_bytes=ck.resources.spill_stores + ck.resources.spill_loads, tile_intensity=p.tile_intensity,
        occupancy=_occupancy(p.occupancy),
        waves=Waves(tiles_m=w.tiles_m, tiles_n=w.tiles_n, tiles=w.tiles, slots=w.slots, waves=w.waves,
                    last_wave_tiles=w.last_wave_tiles, last_wave_utilization=w.last_wave_utilization,
                    efficiency=w.efficiency),
        tile_quantization=model.tile_quantization(M, N, p.tile[0], p.tile[1]), traffic_bytes=p.traffic_bytes,
        hbm_bytes=p.hbm_bytes, l2_hit=p.l2_hit, efficiency=p.efficiency, efficiency_source=p.efficiency_source,
        compute_time_us=p.t_compute_s * 1e6, memory_time_us=p.t_memory_s * 1e6, predicted_time_us=p.time_s * 1e6,
        predicted_tflops=p.tflops, sol_fraction=p.sol_fraction, bound=p.bound)


FORMULA = ("Hopper steps: per 64-deep k-slab, max(wgmma time at the clock, the SM's share of L2->SMEM bandwidth, "
           "TMA latency not covered by the pipeline stages), plus an epilogue per tile, in rounds over the SMs "
           "(gemmlab.model.predict_pipelined). fp32 steps: t = max(FLOPs / tile_quantization / (speed_of_light(clock) "
           "x efficiency), HBM bytes / bandwidth) / wave_efficiency; HBM bytes = max(min bytes, tile traffic x "
           "(1 - L2 hit))")


@_tool
def model_gemm(
    M: Annotated[Dim, Field(description="rows of A and C")],
    N: Annotated[Dim, Field(description="columns of C")],
    K: Annotated[Dim, Field(description="the reduction dimension")],
    kernel: Annotated[KernelName | None, Field(description="a registered step to model in detail")] = None,
    config: Annotated[Config | None, Field(description="its parameters (default: the step's heuristic for the "
                                           "shape if it has one, else its defaults)")] = None,
    clock_mhz: Annotated[ClockMHz | None, Field(description="SM clock for the speed of light (default: the "
                                                "profile's sustained clock, 1320 MHz on H200)")] = None,
    dtype: Annotated[Literal["bf16", "fp16", "fp8", "tf32", "fp32"] | None, Field(
        description="without `kernel`: the data type (default bf16); a step uses its ladder's")] = None,
) -> ModelResult:
    """The analytic model of one GEMM (no GPU needed): FLOPs, minimum bytes, arithmetic intensity, the roofline
    and the speed of light at an SM clock; with `kernel`, the step's tile intensity, occupancy (registers from
    ptxas, smem, threads), tiles and waves (last-wave utilization), tile quantization, global and HBM traffic,
    and the predicted time, TFLOP/s and fraction of the speed of light, with which bound (compute or memory)
    applies. The device is the visible GPU's SM count, else the H200 profile (132 SMs, 4.3 TB/s)."""
    from . import model

    profile = model.device_profile()
    clock = clock_mhz or profile.sm_clock_mhz
    spec = cfg = source = None
    if kernel is not None:
        spec = _spec(kernel)
        cfg, source = _shape_config(spec, config, M, N, K, profile.sm_count)
        lad_dtype = model.ladder_dtype(spec)
        if dtype is not None and dtype != lad_dtype:
            raise _fail(f"{spec.name} is a {lad_dtype} kernel; omit `dtype` or pass {lad_dtype!r}")
        dtype = lad_dtype
    elif config is not None:
        raise _fail("`config` needs `kernel`")
    dtype = dtype or "bf16"
    peak = profile.peak_flops(dtype, clock)
    bw = profile.hbm_bytes_per_s
    ai = model.arithmetic_intensity(M, N, K, dtype)
    roof = model.roofline(ai, peak, bw)
    prob = ProblemModel(M=M, N=N, K=K, dtype=dtype, flops=model.flops(M, N, K),
                        min_bytes=model.min_bytes(M, N, K, dtype), arithmetic_intensity=ai, clock_mhz=clock,
                        speed_of_light_tflops=peak / 1e12, ridge_flop_per_byte=model.ridge_point(peak, bw),
                        roofline_tflops=roof / 1e12, roofline_bound="compute" if ai * bw >= peak else "memory",
                        min_time_us=model.flops(M, N, K) / roof * 1e6)
    km = _kernel_model(spec, cfg, M, N, K, profile, clock, config_source=source) if spec is not None else None
    return ModelResult(device=_device(profile), problem=prob, kernel=km, formula=FORMULA)


# Measuring (GPU only) ---------------------------------------------------------------------------------------------

_GPU_LOCK = threading.Lock()  # one measurement at a time: two would share the GPU and skew both
NO_GPU = ("benchmark_gemm needs an NVIDIA GPU, and this server sees none (torch.cuda.is_available() is False). "
          "Without one, use inspect_kernel (SASS, registers, spills), model_gemm (roofline, waves, predicted time) "
          "and explain_gap (the model's dominant limiter with its numbers).")


def gpu_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - no torch CUDA at all counts as no GPU
        return False


def _check_bench_size(M: int, N: int, K: int, elem: int) -> None:
    if M * N * K > MAX_BENCH_VOLUME:
        raise _fail(f"M*N*K = {M * N * K} is above the benchmark cap 2^36 ({MAX_BENCH_VOLUME}, e.g. 4096^3); "
                    "model_gemm has no such cap")
    set_bytes = elem * (M * K + N * K + M * N)
    if set_bytes > MAX_BENCH_SET_BYTES:
        raise _fail(f"A, B and C take {set_bytes / 2**30:.1f} GiB; the benchmark cap is "
                    f"{MAX_BENCH_SET_BYTES / 2**30:.0f} GiB")


def _measure_step(spec, cfg, M, N, K, rounds: int, replay_ms: float) -> Measurement:
    from . import model
    from .bench import bench_shape

    rec = bench_shape(spec.ladder, M, N, K, [(spec, cfg)], suite="mcp", rounds=rounds, replay_ms=replay_ms)[0]
    pred = None
    sol = None
    if rec.get("sm_clock_mhz"):
        import dataclasses

        prof = dataclasses.replace(model.device_profile(), sm_count=int(rec["sm_count"]))
        pred = model.predict_step(spec, M, N, K, cfg, profile=prof, clock_mhz=rec["sm_clock_mhz"]).tflops
        sol = prof.peak_flops(rec["dtype"], rec["sm_clock_mhz"]) / 1e12
    return _measurement(rec, spec.name, cfg, rounds, pred, sol)


def _measurement(rec: dict, name: str, cfg, rounds: int, pred, sol) -> Measurement:
    return Measurement(kernel=name, config=cfg, M=rec["M"], N=rec["N"], K=rec["K"], dtype=rec["dtype"],
                       layout=rec["layout"], gpu=rec["gpu"], sm_count=rec["sm_count"],
                       sm_clock_mhz=rec.get("sm_clock_mhz"), correct=rec["correct"],
                       rel_error=rec["rel_error"] if math.isfinite(rec["rel_error"]) else None,
                       time_ms=rec.get("time_ms"), tflops=rec.get("tflops"), cublas_time_ms=rec["baseline_ms"],
                       cublas_tflops=rec["baseline_tflops"], ratio_vs_cublas=rec.get("ratio"),
                       spread=rec.get("spread"), model_tflops=pred, sol_tflops=sol, rounds=rounds,
                       git_sha=rec.get("git_sha", "unknown"))


def _measure_matmul(ops, M, N, K, dtype: str, rounds: int, replay_ms: float) -> Measurement:
    """gemmlab.matmul(a, w.t()) against torch.mm on TN operands, with the one timer (rotating sets, graphs)."""
    import torch

    from . import registry
    from .bench import MAX_SET_BYTES, flops, git_sha, rel_error
    from .gpu import gpu_info
    from .timer import sets_for, time_interleaved

    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    tol = registry.ladders()["hopper" if dtype == "bf16" else "sgemm"].rel_tolerance
    info = gpu_info()
    per_set = dt.itemsize * (M * K + N * K + M * N)
    n_sets = max(1, min(sets_for(per_set, info.l2_bytes), MAX_SET_BYTES // per_set))
    gen = torch.Generator(device="cuda").manual_seed(1234 + M + 7 * N + 13 * K)
    sets = [(torch.randn(M, K, generator=gen, device="cuda").to(dt), torch.randn(N, K, generator=gen,
                                                                                device="cuda").to(dt))
            for _ in range(n_sets)]
    outs = [torch.empty(M, N, device="cuda", dtype=dt) for _ in range(n_sets)]
    a0, w0 = sets[0]
    err = rel_error(ops.matmul(a0, w0.t()), a0.double() @ w0.double().t())
    candidates = {"cublas": lambda i: torch.mm(sets[i][0], sets[i][1].t(), out=outs[i])}
    if err <= tol:
        candidates["gemmlab.matmul"] = lambda i: ops.matmul(sets[i][0], sets[i][1].t(), out=outs[i])
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        res = time_interleaved(candidates, n_sets, replay_ms=replay_ms, rounds=rounds)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    base, mine = res.timings["cublas"], res.timings.get("gemmlab.matmul")
    fl = flops(M, N, K)
    rec = {"M": M, "N": N, "K": K, "dtype": dtype, "layout": "TN", "gpu": info.name, "sm_count": info.sm_count,
           "sm_clock_mhz": res.clocks.sm_mhz, "correct": err <= tol, "rel_error": err,
           "baseline_ms": base.median_ms, "baseline_tflops": fl / base.median_ms / 1e9, "git_sha": git_sha()}
    if mine is not None:
        rec.update(time_ms=mine.median_ms, tflops=fl / mine.median_ms / 1e9, ratio=base.median_ms / mine.median_ms,
                   spread=mine.spread)
    del sets, outs
    torch.cuda.empty_cache()
    return _measurement(rec, "gemmlab.matmul", None, rounds, None, None)


def _with_gpu(fn):
    if not _GPU_LOCK.acquire(blocking=False):
        raise _fail("another benchmark is running on the GPU; call again when it has finished")
    try:
        return fn()
    finally:
        _GPU_LOCK.release()


@_tool
def benchmark_gemm(
    M: Annotated[Dim, Field(description="rows of A and C")],
    N: Annotated[Dim, Field(description="columns of C")],
    K: Annotated[Dim, Field(description="the reduction dimension")],
    kernel: Annotated[KernelName, Field(description="a registered step, or 'matmul' for gemmlab.matmul (the GEMM "
                                        "users call)")] = "matmul",
    config: Annotated[Config | None, Field(description="the step's parameters (default: its heuristic for the "
                                           "shape if it has one, else its defaults)")] = None,
    dtype: Annotated[Literal["bf16", "fp32"] | None, Field(description="for 'matmul' only: the inputs' dtype "
                                                           "(default bf16; TN: a (M,K) @ w (N,K).T)")] = None,
    rounds: Annotated[int, Field(ge=1, le=15, description="interleaved timing rounds (median reported)")] = 5,
    replay_ms: Annotated[float, Field(ge=1.0, le=20.0, description="length of one CUDA-graph replay")] = 10.0,
) -> Measurement:
    """Time a step (or gemmlab.matmul) against cuBLAS (torch.mm) on one shape, on this server's GPU, with
    gemmlab's one timer: inputs rotating over 2x L2, CUDA-graph replays, the two interleaved round by round,
    correctness checked first, the SM clock recorded (compare ratios, not absolute TFLOP/s: the clock moves).
    Caps: M*N*K <= 2^36 and 2 GiB of operands; a call takes seconds. Needs an NVIDIA GPU (Hopper for bf16
    steps); without one it answers with an error saying so."""
    ops = None
    if kernel in ("matmul", "gemmlab.matmul"):
        if config is not None:
            raise _fail("`config` is for registered steps; gemmlab.matmul chooses its own")
        dtype = dtype or "bf16"
        try:
            from . import ops
        except ImportError as e:
            raise _fail(f"gemmlab.matmul is not available in this install ({e})") from None
        _check_bench_size(M, N, K, 2 if dtype == "bf16" else 4)
    else:
        from . import model

        spec = _spec(kernel)
        if dtype is not None and dtype != model.ladder_dtype(spec):
            raise _fail(f"{spec.name} is a {model.ladder_dtype(spec)} kernel; `dtype` is for 'matmul'")
        cfg, _ = _shape_config(spec, config, M, N, K, model.device_profile().sm_count)
        _check_bench_size(M, N, K, 4 if model.ladder_dtype(spec) == "fp32" else 2)
        why = spec.why_unsupported(M, N, K, cfg)
        if why:
            raise _fail(f"{spec.name} cannot run {M}x{N}x{K}: {why}")
    if not gpu_available():
        raise _fail(NO_GPU)
    if ops is not None:
        return _with_gpu(lambda: _measure_matmul(ops, M, N, K, dtype, rounds, replay_ms))
    return _with_gpu(lambda: _measure_step(spec, cfg, M, N, K, rounds, replay_ms))


def _limiters(km: KernelModel, sol_tflops: float, ridge: float) -> list[Limiter]:
    w, o = km.waves, km.occupancy
    out = [
        Limiter(name="compute efficiency", factor=1 / km.efficiency,
                evidence=f"the main loop is modelled at {km.efficiency:.0%} of the {sol_tflops:.1f} TFLOP/s peak; "
                         f"efficiency from: {km.efficiency_source}"),
        Limiter(name="tile quantization", factor=1 / km.tile_quantization,
                evidence=f"{w.tiles_m}x{w.tiles_n} tiles of {km.tile[0]}x{km.tile[1]}: {km.tile_quantization:.1%} "
                         "of the computed area is useful"),
        Limiter(name="memory", factor=max(1.0, km.memory_time_us / km.compute_time_us),
                evidence=f"{km.hbm_bytes / 1e6:.1f} MB from HBM (L2 hit {km.l2_hit:.0%}) takes "
                         f"{km.memory_time_us:.1f} us against {km.compute_time_us:.1f} us of math; tile intensity "
                         f"{km.tile_intensity:.1f} FLOP/B vs ridge point {ridge:.1f}"),
        Limiter(name="waves", factor=1 / w.efficiency,
                evidence=f"{w.tiles} tiles on {w.slots} slots ({o.blocks_per_sm} blocks/SM, limited by "
                         f"{o.limiter}): {w.waves:.2f} waves, last wave {w.last_wave_tiles} tiles "
                         f"({w.last_wave_utilization:.0%} full), wave efficiency {w.efficiency:.1%}"),
    ]
    return sorted(out, key=lambda lim: -lim.factor)


def _risks(km: KernelModel, rep) -> list[str]:
    out = []
    if not km.supported:
        out.append(f"the step does not support this shape ({km.unsupported_reason}); the numbers are hypothetical")
    if km.occupancy.blocks_per_sm == 0:
        out.append(f"the block does not fit on an SM ({km.occupancy.limiter}): it cannot launch")
    r = rep.resources
    if r.spills or r.stack_frame or rep.summary.class_counts.get("local"):
        out.append(f"local memory: {r.spill_stores} B spill stores, {r.spill_loads} B spill loads, stack "
                   f"{r.stack_frame} B, {rep.summary.class_counts.get('local', 0)} LDL/STL; not in the model, "
                   "expect the kernel to be slower than predicted")
    if rep.checks:
        out.append("SASS claims failed: " + "; ".join(rep.checks))
    gl = rep.summary.widths.get("global_load", {})
    if gl and max(gl) < 128 and not rep.summary.class_counts.get("tma"):
        out.append(f"global loads are at most {max(gl)}-bit (no LDG.E.128, no TMA): more load instructions per byte")
    if km.occupancy.fraction < 0.25 and not rep.summary.class_counts.get("hgmma"):
        out.append(f"{km.occupancy.warps_per_sm} warps per SM ({km.occupancy.fraction:.0%} occupancy) on CUDA cores: "
                   "little latency hiding unless each thread has much ILP")
    return out


@_tool
def explain_gap(
    M: Annotated[Dim, Field(description="rows of A and C")],
    N: Annotated[Dim, Field(description="columns of C")],
    K: Annotated[Dim, Field(description="the reduction dimension")],
    kernel: Annotated[KernelName, Field(description="a registered step, e.g. 'h04' or 'k06'")],
    config: Annotated[Config | None, Field(description="its parameters (default: the step's heuristic for the "
                                           "shape if it has one, else its defaults)")] = None,
    clock_mhz: Annotated[ClockMHz | None, Field(description="SM clock for the model (default: the profile's "
                                                "sustained clock; a measurement uses the recorded clock)")] = None,
    measure: Annotated[bool, Field(description="on a GPU, also time it against cuBLAS (a few seconds)")] = True,
) -> GapResult:
    """Why a step is as fast as it is on a shape: the model's time split into factors over the speed of light
    (compute efficiency, tile quantization, memory, waves; their product is predicted/ideal), the dominant one
    with its numbers, what the model does not price in (spills, failed SASS claims, narrow loads, low
    occupancy, unsupported shape), and on a GPU the measurement against cuBLAS and measured/model. Without a GPU
    the answer is the model alone, and says so."""
    from . import inspect as gi
    from . import model

    spec = _spec(kernel)
    profile = model.device_profile()
    cfg, source = _shape_config(spec, config, M, N, K, profile.sm_count)
    ck = spec.compile(cfg)
    rep = gi.inspect_compiled(ck, spec=spec, config=cfg)
    meas = None
    not_measured = None
    has_gpu = gpu_available()
    if has_gpu and measure:
        try:
            _check_bench_size(M, N, K, 4 if model.ladder_dtype(spec) == "fp32" else 2)
            if spec.why_unsupported(M, N, K, cfg):
                raise _fail("the step does not support this shape")
        except ToolError as e:
            not_measured = str(e)
        else:
            meas = _with_gpu(lambda: _measure_step(spec, cfg, M, N, K, 5, 10.0))
            if meas.sm_clock_mhz and clock_mhz is None:
                clock_mhz = meas.sm_clock_mhz
    clock = clock_mhz or profile.sm_clock_mhz
    km = _kernel_model(spec, cfg, M, N, K, profile, clock, compiled=ck, config_source=source)
    dtype = model.ladder_dtype(spec)
    peak = profile.peak_flops(dtype, clock)
    lims = _limiters(km, peak / 1e12, model.ridge_point(peak, profile.hbm_bytes_per_s))
    top = lims[0]
    dominant = top.name if top.factor > 1.05 else "none (within 5% of the speed of light)"
    risks = _risks(km, rep)
    ratio = meas.tflops / km.predicted_tflops if meas and meas.tflops else None
    verdict = (f"{spec.name} at {M}x{N}x{K}, {clock:.0f} MHz: the model predicts {km.predicted_tflops:.1f} TFLOP/s "
               f"({km.sol_fraction:.0%} of the {peak / 1e12:.1f} TFLOP/s speed of light), {km.bound} bound. "
               f"Dominant limiter: {dominant}" + (f" (x{top.factor:.2f}: {top.evidence})." if top.factor > 1.05
                                                 else "."))
    if meas is not None:
        if meas.tflops is None:
            verdict += f" Measured: WRONG RESULT (relative error {meas.rel_error}); no timing."
        else:
            verdict += (f" Measured {meas.tflops:.1f} TFLOP/s at {meas.sm_clock_mhz or 0:.0f} MHz = {ratio:.2f}x the "
                        f"model, {meas.ratio_vs_cublas:.2f}x cuBLAS.")
            if ratio < 0.85:
                verdict += (" The kernel falls short of the model: its efficiency or L2 assumptions do not hold"
                            + (f"; look at: {risks[0]}" if risks else "; inspect_kernel shows the main loop") + ".")
    elif not has_gpu:
        verdict += " No GPU here: this is the model alone (benchmark_gemm measures on a GPU)."
    elif not_measured:
        verdict += f" Not measured: {not_measured}."
    if risks:
        verdict += " Not in the model: " + " | ".join(risks)
    return GapResult(kernel=spec.name, config=cfg, M=M, N=N, K=K, model=km, speed_of_light_tflops=peak / 1e12,
                     limiters=lims, dominant=dominant, risks=risks, gpu_available=has_gpu, measurement=meas,
                     measured_over_model=ratio, verdict=verdict)


# Resources and prompts ------------------------------------------------------------------------------------------

BRIEF = """\
# gemmlab for agents

gemmlab holds matrix-multiplication kernels for NVIDIA GPUs, written as two *ladders* of small numbered steps,
each adding one technique to the step before, compiled at run time with NVRTC and launched on torch tensors.

- **sgemm** (fp32 on CUDA cores, NN layout, sm_90): naive -> coalesced -> shared-memory tiling -> 1-D and 2-D
  blocktiling -> vectorized (float4) loads -> conflict-free smem -> autotuned -> warptiling -> double buffering.
  The SASS tells the story: LDG.E.128 / LDS.128 appear, the inner loop unrolls into hundreds of FFMA per trip.
- **hopper** (bf16, TN layout `a @ w.t()`, sm_90a): TMA + wgmma -> 128-row tiles -> warp specialization
  (producer/consumer around an mbarrier ring) -> two consumer warpgroups with setmaxnreg -> persistent kernel
  -> PTX barriers -> cluster multicast -> async stores (stmatrix + TMA) -> tile order (Hilbert) -> deep
  pipeline -> h11, the general engine behind `gemmlab.matmul` (any shape, layout, fused epilogue).

Ceilings: dense bf16 is 4096 FLOP/clock/SM (132 SMs on H200: 714 TFLOP/s at the sustained 1320 MHz, 1070 at
1980); fp32 FFMA 256 FLOP/clock/SM; HBM about 4.3 TB/s. The speed of light moves with the SM clock, so compare
a kernel with cuBLAS in one interleaved run, never absolute numbers across runs.

## Tools
1. `list_kernels`: the steps, their constraints and parameters (`config` values).
2. `inspect_kernel`: what the compiler made (registers, spills, instruction mix with widths, loops, SASS);
   also for your own CUDA source (compiled and disassembled, never run).
3. `model_gemm`: roofline, speed of light, waves, occupancy, predicted time for a shape (and a step).
4. `explain_gap`: the dominant limiter for a step and shape, with numbers; plus the measurement on a GPU.
5. `benchmark_gemm`: a step or `gemmlab.matmul` against cuBLAS (needs a GPU).

A good loop: model the shape, explain the gap, inspect the main loop, change one thing, inspect again.
"""


def ladder_table() -> str:
    """The ladders as Markdown tables, from the registry."""
    from . import registry

    out = []
    for name, lad in registry.ladders().items():
        out += [f"## {name}: {lad.title}", "", f"Layout {lad.layout}: {lad.layout_doc}", "",
                "| step | name | technique | arch | parameters | constraints |", "|---|---|---|---|---|---|"]
        for s in registry.all_kernels(name):
            params = ", ".join(f"{p.name}={p.value} of {list(p.choices)}" for p in s.params) or "-"
            out.append(f"| {s.step} | `{s.name}` | {s.technique} | {s.arch} | {params} | {s.constraints} |")
        out.append("")
    return "\n".join(out)


def diagnose_prompt(kernel: str = "h04", M: str = "4096", N: str = "4096", K: str = "4096") -> str:
    """A first session: find what bounds a step at a shape and where in the SASS to look."""
    spec = _spec(kernel)
    dims = []
    for v in (M, N, K):
        if not re.fullmatch(r"[0-9]{1,6}", v) or not 1 <= int(v) <= MAX_DIM:
            raise ValueError(f"sizes must be integers in 1..{MAX_DIM}, got {v!r}")
        dims.append(int(v))
    m, n, k = dims
    return (f"Find what limits {spec.name} ({spec.technique}) at M={m}, N={n}, K={k}.\n"
            f"1. Call explain_gap(kernel='{spec.name}', M={m}, N={n}, K={k}) and read the dominant limiter and "
            "the risks.\n"
            f"2. Call inspect_kernel(kernel='{spec.name}', listing='main_loop') and check the main loop: is it "
            "unrolled, are loads 128-bit (or TMA), any LDL/STL?\n"
            f"3. Call model_gemm(M={m}, N={n}, K={k}, kernel=...) for the next step of the ladder (list_kernels) "
            "and say what it would change.\n"
            "4. If a GPU is present, benchmark_gemm the two and compare the ratio to cuBLAS.\n"
            "Answer with the numbers from the tools as evidence.")


INSTRUCTIONS = ("gemmlab: GEMM kernels for NVIDIA GPUs in two ladders (fp32 CUDA cores; bf16 Hopper TMA+wgmma). "
                "Start with list_kernels or the gemmlab://brief resource. inspect_kernel, model_gemm and "
                "explain_gap work without a GPU; benchmark_gemm needs one.")


def build_server() -> MCPServer:
    """The gemmlab MCP server with its tools, resources and prompt (no transport started)."""
    server = MCPServer("gemmlab", title="gemmlab: GEMM kernels, SASS, models and timings", version=__version__,
                       instructions=INSTRUCTIONS, log_level="WARNING")
    for fn in (list_kernels, inspect_kernel, model_gemm, benchmark_gemm, explain_gap):
        server.add_tool(fn, annotations=_READ_ONLY, structured_output=True)
    server.resource("gemmlab://brief", name="brief", mime_type="text/markdown",
                    description="The subject in one page: the two ladders, the ceilings, the tools")(lambda: BRIEF)
    server.resource("gemmlab://ladders", name="ladders", mime_type="text/markdown",
                    description="Every ladder step: technique, arch, parameters, constraints")(ladder_table)
    server.prompt(name="diagnose_kernel")(diagnose_prompt)
    return server


def serve(http: bool = False, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Run the server: stdio (default) or streamable HTTP on ``host:port`` at ``/mcp``."""
    server = build_server()
    if not http:
        server.run("stdio")
        return
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"gemmlab mcp: serving on {host}:{port} without authentication; anyone who reaches it can compile "
              "code and use the GPU through it", file=sys.stderr)
    server.run("streamable-http", host=host, port=port)
