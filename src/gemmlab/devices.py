"""Device profiles: every device constant gemmlab's models use, in one dataclass per GPU.

``DeviceProfile`` holds the SM count, clocks, tensor and CUDA-core rates, memory bandwidths and latencies,
shared-memory and register limits, the cluster capacity table, and the constants the models fitted to
the committed H200 records (each with what it was fitted to). ``H200`` plans without a GPU;
``device_profile()`` reads the visible GPU's SM count, L2 and name and keeps the rest from the H200's.
Pure Python: no torch or CUDA import at module import.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass(frozen=True)
class DeviceProfile:
    """The figures of one GPU the models need. Per-SM limits are those of compute capability 9.0.

    The pipeline constants (``l2_smem_bytes_per_s`` .. ``epilogue_bytes_per_s``) are the H200's, read off
    the committed records (``benchmarks/results/*.jsonl``): each from the records of the step whose time
    it dominates, with the other terms subtracted, then used unchanged for every step and shape. A
    "k-step" is one BK = 64 slab; t, x, g, E as in ``kstep_time`` and ``pipeline_time``.

    l2_smem_bytes_per_s = 10 TB/s. A tile streams (BM + BN) x K x 2 B from L2 into shared memory; h01
      (64 x 128 tiles, 5 one-stage CTAs per SM) is the step it bounds. At 4096^3 (0.3725 ms) its 3 full
      waves take 1.56 us per round of 5 x 24 KB slabs per SM once the partial last wave and the
      epilogues are taken out: 132 x 5 x 24 KB / 1.56 us = 10.4 TB/s; at 8192^3 (2.811 ms, 25.8 GB)
      the same arithmetic gives 9.5 TB/s. h10 at BN = 128 (explore run 0227d28) averaged 10.6-10.7 TB/s
      at 12288^3 and 16384^3. 10 TB/s is within 7% of all of them. It does not bind the 128 x 256 steps
      at the clocks of these records: they draw 7.7-8.4 TB/s; h07 halves B's traffic (multicast)
      without getting faster; BN = 128 draws 33% more bytes per FLOP than BN = 256 yet ran 2-5% slower.
    tma_latency_s = 0.6 us. h02 has one stage (load, wait, compute) and 3 CTAs per SM covering one
      another, so its k-step is the whole round trip: (0.2947 ms - 3 rounds x E) / (3 x 64) = 1.50 us
      at 4096^3, 1.54 us at 8192^3; minus x = 32 KB / (10 TB/s / 132) = 0.43 us, t = 512 clk / 0.94 =
      0.36-0.38 us and g = 200 clk = 0.13-0.14 us, that leaves 0.58-0.59 us.
    ring_handoff_s = 0.25 us. With two stages and one wgmma group in flight a slab is freed only after
      the next one has landed, so one load is in flight and each k-step is a whole refill: h08 / h09 at
      QSIZE = 2 (explore run 5217d18) give 1.25-1.35 us per k-step without the epilogues; minus 0.6 us
      latency and x = 0.43 us (A and half of B: multicast) leaves 0.22-0.31 us. That is the consumer's
      arrive on "empty" waking the producer warp, a hop the one-stage loop does not have.
    mma_efficiency = 0.94 and epilogue_bytes_per_s = 14.5 GB/s. The two ends of the h10 sweep (closing
      run): the busiest SM runs 63 tiles of 256 k-steps at 16384^3 (12.351 ms, 1455 MHz) and 4 tiles of
      64 at 4096^3 (0.2035 ms, 1515 MHz). time = fill + tiles x (k_tiles x 1024 clk / (eta x clock) + E)
      at both gives eta = 0.941 and E = 4.5 us per 128 x 256 bf16 tile (64 KB / 4.5 us = 14.5 GB/s). eta
      is against the *recorded* clock, a median over a whole interleaved run (see docs/worklog.md), so
      it also carries the gap between that and the kernel's own clock. E is the time the consumers
      spend converting and storing C while they issue no wgmma.
    The CUDA-core constants (``predict_cuda_core``), read off ``benchmarks/results/sgemm_ladder.jsonl``
    (1980 MHz):

    issue_efficiency = 0.75. The fraction of a clock's issue (and LSU dispatch) slot a ptxas-compiled
      fp32 loop fills when it binds: k10 (latency hidden by its prefetch, 2 blocks x 4 warps, 2251
      instructions per 16-deep tile on its fast path) needs 2 x 4 x 2251 / 4 = 4502 issue clocks per
      iteration and took 5959 (4096^3: 3.082 ms = 6.10 M clk / 4 rounds / 256) and 5866 (8192^3):
      0.76-0.77. cuBLAS SGEMM reaches 77% of the FFMA peak in the same records, consistent with a loop
      that is ~all FFMA at this rate. (Register-bank conflicts and dependency stalls that two to four
      warps per scheduler do not cover; not decomposed further.)
    tile_latency_s = 0.75 us. What a block waits per k-tile in a load -> STS -> barrier -> math ->
      barrier loop, hidden only by other blocks: k05 runs one block per SM (149 registers), so nothing
      hides it: 3203 clk per iteration at 4096^3 (6.627 ms / 8 rounds / 512) minus its issue 8 x 645 /
      4 / 0.75 = 1720 leaves 1483 clk = 0.75 us (0.72 us at 8192^3). Same order as the TMA round trip
      (0.6 us) above.
    l1_wavefronts_per_clk = 1 per SM: the L1's tag stage handles one 128-byte line per clock; not
      fitted (k01, bound by it, then comes out at 1.01).
    kstep_turnaround_clk = 200 clocks. h05 and h06 differ only in how a k-step ends: h05 waits for its
      wgmma group (wait_group 0: the tensor pipe drains) and uses token barriers (every waiting thread
      arrives, then polls its token: 2 x (1 + 128 x consumers) arrivals per stage); h06 keeps one group
      in flight and waits on parity. h05 / h06 = 1.151 at 4096^3 and 1.183 at 8192^3 =
      (fill + R (k (t + g) + E)) / (fill + R (k t + E)): g = 182 and 209 clocks.
    """

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
    source: str = "profile"  # "profile" or "gpu" (SM count, L2 and memory read from the device)
    # The device memory's peak rate (2 transfers a clock x memory clock x bus width), what the HBM rates
    # below (``HBM_RATES``) were measured against: a GPU with other memory has them in proportion
    # (``device_profile``). 0: not known.
    hbm_peak_bytes_per_s: float = 0.0
    # The TMA -> shared memory -> wgmma pipeline (``predict_pipelined``): the H200's values; where they
    # come from is in the docstring above.
    l2_smem_bytes_per_s: float = 10e12  # L2 -> shared memory, all SMs together; clock-independent
    tma_latency_s: float = 0.6e-6  # a TMA load's issue -> bytes in smem -> waiter released, before transfer
    ring_handoff_s: float = 0.25e-6  # extra per stage refill when a producer warp waits on an "empty" barrier
    mma_efficiency: float = 0.94  # fraction of the tensor peak at the recorded clock a wgmma-bound loop keeps
    kstep_turnaround_clk: float = 200.0  # tensor pipe drained + token barrier round trip, per k-step
    # FP8 block scales on tiles with more than two copies of the k-loop (planner.fp8_sb_phases > 2: 96, 160,
    # 224 wide): their k-steps against the same price otherwise (planner.fp8_predict_s; session 26).
    fp8_block_phases_factor: float = 1.08
    epilogue_bytes_per_s: float = 14.5e9  # one CTA writing its C tile out while its tensor work waits
    # The CUDA-core k-tile model (``predict_cuda_core``); where they come from is in the docstring above.
    issue_efficiency: float = 0.75  # fraction of issue / LSU-dispatch slots a binding fp32 loop fills
    tile_latency_s: float = 0.75e-6  # exposed load + barrier time per k-tile of a non-prefetching loop
    l1_wavefronts_per_clk: float = 1.0  # global-load lines the L1 handles per clock per SM
    lsu_per_clk: float = 1.0  # memory instructions dispatched per clock per SM (8 LSU lanes per scheduler)

    # The engine kernel's plan model (``gemmlab.planner`` / ``gemmlab.plan_cost``) and the router's price of
    # h11 (``engine.route``); H200 values, what each was fitted to is in ``plan_cost.DEVICE_CONSTANTS_FIT``
    # (the engine kernel's broad-set records, ``benchmarks/results/engine_broad.jsonl``).
    plan_clock_mhz: float = 1755.0  # the clock planned for: median of those records' sustained clocks
    hbm_read_bytes_per_s: float = 3.895e12  # the floor: a weight streamed once at the best rate the engine reached
    smem_bytes_per_clk: float = 201.0  # wgmma operand reads + TMA writes one SM's shared memory serves
    engine_l2_bytes_per_s: float = 11.6e12  # L2 -> SMEM over all SMs as the h11 plans draw it (ladder fit: 10)
    # What one SM's TMA draws from L2 when few SMs share it: 112 GB/s as fitted, 88 GB/s (= 11.6 TB/s / 132)
    # since the multicast probe (mcast_probe.jsonl): a partial grid of larger tiles ran as slow per tile as
    # its area says, not faster per byte (1536x1024x4096: 128 x 128 on 96 SMs 0.794x torch.mm, 128 x 96 on
    # 132 SMs 1.004x; 512x3072x3072 0.894 / 0.991x; 1024^3 0.880 / 0.951x). On the broad set (3e08f7d) it
    # moved the pick on 30 aligned shapes, which then ran 1.045x their earlier ratio (24 faster, 6 slower).
    sm_l2_bytes_per_s: float = 88e9
    # A 64-row data-parallel / ping-pong tile's loads draw from L2 this many times the rates above: such plans
    # ran at a median 0.85-0.89 of their price on the broad set (105-140 GB/s an SM measured), taller tiles
    # at 1.03-1.06; its 46 changed picks ran x1.060 (tile64_l2_probe.jsonl; plan_cost.DEVICE_CONSTANTS_FIT).
    tile64_l2_factor: float = 1.2
    # K-major rows 16- but not 32-byte aligned (bf16 K % 16 == 8): the TMA's L2 -> SMEM rate divided by this.
    # Measured (H200, tma_pitch.jsonl: 132 SMs loading 128 x 64 boxes of an L2-resident operand, 8 stages
    # in flight): 5.06 TB/s at rows of 3000 elements against 8.83-8.89 TB/s at 3008 / 3024 / 3040 / 3072.
    misaligned_l2_factor: float = 1.75
    l2_latency_s: float = 1.22e-6  # a TMA load's round trip when it hits L2 ...
    hbm_latency_s: float = 1.72e-6  # ... and when it streams from HBM (the stages in flight hide it)
    hbm_stream_bytes_per_s: float = 7.0e12  # an HBM stream's transfer rate past its round trip (plan_cost.stream_s)
    hbm_stream_latency_s: float = 0.744e-6  # an HBM stream's round trip under load: bytes in flight / latency
    # The ring depth the two latency terms credit (plan_cost.kstep_s, stream_s): 64-row plans at 11 / 13 / 16
    # stages measured within 1% of 9 on 13 shapes and 12 / 16 no faster at the decode shapes
    # (stages_probe.jsonl, sessions 13 and 27), where those terms priced them 1.03-1.87x faster.
    ring_credit_stages: int = 9
    launch_s: float = 1.0e-6  # launch, barrier setup, first loads, last stores: once per launch
    tile_fixed_s: float = 0.96e-6  # per tile: the last wgmma group's drain and the next tile's restart
    store_bytes_per_s: float = 39.5e9  # one SM converting and storing its output tile
    partial_bytes_per_s: float = 24.4e9  # one SM writing or reading an fp32 stream-K partial (L2)
    dsmem_bytes_per_s: float = 8.7e9  # one SM reading its cluster's split-K partials (SM-to-SM network)
    cluster_sync_s: float = 3.2e-6  # split-K: two cluster barriers and the partial's round through smem
    # ... for partials of at least cluster_sync_area (rows x columns); smaller ones pay from
    # cluster_sync_small_s up to it in proportion (plan_cost.split_sync_s)
    cluster_sync_small_s: float = 2.0e-6
    cluster_sync_area: int = 8192
    direct_store_bytes_per_s: float = 7.9e9  # one SM storing its tile row by row (output rows not 16-byte aligned)
    # stream-K: once per launch. Fitted when every captured launch carried a flags fill kernel; with the fill
    # gone the same plans ran 1.0-1.5 us faster (H200, 3278dd1). Kept until a broad run re-times the set: set
    # to 0 against the older records, the pick's worst loss on the fit half went 1.22x -> 1.92x.
    stream_k_fixed_s: float = 1.04e-6
    engine_mma_efficiency: float = 0.94  # mma_efficiency as the engine kernel's plans keep it (fitted)
    h11_factor: float = 1.073  # h11's measured / modelled time (its plan priced as the engine kernel's)
    split_k_kstep_factor: float = 1.225  # a split-K CTA's k-step against a data-parallel one's (fitted)
    stream_k_kstep_factor: float = 1.35  # a streamed k-step against a data-parallel one's (fitted)
    # Global split-K (planner schedule "split_k_global", not offered; see plan_cost.predict_s). Fitted (grid,
    # session 27) on its 101 records with the bulk exchange (65cb301: probe_split_fixed.py at 512 x 1024 and
    # K 1-16k, probe_deep_k.py's 13 shapes): mean |log measured / priced| 0.167 -> 0.078 (the first values
    # 1.0, 100 GB/s, 1 us priced it 17% fast). Offered with these prices it would rank worse than today's
    # picks on the deep-K probe (its pick 1.03 -> 1.08 behind the best measured), so it stays unoffered.
    gsk_kstep_factor: float = 1.02  # its k-step against a data-parallel one's
    gsk_partial_bytes_per_s: float = 30e9  # one SM writing (and reading) its share of fp32 partials
    gsk_fixed_s: float = 2.0e-6  # the flags' round trips and the slower ranks' wait
    # Offered where its price times this factor is the lowest (0: not offered): a margin for the price's
    # error (mean |log| 0.078 above) before it displaces a plan priced almost as fast.
    gsk_rank_factor: float = 0.0
    # The same where global split-K is offered on few tiles over a deep K (planner.gsk_few_tiles; 0: not): a
    # 10% margin, the spread of its price on the records that rule covers.
    gsk_few_tiles_factor: float = 1.1
    one_consumer_efficiency: float = 0.85  # share of mma_efficiency one consumer warpgroup (64-row tiles) keeps
    # Whether the planners of the engine and grouped kernels (one stream-K scheduler) offer stream-K
    # (``stream_k_offered``: not where the GPU's memory is slower than STREAM_K_MIN_MEMORY_SHARE of the H200's).
    stream_k_offered: bool = True
    # The decode kernel's time as the router prices it against the engine kernel's plan (``decode.cost_s``):
    # fitted to the decode kernel's broad-set records (M <= 32; benchmarks/fit_plan_model.py --route --decode,
    # the fit half of the shapes). ``decode.plan_time`` (which picks the split) has its own (below): the
    # price only has to rank the decode kernel against the engine's. Session 49 (H200): the records of
    # 5aa5d67cdbae (today's plans) and of d5ef4ae, 7b947dc and bb0d0cc on the shapes whose plan has not
    # changed since (59 of 69), 147 records; mean |log measured / priced| 0.110 / 0.108 (fit / held-out half)
    # with the constants before (2.15 us, 0.54 us an NT, 3.72 TB/s, no stream share), 0.046 / 0.081 now. The
    # per-column share of the stream is new: an NT column's cost grew with the weight's bytes (32-token
    # streams of 16-60 MB ran 1.1-1.2x over their price, small ones 0.6-0.7x under it). Replayed on
    # 5aa5d67's records (the router itself on meta tensors), the routed kernel against the best it weighs
    # 0.9966 -> 0.9973 (held-out minimum 0.855 -> 0.894); with decode_weighed_engine_share, 0.9977.
    decode_fixed_s: float = 1.85e-6  # launch, X's first loads, the epilogue: once per call
    decode_token_tile_s: float = 0.145e-6  # per 8-token MMA column (NT): its X loads and mma.sync issue
    decode_hbm_bytes_per_s: float = 3.82e12  # the weight stream (at the plan's fill of in-flight loads)
    decode_token_stream_share: float = 0.121  # each 8-token column past the first slows the weight stream by this
    # Where the router weighs the decode kernel against the engine kernel (``engine.decode_runs``), the
    # engine kernel's price (up to 32 tokens, its best plain plan's; ``engine._engine_plan``) is taken at this
    # share of itself: the decode price is fitted to measured times, and the engine kernel's plans ran at
    # 0.64-1.02 of that price (median 0.91) on the 70 shapes of M <= 32 at 5aa5d67 (H200). Replayed on four
    # H200 runs (5aa5d67, and d5ef4ae, 7b947dc, bb0d0cc on the shapes whose decode plan has not changed; the
    # 34-45 shapes of each where both kernels were timed), the routed kernel against the better of the two:
    # 0.9947 / 0.9957 / 0.9936 / 0.9941 at 1.0, 0.9969 / 0.9986 / 0.9990 / 0.9990 at 0.95, 0.9967 / 0.9961 /
    # 0.9966 / 0.9964 at 0.91. It moves 8x6400x1600 and 1x5120x5120 back to the engine kernel (1.071x against
    # 0.996, 0.973 / 0.967).
    decode_weighed_engine_share: float = 0.95
    # The split-K fix-up against decode.plan_time's. 19.5 until session 49, when plan_time priced it at 0.05 us
    # a split (a guess); it prices the fix-up as measured now (decode_split_latency_s), so this is 1 until a
    # refit says otherwise.
    decode_fixup_factor: float = 1.0
    # The unaligned variants' weight stream (rows at any address) against the aligned ones': 1 + this x
    # (2 + NT) times slower, one share per 16 bytes cut out of two windows (``decode.cu``'s ``cut_row``) for
    # each of the two weight rows and the NT token tiles of a lane's chunk. Read off the H200 records at
    # edda661 (decode_variants.jsonl, engine_broad.jsonl): unaligned against aligned time 1.42-1.44x at NT = 1,
    # 1.51x at NT = 2; at NT = 4 the decode kernel ran 1.19-1.35x over its price at 1.5x (17-32 tokens, three
    # shapes), i.e. ~1.9x. It kept the router off the decode kernel at 32x2049x2049, where the engine kernel
    # with its copies ran 1.2x faster (10.6 against 12.7 us) than a two-way split; the decode kernel runs it
    # unsplit since session 49 (the split's fix-up priced as measured), 9.7 us on an H100, and takes it.
    decode_unaligned_per_cut: float = 0.15
    # The strided unaligned variants (``decode.STRIDED_VARIANTS``, weights from 30 MB) against the variants
    # above: the median of their time's share over the 15 shapes of 33-235 MB they run on (H100,
    # h100_decode_variants.jsonl at d93081b: 0.78-1.00, 0.80-0.93 at NT = 1 from 90 MB, 0.94-0.98 at NT = 2-4).
    decode_strided_share: float = 0.93
    # The operand copies a call makes where TMA cannot read an operand (``engine.copies_s``, weighed by the
    # router against the decode kernel, which reads such rows in place): a fixed cost, then each copied byte
    # read and written at ``copy_resident_bytes_per_s`` up to ``copy_resident_share`` of the L2 (what the copy
    # writes there is still in L2 when the GEMM reads it back) and at ``copy_bytes_per_s`` past it. Fitted
    # (``benchmarks/fit_copies.py``) to the engine kernel with copies, measured less the router's price of
    # the engine kernel alone (``Route.engine_s``), on the 24 unaligned decode shapes (H200,
    # engine_broad.jsonl at 90e1bea and edda661): the copies ran at ~4.5 TB/s read + write up to a third of
    # the L2 and ~3.0 TB/s past it (7-8.5 MB 3.2-4.1 us, 34 MB 17.7-18.5 us, 227 MB 144 us), and the launch's gap
    # did not show (the fit puts the fixed cost at 0: the copy's PDL trigger hides it). Mean |log measured /
    # priced| of the whole path 0.144 -> 0.022 on the held-out half of the shapes (0.26 -> 0.16 on the
    # H100's records); the price before (1.5 us + 4.3 TB/s at every size) overpriced small copies by the
    # fixed cost and underpriced large ones by 1.4x.
    copy_fixed_s: float = 0.0
    copy_resident_share: float = 0.35
    copy_resident_bytes_per_s: float = 4.48e12
    copy_bytes_per_s: float = 2.94e12
    # The decode kernel's split model (``decode.plan_time``: it ranks one shape's splits against each other;
    # X's reads and the fix-up's partials move at ``l2_smem_bytes_per_s``). The HBM rate is issue 5's copy
    # estimate, kept: the 4.3 TB/s of ``hbm_bytes_per_s`` moves 30 of 6,798 decode plans (M 1-64), untimed.
    decode_split_hbm_bytes_per_s: float = 4.0e12
    # A split plan's fix-up: once, the serial chain after the last k piece (partials stored, a fence, the
    # counter's atomic, the last CTA's fence and its reads of every slot); and per split, its slot's share.
    # Least squares over 23 shapes' split and unsplit plans, each shape's own level left free (H100 at
    # 15ab9dc, h100_decode_splits.jsonl; the split counters' memset gone from the replay since 5dd35c0):
    # 2.5 us + 0.5 us a split, rms 1.7 us. Until session 49 it was 0.05 us a split, a guess; a split then
    # looked nearly free, and the plan split 696 of 4,056 decode shapes (M 1-32, model widths) where 180
    # are worth it now. The picks against the best measured plan of each shape: 1.128x slower in geomean,
    # 1.35x at worst, with the guess; 1.017x / 1.133x with the fit (deep K at N <= 896, where more splits
    # than priced ran faster: 32x768x28672 five splits 28.3 us, the pick's three 32.1).
    decode_split_latency_s: float = 2.5e-6
    decode_split_overhead_s: float = 0.5e-6
    # Weight bytes requested per SM for that rate: 8 warps x 4 KB was the first kernel's assumption (Little's
    # law: 4 TB/s x ~1 us over 132 SMs is ~30 KB).
    decode_in_flight_per_sm: int = 32 * 1024
    # Plans ``decode.plan_time`` prices the same (the weight stream alone) go to the most CTAs up to this many
    # an SM, else the fewest (``decode.plan``). H200 (session 47, h200_decode_splits.jsonl): the tie with
    # 1-1.5 CTAs an SM ran 2-17% faster than those with fewer (1x5120x5120 at 160 CTAs 15.84 us, 80 16.26;
    # 8x5120x5120 16.95 / 18.38; 32x1024x1024 at 64 4.65 / 32 5.63) and 3-36% faster than those with 2 or more
    # (1x4864x896 at 152 4.61, 304 6.27); the one loss, 1x5120x13824, 40.07 at 160 against 38.95 at 80. The
    # H100 ran 80 and 160 CTAs within 1% (4x5120x13824: 11% faster at 160; h100_decode_splits.jsonl).
    decode_fill_ctas_per_sm: float = 1.5
    # h11's split-K model (``engine.choose_plan`` / ``split_seconds``; fitted to engine_policies.jsonl, sha
    # 4fc772e, the latencies at 227f35c: the plans chosen ran 3.4% behind the best measured): a k-step costs
    # its SM the largest of the MMAs, the TMA bytes and a load's round trip over the stages in flight (from
    # the L2's latency to HBM's with the share of loads HBM supplies); the cluster reduction about
    # ``h11_reduce_s`` per 128 columns of tile. While HBM streams, 1x8192x28672 unsplit took 0.53 us a k-step
    # with five 10 KB stages (BN = 64) and 0.58 us with four 40 KB ones (BN = 256): the stages in flight,
    # not their bytes, set the pace.
    h11_sm_flops_per_s: float = 6.6e12
    h11_sm_bytes_per_s: float = 100e9
    h11_reduce_s: float = 3.0e-6
    h11_l2_latency_s: float = 1.0e-6
    h11_hbm_latency_s: float = 2.4e-6
    # Clusters of 1..8 one-SM CTAs the GPU holds at once (GPCs of uneven size leave SMs over): the
    # H200's, from cuda-core's occupancy query (sha 4fc772e). ``gemmlab.engine`` asks the GPU it runs on.
    cluster_capacity: tuple = ((1, 132), (2, 66), (3, 39), (4, 30), (5, 22), (6, 17), (7, 15), (8, 15))

    def clusters(self, size: int) -> int:
        """Clusters of ``size`` one-SM CTAs that fit at once (0 past the table)."""
        return dict(self.cluster_capacity).get(size, 0)

    def peak_flops(self, dtype: str = "bf16", clock_mhz: float | None = None) -> float:
        """Dense FLOP/s at ``clock_mhz`` (default: the sustained clock)."""
        return self.sm_count * self.flop_per_clk_sm[dtype] * (clock_mhz or self.sm_clock_mhz) * 1e6


# H200 SXM: 132 SMs; sustained ~1320 MHz at the 700 W limit, 1980 MHz boost; ~4.3 TB/s HBM copy of a
# 4.92 TB/s peak (HBM3e, 3201 MHz memory clock as NVML reads it, 6144-bit bus); 50 MB L2.
H200 = DeviceProfile(name="H200", sm_count=132, sm_clock_mhz=1320.0, max_clock_mhz=1980.0,
                     hbm_bytes_per_s=4.3e12, l2_bytes=50 * 2**20, hbm_peak_bytes_per_s=2 * 3201e6 * 6144 / 8)
PROFILES: dict[str, DeviceProfile] = {"H200": H200}

# The profile's rates that scale with the device memory's peak (``with_memory``).
HBM_RATES = ("hbm_bytes_per_s", "hbm_read_bytes_per_s", "hbm_stream_bytes_per_s", "decode_hbm_bytes_per_s",
             "decode_split_hbm_bytes_per_s", "copy_resident_bytes_per_s", "copy_bytes_per_s")


def with_memory(prof: DeviceProfile, peak_bytes_per_s: float | None) -> DeviceProfile:
    """``prof`` for a GPU whose memory peaks at ``peak_bytes_per_s``: its ``HBM_RATES`` in proportion to the
    two peaks (an H100 SXM's 3.35 TB/s against the H200's 4.92: x0.68), everything else as it is. The rates
    were measured on one GPU; in proportion is the first-order guess for another, not a measurement.
    ``prof`` itself where either peak is unknown."""
    if not peak_bytes_per_s or not prof.hbm_peak_bytes_per_s or peak_bytes_per_s == prof.hbm_peak_bytes_per_s:
        return prof
    r = peak_bytes_per_s / prof.hbm_peak_bytes_per_s
    return dataclasses.replace(prof, hbm_peak_bytes_per_s=peak_bytes_per_s,
                               **{name: getattr(prof, name) * r for name in HBM_RATES})


def with_sm_count(prof: DeviceProfile, sm_count: int, capacity: dict[int, int] | None = None) -> DeviceProfile:
    """``prof`` for a GPU of ``sm_count`` SMs: that SM count, and the clusters of each size it holds at once:
    ``capacity`` ({size: clusters}, asked of the GPU: ``engine.cluster_capacity``) where given, else
    ``prof``'s table in proportion to the SMs and never past ``sm_count // size`` (a GPU with fewer SMs
    holds fewer clusters; how its GPCs split them is only known by asking it). ``prof`` itself where
    nothing changes."""
    if capacity is not None:
        table = tuple(sorted((int(s), int(n)) for s, n in capacity.items()))
    elif sm_count == prof.sm_count:
        table = prof.cluster_capacity
    else:
        table = tuple((s, min(sm_count // s, n * sm_count // prof.sm_count)) for s, n in prof.cluster_capacity)
    if sm_count == prof.sm_count and table == prof.cluster_capacity:
        return prof
    return dataclasses.replace(prof, sm_count=sm_count, cluster_capacity=table)


# The engine kernel's stream-K is offered only on GPUs whose memory peaks at this share of the H200's or more.
# Measured on an H100 SXM (3.35 TB/s, 0.68 of the H200's; f83af88, h100_engine_broad.jsonl and
# h100_stream_k_recheck.jsonl): the broad set's stream-K picks with 40-116 streamed tiles ran 0.53-0.98x
# torch.mm, behind the data-parallel plans of their own tile (1.00-1.08x where timed), and the loss grows with
# K (8192 x 8192 at K 8192 / 14336 / 20480 / 28672: the stream-K plan +9% / +12-21% / +42-49% / +58-104% over
# 128 x 256 data-parallel). On the H200 the same plans run even with or 1-2.5% ahead of it. The streamed
# k-steps read their tiles at k-offsets no other CTA shares (no L2 reuse) before the data-parallel waves:
# a memory-bound phase, which is why the share is of the memory's peak; the phase's full cost on the H100
# is not explained yet (worklog, session 38). The line lies between the two GPUs measured (0.68 lost, 1.0
# gained), near the H200: a GPU between them (a GH200 with HBM3's 4.0 TB/s: 0.81) is planned without it.
STREAM_K_MIN_MEMORY_SHARE = 0.9


def stream_k_offered(peak_bytes_per_s: float | None) -> bool:
    """Whether the engine kernel's stream-K is offered on a GPU whose memory peaks at ``peak_bytes_per_s``
    (``gpu.memory_peak``; None: unknown, planned as the H200)."""
    return not peak_bytes_per_s or peak_bytes_per_s >= STREAM_K_MIN_MEMORY_SHARE * H200.hbm_peak_bytes_per_s


def gpu_profile(info) -> DeviceProfile:
    """The H200 profile with the SM count (and the clusters it holds, ``with_sm_count``), L2 and name of the
    GPU ``info`` describes (``gpu.gpu_info``), and stream-K offered by its memory's peak
    (``stream_k_offered``); its HBM rates stay the H200's."""
    peak = getattr(info, "hbm_peak_bytes_per_s", None)
    return dataclasses.replace(with_sm_count(H200, info.sm_count), name=info.name, l2_bytes=info.l2_bytes,
                               stream_k_offered=stream_k_offered(peak), source="gpu")


def device_profile(name: str | None = None) -> DeviceProfile:
    """The profile called ``name``; without a name, the visible GPU's (SM count, L2, name and memory peak
    read from it, the HBM rates in proportion to that peak (``with_memory``), the rest from the H200
    profile), or the H200 profile when there is no GPU. What the models and reports use; the engine's
    planner keeps the H200's rates (``engine.plan_profile``: its picks are fitted to them)."""
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
    return with_memory(gpu_profile(info), getattr(info, "hbm_peak_bytes_per_s", None))


