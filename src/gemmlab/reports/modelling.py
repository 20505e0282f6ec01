"""The analytic model as reports: a problem on the roofline, a step at a shape, every step, and why a step is
as fast as it is (``explain``). No GPU needed; on one, the SM count is the GPU's and ``explain`` can also
measure. The numbers come from ``gemmlab.model``; this module chooses the config, checks the request and
lays the answer out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from . import BadRequest, check_clock, check_dims, doc, find_step, gpu_available
from .records import Measurement, check_bench_size, measure_step

FORMULA = ("Hopper steps: per 64-deep k-slab, max(wgmma time at the clock, the SM's share of L2->SMEM bandwidth, "
           "TMA latency not covered by the pipeline stages), plus an epilogue per tile, in rounds over the SMs "
           "(gemmlab.model.predict_pipelined). fp32 steps: t = max(FLOPs / tile_quantization / (speed_of_light(clock) "
           "x efficiency), HBM bytes / bandwidth) / wave_efficiency; HBM bytes = max(min bytes, tile traffic x "
           "(1 - L2 hit)), capped by the FFMA share of their main loop")

Dtype = Literal["bf16", "fp16", "fp8", "tf32", "fp32"]
DTYPES = ("bf16", "fp16", "fp8", "tf32", "fp32")


@dataclass
class Device:
    name: str
    sm_count: int
    source: str = doc("'gpu' (read from the visible GPU) or 'profile' (named profile)")
    hbm_tb_per_s: float = doc("HBM copy bandwidth (read + write) the model uses")


@dataclass
class ProblemModel:
    M: int
    N: int
    K: int
    dtype: str
    flops: float
    min_bytes: int
    arithmetic_intensity: float = doc("FLOP per byte at minimum traffic")
    clock_mhz: float = doc("the SM clock of the speed of light")
    speed_of_light_tflops: float = doc("dense peak at the clock")
    ridge_flop_per_byte: float = doc("the intensity where the roofline turns from memory to compute")
    roofline_tflops: float = doc("min(speed of light, intensity x bandwidth)")
    roofline_bound: Literal["compute", "memory"] = doc("which side of the ridge the problem is on")
    min_time_us: float = doc("FLOPs / roofline")


@dataclass
class Occupancy:
    blocks_per_sm: int
    limiter: str
    by_threads: int
    by_registers: int
    by_smem: int
    warps_per_sm: int
    fraction: float = doc("active warps / the SM's maximum")


@dataclass
class Waves:
    tiles_m: int
    tiles_n: int
    tiles: int
    slots: int = doc("tiles that run at once: SMs x blocks per SM")
    waves: float
    last_wave_tiles: int
    last_wave_utilization: float
    efficiency: float = doc("waves / ceil(waves)")


@dataclass
class KernelModel:
    kernel: str = doc("full registry name")
    config: dict[str, int]
    config_source: str = doc("'given', 'tuned on this GPU' (gemmlab tune), 'heuristic for this shape' (the "
                             "step's own choice) or 'defaults'")
    supported: bool
    unsupported_reason: str | None
    tile: list[int] = doc("BM, BN, BK")
    threads: int
    registers: int
    smem_bytes: int
    spill_bytes: int
    tile_intensity: float
    occupancy: Occupancy
    gpu_blocks_per_sm: int | None = doc("cuda-core's occupancy query on the visible GPU (None without one)")
    waves: Waves
    tile_quantization: float = doc("useful fraction of the computed tile area")
    traffic_bytes: int = doc("tile loads + C before the L2 hit")
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


@dataclass
class StepPrediction:
    step: str = doc("short name, e.g. 'h04_two_consumers'")
    kernel: str
    supported: bool
    note: str | None = doc("why the step cannot run the shape, or the error that stopped its model")
    tile: list[int] | None
    blocks_per_sm: int | None
    waves: float | None
    last_wave_utilization: float | None
    efficiency: float | None
    bound: str | None
    predicted_tflops: float | None
    sol_fraction: float | None


@dataclass
class MatmulPlan:
    kernel: str = doc("what gemmlab.matmul runs: 'engine' (the engine kernel), 'h11' or 'decode'; for fp32 "
                      "operands 'sgemm' (the fp32 ladder's step named in the summary)")
    how: str = doc("why: 'model' (the plan model's price), 'decode priced', 'tuned' or 'forced'")
    tile: list[int] | None = doc("the engine kernel's tile (BM, BN), also when another kernel runs; the fp32 "
                                 "step's block tile for 'sgemm'")
    schedule: str | None = doc("data_parallel, split_k, stream_k or pingpong")
    splits: int | None
    stages: int | None
    predicted_us: float | None = doc("the plan model's time of the engine kernel's plan")
    h11_priced_us: float | None = doc("h11's plan priced by the same model (None where not weighed)")
    decode_priced_us: float | None = doc("the decode kernel's price (None where it cannot run the shape)")
    engine_priced_us: float | None = doc("the engine kernel's price the router weighed h11 and the decode "
                                         "kernel against (its plan's, before the small split-K discount)")
    copies_priced_us: float | None = doc("what the engine kernel's operand copies add, where the decode kernel "
                                         "would read the rows in place and was weighed against both (else None)")
    summary: str = doc("gemmlab.plan(M, N, K)'s repr")


@dataclass
class PlanOption:
    tile: list[int] = doc("BM, BN")
    schedule: str = doc("data_parallel, stream_k or pingpong (grouped); data_parallel (FP8)")
    stages: int
    predicted_us: float = doc("the plan model's time")


@dataclass
class EnginePlan:
    runs: str = doc("the call that runs it: 'gemmlab.scaled_mm' (scale 'tensor' or 'block') or "
                    "'gemmlab.grouped_mm'")
    kernel: str = doc("the kernel instantiation (what `gemmlab inspect` compiles)")
    tile: list[int] = doc("BM, BN")
    schedule: str
    stages: int
    grid: int = doc("persistent CTAs")
    predicted_us: float = doc("the plan model's time (H200 constants)")
    summary: str = doc("the plan's repr")
    candidates: list[PlanOption] = doc("the plan model's cheapest options, the pick among them (at most 6)")


@dataclass
class GroupedProblem:
    groups: int
    rows: int = doc("T, the routed token-rows (contiguous), or C, each expert's slab capacity (masked)")
    N: int
    K: int
    layout: str = doc("'contiguous' (offsets) or 'masked' (counts)")
    dtype: str
    flops: float = doc("2 x rows x N x K (masked: every slab full)")
    min_bytes: int = doc("A, every expert's weight and out, each once")
    arithmetic_intensity: float
    speed_of_light_tflops: float
    roofline_tflops: float
    roofline_bound: Literal["compute", "memory"]
    min_time_us: float


@dataclass
class GroupedModelResult:
    device: Device
    problem: GroupedProblem
    plan: EnginePlan = doc("what gemmlab.grouped_mm runs (gemmlab.grouped.plan), priced for rows / groups rows "
                           "an expert (contiguous) or full slabs (masked)")
    formula: str


@dataclass
class ModelResult:
    device: Device
    problem: ProblemModel
    kernel: KernelModel | None = doc("the named step in detail")
    steps: list[StepPrediction] | None = doc("every registered step at its default config (when asked)")
    formula: str
    matmul: MatmulPlan | None = doc("what gemmlab.matmul runs at this shape (gemmlab.plan), for bf16 and fp16 "
                                    "problems; the plan model prices it at the H200's constants with this "
                                    "device's SM count")
    scaled_mm: list[EnginePlan] | None = doc("fp8 problems: what gemmlab.scaled_mm runs with per-tensor scales "
                                             "and (K a multiple of 128) with 1 x 128 / 128 x 128 block scales")


@dataclass
class Limiter:
    name: str
    factor: float = doc("how many times slower than the speed of light this alone makes it (1.0 = no loss)")
    evidence: str


@dataclass
class GapResult:
    kernel: str
    config: dict[str, int]
    M: int
    N: int
    K: int
    model: KernelModel
    speed_of_light_tflops: float
    limiters: list[Limiter] = doc("largest factor first; their product is predicted / ideal time")
    dominant: str
    risks: list[str] = doc("what the model does not price in (spills, narrow loads, ...)")
    gpu_available: bool
    measurement: Measurement | None
    measured_over_model: float | None
    verdict: str


# Building blocks --------------------------------------------------------------------------------------------

def device_report(profile) -> Device:
    return Device(name=profile.name, sm_count=profile.sm_count, source=profile.source,
                  hbm_tb_per_s=profile.hbm_bytes_per_s / 1e12)


def occupancy_report(o) -> Occupancy:
    return Occupancy(blocks_per_sm=o.blocks_per_sm, limiter=o.limiter, by_threads=o.by_threads,
                     by_registers=o.by_registers, by_smem=o.by_smem, warps_per_sm=o.warps_per_sm,
                     fraction=round(o.fraction, 4))


def problem_model(M: int, N: int, K: int, dtype: str, profile, clock_mhz: float) -> ProblemModel:
    """FLOPs, minimum bytes, intensity, the roofline and the speed of light of one problem."""
    from .. import model

    peak = profile.peak_flops(dtype, clock_mhz)
    bw = profile.hbm_bytes_per_s
    ai = model.arithmetic_intensity(M, N, K, dtype)
    roof = model.roofline(ai, peak, bw)
    return ProblemModel(M=M, N=N, K=K, dtype=dtype, flops=model.flops(M, N, K), min_bytes=model.min_bytes(M, N, K, dtype),
                        arithmetic_intensity=ai, clock_mhz=clock_mhz, speed_of_light_tflops=peak / 1e12,
                        ridge_flop_per_byte=model.ridge_point(peak, bw), roofline_tflops=roof / 1e12,
                        roofline_bound="compute" if ai * bw >= peak else "memory",
                        min_time_us=model.flops(M, N, K) / roof * 1e6)


def resolve_config(spec, config: dict | None) -> dict[str, int]:
    """``spec.resolve``, with the step's parameters and their choices in the message when it fails."""
    from ..errors import UnsupportedProblem

    try:
        return spec.resolve(config)
    except UnsupportedProblem as e:
        raise BadRequest(f"{e}. Parameters of {spec.name}: " + "; ".join(
            f"{p.name} in {list(p.choices)}" for p in spec.params)) from None


def step_config(spec, config: dict | None, M: int, N: int, K: int, sm_count: int) -> tuple[dict[str, int], str]:
    """The config to model or time a step with: the one given, else the one tuned for this GPU and shape,
    else what the step's heuristic picks for the shape, else the defaults; and which of those it is."""
    if config is not None:
        return resolve_config(spec, config), "given"
    from ..autotune import best_config

    tuned = best_config(spec, M, N, K, sm_count)
    if tuned is not None:
        return tuned, "tuned on this GPU"
    if spec.heuristic is not None:
        return spec.config_for(M, N, K, sm_count, tuned=False), "heuristic for this shape"
    return spec.default_config(), "defaults"


def kernel_model(spec, cfg: dict, M: int, N: int, K: int, profile, clock_mhz: float, *, compiled=None,
                 config_source: str = "given") -> KernelModel:
    """A step's model at one shape and config (compiles it for its registers; no GPU needed)."""
    from .. import model

    ck = compiled or spec.compile(cfg)
    p = model.predict_step(spec, M, N, K, cfg, profile=profile, clock_mhz=clock_mhz, compiled=ck)
    w = p.waves
    why = spec.why_unsupported(M, N, K, cfg)
    return KernelModel(
        kernel=spec.name, config=cfg, config_source=config_source, supported=why is None, unsupported_reason=why,
        tile=list(p.tile), threads=spec.threads(cfg), registers=ck.resources.registers,
        smem_bytes=spec.smem_bytes(cfg) + ck.resources.static_shared,
        spill_bytes=ck.resources.spill_stores + ck.resources.spill_loads, tile_intensity=p.tile_intensity,
        occupancy=occupancy_report(p.occupancy),
        gpu_blocks_per_sm=model.gpu_occupancy(ck, spec.threads(cfg), spec.smem_bytes(cfg)),
        waves=Waves(tiles_m=w.tiles_m, tiles_n=w.tiles_n, tiles=w.tiles, slots=w.slots, waves=w.waves,
                    last_wave_tiles=w.last_wave_tiles, last_wave_utilization=w.last_wave_utilization,
                    efficiency=w.efficiency),
        tile_quantization=model.tile_quantization(M, N, p.tile[0], p.tile[1]), traffic_bytes=p.traffic_bytes,
        hbm_bytes=p.hbm_bytes, l2_hit=p.l2_hit, efficiency=p.efficiency, efficiency_source=p.efficiency_source,
        compute_time_us=p.t_compute_s * 1e6, memory_time_us=p.t_memory_s * 1e6, predicted_time_us=p.time_s * 1e6,
        predicted_tflops=p.tflops, sol_fraction=p.sol_fraction, bound=p.bound)


def every_step(M: int, N: int, K: int, profile, clock_mhz: float) -> list[StepPrediction]:
    """Each registered step's prediction at its default config; a step that cannot run the shape, or whose
    model fails, says why in ``note`` (one broken step does not hide the others)."""
    from .. import model, registry
    from ..errors import GemmlabError

    out = []
    for spec in registry.all_kernels():
        empty = dict(tile=None, blocks_per_sm=None, waves=None, last_wave_utilization=None, efficiency=None,
                     bound=None, predicted_tflops=None, sol_fraction=None)
        why = spec.why_unsupported(M, N, K)
        if why:
            out.append(StepPrediction(step=spec.short, kernel=spec.name, supported=False, note=why, **empty))
            continue
        try:
            p = model.predict_step(spec, M, N, K, profile=profile, clock_mhz=clock_mhz)
        except GemmlabError as e:
            out.append(StepPrediction(step=spec.short, kernel=spec.name, supported=True,
                                      note=f"ERROR: {str(e).splitlines()[0]}", **empty))
            continue
        out.append(StepPrediction(step=spec.short, kernel=spec.name, supported=True, note=None, tile=list(p.tile),
                                  blocks_per_sm=p.occupancy.blocks_per_sm, waves=p.waves.waves,
                                  last_wave_utilization=p.waves.last_wave_utilization, efficiency=p.efficiency,
                                  bound=p.bound, predicted_tflops=p.tflops, sol_fraction=p.sol_fraction))
    return out


def _profile(profile_name: str | None):
    from .. import model

    try:
        return model.device_profile(profile_name)
    except ValueError as e:
        raise BadRequest(str(e)) from None


# The reports --------------------------------------------------------------------------------------------------

def model_report(M: int, N: int, K: int, *, kernel: str | None = None, config: dict | None = None,
                 clock_mhz: float | None = None, dtype: str | None = None, profile: str | None = None,
                 every: bool = False) -> ModelResult:
    """The model of one GEMM: the problem on the roofline at ``dtype`` (a step's ladder dtype, else bf16),
    with ``kernel`` that step in detail (config: given, tuned, heuristic or defaults), with ``every`` each
    step's prediction. ``profile`` names a device profile instead of the visible GPU."""
    from .. import model

    check_dims(M, N, K)
    check_clock(clock_mhz)
    if dtype is not None and dtype not in DTYPES:
        raise BadRequest(f"dtype {dtype!r}: one of {', '.join(DTYPES)}")
    prof = _profile(profile)
    clock = clock_mhz or prof.sm_clock_mhz
    km = None
    if kernel is not None:
        spec = find_step(kernel)
        cfg, source = step_config(spec, config, M, N, K, prof.sm_count)
        lad_dtype = model.ladder_dtype(spec)
        if dtype is not None and dtype != lad_dtype:
            raise BadRequest(f"{spec.name} is a {lad_dtype} kernel; omit the dtype or pass {lad_dtype!r}")
        dtype = lad_dtype
        km = kernel_model(spec, cfg, M, N, K, prof, clock, config_source=source)
    elif config is not None:
        raise BadRequest("a config needs a kernel: name the step whose parameters these are")
    dtype = dtype or "bf16"
    return ModelResult(device=device_report(prof), problem=problem_model(M, N, K, dtype, prof, clock),
                       kernel=km, steps=every_step(M, N, K, prof, clock) if every else None, formula=FORMULA,
                       matmul=matmul_plan(M, N, K, dtype, prof.sm_count) if dtype in ("bf16", "fp16", "fp32")
                       else None,
                       scaled_mm=scaled_mm_plans(M, N, K) if dtype == "fp8" else None)


MAX_OPTIONS = 6


def _engine_plan(runs: str, pick, ranked) -> EnginePlan:
    """A planner's pick and its cheapest options as a report (the FP8 and the grouped plans)."""
    options = [PlanOption(tile=[c.bm, c.bn], schedule=getattr(c, "schedule", "data_parallel"), stages=c.stages,
                          predicted_us=round(c.predicted_s * 1e6, 3)) for c in ranked[:MAX_OPTIONS]]
    return EnginePlan(runs=runs, kernel=pick.compiled_name, tile=[pick.bm, pick.bn],
                      schedule=getattr(pick, "schedule", "data_parallel"), stages=pick.stages, grid=pick.grid,
                      predicted_us=round(pick.predicted_s * 1e6, 3), summary=repr(pick), candidates=options)


def scaled_mm_plans(M: int, N: int, K: int) -> list[EnginePlan]:
    """``gemmlab.scaled_mm``'s FP8 plans for an (M, K) x (K, N) e4m3 call with bf16 output: per-tensor
    scales, and block scales where K is a multiple of 128."""
    from .. import planner

    out = []
    for scale in ("tensor", "block") if K % 128 == 0 else ("tensor",):
        ranked = planner.fp8_candidates(M, N, K, scale=scale)
        out.append(_engine_plan(f"gemmlab.scaled_mm (scale {scale!r})", planner.plan_fp8(M, N, K, scale=scale),
                                ranked))
    return out


GROUPED_FORMULA = ("gemmlab.grouped.predict_s: the dense engine's k-step and epilogue terms (plan_cost) over all "
                   "groups' tiles in waves over the SMs, each group padded to whole tiles, stream-K's partial wave "
                   "and ping-pong's hidden epilogues priced as the dense model does, floored by the HBM time of "
                   "A, every expert's weight and out")


def grouped_report(groups: int, rows: int, N: int, K: int, *, layout: str = "contiguous", dtype: str = "bf16",
                   clock_mhz: float | None = None, profile: str | None = None) -> GroupedModelResult:
    """A grouped GEMM (mixture-of-experts) on the roofline, and the plan gemmlab.grouped_mm runs: ``groups``
    experts, ``rows`` = T (contiguous, offsets) or C (masked, counts), each expert's weight N x K."""
    from .. import grouped, model

    check_dims(rows, N, K, "rows, N, K")
    check_clock(clock_mhz)
    if not isinstance(groups, int) or not 1 <= groups <= grouped.MAX_GROUPS:
        raise BadRequest(f"groups = {groups}: an integer from 1 to {grouped.MAX_GROUPS}")
    if layout not in grouped.LAYOUTS:
        raise BadRequest(f"layout {layout!r}: one of {', '.join(grouped.LAYOUTS)}")
    if dtype not in ("bf16", "fp16", "fp8"):
        raise BadRequest(f"dtype {dtype!r}: grouped_mm takes bf16, fp16 or fp8 (e4m3) operands")
    prof = _profile(profile)
    clock = clock_mhz or prof.sm_clock_mhz
    total = rows if layout == "contiguous" else groups * rows
    e = 1 if dtype == "fp8" else 2
    flops = 2.0 * total * N * K
    nbytes = e * (total * K + groups * N * K) + 2 * total * N  # out: bf16 / fp16 (e4m3: bf16)
    peak, bw = prof.peak_flops(dtype, clock), prof.hbm_bytes_per_s
    ai = flops / nbytes
    roof = model.roofline(ai, peak, bw)
    problem = GroupedProblem(groups=groups, rows=rows, N=N, K=K, layout=layout, dtype=dtype, flops=flops,
                             min_bytes=nbytes, arithmetic_intensity=ai, speed_of_light_tflops=peak / 1e12,
                             roofline_tflops=roof / 1e12, roofline_bound="compute" if ai * bw >= peak else "memory",
                             min_time_us=flops / roof * 1e6)
    gdt = "e4m3" if dtype == "fp8" else dtype
    try:
        ranked = grouped.candidates(layout, groups, rows, N, K, dtype=gdt)
        pick = grouped.plan(layout, groups, rows, N, K, dtype=gdt)
    except ValueError as e:
        raise BadRequest(str(e)) from None
    return GroupedModelResult(device=device_report(prof), problem=problem,
                              plan=_engine_plan("gemmlab.grouped_mm", pick, ranked), formula=GROUPED_FORMULA)


def matmul_plan(M: int, N: int, K: int, dtype: str, sm_count: int) -> MatmulPlan:
    """``gemmlab.plan``'s route for a (M, K) x (K, N) call (B as ``w.t()`` of an nn.Linear weight), laid out."""
    import torch

    from .. import functional

    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    r = functional.plan(M, N, K, dtype=dt, sm_count=sm_count)
    if r.kernel == "sgemm":
        cfg = dict(r.config)
        return MatmulPlan(kernel=r.kernel, how=r.how, tile=[cfg["BM"], cfg["BN"]], schedule=None,
                          splits=None, stages=None, predicted_us=None, h11_priced_us=None, decode_priced_us=None,
                          engine_priced_us=None, copies_priced_us=None, summary=repr(r))
    p = r.plan
    us = (lambda s: None if s is None else s * 1e6)
    return MatmulPlan(kernel=r.kernel, how=r.how, tile=[p.bm, p.bn] if p else None, schedule=p.schedule if p else None,
                      splits=p.splits if p else None, stages=p.stages if p else None,
                      predicted_us=us(p.predicted_s) if p else None, h11_priced_us=us(r.h11_s),
                      decode_priced_us=us(r.decode_s), engine_priced_us=us(r.engine_s),
                      copies_priced_us=us(r.copies_s), summary=repr(r))


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


def explain(M: int, N: int, K: int, kernel: str, *, config: dict | None = None, clock_mhz: float | None = None,
            measure: bool = True, rounds: int = 5, replay_ms: float = 10.0) -> GapResult:
    """Why a step is as fast as it is on a shape: the model's time split into factors over the speed of light
    (compute efficiency, tile quantization, memory, waves; their product is predicted/ideal), the dominant
    one, what the model does not price in, and on a GPU (``measure``) the measurement against cuBLAS."""
    from .. import inspect as gi
    from .. import model

    check_dims(M, N, K)
    check_clock(clock_mhz)
    spec = find_step(kernel)
    profile = model.device_profile()
    cfg, source = step_config(spec, config, M, N, K, profile.sm_count)
    ck = spec.compile(cfg)
    rep = gi.inspect_compiled(ck, spec=spec, config=cfg)
    meas = None
    not_measured = None
    has_gpu = gpu_available()
    if has_gpu and measure:
        why = spec.why_unsupported(M, N, K, cfg)
        try:
            check_bench_size(M, N, K, 4 if model.ladder_dtype(spec) == "fp32" else 2)
        except BadRequest as e:
            why = why or str(e)
        if why:
            not_measured = why
        else:
            meas = measure_step(spec, cfg, M, N, K, rounds, replay_ms)
            if meas.sm_clock_mhz and clock_mhz is None:
                clock_mhz = meas.sm_clock_mhz
    clock = clock_mhz or profile.sm_clock_mhz
    km = kernel_model(spec, cfg, M, N, K, profile, clock, compiled=ck, config_source=source)
    peak = profile.peak_flops(model.ladder_dtype(spec), clock)
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
                            + (f"; look at: {risks[0]}" if risks else "; inspect the main loop") + ".")
    elif not has_gpu:
        verdict += " No GPU here: this is the model alone (a benchmark measures on a GPU)."
    elif not_measured:
        verdict += f" Not measured: {not_measured}."
    if risks:
        verdict += " Not in the model: " + " | ".join(risks)
    return GapResult(kernel=spec.name, config=cfg, M=M, N=N, K=K, model=km, speed_of_light_tflops=peak / 1e12,
                     limiters=lims, dominant=dominant, risks=risks, gpu_available=has_gpu, measurement=meas,
                     measured_over_model=ratio, verdict=verdict)

