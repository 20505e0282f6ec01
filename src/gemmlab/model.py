"""Analytic models of a GEMM on a GPU: FLOPs and bytes, the roofline, the speed of light at a clock, tile and
wave quantization, occupancy, a warp-specialized pipeline, and a predicted time for a ladder step.

Everything here is a pure function of its arguments (shapes, tiles, resources and a ``DeviceProfile``), so
it runs without a GPU and the tests check it against hand-computed cases. Only ``device_profile()`` (SM
count and L2 from the visible GPU) and ``gpu_occupancy()`` (cuda-core's query) look at hardware, and both
fall back cleanly without one.

The prediction for a step (``predict``) is deliberately simple:

    t_compute = FLOPs / tile_quantization / (speed_of_light(clock) * efficiency)
    t_memory  = max(min_bytes, tile_traffic * (1 - l2_hit)) / HBM bandwidth
    t         = max(t_compute, t_memory) * wave_inefficiency          (ceil(waves) / waves)

``efficiency`` is the fraction of the tensor-core (or FFMA) peak the step's main loop sustains and
``l2_hit`` the fraction of the tile loads served by L2. A step may state its own in the registry
(``KernelSpec.extra["model_efficiency"]``, ``extra["l2_hit"]``). Otherwise the defaults below apply, except
that a CUDA-core step's efficiency is capped by the FFMA share of its main loop's SASS (every other
instruction there takes an issue slot an FFMA could have used). ``tile_traffic`` counts A re-read once
per column of tiles and B once per row of tiles.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}

DEFAULT_EFFICIENCY = 0.9  # a main loop that keeps the math pipe busy 90% of the time
DEFAULT_L2_HIT = 0.9  # tiles in flight share most A/B panels through L2


@dataclass(frozen=True)
class DeviceProfile:
    """The figures of one GPU the models need. Per-SM limits are those of compute capability 9.0."""

    name: str
    sm_count: int
    sm_clock_mhz: float  # the sustained clock under load: the default for "speed of light"
    max_clock_mhz: float
    hbm_bytes_per_s: float  # achievable copy bandwidth (read + write)
    l2_bytes: int
    flop_per_clk_sm: dict = field(default_factory=lambda: {"bf16": 4096, "fp16": 4096, "fp8": 8192,
                                                           "tf32": 2048, "fp32": 256})
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255
    reg_alloc_unit: int = 256  # registers are allocated per warp, in units of 256
    sub_partitions: int = 4  # each SM quarter holds a quarter of the register file and its own warps
    smem_per_sm: int = 228 * 1024
    smem_per_block: int = 227 * 1024  # the most one block may use
    smem_reserved_per_block: int = 1024  # the runtime keeps 1 KB of each block's share
    max_threads_per_sm: int = 2048
    max_threads_per_block: int = 1024
    max_blocks_per_sm: int = 32
    source: str = "profile"  # "profile" or "gpu" (SM count and L2 read from the device)

    def peak_flops(self, dtype: str = "bf16", clock_mhz: float | None = None) -> float:
        """Dense FLOP/s at ``clock_mhz`` (default: the sustained clock)."""
        return speed_of_light(clock_mhz or self.sm_clock_mhz, self.sm_count, self.flop_per_clk_sm[dtype])


# H200 SXM: 132 SMs; sustained ~1320 MHz at the 700 W limit, 1980 MHz boost; ~4.3 TB/s HBM copy; 50 MB L2.
H200 = DeviceProfile(name="H200", sm_count=132, sm_clock_mhz=1320.0, max_clock_mhz=1980.0,
                     hbm_bytes_per_s=4.3e12, l2_bytes=50 * 2**20)
PROFILES: dict[str, DeviceProfile] = {"H200": H200}


def device_profile(name: str | None = None) -> DeviceProfile:
    """The profile called ``name``; without a name, the visible GPU's (SM count, L2 and name read from it,
    the rest from the H200 profile), or the H200 profile when there is no GPU."""
    if name is not None:
        try:
            return PROFILES[name]
        except KeyError:
            raise ValueError(f"unknown device profile {name!r}; known: {', '.join(PROFILES)}") from None
    try:
        import torch

        if not torch.cuda.is_available():
            return H200
        from .gpu import gpu_info

        info = gpu_info()
    except Exception:  # noqa: BLE001 - no usable GPU: the named default
        return H200
    return dataclasses.replace(H200, name=info.name, sm_count=info.sm_count, l2_bytes=info.l2_bytes, source="gpu")


# Work and traffic ----------------------------------------------------------------------------------

def flops(M: int, N: int, K: int) -> float:
    """2 M N K: one multiply and one add per (m, n, k)."""
    return 2.0 * M * N * K


def min_bytes(M: int, N: int, K: int, dtype: str = "bf16", out_dtype: str | None = None,
              read_c: bool = False) -> int:
    """The least global traffic: read A (M,K) and B (K,N) once, write C (M,N) once (and read it if beta != 0)."""
    e, eo = DTYPE_BYTES[dtype], DTYPE_BYTES[out_dtype or dtype]
    return e * (M * K + K * N) + eo * M * N * (2 if read_c else 1)


def arithmetic_intensity(M: int, N: int, K: int, dtype: str = "bf16", **kw) -> float:
    """FLOPs per byte of the whole problem at its minimum traffic."""
    return flops(M, N, K) / min_bytes(M, N, K, dtype, **kw)


def tile_intensity(BM: int, BN: int, BK: int = 1, dtype: str = "bf16") -> float:
    """FLOPs per byte a block tile loads each k-step: 2 BM BN BK / ((BM + BN) BK elem) = 2 BM BN / ((BM + BN) elem).

    For a fixed area BM * BN it is largest when BM == BN (square tiles); it does not depend on BK.
    """
    return 2.0 * BM * BN * BK / ((BM + BN) * BK * DTYPE_BYTES[dtype])


def tile_traffic_bytes(M: int, N: int, K: int, BM: int, BN: int, dtype: str = "bf16",
                       out_dtype: str | None = None) -> int:
    """Global loads of a tiled GEMM without reuse between blocks, plus the C write: every block tile reads
    its A panel (BM x K) and B panel (K x BN), so A is read ceil(N/BN) times and B ceil(M/BM) times."""
    e, eo = DTYPE_BYTES[dtype], DTYPE_BYTES[out_dtype or dtype]
    return e * (M * K * math.ceil(N / BN) + N * K * math.ceil(M / BM)) + eo * M * N


# Ceilings ------------------------------------------------------------------------------------------

def speed_of_light(clock_mhz: float, sm_count: int = 132, flop_per_clk_sm: int = 4096) -> float:
    """Peak FLOP/s at an SM clock: SMs x FLOP per clock per SM x clock. (dense bf16: 4096, fp32 FFMA: 256)."""
    return sm_count * flop_per_clk_sm * clock_mhz * 1e6


def roofline(intensity: float, peak_flops: float, bandwidth: float) -> float:
    """Attainable FLOP/s at an arithmetic intensity (FLOP/byte): min(peak, intensity x bandwidth)."""
    return min(peak_flops, intensity * bandwidth)


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """The intensity (FLOP/byte) above which a kernel can be compute bound."""
    return peak_flops / bandwidth


# Tile and wave quantization ------------------------------------------------------------------------

@dataclass(frozen=True)
class Waves:
    tiles_m: int
    tiles_n: int
    tiles: int
    slots: int  # tiles that run at once: SMs x blocks per SM
    waves: float  # tiles / slots
    full_waves: int
    last_wave_tiles: int  # tiles in the last wave (== slots when the last wave is full)
    last_wave_utilization: float  # last_wave_tiles / slots
    efficiency: float  # waves / ceil(waves): the fraction of the launched SM time doing work

    @property
    def wave_count(self) -> int:
        return math.ceil(self.waves)


def wave_quantization(M: int, N: int, BM: int, BN: int, sm_count: int = 132, blocks_per_sm: int = 1) -> Waves:
    """How ``ceil(M/BM) x ceil(N/BN)`` tiles fill ``sm_count x blocks_per_sm`` slots.

    Example: 4096 x 4096 with 128 x 256 tiles on 132 SMs: 512 tiles, 3.88 waves, the last wave 116/132 = 88%
    full, efficiency 3.88 / 4 = 97%.
    """
    tm, tn = math.ceil(M / BM), math.ceil(N / BN)
    tiles = tm * tn
    slots = max(1, sm_count * blocks_per_sm)
    waves = tiles / slots
    n_waves = math.ceil(waves)
    last = tiles - (n_waves - 1) * slots if tiles else 0
    return Waves(tiles_m=tm, tiles_n=tn, tiles=tiles, slots=slots, waves=waves, full_waves=tiles // slots,
                 last_wave_tiles=last, last_wave_utilization=last / slots,
                 efficiency=waves / n_waves if n_waves else 1.0)


def tile_quantization(M: int, N: int, BM: int, BN: int) -> float:
    """Useful fraction of the computed tile area: M N / (ceil(M/BM) BM ceil(N/BN) BN)."""
    return (M * N) / (math.ceil(M / BM) * BM * math.ceil(N / BN) * BN)


# Occupancy -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int
    limiter: str  # "threads", "registers", "shared memory", "blocks" (or why it does not fit)
    by_threads: int
    by_registers: int
    by_smem: int
    by_blocks: int
    warps_per_sm: int
    fraction: float  # active warps / the SM's maximum


def occupancy(threads: int, registers: int, smem_bytes: int, profile: DeviceProfile = H200) -> Occupancy:
    """Blocks per SM from threads per block, registers per thread and shared memory per block (static +
    dynamic), the way the CUDA occupancy calculator counts: registers per warp rounded up to the
    allocation unit (256) and warps placed in the four SM quarters (16384 registers each), 1 KB of
    shared memory reserved per block, a block's smem at most ``profile.smem_per_block``."""
    p = profile
    warps = math.ceil(threads / 32)
    if threads > p.max_threads_per_block or threads < 1:
        return Occupancy(0, f"{threads} threads per block", 0, 0, 0, 0, 0, 0.0)
    by_threads = p.max_threads_per_sm // (warps * 32)
    if registers > p.max_regs_per_thread:
        return Occupancy(0, f"{registers} registers per thread", by_threads, 0, 0, 0, 0, 0.0)
    if registers > 0:
        regs_per_warp = math.ceil(registers * 32 / p.reg_alloc_unit) * p.reg_alloc_unit
        warps_by_regs = (p.regs_per_sm // p.sub_partitions // regs_per_warp) * p.sub_partitions
        by_regs = warps_by_regs // warps
    else:
        by_regs = p.max_blocks_per_sm
    if smem_bytes > p.smem_per_block:
        return Occupancy(0, f"{smem_bytes} B shared memory > {p.smem_per_block} per block", by_threads, by_regs,
                         0, p.max_blocks_per_sm, 0, 0.0)
    by_smem = p.smem_per_sm // (smem_bytes + p.smem_reserved_per_block)
    limits = {"threads": by_threads, "registers": by_regs, "shared memory": by_smem, "blocks": p.max_blocks_per_sm}
    blocks = min(limits.values())
    limiter = min(limits, key=lambda k: (limits[k], list(limits).index(k)))
    return Occupancy(blocks_per_sm=blocks, limiter=limiter, by_threads=by_threads, by_registers=by_regs,
                     by_smem=by_smem, by_blocks=p.max_blocks_per_sm, warps_per_sm=blocks * warps,
                     fraction=blocks * warps * 32 / p.max_threads_per_sm)


def gpu_occupancy(compiled, threads: int, dynamic_smem: int) -> int | None:
    """cuda-core's answer (``Kernel.occupancy.max_active_blocks_per_multiprocessor``) for the loaded kernel,
    or None without a GPU. Sets the max-dynamic-smem attribute first, as a launch would."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        from .jit import launch as _launch

        dev = _launch.current_device()
        kern = compiled.load(dev.device_id)
        if dynamic_smem > 48 * 1024:
            _launch._set_max_dynamic_smem(kern, dynamic_smem, dev.device_id, compiled.name)
        return int(kern.occupancy.max_active_blocks_per_multiprocessor(threads, dynamic_smem))
    except Exception:  # noqa: BLE001 - a cubin for another architecture, no driver: no cross-check
        return None


# The warp-specialized pipeline ---------------------------------------------------------------------

@dataclass(frozen=True)
class Segment:
    lane: str  # "producer" or "consumer i"
    k: int  # k-tile index
    slot: int  # ring slot (k % stages)
    start: float
    end: float


def pipeline_timeline(k_tiles: int, stages: int, t_load: float, t_compute: float,
                      consumers: int = 2) -> list[Segment]:
    """A simple model of a producer warp feeding ``consumers`` warpgroups through a ring of ``stages``
    shared-memory slots. Loads go one after the other (the memory pipe is shared); load ``k`` may start
    only when slot ``k % stages`` was released by the consumers' compute of k-tile ``k - stages``. The
    consumers work on k-tile ``k`` together (each on its half of the tile) once its load has landed and
    they finished ``k - 1``. With ``stages >= 2`` and ``t_load <= t_compute`` the consumers never wait
    after the first load; with one stage, load and compute alternate."""
    segs: list[Segment] = []
    load_end = [0.0] * k_tiles
    comp_end = [0.0] * k_tiles
    prev_load = 0.0
    for k in range(k_tiles):
        free = comp_end[k - stages] if k >= stages else 0.0
        # Compute of k - stages must have been scheduled already: it is, since k - stages < k.
        start = max(prev_load, free)
        load_end[k] = start + t_load
        prev_load = load_end[k]
        segs.append(Segment("producer", k, k % stages, start, load_end[k]))
        c0 = max(load_end[k], comp_end[k - 1] if k else 0.0)
        comp_end[k] = c0 + t_compute
        for i in range(consumers):
            segs.append(Segment(f"consumer {i}", k, k % stages, c0, comp_end[k]))
    return segs


def pipeline_utilization(segs: list[Segment]) -> float:
    """Busy fraction of the consumers over the whole timeline."""
    cons = [s for s in segs if s.lane == "consumer 0"]
    if not cons:
        return 0.0
    span = max(s.end for s in segs) - min(s.start for s in segs)
    return sum(s.end - s.start for s in cons) / span if span else 0.0


# The prediction for a step --------------------------------------------------------------------------

@dataclass(frozen=True)
class Prediction:
    M: int
    N: int
    K: int
    dtype: str
    tile: tuple[int, int, int]
    clock_mhz: float
    peak_tflops: float  # speed of light at the clock
    efficiency: float
    efficiency_source: str
    l2_hit: float
    occupancy: Occupancy
    waves: Waves
    tile_intensity: float
    traffic_bytes: int  # tile traffic before the L2 hit
    hbm_bytes: float  # what reaches HBM in the model
    t_compute_s: float
    t_memory_s: float
    time_s: float
    bound: str  # "compute" or "memory"

    @property
    def tflops(self) -> float:
        return flops(self.M, self.N, self.K) / self.time_s / 1e12 if self.time_s > 0 else 0.0

    @property
    def sol_fraction(self) -> float:
        return self.tflops / self.peak_tflops if self.peak_tflops else 0.0


def predict(M: int, N: int, K: int, *, tile: tuple[int, int, int], threads: int, registers: int, smem_bytes: int,
            dtype: str = "bf16", out_dtype: str | None = None, read_c: bool = False,
            profile: DeviceProfile = H200, clock_mhz: float | None = None, efficiency: float = DEFAULT_EFFICIENCY,
            l2_hit: float = DEFAULT_L2_HIT, blocks_per_sm: int | None = None,
            efficiency_source: str = "given") -> Prediction:
    """Predicted time of a tiled GEMM (see the module docstring for the formula).

    ``tile`` is (BM, BN, BK); ``registers`` per thread and ``smem_bytes`` per block (static + dynamic) set
    the occupancy, hence the wave size, unless ``blocks_per_sm`` is given.
    """
    BM, BN, BK = tile
    clock = clock_mhz or profile.sm_clock_mhz
    peak = profile.peak_flops(dtype, clock)
    occ = occupancy(threads, registers, smem_bytes, profile)
    bps = blocks_per_sm if blocks_per_sm is not None else max(1, occ.blocks_per_sm)
    waves = wave_quantization(M, N, BM, BN, profile.sm_count, bps)
    # Partial edge tiles cost a whole tile of math.
    t_compute = flops(M, N, K) / tile_quantization(M, N, BM, BN) / (peak * efficiency)
    traffic = tile_traffic_bytes(M, N, K, BM, BN, dtype, out_dtype) + (
        DTYPE_BYTES[out_dtype or dtype] * M * N if read_c else 0)
    hbm = max(float(min_bytes(M, N, K, dtype, out_dtype, read_c)), traffic * (1.0 - l2_hit))
    t_memory = hbm / profile.hbm_bytes_per_s
    t = max(t_compute, t_memory) / waves.efficiency
    return Prediction(M=M, N=N, K=K, dtype=dtype, tile=(BM, BN, BK), clock_mhz=clock, peak_tflops=peak / 1e12,
                      efficiency=efficiency, efficiency_source=efficiency_source, l2_hit=l2_hit,
                      occupancy=occ, waves=waves,
                      tile_intensity=tile_intensity(BM, BN, BK, dtype), traffic_bytes=traffic, hbm_bytes=hbm,
                      t_compute_s=t_compute, t_memory_s=t_memory, time_s=t,
                      bound="compute" if t_compute >= t_memory else "memory")


def ffma_issue_share(summary) -> float | None:
    """FFMA / instructions in the loop that holds the most FFMA (a ``gemmlab.sass.SassSummary``), or None
    without FFMA loops. Each SM quarter issues one warp instruction per clock and the FFMA peak needs every
    issue slot to be an FFMA, so this share bounds a CUDA-core kernel's fraction of the FFMA peak."""
    loops = [lp for lp in summary.loops if lp.mix.get("ffma", 0)]
    if not loops:
        return None
    best = max(loops, key=lambda lp: (lp.mix["ffma"], -lp.instructions))  # the tightest loop holding them
    return best.mix["ffma"] / best.instructions


def step_efficiency(spec, summary=None) -> tuple[float, str]:
    """The efficiency ``predict`` uses for a step, and where it comes from: the step's own
    ``extra["model_efficiency"]``; for CUDA-core (fp32) steps, min(default, FFMA issue share of the main
    loop); else the default."""
    if "model_efficiency" in spec.extra:
        return float(spec.extra["model_efficiency"]), "stated by the step"
    if ladder_dtype(spec) == "fp32" and summary is not None:
        share = ffma_issue_share(summary)
        if share is not None and share < DEFAULT_EFFICIENCY:
            return share, f"FFMA share of the main loop's instructions ({share:.0%})"
    return DEFAULT_EFFICIENCY, "default"


def ladder_dtype(spec) -> str:
    from .registry import ladders

    return ladders()[spec.ladder].dtype


def predict_step(spec, M: int, N: int, K: int, config: dict | None = None, *,
                 profile: DeviceProfile | None = None, clock_mhz: float | None = None,
                 compiled=None, summary=None) -> Prediction:
    """``predict`` for a registered step: its tile, threads and shared memory from the registry, its
    registers from ptxas and its SASS from nvdisasm (compiles the step; no GPU needed), its efficiency
    from ``step_efficiency`` and its L2 hit from ``spec.extra["l2_hit"]`` (else the default)."""
    from .sass import kernel_summary

    cfg = spec.resolve(config)
    ck = compiled or spec.compile(cfg)
    dtype = ladder_dtype(spec)
    eff, why = step_efficiency(spec, summary if summary is not None else
                               (kernel_summary(ck) if dtype == "fp32" else None))
    return predict(M, N, K, tile=tuple(spec.tile(cfg)), threads=spec.threads(cfg), registers=ck.resources.registers,
                   smem_bytes=spec.smem_bytes(cfg) + ck.resources.static_shared, dtype=dtype,
                   profile=profile or device_profile(),
                   clock_mhz=clock_mhz, efficiency=eff, efficiency_source=why,
                   l2_hit=float(spec.extra.get("l2_hit", DEFAULT_L2_HIT)),
                   blocks_per_sm=spec.extra.get("blocks_per_sm"))
