"""The plan model's clock: how long one plan of the engine kernel (``kernels/engine/gemm.cu``) takes.

Pure arithmetic on a ``DeviceProfile`` (no torch, no CUDA). The busiest SM's time is

    launch_s + (tiles it runs) x (k-steps x kstep + per-tile epilogue) + fix-ups,

floored by the HBM time of the operands. One 64-deep k-step of a BM x BN tile costs the largest of

  * the MMAs: 2 BM BN 64 FLOP at ``flop_per_clk_sm`` x clock x ``mma_efficiency`` (one consumer
    warpgroup, BM = 64, keeps ``ONE_CONSUMER_EFFICIENCY`` of that: nothing covers its k-step turnaround
    and its epilogue),
  * the TMA bytes (the A rows a tile really loads + BN rows of B, 64 deep) at the SM's share of the L2:
    min(``sm_l2_bytes_per_s``, ``engine_l2_bytes_per_s`` / active SMs),
  * the shared-memory traffic (each m64 wgmma reads its A block and all of B; the TMA writes the
    stage) at ``smem_bytes_per_clk``,
  * a load's round trip over the stages in flight: ``l2_latency_s`` when the loads hit L2 ..
    ``hbm_latency_s`` when they stream from HBM (by the share of loaded bytes HBM must supply), plus the
    transfer; a slot is refilled only after the k-step reading it finished.

Per tile the consumers then drain their last wgmma group, run the epilogue and store:
``tile_fixed_s`` + the tile's output bytes at ``store_bytes_per_s``. The schedules differ in what
the busiest SM runs:

  * data-parallel: ceil(tiles / SMs) tiles, the last (partial) wave with its own k-step (fewer SMs
    share the L2);
  * split-K (clusters of ``splits`` CTAs): waves of clusters (``cluster_capacity``), each CTA
    ceil(k / splits) k-steps, then the DSMEM reduction: ``cluster_sync_s`` + its share of the other
    ranks' fp32 partials at ``dsmem_bytes_per_s`` + its rows' stores;
  * stream-K (hybrid): the data-parallel waves, then ceil(streamed k-steps / CTAs) k-steps, the owned
    tiles' epilogues, one fp32 partial written and the contributors' partials read at
    ``partial_bytes_per_s``, and a pipeline restart per extra unit.

What each constant was fitted to is stated in ``DEVICE_CONSTANTS_FIT`` below (the H200 records of h11,
whose k-loop and epilogue the engine kernel keeps).
"""

from __future__ import annotations

import math

from .devices import DeviceProfile

BK = 64
# One consumer warpgroup (64-row tiles) has no second warpgroup to issue MMAs while it stores or waits
# for its k-step's group; not fitted (no record has such a tile yet): h03 (one consumer) against h04.
ONE_CONSUMER_EFFICIENCY = 0.85

DEVICE_CONSTANTS_FIT = """
Fitted with benchmarks/fit_plan_model.py (a grid search over the constants below, loss = mean |log
measured / predicted| + 2 x mean log(picked plan / best measured plan)) to the h11 records: every
(BN, splits) plan of the few-tile shapes in benchmarks/results/engine_policies.jsonl from the runs with
cluster split-K (shas 4fc772e, 227f35c, 0f8f206, 6ea410a, 090adea; 34 shape runs) and the engine's own
plans of the llm (090adea) and square (0f8f206) suites of matmul.jsonl, each at its recorded clock:
  launch_s 2.0 us and tile_fixed_s 0.5 us (flat: 1.5-3 us and 0.25-1 us fit within 1%),
  engine_l2_bytes_per_s 14 TB/s and sm_l2_bytes_per_s 150 GB/s (the unsplit few-tile launches run
  their k-steps at ~100-120 GB/s per SM with 128 SMs busy; gemmlab.model's 10 TB/s is the ladder's fit
  of the same ceiling), l2_latency_s 1.0 us, cluster_sync_s 3.0 us (1.5-4 us: the split reductions),
  store_bytes_per_s 22 GB/s (15-30 fit alike; 128 x 256 bf16: 3 us, the h10 sweep's epilogue E
  less the drain), hbm_latency_s 2.4 us and dsmem_bytes_per_s 26 GB/s (engine.py's fit and the h11
  timeline, kept), mma_efficiency 0.94 (gemmlab.model's pipeline fit, kept).
  Result: measured / predicted 0.55-1.5 per record (mean |log| 0.18); among the measured plans of
  each shape the model's pick runs 3.8% (geomean) behind the best, 49% at worst (1x4096x4096, where
  h11's 128-row tile is the wrong tool and the new kernel has 64-row tiles).
partial_bytes_per_s (stream-K) and smem_bytes_per_clk (144 B/clk: h10 at BN = 128 ran 2-5% slower
than at 256, the worklog) are not fitted to a sweep: no stream-K or 64- / 256-row record exists yet.
"""


def in_bytes(dtype: str) -> int:
    return 4 if dtype == "fp32" else 2


def kstep_s(bm: int, bn: int, rows: float, stages: int, active_sms: int, hbm_share: float, prof: DeviceProfile,
            clock_mhz: float, dtype: str = "bf16") -> float:
    """One 64-deep k-step of a bm x bn tile loading ``rows`` rows of A, on one of ``active_sms`` SMs."""
    clock = clock_mhz * 1e6
    eff = prof.mma_efficiency * (ONE_CONSUMER_EFFICIENCY if bm == 64 else 1.0)
    t_mma = 2.0 * bm * bn * BK / (prof.flop_per_clk_sm[dtype] * clock * eff)
    bw = min(prof.sm_l2_bytes_per_s, prof.engine_l2_bytes_per_s / max(1, active_sms))
    stage = (rows + bn) * BK * in_bytes(dtype)
    t_bytes = stage / bw
    # Shared memory: every m64 wgmma reads its A block and all of B (16 deep per k16), and the TMA
    # writes the stage: 128 x 256 reads 80 KB + writes 48 KB per k-step, 256 x 128 96 KB + 48 KB.
    smem = 4 * (bm // 64) * (64 + bn) * 16 * in_bytes(dtype) + stage
    t_smem = smem / (prof.smem_bytes_per_clk * clock)
    # A slot is refilled only after the k-step that read it finished (one wgmma group in flight): with
    # a round trip R (latency + transfer), S stages sustain max(R / (S - 1), (R + t) / S) per k-step
    # (gemmlab.model.kstep_time's form).
    R = prof.l2_latency_s + hbm_share * (prof.hbm_latency_s - prof.l2_latency_s) + t_bytes
    S = max(2, stages)
    t_lat = max(R / (S - 1), (R + t_mma) / S)
    return max(t_mma, t_bytes, t_smem, t_lat)


def tile_epilogue_s(bm: int, bn: int, out_bytes: int, prof: DeviceProfile) -> float:
    """Drain, epilogue and stores of one tile (the SM issues no MMA meanwhile)."""
    return prof.tile_fixed_s + bm * bn * out_bytes / prof.store_bytes_per_s


def _rows_loaded(M: int, bm: int) -> float:
    """Rows of A a tile loads, averaged over the rows of tiles (the last loads what it has, to 8)."""
    tm = math.ceil(M / bm)
    last = M - (tm - 1) * bm
    return ((tm - 1) * bm + min(bm, math.ceil(last / 8) * 8)) / tm


def _traffic(M: int, N: int, K: int, bm: int, bn: int, dtype: str, out_bytes: int) -> tuple[float, float, float]:
    """(bytes every tile loads from L2 in all, HBM-unique bytes, share of the loads HBM supplies)."""
    es = in_bytes(dtype)
    k_iters = math.ceil(K / BK)
    tiles = math.ceil(M / bm) * math.ceil(N / bn)
    loaded = tiles * k_iters * (_rows_loaded(M, bm) + bn) * BK * es
    unique = es * (M * K + N * K) + out_bytes * M * N
    return loaded, unique, min(1.0, unique / max(1.0, loaded))


def predict_s(M: int, N: int, K: int, *, bm: int, bn: int, schedule: str, stages: int, splits: int = 1,
              sk_tiles: int = 0, sk_ctas: int = 0, prof: DeviceProfile, clock_mhz: float | None = None,
              dtype: str = "bf16", out_bytes: int = 2) -> float:
    """Modelled seconds of one plan (see the module docstring)."""
    clock = clock_mhz or prof.plan_clock_mhz
    G = prof.sm_count
    k = math.ceil(K / BK)
    tiles = math.ceil(M / bm) * math.ceil(N / bn)
    rows = _rows_loaded(M, bm)
    loaded, unique, hbm_share = _traffic(M, N, K, bm, bn, dtype, out_bytes)
    epi = tile_epilogue_s(bm, bn, out_bytes, prof)

    def ks(active: int) -> float:
        return kstep_s(bm, bn, rows, stages, active, hbm_share, prof, clock, dtype)

    if schedule == "data_parallel":
        full, rem = divmod(tiles, G)
        t = full * (k * ks(G) + epi) + (k * ks(rem) + epi if rem else 0.0)
    elif schedule == "split_k":
        slots = max(1, prof.clusters(splits))
        waves = math.ceil(tiles / slots)
        active = min(tiles, slots) * splits
        k_per = math.ceil(k / splits)
        reduce = (prof.cluster_sync_s + (splits - 1) / splits * min(bm, M) * bn * 4 / prof.dsmem_bytes_per_s
                  + min(bm, M) * bn * out_bytes / splits / prof.store_bytes_per_s)
        t = waves * (k_per * ks(active) + reduce)
    elif schedule == "stream_k":
        dp_waves = (tiles - sk_tiles) // G
        per = math.ceil(sk_tiles * k / sk_ctas)
        partial = min(bm, math.ceil(M / 64) * 64) * bn * 4 / prof.partial_bytes_per_s
        reads = math.ceil(k / per) if per < k else 1  # partials the busiest owner adds
        owned = math.ceil(sk_tiles / sk_ctas)
        units = math.ceil(per / k) + 1  # a range cuts at most two tiles
        t = (dp_waves * (k * ks(G) + epi) + per * ks(max(sk_ctas, 1)) + owned * epi
             + partial * (1 + reads) + (units - 1) * prof.tile_fixed_s)
    else:
        raise ValueError(f"unknown schedule {schedule!r}")
    hbm = unique / prof.hbm_read_bytes_per_s
    return prof.launch_s + max(t, hbm)
