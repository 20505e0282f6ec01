"""The MCP tools: typed, read-only faces over ``gemmlab.reports``. Each tool checks what only this face needs
(argument combinations, names by pattern, the GPU lock) and returns the report as a structured result."""

from __future__ import annotations

import functools
import re
import sys
import threading
from typing import Annotated, Literal, get_args

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import Field

from .. import __version__
from ..errors import GemmlabError
from ..reports import BadRequest, MAX_DIM, catalog, compiled, gpu_available, modelling, records
from . import safety
from .schema import Arch, ClockMHz, Config, Dim, KernelName, NameExpression, SourceText, out, out_model

MAX_LISTING_LINES = 2000
MAX_ERROR_CHARS = 6000

_READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                             open_world_hint=False)


def _fail(msg: str) -> ToolError:
    return ToolError(msg if len(msg) <= MAX_ERROR_CHARS else msg[:MAX_ERROR_CHARS] + "\n... (truncated)")


def _tool(fn):
    """Turn gemmlab's own errors into tool errors with their text (the type named, except for a
    ``BadRequest``, whose message says it all); anything else stays an internal error the SDK reports
    without its text."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ToolError:
            raise
        except BadRequest as e:
            raise _fail(str(e)) from e
        except (GemmlabError, ValueError) as e:
            from .. import inspect as gi

            raise _fail(f"{type(e).__name__}: {gi.cite_source(str(e), 'source.cu')}") from e

    return wrapper


def _check_name(name: str) -> str:
    """The name pattern again, for direct calls from Python that skip the schema (defence in depth)."""
    if not isinstance(name, str) or not re.fullmatch(safety.NAME_RE, name):
        raise _fail(f"invalid kernel name {name!r}: use a registry name such as 'h04' or 'sgemm.k05_blocktile_2d' "
                    "(list_kernels lists them)")
    return name


# Tools ----------------------------------------------------------------------------------------------------------

# What the tools return: the reports' dataclasses as models (their fields and descriptions are the schema).
KernelListOut = out_model(catalog.KernelList)
InspectOut = out_model(compiled.InspectResult)
ModelOut = out_model(modelling.ModelResult)
GroupedModelOut = out_model(modelling.GroupedModelResult)
MeasurementOut = out_model(records.Measurement)
GapOut = out_model(modelling.GapResult)

@_tool
def list_kernels(
    ladder: Annotated[KernelName | None, Field(description="only this ladder ('sgemm' or 'hopper')")] = None,
) -> KernelListOut:
    """List the registered GEMM kernels: two ladders of numbered steps (sgemm: fp32 on CUDA cores, k01..;
    hopper: bf16 with TMA + wgmma, h01..), each with the technique it adds, its constraints on shapes, its
    tunable parameters with their allowed values (pass them as `config` to the other tools) and the SASS claims
    the CI checks; and (without `ladder`) the library's planned kernels (engine, fp8, grouped: what
    gemmlab.matmul, scaled_mm and grouped_mm run, one instantiation per shape; see inspect_plan). Start here;
    use the `name` (or the short form like 'h04') in the other tools."""
    return out(catalog.kernel_list(ladder))


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
) -> InspectOut:
    """What the compiler made of a kernel, without a GPU: registers, shared memory, stack and spills (ptxas);
    the SASS instruction mix by class with access widths (is it LDG.E.128? LDS.128? LDL/STL spills? HGMMA?
    UTMALDG?), every loop and how much math one trip holds (unrolled or not), the step's SASS claims checked,
    and a capped listing (each SASS line tagged with its class and loop). Give a registered `kernel` (+ optional
    `config`), or `source` + `name_expression` (+ `arch`) for your own CUDA C++."""
    from .. import inspect as gi

    if (kernel is None) == (source is None):
        raise _fail("give exactly one of `kernel` (a registered step) or `source` (CUDA C++)")
    if arch is not None and arch not in get_args(Arch):
        raise _fail(f"invalid arch {arch!r}; one of {get_args(Arch)}")
    if kernel is not None:
        if name_expression is not None or threads_per_block is not None:
            raise _fail("`name_expression` and `threads_per_block` go with `source`; a step has its own")
        from ..reports import find_step

        spec = find_step(_check_name(kernel))
        if arch is not None and arch != spec.arch:
            raise _fail(f"{spec.name} compiles for {spec.arch} only (omit `arch`)")
        return out(compiled.inspect_step(spec.name, config, listing=listing, max_lines=max_lines))
    if config is not None:
        raise _fail("`config` goes with a registered `kernel`; for source, spell the template arguments in "
                    "`name_expression`")
    if name_expression is None:
        raise _fail("`source` needs `name_expression`: the kernel (or template instantiation) to build")
    if not re.fullmatch(safety.EXPR_RE, name_expression):
        raise _fail(f"invalid name_expression {name_expression!r}")
    safety.check_source(source)
    ck, ptx = safety.compile_user_source(source, name_expression, arch or "sm_90a", listing == "ptx")
    rep = gi.inspect_compiled(ck)
    rep.name = f"source:{name_expression}"
    rep.threads = threads_per_block
    return out(compiled.inspect_result(rep, listing=listing, max_lines=max_lines, ptx=ptx))


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
) -> ModelOut:
    """The analytic model of one GEMM (no GPU needed): FLOPs, minimum bytes, arithmetic intensity, the roofline
    and the speed of light at an SM clock; with `kernel`, the step's tile intensity, occupancy (registers from
    ptxas, smem, threads), tiles and waves (last-wave utilization), tile quantization, global and HBM traffic,
    and the predicted time, TFLOP/s and fraction of the speed of light, with which bound (compute or memory)
    applies. For bf16 / fp16 also `matmul`: what gemmlab.matmul runs at the shape (gemmlab.plan: the kernel,
    its tile, schedule, stages and predicted time, and the prices of the kernels weighed against it; for fp32
    the CUDA-core ladder's step and its block tile); for fp8
    `scaled_mm`: gemmlab.scaled_mm's plans (per-tensor and block scales) with their cheapest options. The
    device is the visible GPU's SM count, else the H200 profile (132 SMs, 4.3 TB/s)."""
    return out(modelling.model_report(M, N, K, kernel=kernel and _check_name(kernel), config=config,
                                      clock_mhz=clock_mhz, dtype=dtype))


@_tool
def model_grouped_gemm(
    groups: Annotated[int, Field(ge=1, le=512, description="experts (groups)")],
    rows: Annotated[Dim, Field(description="contiguous: T, the routed token-rows sorted by expert; masked: C, each "
                                           "expert's slab capacity")],
    N: Annotated[Dim, Field(description="columns of each expert's output (its weight is N x K)")],
    K: Annotated[Dim, Field(description="the reduction dimension")],
    layout: Annotated[Literal["contiguous", "masked"], Field(
        description="contiguous (offsets; prefill / training) or masked (counts; decode under CUDA graphs)")]
    = "contiguous",
    dtype: Annotated[Literal["bf16", "fp16", "fp8"], Field(description="the operands (fp8: e4m3, bf16 out)")] = "bf16",
    clock_mhz: Annotated[ClockMHz | None, Field(description="SM clock for the speed of light (default: the "
                                                "profile's sustained clock)")] = None,
) -> GroupedModelOut:
    """A grouped GEMM (mixture-of-experts layer) on the roofline, no GPU needed: FLOPs, the least bytes (A, every
    expert's weight and out once), intensity and the roofline bound; and the plan gemmlab.grouped_mm runs (tile,
    schedule: data-parallel, stream-K or ping-pong, stages, grid, predicted time) with the plan model's cheapest
    options, priced for rows / groups rows an expert (contiguous) or full slabs (masked)."""
    return out(modelling.grouped_report(groups, rows, N, K, layout=layout, dtype=dtype, clock_mhz=clock_mhz))


@_tool
def inspect_plan(
    kernel: Annotated[Literal["engine", "fp8", "grouped"], Field(
        description="engine: gemmlab.matmul's engine kernel; fp8: gemmlab.scaled_mm's; grouped: "
                    "gemmlab.grouped_mm's")],
    M: Annotated[Dim, Field(description="rows of A (grouped: T, or C with layout masked)")],
    N: Annotated[Dim, Field(description="columns of the output")],
    K: Annotated[Dim, Field(description="the reduction dimension")],
    groups: Annotated[int | None, Field(ge=1, le=512, description="grouped: the experts")] = None,
    layout: Annotated[Literal["contiguous", "masked"], Field(description="grouped: offsets or counts")]
    = "contiguous",
    dtype: Annotated[Literal["bf16", "fp16", "fp8"], Field(
        description="engine: bf16 / fp16; grouped: bf16 / fp16 / fp8 (fp8: e4m3 operands)")] = "bf16",
    scale: Annotated[Literal["tensor", "block"], Field(
        description="fp8 operands: per-tensor scales or 1 x 128 / 128 x 128 block scales")] = "tensor",
    listing: Annotated[Literal["none", "main_loop", "sass", "ptx"], Field(
        description="main_loop: the annotated SASS of the loop with the most math; sass: the whole annotated "
                    "SASS; ptx: the PTX; none: the summary only")] = "main_loop",
    max_lines: Annotated[int, Field(ge=1, le=MAX_LISTING_LINES, description="cap on listing lines")] = 120,
) -> InspectOut:
    """What the compiler made of the kernel a gemmlab call would run at a shape, without a GPU: the planner's
    instantiation (its name says the tile, stages and schedule) compiled, with registers, shared memory,
    spills, the SASS instruction mix, loops, the plan's SASS claims checked and a capped listing. Pair with
    model_gemm (matmul, dtype fp8: scaled_mm) or model_grouped_gemm for the plan and its price."""
    return out(compiled.inspect_plan(kernel, M, N, K, groups=groups, layout=layout, dtype=dtype, scale=scale,
                                     listing=listing, max_lines=max_lines))


# Measuring (GPU only) ---------------------------------------------------------------------------------------------

_GPU_LOCK = threading.Lock()  # one measurement at a time: two would share the GPU and skew both
NO_GPU = ("benchmark_gemm needs an NVIDIA GPU, and this server sees none (torch.cuda.is_available() is False). "
          "Without one, use inspect_kernel (SASS, registers, spills), model_gemm (roofline, waves, predicted time) "
          "and explain_gap (the model's dominant limiter with its numbers).")


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
) -> MeasurementOut:
    """Time a step (or gemmlab.matmul) against cuBLAS (torch.mm) on one shape, on this server's GPU, with
    gemmlab's one timer: inputs rotating over 2x L2, CUDA-graph replays, the two interleaved round by round,
    correctness checked first, the SM clock recorded (compare ratios, not absolute TFLOP/s: the clock moves).
    Caps: M*N*K <= 2^36 and 2 GiB of operands; a call takes seconds. Needs an NVIDIA GPU (Hopper for bf16
    steps); without one it answers with an error saying so."""
    from .. import model
    from ..reports import find_step

    if kernel in ("matmul", "gemmlab.matmul"):
        if config is not None:
            raise _fail("`config` is for registered steps; gemmlab.matmul chooses its own")
        dtype = dtype or "bf16"
        records.check_bench_size(M, N, K, 2 if dtype == "bf16" else 4)
        if not gpu_available():
            raise _fail(NO_GPU)
        return out(_with_gpu(lambda: records.measure_matmul(M, N, K, dtype, rounds, replay_ms)))
    spec = find_step(_check_name(kernel))
    if dtype is not None and dtype != model.ladder_dtype(spec):
        raise _fail(f"{spec.name} is a {model.ladder_dtype(spec)} kernel; `dtype` is for 'matmul'")
    cfg, _ = modelling.step_config(spec, config, M, N, K, model.device_profile().sm_count)
    records.check_bench_size(M, N, K, 4 if model.ladder_dtype(spec) == "fp32" else 2)
    why = spec.why_unsupported(M, N, K, cfg)
    if why:
        raise _fail(f"{spec.name} cannot run {M}x{N}x{K}: {why}")
    if not gpu_available():
        raise _fail(NO_GPU)
    return out(_with_gpu(lambda: records.measure_step(spec, cfg, M, N, K, rounds, replay_ms)))


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
) -> GapOut:
    """Why a step is as fast as it is on a shape: the model's time split into factors over the speed of light
    (compute efficiency, tile quantization, memory, waves; their product is predicted/ideal), the dominant one
    with its numbers, what the model does not price in (spills, failed SASS claims, narrow loads, low
    occupancy, unsupported shape), and on a GPU the measurement against cuBLAS and measured/model. Without a GPU
    the answer is the model alone, and says so."""
    def run():
        return modelling.explain(M, N, K, _check_name(kernel), config=config, clock_mhz=clock_mhz, measure=measure)

    return out(_with_gpu(run) if measure and gpu_available() else run())


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
3. `inspect_plan`: the kernel `gemmlab.matmul`, `scaled_mm` or `grouped_mm` would run at a shape, inspected.
4. `model_gemm`: roofline, speed of light, waves, occupancy, predicted time for a shape (and a step).
5. `model_grouped_gemm`: a MoE layer's grouped GEMM modelled, and the plan `grouped_mm` runs.
6. `explain_gap`: the dominant limiter for a step and shape, with numbers; plus the measurement on a GPU.
7. `benchmark_gemm`: a step or `gemmlab.matmul` against cuBLAS (needs a GPU).

A good loop: model the shape, explain the gap, inspect the main loop, change one thing, inspect again.
"""

INSTRUCTIONS = ("gemmlab: GEMM kernels for NVIDIA GPUs in two ladders (fp32 CUDA cores; bf16 Hopper TMA+wgmma). "
                "Start with list_kernels or the gemmlab://brief resource. inspect_kernel, inspect_plan (the kernel "
                "gemmlab.matmul / scaled_mm / grouped_mm would run at a shape), model_gemm, model_grouped_gemm and "
                "explain_gap work without a GPU; benchmark_gemm needs one.")


def diagnose_prompt(kernel: str = "h04", M: str = "4096", N: str = "4096", K: str = "4096") -> str:
    """A first session: find what bounds a step at a shape and where in the SASS to look."""
    from ..reports import find_step

    spec = find_step(_check_name(kernel))
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


def build_server() -> MCPServer:
    """The gemmlab MCP server with its tools, resources and prompt (no transport started)."""
    server = MCPServer("gemmlab", title="gemmlab: GEMM kernels, SASS, models and timings", version=__version__,
                       instructions=INSTRUCTIONS, log_level="WARNING")
    for fn in (list_kernels, inspect_kernel, inspect_plan, model_gemm, model_grouped_gemm, benchmark_gemm,
               explain_gap):
        server.add_tool(fn, annotations=_READ_ONLY, structured_output=True)
    server.resource("gemmlab://brief", name="brief", mime_type="text/markdown",
                    description="The subject in one page: the two ladders, the ceilings, the tools")(lambda: BRIEF)
    server.resource("gemmlab://ladders", name="ladders", mime_type="text/markdown",
                    description="Every ladder step: technique, arch, parameters, constraints")(catalog.ladder_markdown)
    server.prompt(name="diagnose_kernel")(diagnose_prompt)
    return server


def serve(http: bool = False, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Run the server until the client goes away or Ctrl-C: stdio (default) or streamable HTTP on
    ``host:port`` at ``/mcp``. Says on stderr what it is doing (stdout is the protocol's)."""
    server = build_server()
    if not http:
        if sys.stdin.isatty():
            print("gemmlab mcp: serving MCP on stdin/stdout and waiting for a client. An editor or agent starts "
                  "this command itself (see `gemmlab mcp --help`); Ctrl-C stops it.", file=sys.stderr)
        server.run("stdio")
        return
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"gemmlab mcp: serving on {host}:{port} without authentication; anyone who reaches it can compile "
              "code and use the GPU through it", file=sys.stderr)
    shown = f"[{host}]" if ":" in host else host
    print(f"gemmlab mcp: serving streamable HTTP at http://{shown}:{port}/mcp (Ctrl-C stops it)", file=sys.stderr)
    server.run("streamable-http", host=host, port=port)
