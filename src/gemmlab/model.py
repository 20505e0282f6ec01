"""Analytic models of a GEMM on a GPU: FLOPs and bytes, the roofline, the speed of light at a clock, tile and
wave quantization, occupancy, a warp-specialized pipeline, and a predicted time for a ladder step.

Everything here is a pure function of its arguments (shapes, tiles, resources and a ``DeviceProfile``), so
it runs without a GPU and the tests check it against hand-computed cases. Only ``device_profile()`` (SM
count and L2 from the visible GPU) and ``gpu_occupancy()`` (cuda-core's query) look at hardware, and both
fall back cleanly without one.

Two predictions, one per kind of main loop.

CUDA-core (fp32) steps, ``predict_cuda_core``: a k-tile model of the main loop from its SASS (see
``cuda_core_period``). Per iteration of the loop (one BK-deep tile; 16 k for k01/k02's unrolled loop), a
block needs R = the largest of

  * issue: warps x instructions on the loop's fast path / 4 schedulers, at ``issue_efficiency`` of a
    clock each,
  * memory-instruction dispatch: warps x (LDG + LDS + STS) at one per clock per SM (8 LSU lanes per
    scheduler), at the same ``issue_efficiency``,
  * L1 wavefronts of its global loads: warps x lines touched per LDG, one per clock per SM (k01: a warp's
    A load walks 32 rows, 32 lines; a registry fact, ``extra["lines_per_load"]``);

B co-resident blocks take max(B x R, R + L) per iteration when the loop stages tiles through shared
memory between barriers (L = ``tile_latency_s``: load round trip + barriers, hidden only by the other
blocks), max(B x R, L) when the loop fetches the next tile before this tile's math (``extra
["prefetch"]``: k10), and B x R without barriers (k01, k02: warps are independent). The busiest SM runs
ceil(tiles / SMs) blocks in rounds of B. The result is max'ed with the HBM time below.

The older formula, ``predict``, stays for steps that state ``extra["model_efficiency"]`` and for
hand cases:

    t_compute = FLOPs / tile_quantization / (speed_of_light(clock) * efficiency)
    t_memory  = max(min_bytes, tile_traffic * (1 - l2_hit)) / HBM bandwidth
    t         = max(t_compute, t_memory) * wave_inefficiency          (ceil(waves) / waves)

``efficiency`` is the fraction of the FFMA peak the step's main loop sustains and ``l2_hit`` the fraction
of the tile loads served by L2. A step may state its own in the registry (``KernelSpec.extra
["model_efficiency"]``, ``extra["l2_hit"]``). Otherwise the defaults below apply, except that the
efficiency is capped by the FFMA share of the main loop's SASS (every other instruction there takes an
issue slot an FFMA could have used). ``tile_traffic`` counts A re-read once per column of tiles and B
once per row of tiles.

Tensor-core (Hopper, bf16) steps, ``predict_pipelined``: a k-step model of the TMA -> shared memory ->
wgmma loop (see ``kstep_time``). Per k-step (one BK-deep slab of A and B), an SM needs the larger of

  * the tensor-core time of its CTAs' slabs at the recorded clock (``DeviceProfile.mma_efficiency``),
  * the transfer of those slabs from L2 at the SM's share of the L2->SMEM bandwidth
    (``DeviceProfile.l2_smem_bytes_per_s``; cluster multicast halves B's share),
  * the load latency (``tma_latency_s`` + transfer, + ``ring_handoff_s`` for a producer warp) spread
    over the stages in flight, or, with one stage, not hidden at all,
  * for loops that wait for every wgmma group and use token barriers (h01-h05), the tensor pipe's drain
    and the barrier round trip each k-step (``kstep_turnaround_clk``);

a tile costs ``k_tiles`` such k-steps plus its epilogue (``epilogue_time``), and the busiest SM runs
ceil(tiles / slots) tiles (wave quantization falls out of the tile count). Every constant is a device
constant stated (with the arithmetic) where the H200 profile is defined; the step-specific inputs are
structural facts (tile, stages, CTAs per SM, persistence, wgmma groups in flight, cluster size) from the
registry and ptxas, never a fitted per-step number.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .schedule import Waves, tile_quantization, wave_quantization  # noqa: F401 - part of the model's API
from .devices import H200, PROFILES, DeviceProfile, device_profile  # noqa: F401 - re-exported (PROFILES too)

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}

DEFAULT_EFFICIENCY = 0.9  # a main loop that keeps the math pipe busy 90% of the time
DEFAULT_L2_HIT = 0.9  # tiles in flight share most A/B panels through L2


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


# Tile and wave quantization: in ``gemmlab.schedule`` (the engine plans with them), re-exported here.

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


# The TMA -> shared memory -> wgmma pipeline -------------------------------------------------------------

@dataclass(frozen=True)
class MainLoop:
    """The structural facts of a tensor-core step's k-loop that the pipeline model needs.

    ``stages``: shared-memory slabs in the ring (1: load, wait, compute, load again). ``ctas_per_sm``:
    co-resident CTAs (occupancy), each with its own loop. ``persistent``: one CTA per SM walks the tiles,
    so the ring runs on across tiles and only the first load is waited for. ``wgmma_in_flight``: 0 if each
    k-step waits for its own wgmma group (``wgmma.wait_group 0``) and uses token barriers, 1 if it issues
    the next group before waiting for the previous one and waits on barrier parity. ``cluster``: CTAs that
    share each B slab by TMA multicast (each loads 1/cluster of it). ``producer_warp``: loads are issued
    by a separate producer warp woken by an "empty" barrier (warp-specialized ring)."""

    stages: int = 1
    ctas_per_sm: int = 1
    persistent: bool = False
    wgmma_in_flight: int = 0
    cluster: int = 1
    producer_warp: bool = False
    epilogue_overlapped: bool = False  # a tile's stores run under the next tile's k-steps (persistent only)


@dataclass(frozen=True)
class KStep:
    """One k-step (a BK-deep slab of A and B) of every CTA on an SM, and what limits it (seconds)."""

    t_mma: float  # one CTA's slab on the tensor cores, at the recorded clock and ``mma_efficiency``
    t_transfer: float  # one CTA's slab at the SM's share of the L2->SMEM bandwidth
    t_load: float  # issue -> landed -> consumer released: latency + transfer (+ producer handoff)
    t_turnaround: float  # drained tensor pipe + token barrier per k-step (0 with a group in flight)
    period: float  # the SM's time per k-step of each of its CTAs
    limiter: str  # "tensor cores" (+ "k-step turnaround"), "L2->SMEM bandwidth" or "load latency"


def stage_bytes(BM: int, BN: int, BK: int, dtype: str = "bf16", cluster: int = 1) -> float:
    """Bytes one CTA pulls from L2 per k-step: its A slab (BM x BK) and its share of the B slab (BN x BK /
    cluster; the rest arrives by multicast from the other CTAs of the cluster)."""
    return (BM + BN / cluster) * BK * DTYPE_BYTES[dtype]


def l2_smem_bytes(M: int, N: int, K: int, BM: int, BN: int, BK: int = 64, dtype: str = "bf16",
                  cluster: int = 1) -> float:
    """L2 -> shared memory traffic of the whole product: every tile streams its A and B panels once
    (edge tiles in full, as the TMA box is full), B's share divided by the cluster size. 4096^3 with
    128 x 256 tiles: 512 x (128 + 256) x 4096 x 2 B = 1.61 GB."""
    tiles = math.ceil(M / BM) * math.ceil(N / BN)
    return tiles * math.ceil(K / BK) * stage_bytes(BM, BN, BK, dtype, cluster)


def kstep_time(BM: int, BN: int, BK: int, loop: MainLoop, clock_mhz: float, *, dtype: str = "bf16",
               profile: DeviceProfile = H200, efficiency: float | None = None, active_sms: int | None = None,
               ctas: int | None = None) -> KStep:
    """The SM's time for one k-step of each of its ``ctas`` (default ``loop.ctas_per_sm``) CTAs.

    With t = the slab's tensor time, x = its transfer at the SM's share of the L2->SMEM bandwidth
    (shared by ``active_sms``, default all), L = ``tma_latency_s`` + x (+ ``ring_handoff_s`` with a
    producer warp) and g = the turnaround (``kstep_turnaround_clk`` / clock, only with
    ``wgmma_in_flight == 0``), S stages and n CTAs:

      S = 1                 max(n t, n x, L + t + g)              the load is never hidden: each CTA
                                                                  loads, waits, computes, syncs; n
                                                                  CTAs cover one another's waits
      S >= 2, group drains  max(n (t + g), n x, (L + t + g) / S)  a slab is freed when its group has
                                                                  finished; S - 1 k-steps cover its refill
      S >= 2, in flight     max(n t, n x, L / (S - 1), (L + t) / S)
                                                                  slab k is freed only after k + 1 was
                                                                  issued (it had landed) and k finished

    The first two terms are the SM's shared resources (tensor cores, L2 bandwidth share), the others
    one CTA's dependency chain.
    """
    p = profile
    f = clock_mhz * 1e6
    eff = p.mma_efficiency if efficiency is None else efficiency
    n = loop.ctas_per_sm if ctas is None else ctas
    S = max(1, loop.stages)
    t = 2.0 * BM * BN * BK / (p.flop_per_clk_sm[dtype] * f * eff)
    x = stage_bytes(BM, BN, BK, dtype, loop.cluster) / (p.l2_smem_bytes_per_s / (active_sms or p.sm_count))
    L = p.tma_latency_s + x + (p.ring_handoff_s if loop.producer_warp else 0.0)
    g = p.kstep_turnaround_clk / f if loop.wgmma_in_flight == 0 else 0.0
    if S == 1:
        terms = {"tensor cores": n * t, "L2->SMEM bandwidth": n * x, "load latency": L + t + g}
    elif loop.wgmma_in_flight == 0:
        terms = {"tensor cores + k-step turnaround": n * (t + g), "L2->SMEM bandwidth": n * x,
                 "load latency": (L + t + g) / S}
    else:
        terms = {"tensor cores": n * t, "L2->SMEM bandwidth": n * x,
                 "load latency": max(L / (S - 1), (L + t) / S)}
    limiter = max(terms, key=terms.get)  # ties: the first listed (tensor cores)
    return KStep(t_mma=t, t_transfer=x, t_load=L, t_turnaround=g, period=terms[limiter], limiter=limiter)


def epilogue_time(BM: int, BN: int, out_dtype: str = "bf16", profile: DeviceProfile = H200) -> float:
    """Time a CTA spends writing out its C tile (BM x BN), during which it issues no wgmma: the tile's
    bytes at ``epilogue_bytes_per_s``. 128 x 256 bf16 on the H200: 64 KB / 14.5 GB/s = 4.5 us. CTAs on
    one SM (h01, h02) write their tiles at the same time, so one epilogue is counted per round."""
    return BM * BN * DTYPE_BYTES[out_dtype] / profile.epilogue_bytes_per_s


@dataclass(frozen=True)
class PipelineTime:
    """The SM side of ``predict_pipelined``: the busiest SM's tiles and what they cost."""

    rounds: int  # tiles the busiest SM runs one after the other (per CTA slot)
    kstep: KStep  # the first round's k-step (a full wave's, unless there is only a partial one)
    t_fill_s: float  # waits for a first load that nothing hides
    t_epilogue_s: float  # all the epilogues on the busiest SM's critical path
    time_s: float


def pipeline_time(M: int, N: int, K: int, BM: int, BN: int, BK: int, loop: MainLoop, clock_mhz: float, *,
                  dtype: str = "bf16", out_dtype: str | None = None, profile: DeviceProfile = H200,
                  efficiency: float | None = None) -> PipelineTime:
    """The busiest SM's time for the product (see ``kstep_time`` for a k-step).

    The tiles run in rounds. Persistent: ``SMs / cluster`` cluster slots walk ceil(tile_rows / cluster) x
    tile_cols cluster tiles, so the busiest CTA runs ceil(units / slots) tiles, and the ring waits only
    once, for the very first load. Otherwise CTAs run in rounds of ``SMs x ctas_per_sm``; a round of w
    CTAs puts ceil(w / SMs) on the busiest SM, and each round waits for its first load (with a ring; a
    one-stage loop waits in every k-step anyway). Each round costs k_tiles k-steps and one epilogue. The
    last round's k-step is worked out for its own CTA count: a partial wave shares the L2 bandwidth among
    fewer SMs and the tensor cores among fewer CTAs.
    """
    p = profile
    k_tiles = math.ceil(K / BK)
    tiles_m, tiles_n = math.ceil(M / BM), math.ceil(N / BN)
    epi = epilogue_time(BM, BN, out_dtype or dtype, p)
    if loop.persistent:
        slots = max(1, p.sm_count // loop.cluster)
        units = math.ceil(tiles_m / loop.cluster) * tiles_n
        shapes = [(1, min(units, slots) * loop.cluster)] * (units // slots)
        if units % slots:
            shapes.append((1, (units % slots) * loop.cluster))
    else:
        slots = p.sm_count * max(1, loop.ctas_per_sm)
        tiles = tiles_m * tiles_n
        shapes = [(math.ceil(slots / p.sm_count), p.sm_count)] * (tiles // slots)
        if tiles % slots:
            w = tiles % slots
            shapes.append((math.ceil(w / p.sm_count), min(p.sm_count, w)))
    if not shapes:  # an empty product
        return PipelineTime(rounds=0, kstep=kstep_time(BM, BN, BK, loop, clock_mhz, dtype=dtype, profile=p,
                                                       efficiency=efficiency), t_fill_s=0.0, t_epilogue_s=0.0,
                            time_s=0.0)
    steps = {sh: kstep_time(BM, BN, BK, loop, clock_mhz, dtype=dtype, profile=p, efficiency=efficiency,
                            active_sms=min(p.sm_count, sh[1]), ctas=sh[0]) for sh in set(shapes)}
    first = steps[shapes[0]]
    if loop.persistent:
        fill = first.t_load
    else:
        fill = sum(steps[sh].t_load for sh in shapes) if loop.stages > 1 else 0.0
    # An overlapped epilogue is paid once, by the last tile; the others store under the next tile's k-steps.
    t_epi = epi * (1 if loop.epilogue_overlapped and loop.persistent else len(shapes))
    t = fill + sum(k_tiles * steps[sh].period for sh in shapes) + t_epi
    return PipelineTime(rounds=len(shapes), kstep=first, t_fill_s=fill, t_epilogue_s=t_epi, time_s=t)


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
    bound: str  # "compute" (the SMs: math, latency, barriers) or "memory" (HBM, or L2 -> SMEM)
    limiter: str = ""  # what sets the time, in words (``predict_pipelined``: the k-step's limiter or HBM)
    t_l2_s: float = 0.0  # L2 -> SMEM bytes / bandwidth, the whole product (``predict_pipelined``)
    l2_smem_bytes: float = 0.0
    pipeline: PipelineTime | None = None  # the k-step, rounds, fill and epilogues (``predict_pipelined``)
    main_loop: MainLoop | None = None

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


def predict_pipelined(M: int, N: int, K: int, *, tile: tuple[int, int, int], loop: MainLoop, dtype: str = "bf16",
                      out_dtype: str | None = None, profile: DeviceProfile = H200, clock_mhz: float | None = None,
                      efficiency: float | None = None, efficiency_source: str = "device constant mma_efficiency",
                      l2_hit: float = DEFAULT_L2_HIT, threads: int = 384, registers: int = 0,
                      smem_bytes: int = 0) -> Prediction:
    """Predicted time of a TMA + wgmma step: max(the busiest SM's pipeline time, HBM bytes / bandwidth).

    The SM side is ``pipeline_time`` (k-steps from ``kstep_time``, epilogues, waves); the HBM side is the
    same as ``predict``'s. ``t_compute_s`` reports the pure tensor-core time (FLOPs of the computed tiles
    at ``efficiency``, with wave quantization) and ``t_l2_s`` the whole product's L2 -> SMEM bytes at the
    device's bandwidth, for comparison; neither is added in. ``threads``, ``registers`` and
    ``smem_bytes`` only fill in the reported occupancy (``loop.ctas_per_sm`` is what the model uses).
    """
    BM, BN, BK = tile
    p = profile
    clock = clock_mhz or p.sm_clock_mhz
    eff = p.mma_efficiency if efficiency is None else efficiency
    peak = p.peak_flops(dtype, clock)
    occ = occupancy(threads, registers, smem_bytes, p)
    waves = wave_quantization(M, N, BM, BN, p.sm_count, max(1, loop.ctas_per_sm))
    t_compute = flops(M, N, K) / tile_quantization(M, N, BM, BN) / (peak * eff) / waves.efficiency
    traffic = tile_traffic_bytes(M, N, K, BM, BN, dtype, out_dtype)
    hbm = max(float(min_bytes(M, N, K, dtype, out_dtype)), traffic * (1.0 - l2_hit))
    t_memory = hbm / p.hbm_bytes_per_s
    l2b = l2_smem_bytes(M, N, K, BM, BN, BK, dtype, loop.cluster)
    pt = pipeline_time(M, N, K, BM, BN, BK, loop, clock, dtype=dtype, out_dtype=out_dtype, profile=p, efficiency=eff)
    t = max(pt.time_s, t_memory)
    if t_memory > pt.time_s:
        limiter, bound = "HBM bandwidth", "memory"
    else:
        limiter = pt.kstep.limiter
        bound = "memory" if limiter == "L2->SMEM bandwidth" else "compute"
    return Prediction(M=M, N=N, K=K, dtype=dtype, tile=(BM, BN, BK), clock_mhz=clock, peak_tflops=peak / 1e12,
                      efficiency=eff, efficiency_source=efficiency_source, l2_hit=l2_hit, occupancy=occ,
                      waves=waves, tile_intensity=tile_intensity(BM, BN, BK, dtype), traffic_bytes=traffic,
                      hbm_bytes=hbm, t_compute_s=t_compute, t_memory_s=t_memory, time_s=t, bound=bound,
                      limiter=limiter, t_l2_s=l2b / p.l2_smem_bytes_per_s, l2_smem_bytes=l2b, pipeline=pt,
                      main_loop=loop)


# The CUDA-core (fp32) k-tile model ------------------------------------------------------------------

@dataclass(frozen=True)
class LoopMix:
    """What one iteration of a CUDA-core main loop executes per warp (its fast path, see ``loop_mix``)."""

    instructions: int
    ffma: int
    memory: int  # LDG + LDS + STS (+ STG): instructions the LSU dispatches
    global_loads: int
    l1_wavefronts: float  # 128-byte lines the global loads touch, summed over the LDGs
    barrier: bool  # a BAR.SYNC on the path: the loop stages tiles through shared memory


def loop_fast_path(summary, loop):
    """The instructions an interior iteration of ``loop`` executes: among the paths from its header back
    to the header, those that move the most global-load + shared-store bytes (the vector fast path, all
    tiles staged), and of those the shortest (ragged-edge fallbacks are longer). The unrolled loop body
    has no inner loops, so its blocks in address order (from the header) are a topological order."""
    from . import sass

    ins = summary.instructions
    blocks, succ = sass._blocks(ins)
    body = sorted(n for n, b in enumerate(blocks) if ins[b[0]].address in loop.addresses)
    head = next(n for n in body if ins[blocks[n][0]].address == loop.start)

    def cost(n):
        b = [ins[i] for i in blocks[n]]
        moved = sum(sass._width(i.opcode) // 8 for i in b if sass.classify(i) in ("global_load", "shared_store"))
        return (-moved, len(b))

    h = body.index(head)
    best = {head: (cost(head), [head])}
    end = None
    for u in body[h:] + body[:h]:
        if u not in best:
            continue
        (cb, ci), path = best[u]
        for v in succ[u]:
            if v not in best and v not in body:
                continue
            if v == head:
                if end is None or (cb, ci) < end[0]:
                    end = ((cb, ci), path)
                continue
            if v not in body:
                continue
            c = cost(v)
            nc = (cb + c[0], ci + c[1])
            if v not in best or nc < best[v][0]:
                best[v] = (nc, path + [v])
    if end is None:
        return [ins[i] for n in body for i in blocks[n]]
    return [ins[i] for n in end[1] for i in blocks[n]]


def loop_mix(summary, lines_per_load: float = 1.0) -> LoopMix | None:
    """The mix of the main loop (the loop holding the most FFMA) on its fast path, or None without one.
    A warp's LDG touches ``lines_per_load`` 128-byte lines per 32 bits of width (coalesced: 1 per 128 B
    of the request; k01's uncoalesced A: 32)."""
    from . import sass

    loops = [lp for lp in summary.loops if lp.mix.get("ffma", 0)]
    if not loops:
        return None
    lp = max(loops, key=lambda x: (x.mix["ffma"], -x.instructions))
    path = loop_fast_path(summary, lp)
    cls = [sass.classify(i) for i in path]
    ldg = [i for i, c in zip(path, cls) if c == "global_load"]
    return LoopMix(instructions=len(path), ffma=sum(c == "ffma" for c in cls),
                   memory=sum(c in ("global_load", "global_store", "shared_load", "shared_store") for c in cls),
                   global_loads=len(ldg),
                   l1_wavefronts=sum(lines_per_load * sass._width(i.opcode) / 32 for i in ldg),
                   barrier=any(i.base == "BAR" for i in path))


@dataclass(frozen=True)
class CudaCorePeriod:
    """One main-loop iteration of ``blocks`` co-resident blocks on an SM, in seconds."""

    t_issue: float  # one block's instructions at issue_efficiency
    t_lsu: float  # one block's memory instructions at issue_efficiency
    t_l1: float  # one block's global-load lines
    t_block: float  # R: the largest of the three
    t_latency: float  # L (0 without barriers)
    period: float
    limiter: str


def cuda_core_period(mix: LoopMix, warps: int, blocks: int, clock_mhz: float, *, prefetch: bool = False,
                     profile: DeviceProfile = H200) -> CudaCorePeriod:
    """Per iteration: R = max(issue, LSU dispatch, L1 lines) of one block (see the module docstring);
    ``blocks`` blocks on the SM take max(B R, R + L) with barriers, max(B R, L) with ``prefetch`` (the
    next tile's loads are in flight during this tile's math), B R without barriers."""
    p = profile
    clk = clock_mhz * 1e6
    eta = p.issue_efficiency
    terms = {"instruction issue": warps * mix.instructions / p.sub_partitions / eta / clk,
             "LSU dispatch": warps * mix.memory / p.lsu_per_clk / eta / clk,
             "L1 wavefronts": warps * mix.l1_wavefronts / p.l1_wavefronts_per_clk / clk}
    lim = max(terms, key=terms.get)
    R = terms[lim]
    L = p.tile_latency_s if mix.barrier else 0.0
    b = max(1, blocks)
    if not mix.barrier:
        period = b * R
    elif prefetch:
        period = max(b * R, L)
        if L > b * R:
            lim = "tile latency"
    else:
        period = max(b * R, R + L)
        if R + L > b * R:
            lim = "tile latency"
    return CudaCorePeriod(t_issue=terms["instruction issue"], t_lsu=terms["LSU dispatch"],
                          t_l1=terms["L1 wavefronts"], t_block=R, t_latency=L, period=period, limiter=lim)


def predict_cuda_core(M: int, N: int, K: int, *, tile: tuple[int, int, int], threads: int, registers: int,
                      smem_bytes: int, mix: LoopMix, dtype: str = "fp32", profile: DeviceProfile = H200,
                      clock_mhz: float | None = None, l2_hit: float = DEFAULT_L2_HIT,
                      blocks_per_sm: int | None = None, prefetch: bool = False) -> Prediction:
    """Predicted time of a CUDA-core GEMM from its main loop's ``mix``: the busiest SM runs ceil(tiles /
    SMs) blocks in rounds of B (occupancy), each ceil(K / k-per-iteration) iterations at
    ``cuda_core_period`` (a last partial round at its own, lighter, period); max'ed with the HBM time of
    ``predict``. k per iteration = the loop's FFMA / (BM BN / threads). ``efficiency`` reports the SM
    time's fraction of the FFMA peak net of tile and wave quantization."""
    BM, BN, BK = tile
    p = profile
    clock = clock_mhz or p.sm_clock_mhz
    peak = p.peak_flops(dtype, clock)
    occ = occupancy(threads, registers, smem_bytes, p)
    B = blocks_per_sm if blocks_per_sm is not None else max(1, occ.blocks_per_sm)
    waves = wave_quantization(M, N, BM, BN, p.sm_count, B)
    warps = math.ceil(threads / 32)
    k_per_iter = max(1, round(mix.ffma / (BM * BN / threads)))
    iters = math.ceil(K / k_per_iter)
    per_sm = math.ceil(waves.tiles / p.sm_count)
    full, rest = divmod(per_sm, B)
    per = cuda_core_period(mix, warps, B, clock, prefetch=prefetch, profile=p)
    t_sm = iters * full * per.period
    if rest:
        t_sm += iters * cuda_core_period(mix, warps, rest, clock, prefetch=prefetch, profile=p).period
    traffic = tile_traffic_bytes(M, N, K, BM, BN, dtype)
    hbm = max(float(min_bytes(M, N, K, dtype)), traffic * (1.0 - l2_hit))
    t_memory = hbm / p.hbm_bytes_per_s
    t = max(t_sm, t_memory)
    limiter, bound = (per.limiter, "compute") if t_sm >= t_memory else ("HBM bandwidth", "memory")
    if limiter == "L1 wavefronts":
        bound = "memory"
    # efficiency: the main loop's share of the FFMA peak with B blocks an SM (a round of B blocks runs one
    # iteration each in per.period; <= 1, since that period covers their FFMAs' issue). The waves' share
    # then closes 1/efficiency x 1/tile_quantization x 1/wave efficiency x max(1, t_memory / t_compute) =
    # predicted / ideal: a last round of fewer than B blocks runs at a lone block's shorter period, so its
    # empty slots cost less than their count says (the slot count put a lone k10 block at "135%" of the
    # peak before).
    tq = tile_quantization(M, N, BM, BN)
    eff = B * 2.0 * BM * BN * k_per_iter / (per.period * peak / p.sm_count) if per.period > 0 else 0.0
    if t_sm > 0 and eff > 0:
        waves = dataclasses.replace(waves, efficiency=flops(M, N, K) / (t_sm * peak * tq * eff))
    return Prediction(M=M, N=N, K=K, dtype=dtype, tile=(BM, BN, BK), clock_mhz=clock, peak_tflops=peak / 1e12,
                      efficiency=eff,
                      efficiency_source=f"k-tile model of the main loop's SASS ({per.limiter}; "
                                        f"{mix.instructions} instructions per iteration, FFMA share {mix.ffma / mix.instructions:.0%})",
                      l2_hit=l2_hit, occupancy=occ, waves=waves, tile_intensity=tile_intensity(BM, BN, BK, dtype),
                      traffic_bytes=traffic, hbm_bytes=hbm, t_compute_s=t_sm, t_memory_s=t_memory, time_s=t,
                      bound=bound, limiter=limiter)


def ffma_issue_share(summary) -> float | None:
    """FFMA / instructions in the loop that holds the most FFMA (a ``gemmlab.sass.SassSummary``), or None
    without FFMA loops. Each SM quarter issues one warp instruction per clock and the FFMA peak needs every
    issue slot to be an FFMA, so this share bounds a CUDA-core kernel's fraction of the FFMA peak."""
    loops = [lp for lp in summary.loops if lp.mix.get("ffma", 0)]
    if not loops:
        return None
    best = max(loops, key=lambda lp: (lp.mix["ffma"], -lp.instructions))  # the tightest loop holding them
    return best.mix["ffma"] / best.instructions


def step_efficiency(spec, summary=None, profile: DeviceProfile = H200) -> tuple[float, str]:
    """The efficiency the prediction uses for a step, and where it comes from: the step's own
    ``extra["model_efficiency"]``; for CUDA-core (fp32) steps, min(default, FFMA issue share of the main
    loop); for tensor-core steps the device's ``mma_efficiency`` (the k-step model adds the rest)."""
    if "model_efficiency" in spec.extra:
        return float(spec.extra["model_efficiency"]), "stated by the step"
    if ladder_dtype(spec) == "fp32":
        share = ffma_issue_share(summary) if summary is not None else None
        if share is not None and share < DEFAULT_EFFICIENCY:
            return share, f"FFMA share of the main loop's instructions ({share:.0%})"
        return DEFAULT_EFFICIENCY, "default"
    return profile.mma_efficiency, "wgmma main loop at the recorded clock (device constant)"


def ladder_dtype(spec) -> str:
    """The element type of a registered step's ladder ("fp32" or "bf16")."""
    return spec.dtype


def main_loop(spec, cfg: dict, registers: int, smem_bytes: int, profile: DeviceProfile = H200) -> MainLoop:
    """A tensor-core step's ``MainLoop``, from the registry: stages = the ``QSIZE`` parameter (else
    ``extra["stages"](config)`` where the depth is derived, else 1), CTAs per SM = occupancy from threads,
    ptxas registers and shared memory (or ``extra["blocks_per_sm"]``), a producer warp whenever there is
    more than one warpgroup, the cluster size from the ``CLUSTER`` parameter or ``extra["cluster"]``, and
    the facts the source states but no parameter does: ``extra["persistent"]``, ``extra["wgmma_in_flight"]``,
    ``extra["epilogue_overlapped"]``."""
    threads = spec.threads(cfg)
    bps = spec.extra.get("blocks_per_sm")
    if bps is None:
        bps = max(1, occupancy(threads, registers, smem_bytes, profile).blocks_per_sm)
    stages = cfg["QSIZE"] if "QSIZE" in cfg else spec.extra.get("stages", lambda c: 1)(cfg)
    return MainLoop(stages=int(stages), ctas_per_sm=int(bps),
                    persistent=bool(spec.extra.get("persistent", False)),
                    wgmma_in_flight=int(spec.extra.get("wgmma_in_flight", 0)),
                    cluster=int(cfg.get("CLUSTER", spec.extra.get("cluster", 1))), producer_warp=threads > 128,
                    epilogue_overlapped=bool(spec.extra.get("epilogue_overlapped", False)))


def predict_step(spec, M: int, N: int, K: int, config: dict | None = None, *,
                 profile: DeviceProfile | None = None, clock_mhz: float | None = None,
                 compiled=None, summary=None) -> Prediction:
    """The prediction for a registered step: its tile, threads and shared memory from the registry, its
    registers from ptxas (compiles the step; no GPU needed). CUDA-core (fp32) steps go through
    ``predict_cuda_core`` with their main loop's ``loop_mix`` (SASS from nvdisasm; ``extra
    ["lines_per_load"]``: lines a warp's A and B loads touch, ``extra["prefetch"]``), or, when the step
    states ``extra["model_efficiency"]`` or has no FFMA loop, ``predict`` with the efficiency from
    ``step_efficiency``; the L2 hit from ``spec.extra["l2_hit"]`` (else the default); tensor-core steps through ``predict_pipelined``
    with their ``main_loop``."""
    from .sass import kernel_summary

    cfg = spec.resolve(config)
    ck = compiled or spec.compile(cfg)
    dtype = ladder_dtype(spec)
    prof = profile or device_profile()
    smem = spec.smem_bytes(cfg) + ck.resources.static_shared
    l2_hit = float(spec.extra.get("l2_hit", DEFAULT_L2_HIT))
    if dtype != "fp32":
        eff, why = step_efficiency(spec, None, prof)
        return predict_pipelined(M, N, K, tile=tuple(spec.tile(cfg)),
                                 loop=main_loop(spec, cfg, ck.resources.registers, smem, prof), dtype=dtype,
                                 profile=prof, clock_mhz=clock_mhz, efficiency=eff, efficiency_source=why,
                                 l2_hit=l2_hit, threads=spec.threads(cfg), registers=ck.resources.registers,
                                 smem_bytes=smem)
    summ = summary if summary is not None else kernel_summary(ck)
    lines = spec.extra.get("lines_per_load")
    mix = loop_mix(summ, float(sum(lines) / len(lines)) if lines else 1.0)
    if mix is not None and "model_efficiency" not in spec.extra:
        return predict_cuda_core(M, N, K, tile=tuple(spec.tile(cfg)), threads=spec.threads(cfg),
                                 registers=ck.resources.registers, smem_bytes=smem, mix=mix, dtype=dtype,
                                 profile=prof, clock_mhz=clock_mhz, l2_hit=l2_hit,
                                 blocks_per_sm=spec.extra.get("blocks_per_sm"),
                                 prefetch=bool(spec.extra.get("prefetch", False)))
    eff, why = step_efficiency(spec, summ, prof)
    return predict(M, N, K, tile=tuple(spec.tile(cfg)), threads=spec.threads(cfg), registers=ck.resources.registers,
                   smem_bytes=smem, dtype=dtype, profile=prof,
                   clock_mhz=clock_mhz, efficiency=eff, efficiency_source=why, l2_hit=l2_hit,
                   blocks_per_sm=spec.extra.get("blocks_per_sm"))
