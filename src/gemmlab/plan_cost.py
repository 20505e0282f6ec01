"""The plan model's clock: how long one plan of the engine kernel (``kernels/engine/gemm.cu``) takes.

Pure arithmetic on a ``DeviceProfile`` (no torch, no CUDA). The busiest SM's time is

    launch_s + (tiles it runs) x (k-steps x kstep + per-tile epilogue) + fix-ups,

floored by the HBM time of the operands. One 64-deep k-step of a BM x BN tile costs the largest of

  * the MMAs: 2 BM BN 64 FLOP at ``flop_per_clk_sm`` x clock x ``mma_efficiency`` (one consumer
    warpgroup, BM = 64, keeps ``one_consumer_efficiency`` of that: nothing covers its k-step turnaround
    and its epilogue),
  * the TMA bytes (the A rows a tile really loads + BN rows of B, 64 deep) at the SM's share of the L2:
    min(``sm_l2_bytes_per_s``, ``engine_l2_bytes_per_s`` / active SMs), ``tile64_l2_factor`` times that
    for 64-row data-parallel and ping-pong tiles,
  * the shared-memory traffic (each m64 wgmma reads its A block and all of B; the TMA writes the
    stage) at ``smem_bytes_per_clk``,
  * a load's round trip over the stages in flight: ``l2_latency_s`` when the loads hit L2 ..
    ``hbm_latency_s`` when they stream from HBM (by the share of loaded bytes HBM must supply), plus the
    transfer; a slot is refilled only after the k-step reading it finished.
  * the k-step's share of an HBM stream (``stream_s``): the active SMs' stages in flight against a round
    trip of ``hbm_stream_latency_s`` plus the transfer at ``hbm_stream_bytes_per_s`` (Little's law), by
    the share of loaded bytes HBM supplies: a partial wave (fewer SMs, fewer bytes in flight) streams
    slower, and a deeper ring faster.

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
  * global split-K (stream-K's hybrid with tile-aligned ranges, s CTAs per streamed tile): the
    data-parallel waves, then ceil(k / s) k-steps, and the tile's reduction shared by its s CTAs.

Split-K and streamed k-steps carry fitted factors (``split_k_kstep_factor``, ``stream_k_kstep_factor``);
a DIRECT output (rows not 16-byte aligned) is stored at ``direct_store_bytes_per_s``. What each constant
was fitted to is stated in ``DEVICE_CONSTANTS_FIT`` below (the engine kernel's own broad-set records).
"""

from __future__ import annotations

import math

from .devices import DeviceProfile

BK = 64

DEVICE_CONSTANTS_FIT = """
Fitted with ``benchmarks/fit_plan_model.py --broad --fit`` to the engine kernel's own H200 records: the
broad set (benchmarks/results/engine_broad.jsonl, sha ac16df0070a2; 297 shapes, 1186 timed plans of the
new kernel, ~4 per shape: the model's pick then, the best of each other schedule and tile height), each
at its kernel's recorded SM clock (1980 MHz). Only the even positions of the sorted distinct shapes were
fitted (149 shapes, 596 records); the odd half (148 shapes, 590 records) is held out. Coordinate descent
over the constants below, loss = mean |log measured / predicted| + 2 log(geomean of picked / best
measured) + 0.5 log(worst of it). Result (fit half / held-out half): mean |log| 0.103 / 0.103; the
model's pick among a shape's measured plans runs 0.6% / 0.7% (geomean) and 12.0% / 12.1% (worst) behind
the best measured (before: 9.4% / 7.8%, worst 2.42x / 2.39x).
  launch_s 1.0 us, tile_fixed_s 0.96 us, store_bytes_per_s 39.5 GB/s (TMA-stored tile), direct_store_
  bytes_per_s 7.9 GB/s (rows stored by threads: the unaligned class ran 1.7x its prediction before),
  engine_l2_bytes_per_s 11.6 TB/s, sm_l2_bytes_per_s 112 GB/s, l2_latency_s 1.22 us, hbm_latency_s
  1.72 us (constrained >= the L2's), smem_bytes_per_clk 201, engine_mma_efficiency 0.94 (a separate
  field from gemmlab.model's mma_efficiency; it did not move), one_consumer_efficiency 0.68 (64-row
  tiles; 0.85 since session 26, below), hbm_read_bytes_per_s 3.64 TB/s; split-K: cluster_sync_s 3.2 us,
  dsmem_bytes_per_s 8.7 GB/s,
  split_k_kstep_factor 1.225 (a split's k-step costs that much more than a data-parallel one's);
  stream-K: partial_bytes_per_s 24.4 GB/s, stream_k_fixed_s 1.04 us per launch, stream_k_kstep_factor
  1.35 (the best stream-K plan beat the best data-parallel one on 21 of 296 shapes). The two factors
  are fitted, not derived: what in the kernel makes those k-steps slower is not decomposed yet.
Refit (this text's last paragraph; ``benchmarks/fit_plan_model.py --broad --fit --only hbm_read_bytes_per_s
hbm_stream_bytes_per_s hbm_stream_latency_s``, ``benchmarks/pick_vs_oracle.py``) on the two newest broad
runs, which time all 297 shapes with the same code (240cc1560ab0: 180 shapes, 6417c0cb0f7a: 117; 1186
engine-kernel records), same split (fit: 149 shapes / 596 records, held out: 148 / 590). The term
``stream_s`` is new; only the HBM constants were refitted (a fit of every constant moved 12 of them and
made the held-out worst pick 1.24x from 1.11x: not kept): hbm_read_bytes_per_s 3.64 -> 3.895 TB/s (the
floor), hbm_stream_bytes_per_s 7.0 TB/s, hbm_stream_latency_s 0.744 us. With these the stream term binds
in partial waves of weight streams (32x43008x5376's 128x256 plan, 1.27 waves, is priced above its
64x256 one, 7% (measured: 19%)); in full waves both stay at the floor and ``planner.rank_key``'s
tie-break (more bytes in flight first) picks 64 x 256 / 5 stages over 128 x 256 / 4, 3-7% faster on
every such shape. The pick's loss among measured plans is now scored with the planner's tie-break at the planning clock (before, ties
went to the faster measured record): fit half mean |log| 0.101 -> 0.095, pick behind best 1.014 -> 1.011
(worst 1.216 both); held out 0.100 -> 0.091, 1.006 -> 1.007 (worst 1.105 both). The router on the same
records (the engine kernel limited to its measured plans; its measured ratio to torch.mm): fit half
1.071 -> 1.082 (oracle 1.100), held out 1.039 -> 1.046 (oracle 1.059); decode class 1.029 -> 1.062
(oracle 1.072). ``h11_factor`` refitted to 1.073 (fit half's h11 records, now 145 of them; held out
1.084).
Since session 22 (not a fit): split-K plans whose partial and receive slots fit their stages push their
slices to the other ranks by bulk copies (``Plan.split_push``), 1.0% faster over the broad set's 34 split-K
routes than the pulled form these constants were fitted to (``splitk_push.jsonl``). Refitted on the
broad run that times the pushed form (017f6fcd4095, all 297 shapes; ``--only cluster_sync_s
dsmem_bytes_per_s split_k_kstep_factor``): the descent leaves all three where they are (held-out pick
1.0135, worst 1.187 either way).
Since session 24 (not a fit): a split-K partial smaller than ``cluster_sync_area`` (8192 = 64 x 128) pays
``split_sync_s``: from ``cluster_sync_small_s`` (2.0 us) up to ``cluster_sync_s`` in proportion to its area.
Chosen on the two newest broad runs' records (fit / held-out mean |log| 0.128 / 0.124 -> 0.123 / 0.121, pick
1.013 / 1.011 -> 1.012 / 1.011, the three picks it moves the measured best); the 45 picks it changes on the
broad set and 300 random small shapes timed against the old ones (``split_sync_probe.jsonl``): where the
router runs the engine kernel (23) x1.089 geomean, 8 faster by more than 2%, 4 slower by 2-4%. The router
weighs the engine kernel against the decode kernel and h11 without the discount (``engine._weighing_profile``).
Since session 25 (not a fit): a 64-row data-parallel or ping-pong tile draws L2 at ``tile64_l2_factor`` (1.2) x
that rate. On five broad runs such plans ran at a median 0.85-0.89 of their price (64 x 128..208 tiles drew
105-140 GB/s an SM), taller tiles at 1.03-1.06; split-K and stream-K plans of 64 rows showed no such bias and
keep the rate. Fit / held-out mean |log| 0.121 -> 0.118 on be963b8 + 4b5933e (flat from 1.2 to 1.5; 1.2
keeps the fewest changed picks). The 46 picks it changes (10 of the broad set, 36 of random shapes M 65-3000)
timed against the old ones (``tile64_l2_probe.jsonl``): x1.060 geomean, 27 faster by more than 2%, 8 slower
(the random 36: x1.074, 17 -> 26 at or above torch.mm); at M 1-64 (36 random changed picks)
x0.999. Scaling it down with the share of loads HBM
supplies scored no better on those records (x1.053-1.057).
Since session 26 (not a fit): ``one_consumer_efficiency`` 0.68 -> 0.85. Once the 64-row tiles' L2 rate was
raised (above), their MMA term bound the wide ones (64 x 144..256), and those ran 5-20% faster than priced
(300x5120x27648 64 x 208 1.07x torch.mm, priced behind the swapped 128 x 112 at 1.00x). Fit / held-out mean
|log| 0.120 / 0.119 -> 0.118 / 0.117, pick 1.010 / 1.010 -> 1.007 / 1.009 (fit worst 1.215 -> 1.143) on
5ef0de8 + ba041bc; 0.8-0.9 pick alike. It moves 6 broad-set picks and ~3.5% of random shapes at M 65-3000
(none at M <= 64, no grouped or FP8 pick of their suites); the 36 changed picks timed against the old ones
(``one_consumer_probe.jsonl``): x1.028 geomean, 13 faster by more than 2%, 4 slower (1132x1408x14336 0.91x),
at or above torch.mm 20 -> 27 (318x6144x12288 0.77 -> 0.99x, 2074x1024x9216 0.83 -> 1.01x).
Since (session 9, not a fit): ``sm_l2_bytes_per_s`` 112 -> 88 GB/s (the all-SM rate over 132 SMs: partial
grids of larger tiles ran as slow as their area says; the broad set's 30 changed picks ran 1.045x their
earlier ratio) and ``misaligned_l2_factor`` 1.75 (the TMA's L2 rate at K-major rows 16- but not 32-byte
aligned, measured by ``benchmarks/probes/probe_tma_pitch.py``), with B multicast priced as half of B's bytes.
h11 is priced as the engine kernel's 128-row plan with h11's ring depth and its overlapped epilogue
(``engine.h11_cost``), times ``h11_factor`` = 1.085 (the geomean of measured / priced over the fit half's
128 h11 records; held-out half: 1.103, mean |log| 0.109 / 0.119). The older h11 records this model was
first fitted to (engine_policies.jsonl, matmul.jsonl) now come out at measured / priced 0.65-1.35 with
that factor (tests/test_plan.py).
"""


def in_bytes(dtype: str) -> int:
    return 4 if dtype == "fp32" else 2


def kstep_s(bm: int, bn: int, rows: float, stages: int, active_sms: int, hbm_share: float, prof: DeviceProfile,
            clock_mhz: float, dtype: str = "bf16", one_consumer: bool | None = None, mcast: int = 1,
            misaligned: bool | tuple[bool, bool] = False, ring_latency: bool = True, l2_factor: float = 1.0) -> float:
    """One 64-deep k-step of a bm x bn tile loading ``rows`` rows of A, on one of ``active_sms`` SMs.
    ``ring_latency=False``: without the ring's round-trip term (a slot refilled only after its k-step; see
    below), for kernels measured to run at their byte rate with a shallow ring (the grouped ping-pong).
    ``one_consumer``: one consumer warpgroup runs the SM's wgmmas alone (default: 64-row tiles).
    ``l2_factor``: the tile's loads draw from L2 this many times the SM's rate (``tile64_l2_factor``).
    ``mcast``: CTAs sharing B's tile by multicast (each loads bn / mcast of its rows from the L2).
    ``misaligned``: (A, B) or both: the operand's rows are 16- but not 32-byte aligned
    (``misaligned_operands``): the TMA draws its bytes from the L2 ``misaligned_l2_factor`` times slower."""
    clock = clock_mhz * 1e6
    alone = bm == 64 if one_consumer is None else one_consumer
    eff = prof.engine_mma_efficiency * (prof.one_consumer_efficiency if alone else 1.0)
    t_mma = 2.0 * bm * bn * BK / (prof.flop_per_clk_sm[dtype] * clock * eff)
    bw = min(prof.sm_l2_bytes_per_s, prof.engine_l2_bytes_per_s / max(1, active_sms)) * l2_factor
    mis_a, mis_b = misaligned if isinstance(misaligned, tuple) else (misaligned, misaligned)
    fa, fb = (prof.misaligned_l2_factor if m else 1.0 for m in (mis_a, mis_b))
    stage = (rows + bn) * BK * in_bytes(dtype)
    t_bytes = (rows * fa + bn / mcast * fb) * BK * in_bytes(dtype) / bw
    # Shared memory: every m64 wgmma reads its A block and all of B (16 deep per k16), and the TMA
    # writes the stage: 128 x 256 reads 80 KB + writes 48 KB per k-step, 256 x 128 96 KB + 48 KB.
    smem = 4 * (bm // 64) * (64 + bn) * 16 * in_bytes(dtype) + stage
    t_smem = smem / (prof.smem_bytes_per_clk * clock)
    # A slot is refilled only after the k-step that read it finished (one wgmma group in flight): with
    # a round trip R (latency + transfer), S stages sustain max(R / (S - 1), (R + t) / S) per k-step
    # (gemmlab.model.kstep_time's form).
    R = prof.l2_latency_s + hbm_share * (prof.hbm_latency_s - prof.l2_latency_s) + t_bytes
    S = max(2, min(stages, prof.ring_credit_stages))  # deeper rings measured no faster
    t_lat = max(R / (S - 1), (R + t_mma) / S) if ring_latency else 0.0
    return max(t_mma, t_bytes, t_smem, t_lat, stream_s(rows, bn / mcast, stages, active_sms, hbm_share, prof, dtype))


def stream_s(rows: float, bn: int, stages: int, active_sms: int, hbm_share: float, prof: DeviceProfile,
             dtype: str = "bf16") -> float:
    """One k-step's share of an HBM stream: the ``active_sms`` SMs each keep ``stages`` stages of (rows +
    bn) x 64 bytes in flight, and a round of them takes ``hbm_stream_latency_s`` plus its transfer at
    ``hbm_stream_bytes_per_s`` (Little's law): 1 / rate = 1 / peak + latency / bytes in flight. Only the
    share of the loads HBM supplies counts. Where a weight streams once (M <= ~128, wide N) this binds, and a
    deeper ring (more bytes in flight) or more active SMs stream faster."""
    stage = (rows + bn) * BK * in_bytes(dtype)
    return hbm_share * (stage * max(1, active_sms) / prof.hbm_stream_bytes_per_s
                        + prof.hbm_stream_latency_s / max(1, min(stages, prof.ring_credit_stages)))


def misaligned_pitch(pitch: int, dtype: str = "bf16") -> bool:
    """Whether rows ``pitch`` elements apart are 16- but not 32-byte aligned: each 128-byte box row then
    spans five L2 sectors every other row, and the TMA's L2 rate drops (``misaligned_l2_factor``; measured
    on K-major rows, ``probe_tma_pitch.py``; an MN-major box row is 128 bytes of a row as well)."""
    return (pitch * in_bytes(dtype)) % 32 == 16


def misaligned_operands(M: int, N: int, K: int, a_mn: bool, b_mn: bool, dtype: str = "bf16",
                        a_pitch: int | None = None, b_pitch: int | None = None) -> tuple[bool, bool]:
    """(A, B): whether the rows the TMA reads of each operand are 16- but not 32-byte aligned
    (``misaligned_pitch``). a_pitch / b_pitch: elements between those rows (A's: K-major rows of K, or
    MN-major ones of M; B's of K or N); None: contiguous (K, or M / N when MN-major). Rows not 16-byte
    aligned are copied into 32-byte aligned ones (``engine._aligned_empty``): pass None for them."""
    ap = a_pitch if a_pitch is not None else (M if a_mn else K)
    bp = b_pitch if b_pitch is not None else (N if b_mn else K)
    return misaligned_pitch(ap, dtype), misaligned_pitch(bp, dtype)


def tile_epilogue_s(bm: int, bn: int, out_bytes: int, prof: DeviceProfile, direct: bool = False) -> float:
    """Drain, epilogue and stores of one tile (the SM issues no MMA meanwhile); ``direct``: the threads
    store the rows themselves (no TMA store: the output's rows are not 16-byte aligned)."""
    rate = prof.direct_store_bytes_per_s if direct else prof.store_bytes_per_s
    return prof.tile_fixed_s + bm * bn * out_bytes / rate


def split_sync_s(area: int, prof: DeviceProfile) -> float:
    """A cluster split-K launch's fixed cost after its k-loop for a partial of ``area`` rows x columns:
    ``cluster_sync_s`` (fitted on the broad set, where split-K tiles are mostly 64-128 x 64-256) from
    ``cluster_sync_area`` up, and less for smaller partials, from ``cluster_sync_small_s`` in proportion
    (the pushed reduction's copies, sums and stores scale with the partial; session 22's timeline: the
    barriers alone 0.16-0.24 us). Priced at 3.2 us, the swapped 64 x 16 split-K plans of 16x1152x1024 and
    32x1024x1024 and the 64 x 64 one of 256x512x2048 lost to data-parallel plans they beat by 4-15%."""
    small = prof.cluster_sync_small_s
    return small + (prof.cluster_sync_s - small) * min(1.0, area / prof.cluster_sync_area)


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
              dtype: str = "bf16", out_bytes: int = 2, direct: bool = False, overlap: bool = False,
              mcast: int = 1, misaligned: bool | tuple[bool, bool] = False, floor: bool = True,
              col_split: bool = False) -> float:
    """Modelled seconds of one plan (see the module docstring). ``overlap``: the epilogue's stores run
    under the next tile's k-steps (h11's overlapped epilogue, data-parallel only): a tile then costs its
    SM only ``tile_fixed_s`` past its k-steps, except the SM's last. ``mcast`` (data-parallel): clusters
    of that many CTAs share B's tile by multicast; the rows of tiles are padded to whole clusters.
    ``misaligned``: (A, B) or both: the operand's rows 16- but not 32-byte aligned (``misaligned_operands``;
    A and B as the kernel sees them: a swapped plan's A is the weight). ``floor=False``: without the HBM
    floor, i.e. the SMs' own time (waves, tiles, k-steps), which ranks the swapped plans the floor ties
    (``planner.rank_key``). ``col_split``: a 64-row tile's two consumers take half its columns each, so its
    k-steps do not pay the lone consumer's penalty."""
    clock = clock_mhz or prof.plan_clock_mhz
    G = prof.sm_count
    k = math.ceil(K / BK)
    tiles = math.ceil(math.ceil(M / bm) / mcast) * mcast * math.ceil(N / bn)
    if mcast > 1:
        G = min(G, mcast * prof.clusters(mcast))
    rows = _rows_loaded(M, bm)
    loaded, unique, hbm_share = _traffic(M, N, K, bm, bn, dtype, out_bytes)
    epi = tile_epilogue_s(bm, bn, out_bytes, prof, direct)
    l2_factor = prof.tile64_l2_factor if bm == 64 and schedule in ("data_parallel", "pingpong") else 1.0

    def ks(active: int) -> float:
        # Ping-pong: two consumers alternate, so a 64-row tile's k-steps do not pay the one-consumer
        # penalty (64-row ping-pong ran at 0.80x its price with it; 128-row 1.05x, data-parallel 1.04x).
        return kstep_s(bm, bn, rows, stages, active, hbm_share, prof, clock, dtype,
                       one_consumer=False if schedule == "pingpong" or col_split else None, mcast=mcast,
                       misaligned=misaligned, l2_factor=l2_factor)

    if schedule == "data_parallel":
        full, rem = divmod(tiles, G)
        t = full * (k * ks(G) + epi) + (k * ks(rem) + epi if rem else 0.0)
        if overlap:
            waves = full + (1 if rem else 0)
            t -= (waves - 1) * (epi - prof.tile_fixed_s)
    elif schedule == "pingpong":
        # Two consumers take the CTA's tiles in turn: one's epilogue (its fixed cost included) runs under
        # the other's k-loop, so past the first tile each costs its k-steps, or half of k-loop + epilogue
        # where the epilogue is the longer (the two consumers' tiles then alternate at that pace); the
        # SM's last epilogue shows. The consumers' k-steps are priced as the cooperative tile's. A turn's
        # fixed cost on top of each tile (before session 20) had ping-pong measure 0.85x its price on
        # short-K shapes (broad-set records of 3f0f16e and d6515d0; docs/worklog.md).
        full, rem = divmod(tiles, G)
        kl = k * ks(G)
        t = full * max(kl, (kl + epi) / 2) + (k * ks(rem) if rem else 0.0) + epi
    elif schedule == "split_k":
        slots = max(1, prof.clusters(splits))
        waves = math.ceil(tiles / slots)
        active = min(tiles, slots) * splits
        k_per = math.ceil(k / splits)
        area = min(bm, M) * bn
        reduce = (split_sync_s(area, prof) + (splits - 1) / splits * area * 4 / prof.dsmem_bytes_per_s
                  + min(bm, M) * bn * out_bytes / splits / prof.store_bytes_per_s)
        t = waves * (k_per * ks(active) * prof.split_k_kstep_factor + reduce)
    elif schedule == "stream_k":
        dp_waves = (tiles - sk_tiles) // G
        per = math.ceil(sk_tiles * k / sk_ctas)
        partial = min(bm, math.ceil(M / 64) * 64) * bn * 4 / prof.partial_bytes_per_s
        reads = math.ceil(k / per) if per < k else 1  # partials the busiest owner adds
        owned = math.ceil(sk_tiles / sk_ctas)
        units = math.ceil(per / k) + 1  # a range cuts at most two tiles
        t = (dp_waves * (k * ks(G) + epi) + per * ks(max(sk_ctas, 1)) * prof.stream_k_kstep_factor + owned * epi
             + partial * (1 + reads) + (units - 1) * prof.tile_fixed_s + prof.stream_k_fixed_s)
    elif schedule == "split_k_global":
        # The data-parallel waves, then one aligned k-range of ceil(k / s) k-steps on each of the sk_ctas
        # CTAs, the drain, the exchange ((s - 1) / s of the tile's fp32 partial written and as much read,
        # at ``gsk_partial_bytes_per_s``), the flag round trip and 1 / s of the tile stored.
        s = max(1, splits)
        dp_waves = (tiles - sk_tiles) // G
        tile_bytes = min(bm, math.ceil(M / 64) * 64) * bn
        exchange = 2 * (s - 1) / s * tile_bytes * 4 / prof.gsk_partial_bytes_per_s
        t = (dp_waves * (k * ks(G) + epi) + math.ceil(k / s) * ks(max(sk_ctas, 1)) * prof.gsk_kstep_factor
             + prof.tile_fixed_s + exchange + tile_bytes * out_bytes / s / prof.store_bytes_per_s + prof.gsk_fixed_s)
    else:
        raise ValueError(f"unknown schedule {schedule!r}")
    hbm = unique / prof.hbm_read_bytes_per_s if floor else 0.0
    return prof.launch_s + max(t, hbm)
