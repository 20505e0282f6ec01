"""The plan model's clock: how long one plan of the engine kernel (``kernels/engine/gemm.cu``) takes.

Pure arithmetic on a ``DeviceProfile`` (no torch, no CUDA). The busiest SM's time is

    launch_s + (tiles it runs) x (k-steps x kstep + per-tile epilogue) + fix-ups,

floored by the HBM time of the operands. One 64-deep k-step of a BM x BN tile costs the largest of

  * the MMAs: 2 BM BN 64 FLOP at ``flop_per_clk_sm`` x clock x ``mma_efficiency`` (one consumer
    warpgroup, BM = 64, keeps ``ONE_CONSUMER_EFFICIENCY`` of that: nothing covers its k-step turnaround
    and its epilogue),
  * the TMA bytes (the A rows a tile really loads + BN rows of B, 64 deep) at the SM's share of the L2:
    min(``sm_l2_bytes_per_s``, ``l2_smem_bytes_per_s`` / active SMs),
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
Fitted with benchmarks/fit_plan_model.py to the h11 records (BM = 128 tiles of BN 64..256, data-parallel
and cluster split-K) in benchmarks/results/engine_policies.jsonl (shas 227f35c .. 090adea, 18 + 16
shapes x plans, each timed against torch.mm at its recorded clock) and the llm / square suites of
matmul.jsonl (sha 090adea / 0f8f206, the engine's own h11 plans, M = 1 .. 16384):
  launch_s 2.0 us, tile_fixed_s 1.5 us, store_bytes_per_s 22 GB/s (128 x 256 bf16 tile: 4.5 us, the
  h10 sweep's epilogue E), sm_l2_bytes_per_s 100 GB/s and the latencies 1.0 / 2.4 us (engine.py's
  split-K fit), l2_smem_bytes_per_s 10 TB/s and mma_efficiency 0.94 (gemmlab.model's pipeline fit),
  dsmem_bytes_per_s 26 GB/s (h11 timeline), cluster_sync_s 1.5 us (split launches' reduce minus bytes).
partial_bytes_per_s (stream-K) is not fitted: no stream-K record exists; 100 GB/s = the SM's L2 rate.
"""


def in_bytes(dtype: str) -> int:
    return 4 if dtype == "fp32" else 2


def kstep_s(bm: int, bn: int, rows: float, stages: int, active_sms: int, hbm_share: float, prof: DeviceProfile,
            clock_mhz: float, dtype: str = "bf16") -> float:
    """One 64-deep k-step of a bm x bn tile loading ``rows`` rows of A, on one of ``active_sms`` SMs."""
    clock = clock_mhz * 1e6
    eff = prof.mma_efficiency * (ONE_CONSUMER_EFFICIENCY if bm == 64 else 1.0)
    t_mma = 2.0 * bm * bn * BK / (prof.flop_per_clk_sm[dtype] * clock * eff)
    bw = min(prof.sm_l2_bytes_per_s, prof.l2_smem_bytes_per_s / max(1, active_sms))
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
