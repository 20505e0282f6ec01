"""What the engine kernel (``kernels/engine/gemm.cu``) runs for a problem: its plan.

``Plan`` is one frozen dataclass and the only source of the kernel's template arguments
(``template_args``, ``name_expression``), its compiled name, and its launch shape (grid, cluster, threads,
shared memory, stream-K workspace). ``plan(M, N, K, ...)`` scores every candidate (tile height 64 / 128 /
256 x width 16 .. 256 in steps of 16, data-parallel / split-K / hybrid stream-K) with the cycle model of
``gemmlab.plan_cost`` on a ``DeviceProfile`` and returns the fastest, with its predicted time in the repr.
Without a GPU it plans for the H200. The form follows the public sm90 heuristics: DeepGEMM scores
block_m in {64, 128, 256} x block_n in steps of 16 by modelled cycles over wave efficiency; CUTLASS's
stream-K scheduler keeps full waves data-parallel and spreads the partial wave's k-iterations over all
SMs, and skips stream-K for few k-tiles. Here the model prices the choices instead of fixed thresholds.

Imports neither torch nor CUDA at module import: a torch dtype is read by its name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import plan_cost
from .devices import H200, DeviceProfile, gpu_profile

SOURCE = "engine/gemm.cu"
KERNEL = "engine_gemm"
BK = 64
MAX_STAGES = 9
# Deeper rings (``ring_stages``): a plain 64-row data-parallel plan of one wave over DEEP_RING_MIN_ROWS to
# DEEP_RING_MAX_ROWS rows of tiles and a K of DEEP_RING_MIN_K or more runs up to DEEP_RING_STAGES stages where
# they fit. Its CTAs each stream a weight panel that two or three CTAs read, over one wave: more bytes in
# flight buy time. Measured (H200, stages_probe.jsonl, sessions 13 and 27, the same plan at 9 and deeper):
# 128x4096x4096 64 x 64 1.010 -> 1.056x torch.mm at 11 stages (0.995 -> 1.040 at 12), 128x5120x5120 64 x 80
# 0.984 -> 1.029, 160x2048x4096 64 x 48 0.947 -> 0.962; over four rows of tiles or more (200x1024x2048,
# 256x2560x9728, 512x1024x4096 / 8192, 640x1024x5120) within 1%, and slower on split-K plans and on swapped
# weight streams of several waves (32x14336x4096 64 x 32 0.977 -> 0.964 at 12). Held out (H100, seed 5901, 40
# random shapes at M 1-192 whose ring the rule deepened, h100_rings_heldout.jsonl, two passes within 0.5%): x1.038
# over three rows of tiles (7 shapes, 160x2816x6912 x1.062), x1.019 over two (6), but x0.992 over one (27
# shapes, M 1-64, 60x6912x4608 x0.973: a panel read by one CTA only streams from HBM at the rate 9 stages
# already reach), hence two rows at least. The model credits no depth past ``ring_credit_stages`` (9), so a
# deeper plan is priced as at 9 and ranks the same; DEEP_RING_STAGES = MAX_STAGES turns the rule off.
DEEP_RING_STAGES = 11
DEEP_RING_MIN_ROWS = 2
DEEP_RING_MAX_ROWS = 3
DEEP_RING_MIN_K = 2048
SMEM_LIMIT = 227 * 1024 - 256  # dynamic shared memory per block, less the ring's static barriers
SLAB_BYTES = 64 * 128  # one output piece: 64 rows x 128 bytes
MAX_CLUSTER = 8  # split-K CTAs of a tile form one cluster; 8 is the portable limit
MIN_SPLIT_K_STEPS = 4  # each split runs at least this many k-steps (h11's rule)
MIN_SK_STEPS = 4  # each stream-K CTA runs at least this many k-steps (CUTLASS skips stream-K below a few)
SCHEDULES = ("data_parallel", "split_k", "stream_k", "pingpong", "split_k_global")  # template index = position
STREAMED = ("stream_k", "split_k_global")  # schedules with a global workspace (partial slots and flags)
MAX_GLOBAL_SPLITS = 4  # global split-K: ranks per tile (its reduction keeps 4 items x 4 ranks of loads in registers)
# What the planner offers unless asked for fewer. Ping-pong was measured beside the others first (H200,
# dc8faff, 290 broad shapes): offered, the model picks it on 53 shapes, and on the 51 where both picks
# were timed the geomean ratio to torch.mm goes 1.070 -> 1.088 (43 faster).
# Global split-K is not offered: measured on the H200 (sha 3278dd1, 20 shapes of few tiles and deep K, the
# prefill suite's M = 512 rows and a mid-shape sample), its best plan ran slower than the best stream-K or
# data-parallel plan on every one (512x1024x4096 128x128 x4: 14.4 us against 9.9 predicted; stream-K's
# 64x128 plan 12.6 us). It stays runnable (schedules=SCHEDULES) and GPU-tested; see docs/worklog.md.
OFFERED_SCHEDULES = tuple(s for s in SCHEDULES if s != "split_k_global")
# Except on few tiles over a deep K (``gsk_few_tiles``): 128 x <= GSK_FEW_MAX_BN tiles, at most a quarter as
# many as SMs, at least GSK_FEW_MIN_M rows, GSK_FEW_SPLITS ranks of at least GSK_FEW_MIN_STEPS k-steps, ranked
# by price x the profile's ``gsk_few_tiles_factor``. There the data-parallel plans are 64-row tiles whose loads
# bind (the kstep-bound probe) and cluster split-K pays its DSMEM reduction on 128 x 96-128 partials, while
# global split-K's price held (measured / priced 0.99-1.04). Measured (H200, 6428b37, deep_k_gsk_probe.jsonl,
# every schedule on 16 deep-K few-tile shapes): 512x1024x8192 128 x 128 x4 0.955x torch.mm against the pick's 0.870,
# 512x1024x14336 0.916 / 0.808, 384x1024x8192 128 x 96 x4 0.938 / 0.866, 512x768x8192 1.007 / 0.941; where
# it lost (512x1024x4096 x4: 16 k-steps a rank, 0.745 / 0.871; 512x2048x8192 and 1024x1024x8192 x2: 64 tiles;
# 300x1600x6400 x3: 39 tiles) the rule does not offer it. Timed in place (gsk_few_tiles_probe.jsonl, 62 shapes
# it moved, mostly random): x1.023 over the plans it replaced, but every plan of 224-240 columns ran 1.06-1.19x
# its price and lost (x0.85-1.00), as did the one 3-rank plan (x0.89): hence GSK_FEW_MAX_BN and GSK_FEW_SPLITS,
# drawn on those records (the 54 left: x1.039, 7 slower by more than 2%, worst x0.91). On the broad set it
# moves one shape (256x2560x9728 128 x 160 x4, 0.98-1.01x the pick).
GSK_FEW_MIN_M = 256
GSK_FEW_MIN_STEPS = 32
GSK_FEW_SPLITS = 4
GSK_FEW_MAX_BN = 192
GSK_FEW_TILES_SHARE = 4  # tiles x this <= SMs
# Swap AB (``Plan.swap_ab``): at few tokens the kernel may compute out^T = W @ A^T, the weight as the
# wgmma's 64-row operand and the tokens as its narrow n (cuBLAS's sm90 kernels do at decode shapes, e.g.
# 64 weight rows x 16 tokens per tile at 16x14336x4096). Offered where M <= SWAP_MAX_M (and data-parallel
# over up to SWAP_PAD_COLUMNS columns of token tiles up to SWAP_PAD_MAX_M, below), with 16-bit
# output (the transposed store writes 64 tile rows as one 128-byte row of out), when SWAP_AB is set (the
# default) or ``candidates(swap_ab=True)`` asks.
SWAP_AB = True
SWAP_MAX_M = 64
# Up to SWAP_PREFER_M tokens a swapped plan runs whenever one applies (the model ranks them among
# themselves; the plain plans follow), unless the model's best swapped plan is stream-K: then the model
# ranks both kinds. Measured (H200, swap_probe.jsonl, the model's first swapped plan against the router's
# plain one): M = 1..32 on 8 shapes 0.99-1.07x torch.mm against 0.86-1.03x (1x16384x16384 1.009 / 0.984,
# 16x4096x14336 1.067 / 0.944, 4x5120x4096 0.969 / 0.910); at M = 64 even or worse (64x3072x3072 0.826 /
# 0.886). The swapped stream-K plans lost (swap_stack_probe.jsonl, 42a6e61): 1x11008x4096 0.916 against
# the plain 64x144 data-parallel plan's 1.014, 16x11008x4096 0.904 / 0.990 (172 swapped tiles: 1.3 waves).
# The model prices the swapped tiles' lone consumer and extra epilogues too high to pick them where they
# win (4096x11008: split-K x2 swapped 1.13-1.15 against the plain 1.04): a rule from records until it is
# refitted.
SWAP_PREFER_M = 32
# ... unless the model prices that swapped plan at SWAP_PREFER_MARGIN times the best plain plan's or more:
# then the model ranks both kinds. The gap that wide is a wave the swapped tiles leave almost empty where the
# plain ones fit one: N of 8960-10240 in 140-160 swapped 64-row tiles (1.06-1.21 waves on 132 SMs) against
# 112-128 plain 64 x 80 tiles (H200, wave_probe.jsonl at d5ef4ae: 1x8960x1536 swapped 0.908x torch.mm,
# plain 1.116; 4x8960x1536 0.911 / 1.115; 16x8960x1536 0.901 / 1.098; 2x10240x1024 0.959 / 1.042, priced
# 1.40-1.54x the plain plan). Under the margin the rule holds (2x3072x3072 priced 1.32x: swapped 1.266,
# plain 1.216; 1x2048x2048 1.29x: 1.066 / 1.042; none of the broad set's shapes is priced past 1.33x). Held
# out (H100, h100_wave_heldout.jsonl at 71f9635): on 12 drawn shapes past the margin the plain pick ran
# 1.028-1.100x torch.mm, ahead of the swapped plans it passed over on all 12.
SWAP_PREFER_MARGIN = 1.35
# ... and where that swapped plan runs past one wave (more tiles than its CTAs, or more split-K clusters than
# the GPU holds) the margin is SWAP_PREFER_WAVES_MARGIN: the model prices the partial wave itself, and the
# over-pricing the wide margin makes up for (a lone consumer's k-steps and epilogues in one wave) is the
# smaller share. Seen where stream-K is not offered (an H100: on the H200 these shapes' best swapped plan is
# stream-K, so both kinds were ranked already): the swapped 64 x 16 plans of 1.2-2.4 waves, priced 1.09-1.31x
# the plain one-wave plan, ran 4-12% behind it (h100_engine_broad.jsonl, ef953e0 and 6dfd0a9: 4x10240x8192
# ping-pong over 160 tiles x0.878-0.891, 8x17408x5120 x0.896-0.919, 1x11007x4096 x0.919-0.935, 8x5120x32768
# split-K x4 in 80 clusters x0.919-0.922), while the multi-wave swapped plans priced even with the plain
# ones ran ahead of them (1x24576x1536, 384 tiles: x1.048-1.068 on both GPUs). From SWAP_PREFER_WAVES_MIN_K
# up: held out (H100, h100_waves_heldout.jsonl at a982f5b, 80 shapes at M 1-32 whose pick the narrow margin
# moved), the plain pick ran x1.04 ahead overall and on every shape from K = 4096 but one (x0.973 of 36), while
# at K 512-1536 the swapped ping-pong plans it replaced ran 2-5% ahead on 14 of 16 (a k-loop of 8-24 k-steps,
# where the second consumer hides the epilogue: the model prices it too high there). The cut lies between.
# A fresh draw under the cut (H100 at 4dd8f0c, seed 5711, 40 shapes at K 2304-18432): x1.069, 36 faster by
# more than 2%, none slower.
SWAP_PREFER_WAVES_MARGIN = 1.05
SWAP_PREFER_WAVES_MIN_K = 1600
# Past SWAP_MAX_M and up to SWAP_PAD_MAX_M tokens the swapped plans offered are the data-parallel ones over
# at most SWAP_PAD_COLUMNS columns of token tiles: a plain tile pads the tokens to whole 64- or 128-row
# tiles (M = 200 to 256: 22% of its MMAs on padding; 300: 28%), a swapped one to its width in steps of 16
# (200 in two columns of 112: 224). The model does not see what that padding costs (its k-steps are bound by
# bytes there, the MMAs next to them), so a rule from records ranks them: the best such plan goes first where
# the best plain plan is data-parallel and swapped / plain price < (plain plan's padded rows / the swapped
# plan's padded tokens) ** SWAP_PAD_EXPONENT. Measured (H200, swap_mid_probe.jsonl, fc23a2c: 20 shapes,
# M = 77..256): 200x8192x5376 0.965x torch.mm against the plain 128 x 128's 0.836, 200x8192x3072 0.968 /
# 0.849, 77x6144x4096 0.986 / 0.959, 150x14336x4096 0.991 / 0.965 (h11); where the plain tiles pad little
# or the swapped ones fill fewer SMs they lose (128x5120x5120 0.854 / 0.922, 160x5120x5120 0.966 / 1.033).
# The exponent (0.75) ranks all 20 shapes' best kind first. Checked on the broad set's 9 shapes it moved
# (1bd031d, engine_broad.jsonl): 200x8192x5376 0.830 -> 0.978, 77x32000x4096 0.994 -> 1.059, 77x50257x768
# 3.41 -> 4.26; one lost, 77x17920x5120 1.049 -> 0.851, its 64 x 80 swapped tiles over 2.1 waves: a swapped
# tile of one consumer warpgroup goes first only where its tiles fit one wave (every such winner did; the
# 128-row ones won over 2-8 waves).
# Until d769bef the rule offered one column of tiles only (bn >= M): a second column's token box hung past M
# and its zero fill made those plans 1.5-2x slower (100x4096x4096 64 x 96: 0.455x torch.mm). With short B
# boxes (mainloop.cuh's BEdge) they run as their area says (0.886), and swap_multi_probe.jsonl (H200, 65
# shapes, M = 77..512) measured the rule over 1, 2 and 3 columns: geomean 1.059 / 1.060 / 1.065 over the
# shapes (the plain plans alone 1.048); 300x5120x27648 0.889 -> 1.018 (128 x 112, 3 columns), 300x7168x16384
# 0.878 -> 0.964 (128 x 160), 200x4096x4096 0.986 -> 1.080 (64 x 112, 2 columns); one lost 7%
# (320x6144x4096 1.165 -> 1.086). No 512-token shape moved.
SWAP_PAD_MAX_M = 512
SWAP_PAD_COLUMNS = 3
SWAP_PAD_EXPONENT = 0.75
# SWAP_PAD_ANY (session 54): the same rule where the best plain plan is ping-pong, not only data-parallel,
# and past SWAP_PAD_MAX_M where the plain tiles pad the tokens more than the swapped ones (the swapped
# data-parallel and ping-pong plans SWAP_WIDE lists). Found on a fresh draw (benchmarks/fresh_draw.py, seeds
# 5401-5403, H100): token counts just past a multiple of 128 (515, 787, 1048) ran 0.84-0.95x torch.mm on
# plain 128-row tiles whose last row of tiles was mostly padding; the swapped ping-pong plan of the same
# width, its tokens padded to 16, ran x1.07-1.12 faster on them (h100_fresh_losers.jsonl), priced within
# 1% of the plain one, so neither SWAP_WIDE_MARGIN nor the data-parallel-only rule took it. Past
# SWAP_PAD_MAX_M the plain plan must pad at least SWAP_PAD_WIDE_MIN times the swapped one's tokens (a
# prefill's last row of tiles is a small share of its rows: 6000, 8224 and 9232 tokens pad under 1% more).
# Held out (h100_pad_any_heldout.jsonl: 32 drawn shapes of M 129-4000 whose pick it moves, H100): x1.050
# against the plain picks replaced, 20 faster by more than 2%, 3 slower by 3-5%. No broad-set pick moves.
SWAP_PAD_ANY = True
SWAP_PAD_WIDE_MIN = 1.02
# SWAP_PAD_SPAN (session 55): the padding rule moves a pick only where the swapped plan's critical path is no
# longer than the plain one's: its busiest CTA's tiles x tile area (``_tile_span``: ceil(tiles / grid) x
# bm x bn) at most SWAP_PAD_SPAN times the plain plan's. Fewer padded tokens buy nothing where the CTAs that
# run longest run more tile area. Found on the fresh draws (H100, 022b227: 322x6144x6144, its swapped
# 128 x 176 over 96 tiles against the plain 128 x 144 over 129, ran 0.801 against 1.002x torch.mm). Held out
# (h100_span_heldout.jsonl, 290525a: two draws of changed_picks.py --fresh, M 129-4096, both picks
# interleaved with torch.mm): the 40 picks it moves from a longer swapped span ran x1.038 (22 faster by more
# than 2%, 1 slower: 228x13824x5120 x0.974; 422x6144x24576 0.762 -> 0.885, 351x6144x16384 0.767 -> 0.922).
# A third draw at this rule (seed 5503, 492ccca): its 40 moves x1.028, 16 faster, 4 slower by 2-5%.
# A stricter bound (the swapped span shorter, not only no longer, past 512 tokens) lost on the same draws:
# its 36 equal-span moves ran x0.978, 9 slower by more than 2% (2822x1024x6144 x0.835), none faster.
# Under SWAP_PAD_SPAN_MIN_K (fewer than 32 k-steps) a tile's fixed costs outweigh its MMAs, the span says
# little, and the rule stands as it was (200x6144x1024: the swapped 64 x 208 over 96 tiles ran 3% faster
# than the plain 64 x 192 over 128 on both GPUs).
SWAP_PAD_SPAN = 1.0
SWAP_PAD_SPAN_MIN_K = 2048
# Past SWAP_PAD_MAX_M tokens (SWAP_WIDE) the swapped data-parallel and ping-pong plans of 128 and 256
# weight rows (the heights measured there) are priced too, over any number of token columns, and the best
# of them goes first where the model prices it below SWAP_WIDE_MARGIN x the best plain plan's time.
# Swapped, the weight's rows take the tile's 128 (or 256) and the tokens its width in steps of 16
# (cuBLAS's sm90 kernels tile that way), so narrow weights (N = 768..1152) and ragged token counts pad
# less and fill the waves better. Measured (H200,
# swap_any_probe.jsonl, 06656d3: the 217 broad-set shapes with M > 64, the pick against the best swapped plan
# of each schedule): on the 161 shapes past 512 tokens the rule changes 18 picks, 15 of them faster by
# more than 2% (12608x768x3072 0.951 -> 1.050x torch.mm, 5000x896x4864 0.944 -> 1.020, 3000x1024x3072
# 0.953 -> 1.020, 5000x5120x14336 0.947 -> 0.987, 1023x4097x1025 2.49 -> 2.75), none slower by more
# than 2%; without the margin 29 picks change, two of them 2.2-2.8% slower. Swapped split-K lost nearly
# everywhere (0.72x torch.mm geomean; 300x3584x14336 1.199 -> 0.996). Held out (swap_wide_heldout.jsonl,
# 93af8f9: 90 of 400 random shapes past 512 tokens whose pick the rule made swapped, against the best plain
# plan): x1.059 geomean, 76 faster by more than 2% (520x4608x4608 0.738 -> 0.929x torch.mm, 20000x1024x1792
# 1.040 -> 1.125), 7 slower by more than 2%, the worst a swapped stream-K plan (3500x1280x32000: 0.941 ->
# 0.725; the probe's swapped stream-K 0.95x torch.mm geomean against data-parallel's 1.08): stream-K is not
# offered swapped past SWAP_PAD_MAX_M either.
SWAP_WIDE = True
SWAP_WIDE_MARGIN = 0.99
# The swapped twin (``swap_twin``): a plain 64-row data-parallel pick and the same tile over the transposed
# problem (the weight's rows as the 64, the tokens as the width) multiply the same blocks and move the same
# bytes through the L2, and the model prices them alike; but each bn-wide panel of the weight is read by
# ceil(M / 64) CTAs in the plain plan and each 64-row panel by ceil(M / bn) in the twin. Where the weight
# streams from HBM, how far apart a panel's readers run decides how often it is fetched (session 51's
# tile-order probe: the same tiles dealt so that readers sat far apart ran 0.43-0.69x against 1.06x). From
# SWAP_TWIN_MIN_M tokens, where the twin has fewer readers a panel (bn > 64) and the model prices it within
# SWAP_TWIN_MARGIN of the plain pick, the twin goes first. Measured (the twin against the plain pick, each
# interleaved with torch.mm): H200 (swap_any_probe.jsonl, 06656d3) the 5 broad shapes at such a tie with
# N > M, M 256-640: x0.999-1.015 and 300x2050x4095 x1.089; H100 (h100_deepk_swap_probe.jsonl,
# h100_deepk_swap_heldout.jsonl) 12 drawn deep-K shapes at such a tie, all N > M, M 186-1003: x1.040
# geomean, 11 of 12 faster (813x2048x11008 0.95 -> 1.20x torch.mm), the other x0.995. Past SWAP_PAD_MAX_M
# tokens the twin is the one 64-row swapped plan offered.
# Held out (H100, h100_swap_twin_probe.jsonl, 3263e3c: the rule without the N > M condition, 40 shapes it
# moved, M 256-2026): x0.996, seven slower by more than 2%, five of them where the tokens outnumber the
# weight's rows (1573x1024x4608 0.928: the twin's token panels then have the more readers); where N > M,
# x1.004 over 20 (1000x1152x6912 0.946, 380x4096x9216 0.973; 300x2050x4095 1.044). So the rule now asks
# N > M. Held out under it (H100 at 8762239, h100_swap_twin_heldout2/3.jsonl: two fresh draws of 32 shapes
# it moved, 5 and 3 passes): x0.990 (8 slower by more than 2%, 1 faster; 877x1600x9728 0.893, 746x1408x9728
# 0.913, 187x8192x14336 0.961, each in every pass) and x1.010 (9 faster, 4 slower; 509x2048x27648 1.105):
# x1.000 over the 64, a coin flip. The readers of a weight panel are not what decides these shapes on the
# H100 either, so it stays off (docs/worklog.md, session 52); ``candidates(swap_twin=True)`` plans with it.
SWAP_TWIN = False
SWAP_TWIN_MARGIN = 1.01
SWAP_TWIN_MIN_M = 129
# B multicast (``Plan.mcast``): data-parallel plans whose clusters of two CTAs on vertically adjacent tiles
# load B's tile once between them (TMA multicast). Offered when MCAST_OFFERED is set or
# ``candidates(mcast=True)`` asks; ``mcast_problem`` says where it cannot run.
# Measured (H200, mcast_probe.jsonl, e21783d: 20 shapes, each tile with and without): where K-major rows
# are 16- but not 32-byte aligned (``plan_cost.misaligned_operands``) it ran 1.10-1.42x faster than the same
# tile without (3000^3 128 x 192: 0.983x torch.mm against 0.789x; 3000x5000x1000 128 x 240 1.002 / 0.888;
# 2050x3000x1000 128 x 224 0.887 / 0.715; 1000^3 64 x 144 0.927), where the L2 -> SMEM rate binds; on 16
# aligned shapes 45 of 48 tiles ran slower with it (by up to 28%), 3 within 1%: a clustered launch of these
# tiles costs 5-20% even with nothing shared (mc_parts_probe.jsonl, worklog session 10). So it is offered
# where B's rows are misaligned only (MCAST_OFFERED None), everywhere with True, nowhere with False.
MCAST_OFFERED: bool | None = None
# Column split (``Plan.col_split``): the plain 64-row data-parallel plans whose width splits into whole
# 16-column halves (``col_split_problem``) run two consumers of half the columns instead of one of all, when
# COL_SPLIT_OFFERED is set. Not offered: measured (H200, col_split_probe.jsonl, 52 tile pairs on 36 shapes)
# 0.969x the one-consumer plan's speed, faster on 5 (by under 2%), slower on 35 (64 x 64: 0.89x).
COL_SPLIT_OFFERED = False
# Evict-first weight loads (``Plan.evict_weight``, GemmTraits::EVICT_WEIGHT): where the tokens are one tile
# (M rows in one tile row, or a swapped plan's tokens in one tile column) every weight box is read by one CTA
# and never again, while the tokens are re-read by every CTA along the weight; the weight's TMA loads then ask
# the L2 to evict their lines first. Measured (H200, l2_hints_probe.jsonl at 0be9b20, every 18th broad-set
# shape of M <= 128 on the engine kernel, 16 shapes, M 1-77, swapped and plain, split-K, stream-K and
# data-parallel plans): x1.017 in geomean over the same plan without, each of the 16 ahead (x1.001 to
# x1.039: 64x4096x3584 0.887 -> 0.921x torch.mm, 32x4096x4096 1.169 -> 1.209). Both operands' hinted
# (weight first, tokens last) x1.011; the output's stores evict-first x0.999. Not on multicast plans (their
# weight loads are the pair's shared boxes) and never priced: the model's time is the plan's without it.
EVICT_WEIGHT_OFFERED = True
# ... but only for a weight of more than EVICT_WEIGHT_ABOVE_ELEMENTS (N x K). Under it the hint costs time: over
# six H200 broad runs (7b947dc .. 88c970d, the pick against the same plan without the hint, interleaved) weights
# of up to 1.2M elements ran x0.970 with it (1x1024x1152 x0.939, 1x256x2048 x0.945, 16x1152x1024 x0.951, 2x256x1152
# x0.962 in every run), 2-4M x1.009 (7 shapes, each >= 1.0), 4M and more x1.013-1.020 (99). Two draws timed on
# an H100 (engine-kernel picks, the hinted plan against the same without, two passes each): 16 of 0.13-1.05M
# elements ran x1.037 without the hint, every one faster (h100_evict_small_heldout.jsonl; 11x4096x256 x1.101,
# 38x896x640 x1.072); 28 of 1.18-2.06M ran x1.017 with it, 25 of them ahead (h100_evict_band_heldout.jsonl:
# 102x5120x256 x1.062, 60x4096x384 x1.042; behind: 11x384x3072 x0.969, two within 0.5%). At 1.18M the swapped
# split-K plans of M 1-16 also ran 5-8% slower with it on both GPUs (broad records). So 2^20 elements, 2 MiB of
# bf16; the band above it is the H100's measurement (the H200's records hold no plan of M > 16 there).
# Those draws timed the hinted candidate of the small weights right after the unhinted pick, which costs a
# hinted kernel ~3% (the timer's place effect, probe_place.py); timed again after the timer's flush (session
# 56, h100_evict_draws_flush.jsonl, one pass): the small weights x1.087 without the hint (15 of 16 faster by
# more than 2%), the band x1.033 with it (12 of 20 faster, 1 slower: 11x384x3072 x0.970). The cut stands.
EVICT_WEIGHT_ABOVE_ELEMENTS = 1 << 20
ACTIVATIONS = {None: 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4}
_CTYPE = {"bf16": "__nv_bfloat16", "fp16": "__half", "fp32": "float"}


def cpp_bool(x) -> str:
    """A template argument's C++ bool: "true" or "false" (the kernels' name expressions)."""
    return "true" if x else "false"

_DTYPE_NAMES = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "half": "fp16", "fp16": "fp16",
                "float32": "fp32", "float": "fp32", "fp32": "fp32"}

# The tile space: 64-row tiles (one consumer) for small M, 128 (two consumers, h11's) and 256 (two
# consumers of 128 rows each), widths in steps of 16, the wgmma n sizes. The 128- and 256-row tiles
# narrower than 64 (NARROW_TALL) are offered to swapped plans only: a few tokens on the n side of many
# weight rows (cuBLAS runs 128 x 8, 128 x 32 and 192 x 32 there; Nsight Compute, probe_ncu.py), with one
# column of token tiles (bn >= M), data-parallel, and where their waves fill the SMs (``_tall_fills``): what
# swap_tall_probe.jsonl and the broad set measured (``rank_key``).
NARROW_TALL: tuple[tuple[int, int], ...] = tuple((bm, n) for bm in (128, 256) for n in range(16, 64, 16))
TALL_MIN_FILL = 0.8  # _tall_fills
TILES: tuple[tuple[int, int], ...] = (tuple((64, n) for n in range(16, 257, 16))
                                      + tuple((128, n) for n in range(64, 257, 16))
                                      + tuple((256, n) for n in range(64, 193, 16)) + NARROW_TALL)


def dtype_name(dtype) -> str:
    """'bf16', 'fp16' or 'fp32' for a torch dtype (read by name: no torch import) or such a string."""
    if dtype is None:
        return "bf16"
    name = str(dtype).removeprefix("torch.")
    try:
        return _DTYPE_NAMES[name]
    except KeyError:
        raise ValueError(f"unsupported dtype {dtype!r}: bf16 or fp16 operands, bf16 / fp16 / fp32 output") from None


def consumer_count(bm: int, schedule: str | None, col_split: bool = False) -> int:
    """Consumer warpgroups of an engine-part kernel (GemmTraits::CONSUMERS): one for 64-row tiles, two for
    taller ones, with ping-pong consumers and with a column split."""
    return 1 if bm == 64 and schedule != "pingpong" and not col_split else 2


class Warpgroups:
    """A tile's warpgroups (every engine-part kernel): one consumer for 64-row tiles, two otherwise (and
    with ping-pong consumers, which take whole tiles in turn), and the producer's warpgroup."""

    @property
    def consumers(self) -> int:
        return consumer_count(self.bm, getattr(self, "schedule", None), getattr(self, "col_split", False))

    @property
    def threads(self) -> int:
        return 128 * (self.consumers + 1)

    def launch_args(self) -> dict:
        """grid (CTAs), cluster (None: no cluster), block, smem: a data-parallel launch's."""
        return {"grid": self.grid, "cluster": None, "block": self.threads, "smem": self.smem_bytes}


class _Tiling(Warpgroups):
    """A plan's tile geometry (the bf16 and FP8 plans): tiles of BM x BN over M x N, k-steps of ``BK``
    elements."""

    @property
    def tiles_m(self) -> int:
        return math.ceil(self.M / self.bm)

    @property
    def tiles_n(self) -> int:
        return math.ceil(self.N / self.bn)

    @property
    def tiles(self) -> int:
        return self.tiles_m * self.tiles_n

    @property
    def k_iters(self) -> int:
        return math.ceil(self.K / self.BK)


@dataclass(frozen=True)
class Plan(_Tiling):
    """One launch of the engine kernel for an M x N x K problem (A M x K, B K x N, out M x N).

    Chosen by the planner: ``bm`` x ``bn`` tile, ``schedule``, ``splits`` (split-K CTAs per tile, one
    cluster; global split-K: CTAs per streamed tile, no cluster), ``sk_tiles`` / ``sk_ctas`` (stream-K and
    global split-K: the last sk_tiles tiles' k-steps spread over CTAs 0 .. sk_ctas - 1; global split-K has
    sk_ctas = splits x sk_tiles, so each of those CTAs runs one k-range of one tile), ``stages`` (ring depth:
    ``ring_stages``), ``grid`` (CTAs). Fixed by the problem: dtypes, MN-major operands, epilogue (bias dtype or
    None, beta * C, activation), ``direct`` (output rows not 16-byte aligned: threads store). ``predicted_s``:
    the cycle model's time."""

    M: int
    N: int
    K: int
    bm: int
    bn: int
    schedule: str
    stages: int
    grid: int
    splits: int = 1
    sk_tiles: int = 0
    sk_ctas: int = 0
    dtype: str = "bf16"
    out_dtype: str = "bf16"
    bias_dtype: str | None = None
    has_c: bool = False
    activation: str | None = None
    a_mn: bool = False
    b_mn: bool = False
    direct: bool = False
    predicted_s: float = 0.0
    kernel: str = KERNEL
    swap_ab: bool = False
    mcast: int = 1
    # What ranks plans the HBM floor ties (``rank_key``): for swapped plans of up to SWAP_PREFER_M tokens the
    # model's time without the floor (``plan_cost.predict_s(floor=False)``), else ``predicted_s`` (0: the same).
    tie_s: float = 0.0
    # L2 prefetch distance (GemmTraits::PREFETCH): the producer asks the L2 for the boxes this many k-steps
    # past the ones it loads (K-major operands, no multicast). A probe's knob, never offered: it measured slower
    # at every distance on every shape timed (prefetch_probe.jsonl, 63407ef).
    prefetch: int = 0
    # Column split (GemmTraits::COL_SPLIT): a 64-row data-parallel tile's two consumers take half its columns
    # each (64 x bn / 2), where one consumer alone runs one chain of dependent wgmmas.
    col_split: bool = False
    # The weight's loads evict-first in the L2 (EVICT_WEIGHT_OFFERED's rule; ``weight_read_once``).
    evict_weight: bool = False
    # What ``rank_key`` orders by where it is not ``predicted_s`` (0: the same): global split-K's price
    # times the profile's ``gsk_rank_factor``.
    rank_s: float = 0.0

    # Derived launch facts ------------------------------------------------------------------------
    BK = BK  # k elements per k-step (the _Tiling properties read it)

    # Swap AB: the kernel's problem is the transposed one, kernel_m (its tile rows: out's columns) x
    # kernel_n (out's rows, the tokens), its A operand the weight (B's layout) and its B the tokens (A's).
    @property
    def kernel_m(self) -> int:
        return self.N if self.swap_ab else self.M

    @property
    def kernel_n(self) -> int:
        return self.M if self.swap_ab else self.N

    @property
    def kernel_a_mn(self) -> bool:
        return self.b_mn if self.swap_ab else self.a_mn

    @property
    def kernel_b_mn(self) -> bool:
        return self.a_mn if self.swap_ab else self.b_mn

    @property
    def tiles_m(self) -> int:
        """Rows of tiles; with B multicast padded to whole pairs (``mcast``)."""
        return math.ceil(math.ceil(self.kernel_m / self.bm) / self.mcast) * self.mcast

    @property
    def tiles_n(self) -> int:
        return math.ceil(self.kernel_n / self.bn)

    @property
    def cluster(self) -> int:
        return self.splits if self.schedule == "split_k" else self.mcast

    @property
    def b_box_rows(self) -> int:
        """Rows of the kernel's K-major B box: the tile's width, or each CTA's share of it with multicast."""
        return self.bn // self.mcast

    @property
    def smem_bytes(self) -> int:
        return smem_bytes(self.bm, self.bn, self.stages, self.schedule, self.dtype, self.col_split)

    @property
    def a_rows(self) -> int:
        """Rows of the short A box (K-major A) for tiles whose rows run past M: the last row of tiles'
        rows rounded up to 8; bm when M is a multiple of it (the kernel's M: N when swapped)."""
        left = self.kernel_m - (math.ceil(self.kernel_m / self.bm) - 1) * self.bm
        return min(self.bm, math.ceil(left / 8) * 8)

    @property
    def b_rows(self) -> int:
        """Rows of the short B box (K-major B) for the last column of tiles when its columns run past the
        kernel's N (the tokens when swapped): the columns left rounded up to 8; b_box_rows otherwise and
        with multicast (each CTA loads a share of whole tiles)."""
        left = self.kernel_n - (math.ceil(self.kernel_n / self.bn) - 1) * self.bn
        return self.b_box_rows if self.mcast > 1 else min(self.bn, math.ceil(left / 8) * 8)

    @property
    def uniform_wg(self) -> bool:
        """GemmTraits::UNIFORM_WG: the kernel reads its warpgroup index warp-uniformly, so the k-loop's
        wgmma descriptors stay in uniform registers: a plain epilogue (16-bit output, TMA-stored, no bias,
        C or activation) and a schedule that is not streamed (elsewhere it spilled or bought nothing)."""
        return (self.schedule not in STREAMED and self.bias_dtype is None and not self.activation
                and not self.has_c and not self.direct and self.out_dtype != "fp32")

    @property
    def split_push(self) -> bool:
        """GemmTraits::SPLIT_PUSH: a cluster split-K plan whose ranks copy each other their row slices of the
        partial (reduction.cuh) because the partial and the receive slots ((2 bm + 7) rows of bn + 8 fp32)
        fit the drained stages; other split-K plans pull the slices through distributed shared memory."""
        return self.schedule == "split_k" and split_rows_fit(2 * self.bm + 7, self.bm, self.bn, self.stages, self.dtype)

    @property
    def gsk_bulk(self) -> bool:
        """GemmTraits::GSK_BULK: a global split-K plan whose ranks exchange the same row slices through the
        workspace by bulk copies (reduction.cuh gsk_bulk_exchange), where they fit the drained stages as
        ``split_push``'s do; other global split-K plans store and load their fragments thread by thread."""
        return self.schedule == "split_k_global" and split_rows_fit(2 * self.bm + 7, self.bm, self.bn, self.stages,
                                                                     self.dtype)

    @property
    def workspace_floats(self) -> int:
        """Stream-K and global split-K: one fp32 partial slot per streamed CTA (flags: 2 ints per slot), bm x bn
        floats, or for global split-K bm rows of bn + 8 (GemmTraits::LDP: the bulk exchange copies the
        partial's rows as they lie in shared memory)."""
        if self.schedule not in STREAMED:
            return 0
        return self.sk_ctas * self.bm * (self.bn + 8 if self.schedule == "split_k_global" else self.bn)

    def store_boxes(self) -> tuple[tuple[int, int], tuple[int, int] | None, int]:
        """The TMA store boxes over out, (rows, cols): a full piece's, the tail piece's (BN % piece columns;
        None if none) and the tail's swizzle in bytes. A piece is 64 tile rows x one 128-byte row of output
        (64 16-bit or 32 fp32 columns); the tail is unswizzled. Swapped: a piece of 64 tile rows x W tile
        columns is W rows x 64 columns of out, the tail too in the 128-byte swizzle (its rows are 128 bytes)."""
        piece = 32 if self.out_dtype == "fp32" else 64
        tail = (self.bn // 2 if self.col_split else self.bn) % piece  # a consumer's columns
        if self.swap_ab:
            return (piece, 64), ((tail, 64) if tail else None), 128
        return (64, piece), ((64, tail) if tail else None), 0

    def template_args(self) -> tuple[str, ...]:
        """GemmTraits<TIn, TOut, TBias, BM, BN, STAGES, A_MN, B_MN, BIAS, C, ACT, DIRECT, SCHEDULE, TRANS_OUT
        [, MCAST [, PREFETCH [, COL_SPLIT [, EVICT_WEIGHT]]]]> (A_MN / B_MN: the kernel's operands, swapped with
        swap_ab; each optional one written when it is not its default or one after it is)."""
        b = cpp_bool
        optional = [str(self.mcast), str(self.prefetch), b(self.col_split), b(self.evict_weight)]
        defaults = ("1", "0", "false", "false")
        while optional and optional[-1] == defaults[len(optional) - 1]:
            optional.pop()
        return (_CTYPE[self.dtype], _CTYPE[self.out_dtype], _CTYPE[self.bias_dtype or "fp32"], str(self.bm),
                str(self.bn), str(self.stages), b(self.kernel_a_mn), b(self.kernel_b_mn), b(self.bias_dtype),
                b(self.has_c), str(ACTIVATIONS[self.activation]), b(self.direct), str(SCHEDULES.index(self.schedule)),
                b(self.swap_ab)) + tuple(optional)

    @property
    def name_expression(self) -> str:
        return f"{KERNEL}<GemmTraits<{', '.join(self.template_args())}>>"

    @property
    def compiled_name(self) -> str:
        """The name of the compiled variant (one per instantiation, shape-independent)."""
        return f"engine.gemm[{', '.join(self.template_args())}]"

    def launch_args(self) -> dict:
        """grid (CTAs), cluster (None or CTAs per cluster), block, smem, and the schedule's kernel
        arguments (splits, sk_tiles, sk_ctas)."""
        return {"grid": self.grid, "cluster": self.cluster if self.cluster > 1 else None, "block": self.threads,
                "smem": self.smem_bytes, "splits": self.splits, "sk_tiles": self.sk_tiles, "sk_ctas": self.sk_ctas}

    def __repr__(self) -> str:
        dp = "data-parallel" + (f", B multicast to clusters of {self.mcast}" if self.mcast > 1 else "") + (
            ", two consumers of half the columns" if self.col_split else "")
        sched = {"data_parallel": dp, "pingpong": "data-parallel, ping-pong consumers",
                 "split_k": f"split-K x{self.splits} (clusters of {self.splits})",
                 "stream_k": f"stream-K ({self.tiles - self.sk_tiles} tiles data-parallel, {self.sk_tiles} "
                             f"streamed over {self.sk_ctas} CTAs)",
                 "split_k_global": f"global split-K x{self.splits} ({self.tiles - self.sk_tiles} tiles "
                                   f"data-parallel, {self.sk_tiles} split over {self.sk_ctas} CTAs)"}[self.schedule]
        extra = [x for x in (self.a_mn and "A MN-major", self.b_mn and "B MN-major", self.direct and "direct stores",
                             self.bias_dtype and "bias", self.has_c and "beta*C", self.activation) if x]
        swap = " swap AB (out^T = W @ A^T: weight rows x tokens)," if self.swap_ab else ""
        return (f"Plan({self.M}x{self.N}x{self.K} {self.dtype}->{self.out_dtype}: {self.kernel}{swap} {self.bm}x{self.bn} "
                f"tiles ({self.tiles}), {sched}, {self.stages} stages"
                + (f", L2 prefetch {self.prefetch} k-steps ahead" if self.prefetch else "")
                + (", weight loads evict-first" if self.evict_weight else "") + f", grid {self.grid}"
                + (f", {', '.join(extra)}" if extra else "") + f"; predicted {self.predicted_s * 1e6:.1f} us)")


def smem_bytes(bm: int, bn: int, stages: int, schedule: str, dtype: str = "bf16", col_split: bool = False) -> int:
    """Dynamic shared memory: 1 KB to align the stages to the swizzle atoms, the stages, and two 8 KB
    output slabs per consumer (not split-K: it stores from its reduction)."""
    slabs = 0 if schedule == "split_k" else consumer_count(bm, schedule, col_split) * 2 * SLAB_BYTES
    return 1024 + stages * (bm + bn) * BK * plan_cost.in_bytes(dtype) + slabs


def split_rows_fit(rows: int, bm: int, bn: int, stages: int, dtype: str = "bf16") -> bool:
    """Whether `rows` rows of split-K's fp32 partial (bn + 8 floats apart, GemmTraits::LDP) fit over the
    drained stages: bm of them always (the partial), 2 bm + 7 where the slices are pushed (the partial and
    the receive slots, ``Plan.split_push``)."""
    return rows * (bn + 8) * 4 <= stages * (bm + bn) * BK * plan_cost.in_bytes(dtype)


def stages_for(bm: int, bn: int, schedule: str, dtype: str = "bf16", col_split: bool = False) -> int:
    """The deepest ring that fits (up to MAX_STAGES); split-K also needs its bm x (bn + 8) fp32 partial
    to fit over the stages. 0 if none fits."""
    for q in range(MAX_STAGES, 1, -1):
        if smem_bytes(bm, bn, q, schedule, dtype, col_split) <= SMEM_LIMIT and (
                schedule != "split_k" or split_rows_fit(bm, bm, bn, q, dtype)):
            return q
    return 0


def ring_stages(bm: int, bn: int, schedule: str, dtype: str, col_split: bool, swapped: bool, pm: int, pn: int,
                K: int, prof: DeviceProfile) -> int:
    """The ring of a plan for the kernel's pm x pn x K problem: ``stages_for``'s, or for a plain 64-row
    data-parallel tile of one wave over DEEP_RING_MIN_ROWS to DEEP_RING_MAX_ROWS rows of tiles and K >=
    DEEP_RING_MIN_K the deepest up to DEEP_RING_STAGES that fits (the rule at DEEP_RING_STAGES)."""
    q = stages_for(bm, bn, schedule, dtype, col_split)
    rows = math.ceil(pm / bm)
    one_wave = rows * math.ceil(pn / bn) <= prof.sm_count
    if (swapped or col_split or bm != 64 or schedule != "data_parallel" or K < DEEP_RING_MIN_K
            or not DEEP_RING_MIN_ROWS <= rows <= DEEP_RING_MAX_ROWS or not one_wave):
        return q
    return max([q] + [s for s in range(q + 1, DEEP_RING_STAGES + 1)
                      if smem_bytes(bm, bn, s, schedule, dtype) <= SMEM_LIMIT])


def heavy_epilogue(out_dtype: str, bias_dtype, has_c: bool, activation, direct: bool) -> bool:
    """Epilogues that hold more registers than a 16-bit TMA-stored plain/bias/relu one."""
    return out_dtype == "fp32" or has_c or direct or activation in ("gelu", "gelu_tanh", "silu")


def register_problem(bm: int, bn: int, schedule: str, heavy: bool) -> str | None:
    """Why a tile would spill under the consumers' register budget, or None. Accumulators are MI x BN / 2
    floats per thread (MI = 2 for 256-row tiles); two consumers get 232 registers each (setmaxnreg), one
    keeps its entry allocation. Limits calibrated on a compile sweep of every tile x schedule with the
    plainest and the heaviest epilogue (fp32 out, beta * C, bias, gelu, DIRECT); tests/test_plan.py
    compiles the accepted ones and checks for spills. 256-row tiles: data-parallel up to 256 x 192,
    split-K 256 x 160, stream-K (the partial's adds live beside the accumulators) 256 x 144, and with
    a heavy epilogue 256 x 112 (stream-K 256 x 96); 64- and 128-row tiles fit every width. Ping-pong
    consumers hold whole tiles: a 128-row one has a 256-row tile's accumulators per thread (heavy: up to
    128 x 96, as stream-K's; 128 x 112 spills 12 bytes). Global split-K (not offered): see below."""
    two_blocks = bm == 256 or (bm == 128 and schedule == "pingpong")  # m64 blocks per consumer: 2
    acc = (2 if two_blocks else 1) * bn // 2
    if schedule == "split_k_global" and not two_blocks:
        # Its reduction's float4 loads sit beside the accumulators of one-block tiles too (compile sweep,
        # NVRTC 13.5): 128 rows spill past 120 accumulators (128 x 256: 56 bytes), past 80 with a heavy
        # epilogue (128 x 176); 64 rows (one consumer, no setmaxnreg) past 112 heavy (64 x 240).
        limit = (80 if heavy else 120) if bm == 128 else (112 if heavy else 128)
        if acc > limit:
            return f"{acc} accumulators per thread spill with global split-K and this epilogue (limit {limit})"
        return None
    if heavy:
        # global split-K: its reduction holds 16 float4 loads beside the accumulators; 256 x 80 spills
        limit = {"stream_k": 96, "pingpong": 96, "split_k_global": 0}.get(schedule, 112)
    else:
        limit = {"data_parallel": 192, "split_k": 160, "stream_k": 144, "pingpong": 192,
                 "split_k_global": 112}[schedule]  # global split-K: 256 x 128 spills 56 bytes
    if not two_blocks or acc <= limit:
        return None
    return f"{acc} accumulators per thread spill with this schedule and epilogue (limit {limit})"


def tile_problem(bm: int, bn: int, schedule: str, *, dtype: str = "bf16", b_mn: bool = False,
                 heavy: bool = False) -> str | None:
    """Why the kernel cannot be instantiated with this tile and schedule, or None."""
    if (bm, bn) not in TILES:
        return f"{bm}x{bn} is not in the tile space"
    if schedule == "pingpong" and bm > 128:
        return "ping-pong consumers hold whole tiles of 64 or 128 rows"
    if b_mn and bn % 64:
        return "MN-major B is loaded in 64-column boxes: BN must be a multiple of 64"
    if not stages_for(bm, bn, schedule, dtype):
        return "no pipeline depth fits in shared memory"
    return register_problem(bm, bn, schedule, heavy)


def gsk_few_tiles(M: int, N: int, K: int, bm: int, bn: int, swapped: bool, prof: DeviceProfile) -> bool:
    """Whether global split-K is offered on this tile of the kernel's M x N x K problem although the schedule
    is not (OFFERED_SCHEDULES' comment): few 128 x <= GSK_FEW_MAX_BN tiles over a deep K, not swapped (then
    in GSK_FEW_SPLITS ranks of at least GSK_FEW_MIN_STEPS k-steps)."""
    return (prof.gsk_few_tiles_factor > 0 and bm == 128 and bn <= GSK_FEW_MAX_BN and not swapped
            and M >= GSK_FEW_MIN_M and math.ceil(K / BK) // GSK_FEW_SPLITS >= GSK_FEW_MIN_STEPS
            and GSK_FEW_TILES_SHARE * math.ceil(M / bm) * math.ceil(N / bn) <= prof.sm_count)


def _schedules(M: int, N: int, K: int, bm: int, bn: int, prof: DeviceProfile, offered=OFFERED_SCHEDULES,
               few: bool = False):
    """(schedule, splits, sk_tiles, sk_ctas, grid) worth scoring for one tile; ``few``: global split-K too, in
    GSK_FEW_SPLITS ranks (``gsk_few_tiles``)."""
    G = prof.sm_count
    tiles = math.ceil(M / bm) * math.ceil(N / bn)
    k = math.ceil(K / BK)
    yield "data_parallel", 1, 0, 0, min(G, tiles)
    if "pingpong" in offered and bm <= 128 and tiles > G:  # a CTA with one tile has nothing to overlap
        yield "pingpong", 1, 0, 0, G
    for s in range(2, MAX_CLUSTER + 1):
        per = math.ceil(k / s)
        # Every split at least MIN_SPLIT_K_STEPS long, none empty, and the GPU holds such a cluster.
        if k // s >= MIN_SPLIT_K_STEPS and (s - 1) * per < k and prof.clusters(s) >= 1:
            yield "split_k", s, 0, 0, tiles * s
    # Hybrid stream-K: the partial wave's tiles (or it and one full wave) streamed over the SMs, where the
    # profile offers it (``devices.stream_k_offered``).
    full, rem = divmod(tiles, G)
    # Spread over all SMs, or over 2-4 CTAs per tile (an owner adds fewer partials).
    streamed = sorted({rem, rem + G if full else 0} - {0}) if prof.stream_k_offered else []
    for sk_tiles in streamed:
        most = min(G, sk_tiles * k // MIN_SK_STEPS)
        for ctas in sorted({most} | {sk_tiles * s for s in (2, 3, 4) if sk_tiles * s < most}):
            if ctas > sk_tiles:  # else every CTA would run whole tiles: that is data-parallel
                yield "stream_k", 1, sk_tiles, ctas, G if tiles > sk_tiles else ctas
    # Global split-K: the same streamed tiles, each cut into `s` aligned k-ranges (one CTA each, no
    # cluster), reduced by all s CTAs together.
    if "split_k_global" in offered or few:
        splits = range(2, MAX_GLOBAL_SPLITS + 1) if "split_k_global" in offered else (GSK_FEW_SPLITS,)
        for sk_tiles in sorted({rem, rem + G if full else 0} - {0}):
            for s in splits:
                if s * sk_tiles <= G and k // s >= MIN_SPLIT_K_STEPS:
                    yield "split_k_global", s, sk_tiles, s * sk_tiles, G if tiles > sk_tiles else s * sk_tiles


def candidates(M: int, N: int, K: int, *, dtype=None, out_dtype=None, profile: DeviceProfile | None = None,
               device=None, bias_dtype=None, has_c: bool = False, activation: str | None = None,
               a_mn: bool = False, b_mn: bool = False, direct: bool | None = None,
               schedules=None, swap_ab: bool | None = None, mcast: bool | None = None,
               a_pitch: int | None = None, b_pitch: int | None = None, swap_twin: bool | None = None) -> list[Plan]:
    """Every plan the engine kernel can run for the problem, fastest first by the model. Arguments as
    for ``plan``; schedules: those to consider (default ``OFFERED_SCHEDULES``; ``SCHEDULES`` for all);
    swap_ab: also offer swapped plans where they apply (``swap_problem``; None: the module's SWAP_AB);
    mcast: also offer data-parallel plans with B multicast (``mcast_problem``; None: MCAST_OFFERED's rule);
    swap_twin: put the swapped twin of a plain 64-row pick first where ``swap_twin`` finds one (None:
    SWAP_TWIN)."""
    prof = _profile(profile, device)
    dt = dtype_name(dtype)
    if dt == "fp32":
        raise ValueError("the engine kernel takes bf16 or fp16 operands")
    odt = dtype_name(out_dtype) if out_dtype is not None else dt
    bdt = dtype_name(bias_dtype) if bias_dtype is not None else None
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; known: {[a for a in ACTIVATIONS if a]}")
    if min(M, N, K) < 1:
        raise ValueError(f"M, N, K must be >= 1, got {M}, {N}, {K}")
    if direct is None:  # a contiguous output: rows of N elements are 16-byte aligned or not
        direct = (N * plan_cost.in_bytes(odt)) % 16 != 0
    offered = OFFERED_SCHEDULES if schedules is None else tuple(schedules)
    if schedules is None and prof.gsk_rank_factor > 0:
        offered += ("split_k_global",)
    swap = (SWAP_AB if swap_ab is None else swap_ab) and swap_problem(M, odt) is None
    mis = plan_cost.misaligned_operands(M, N, K, a_mn, b_mn, dt, a_pitch, b_pitch)
    mc = MCAST_OFFERED if mcast is None else mcast
    if mc is None:  # where B's rows load slowly (the bytes multicast halves): measured on K % 16 == 8
        mc = mis[1]
    twin = (SWAP_TWIN if swap_twin is None else swap_twin) and swap and M >= SWAP_TWIN_MIN_M
    key = (M, N, K, dt, odt, bdt, has_c, activation, a_mn, b_mn, direct, id(prof), offered, swap, mc, mis, twin,
           SWAP_PAD_ANY, SWAP_PAD_SPAN, SWAP_PAD_SPAN_MIN_K, DEEP_RING_STAGES)
    hit = _CACHE.get(key)
    if hit is None or hit[0] is not prof:  # (a profile's dict field makes it unhashable: keyed by identity)
        if len(_CACHE) > 4096:
            _CACHE.clear()
        hit = _CACHE[key] = (prof, _candidates(M, N, K, dt, odt, bdt, has_c, activation, a_mn, b_mn, direct, prof,
                                                      offered, swap, mc, mis, twin))
    return list(hit[1])


_CACHE: dict = {}


def swap_problem(M: int, out_dtype: str) -> str | None:
    """Why no swapped plan is offered for M tokens and this output dtype, or None."""
    if M > SWAP_PAD_MAX_M and not SWAP_WIDE:
        return f"swap AB is offered up to M = {SWAP_PAD_MAX_M} tokens (SWAP_WIDE is off)"
    if out_dtype == "fp32":
        return "the transposed store writes 16-bit output only"
    return None


def mcast_problem(tiles_m: int, bm: int, bn: int, b_mn: bool, swapped: bool, heavy: bool,
                  prof: DeviceProfile) -> str | None:
    """Why a data-parallel plan cannot share B by multicast in clusters of two, or None."""
    if heavy and bm == 256 and bn > 96:  # compile sweep (tests/test_engine2.py): 256 x 112 spills 12 bytes
        return f"{bn} accumulators per thread spill with B multicast and this epilogue (limit 96)"
    if swapped:
        return "swapped plans do not multicast"
    if b_mn:
        return "B multicast loads halves of a K-major B tile"
    if tiles_m < 2:
        return "one row of tiles: no vertical neighbour to share B with"
    if bn % 16 or prof.clusters(2) < 1:
        return "each half of B must be whole 8-row swizzle atoms, in clusters of two the GPU holds"
    return None


def col_split_problem(bm: int, bn: int, schedule: str, b_mn: bool, swapped: bool, mcast: int = 1) -> str | None:
    """Why a plan cannot split its tile's columns between two consumers (GemmTraits::COL_SPLIT), or None."""
    if bm != 64 or schedule != "data_parallel" or mcast > 1:
        return "the column split is for 64-row data-parallel tiles without multicast"
    if bn % 32:
        return "each consumer's half must be whole 16-column wgmmas"
    if b_mn or swapped:
        return "the column split reads a K-major B's rows and stores plain (not transposed) tiles"
    return None


def _candidates(M, N, K, dt, odt, bdt, has_c, activation, a_mn, b_mn, direct, prof, offered,
                swap=False, mcast=False, mis=(False, False), twin=False) -> tuple[Plan, ...]:
    heavy = heavy_epilogue(odt, bdt, has_c, activation, direct)
    out_bytes = plan_cost.in_bytes(odt)
    plans = []
    # Swapped plans tile the transposed problem (N x M x K: the weight's rows by the tokens), the kernel's
    # B operand then being A (so A's layout limits its boxes), at widths up to the tokens rounded to 16.
    problems = [(False, M, N, b_mn)] + ([(True, N, M, a_mn)] if swap else [])
    wide = M > SWAP_PAD_MAX_M  # SWAP_WIDE: 128- and 256-row data-parallel and ping-pong, any token columns
    padded = SWAP_MAX_M < M <= SWAP_PAD_MAX_M  # data-parallel swapped plans of few token columns only
    for swapped, pm, pn, kb_mn in problems:
        for bm, bn in TILES:
            if swapped and (bn > math.ceil(M / 16) * 16 or (padded and math.ceil(M / bn) > SWAP_PAD_COLUMNS)
                            or (wide and bm < 128)):
                continue
            narrow_tall = (bm, bn) in NARROW_TALL
            if narrow_tall and (not swapped or bn < M or not _tall_fills(pm, pn, bm, bn, prof.sm_count)):
                continue
            if swapped and heavy and bm == 256 and bn > 96:  # its transposed epilogue: 256 x 112 spills 16 bytes
                continue
            tile = _tile_plans(swapped, pm, pn, K, bm, bn, dt, odt, bdt, has_c, activation, a_mn, b_mn, kb_mn,
                               direct, heavy, out_bytes, prof, offered, mcast, mis[::-1] if swapped else mis)
            dp_only = narrow_tall or (swapped and padded)
            plans += [p for p in tile if not (dp_only and p.schedule != "data_parallel")
                      and not (swapped and wide and p.schedule not in ("data_parallel", "pingpong"))]
    prefer_swap = swap and M <= SWAP_PREFER_M and _swap_preferred(plans, prof)
    plans.sort(key=lambda p: (prefer_swap and not p.swap_ab, plan_key(p)))
    if swap and wide and plans and plans[0].swap_ab:
        plain = next((p for p in plans if not p.swap_ab), None)
        if plain is not None and plans[0].predicted_s >= SWAP_WIDE_MARGIN * plain.predicted_s:
            plans.remove(plain)
            plans.insert(0, plain)
    if swap and (padded or (wide and SWAP_PAD_ANY)) and plans and not plans[0].swap_ab and \
            _padding_prefers_swap(M, plans, wide):
        first = next(p for p in plans if p.swap_ab)
        plans.remove(first)
        plans.insert(0, first)
    first = swap_twin(plans, M, N, K, dt, odt, bdt, has_c, activation, a_mn, b_mn, direct, heavy, out_bytes, prof,
                      offered, mis) if twin and plans else None
    if first is not None:
        if first in plans:
            plans.remove(first)
        plans.insert(0, first)
    return tuple(plans)


def swap_twin(plans, M, N, K, dt, odt, bdt, has_c, activation, a_mn, b_mn, direct, heavy, out_bytes, prof, offered,
              mis) -> Plan | None:
    """SWAP_TWIN's rule: the swapped twin of ``plans``' first plan (ranked) where it goes first, else None.
    The first must be a plain 64-row data-parallel plan whose width exceeds 64 (so the twin's ceil(M / bn)
    readers of each weight panel are fewer than its ceil(M / 64)), of a weight larger than the tokens (N > M:
    the twin's token panels have more readers, ceil(N / 64) against ceil(N / bn)); the twin, the same tile
    over the transposed problem, is taken from ``plans`` or priced here (past SWAP_PAD_MAX_M and over more
    than SWAP_PAD_COLUMNS token columns no 64-row swapped plan is listed), and goes first where priced within
    SWAP_TWIN_MARGIN."""
    first = plans[0]
    if (first.swap_ab or first.bm != 64 or first.schedule != "data_parallel" or first.mcast > 1 or N <= M
            or first.bn <= 64 or first.bn > math.ceil(M / 16) * 16 or "data_parallel" not in offered):
        return None
    twin = next((p for p in plans if p.swap_ab and p.schedule == "data_parallel" and p.mcast == 1
                 and (p.bm, p.bn) == (64, first.bn)), None)
    if twin is None:
        tile = _tile_plans(True, N, M, K, 64, first.bn, dt, odt, bdt, has_c, activation, a_mn, b_mn, a_mn, direct,
                           heavy, out_bytes, prof, ("data_parallel",), False, mis[::-1])
        twin = next((p for p in tile if p.schedule == "data_parallel"), None)
    if twin is None or twin.predicted_s > SWAP_TWIN_MARGIN * first.predicted_s:
        return None
    return twin


def _wave_fill(tiles: int, sms: int) -> float:
    """The share of the SMs' tile slots a data-parallel launch fills: tiles / (waves x SMs)."""
    return tiles / (math.ceil(tiles / sms) * sms)


def _tall_fills(pm: int, pn: int, bm: int, bn: int, sms: int) -> bool:
    """Whether a NARROW_TALL swapped tile (pm weight rows x pn tokens) keeps the SMs as busy as a weight
    stream needs: its waves filled to TALL_MIN_FILL at least, and no less than the 64-row tile's of the same
    width. Measured (H200, engine_broad_tall.jsonl at 4188a14, the 21 decode shapes the tall tiles moved):
    where they filled 0.85-1.0 they ran even or faster (32x43008x5376 128 x 32 0.905 -> 0.978x torch.mm,
    8x28672x4096 256 x 16 0.921 -> 0.954); at 0.73 or less they lost where the 64-row tile filled more
    (1x24576x1536 256 x 16, 96 tiles: 1.044 -> 0.969; 32x24576x1536 0.994 -> 0.937; 16x12288x4096 128 x 16
    0.969 -> 0.947)."""
    tiles = math.ceil(pm / bm) * math.ceil(pn / bn)
    fill = _wave_fill(tiles, sms)
    return fill >= TALL_MIN_FILL and fill >= _wave_fill(math.ceil(pm / 64) * math.ceil(pn / bn), sms) - 1e-9


def _padding_prefers_swap(M: int, plans, wide: bool = False) -> bool:
    """SWAP_PAD_MAX_M's rule (and SWAP_PAD_ANY's): whether the model's best swapped plan among ``plans``
    (ranked, a plain one first) goes before the best plain plan, by the rows each pads the tokens to.
    ``wide``: past SWAP_PAD_MAX_M, where it applies only if the plain plan pads SWAP_PAD_WIDE_MIN times the
    swapped one's tokens or more. Neither applies where the swapped plan's critical path is longer
    (SWAP_PAD_SPAN)."""
    plain = plans[0]
    swapped = next((p for p in plans if p.swap_ab), None)
    schedules = ("data_parallel", "pingpong") if SWAP_PAD_ANY else ("data_parallel",)
    if swapped is None or plain.schedule not in schedules:
        return False
    if swapped.bm == 64 and swapped.tiles > swapped.grid:  # one consumer over several waves (see the rule)
        return False
    padded = math.ceil(M / plain.bm) * plain.bm / (math.ceil(M / swapped.bn) * swapped.bn)
    if wide and padded < SWAP_PAD_WIDE_MIN:
        return False
    if SWAP_PAD_SPAN is not None and plain.K >= SWAP_PAD_SPAN_MIN_K and \
            _tile_span(swapped) > SWAP_PAD_SPAN * _tile_span(plain):
        return False
    return swapped.predicted_s < plain.predicted_s * padded ** SWAP_PAD_EXPONENT


def _tile_span(p: Plan) -> int:
    """A data-parallel or ping-pong plan's critical path in tile areas: the tiles its busiest CTA runs
    (ceil(tiles / grid)) times the tile's bm x bn."""
    return math.ceil(p.tiles / p.grid) * p.bm * p.bn


def _swap_preferred(plans, prof: DeviceProfile) -> bool:
    """``SWAP_PREFER_M``'s rule: whether the model's best swapped plan among ``plans`` goes before every plain
    one: it is not stream-K and is priced under ``SWAP_PREFER_MARGIN`` times the best plain plan
    (``SWAP_PREFER_WAVES_MARGIN`` where it runs past one wave on ``prof``'s SMs, ``runs_past_one_wave``, over
    a K of ``SWAP_PREFER_WAVES_MIN_K`` or more)."""
    swapped = [p for p in plans if p.swap_ab]
    if not swapped:
        return False
    best = min(swapped, key=plan_key)
    plain = [p for p in plans if not p.swap_ab]
    past = best.K >= SWAP_PREFER_WAVES_MIN_K and runs_past_one_wave(best, prof)
    margin = SWAP_PREFER_WAVES_MARGIN if past else SWAP_PREFER_MARGIN
    if plain and best.predicted_s >= margin * min(plain, key=plan_key).predicted_s:
        return False
    return best.schedule != "stream_k"


def runs_past_one_wave(p: Plan, prof: DeviceProfile) -> bool:
    """Whether a data-parallel, ping-pong or split-K plan has more tiles than run at once: more than its
    CTAs (one tile each), or for split-K more than the clusters of ``p.splits`` CTAs ``prof``'s GPU holds."""
    if p.schedule == "split_k":
        return p.tiles > max(1, prof.clusters(p.splits))
    if p.schedule in ("data_parallel", "pingpong"):
        return p.tiles > p.grid
    return False


def _tile_plans(swapped, pm, pn, K, bm, bn, dt, odt, bdt, has_c, activation, a_mn, b_mn, kb_mn, direct, heavy,
                out_bytes, prof, offered, mcast=False, misaligned=(False, False)) -> list[Plan]:
    """The plans of one tile for the kernel's problem pm x pn x K (the transposed one when swapped);
    misaligned: (A, B) of that problem (``plan_cost.misaligned_operands``)."""
    plans = []
    if mcast and "data_parallel" in offered and not tile_problem(bm, bn, "data_parallel", dtype=dt, b_mn=kb_mn,
                                                                  heavy=heavy):
        tm = math.ceil(pm / bm)
        if mcast_problem(tm, bm, bn, kb_mn, swapped, heavy, prof) is None:
            stages = stages_for(bm, bn, "data_parallel", dt)
            tiles = math.ceil(tm / 2) * 2 * math.ceil(pn / bn)
            t = plan_cost.predict_s(pm, pn, K, bm=bm, bn=bn, schedule="data_parallel", stages=stages, prof=prof,
                                    dtype=dt, out_bytes=out_bytes, direct=direct, mcast=2, misaligned=misaligned)
            plans.append(Plan(M=pm, N=pn, K=K, bm=bm, bn=bn, schedule="data_parallel", stages=stages,
                              grid=min(2 * prof.clusters(2), tiles), dtype=dt, out_dtype=odt, bias_dtype=bdt,
                              has_c=has_c, activation=activation, a_mn=a_mn, b_mn=b_mn, direct=direct,
                              predicted_s=t, tie_s=t, mcast=2))
    few = "split_k_global" not in offered and gsk_few_tiles(pm, pn, K, bm, bn, swapped, prof)
    for sched, splits, sk_tiles, sk_ctas, grid in _schedules(pm, pn, K, bm, bn, prof, offered, few):
        if tile_problem(bm, bn, sched, dtype=dt, b_mn=kb_mn, heavy=heavy):
            continue
        if sched == "pingpong" and (direct or K % 16):
            # Measured (H200, d107e97): where the router ran ping-pong on aligned problems it gained
            # 2.5% (29 of 31 shapes faster); with direct stores or rows of K not 32-byte aligned it
            # lost 9% (6 of 7 slower; its smaller tiles pay the misaligned sectors more often).
            continue
        split = COL_SPLIT_OFFERED and col_split_problem(bm, bn, sched, kb_mn, swapped) is None
        stages = ring_stages(bm, bn, sched, dt, split, swapped, pm, pn, K, prof)
        t = plan_cost.predict_s(pm, pn, K, bm=bm, bn=bn, schedule=sched, stages=stages, splits=splits,
                                sk_tiles=sk_tiles, sk_ctas=sk_ctas, prof=prof, dtype=dt, out_bytes=out_bytes,
                                direct=direct, misaligned=misaligned, col_split=split)
        u = t
        if swapped and pn <= SWAP_PREFER_M:  # few tokens: floor ties ranked by the SMs' own time (rank_key)
            u = plan_cost.predict_s(pm, pn, K, bm=bm, bn=bn, schedule=sched, stages=stages, splits=splits,
                                    sk_tiles=sk_tiles, sk_ctas=sk_ctas, prof=prof, dtype=dt, out_bytes=out_bytes,
                                    direct=direct, misaligned=misaligned, floor=False)
        M, N = (pn, pm) if swapped else (pm, pn)
        evict = (EVICT_WEIGHT_OFFERED and weight_read_once(pm, pn, bm, bn, swapped)
                 and N * K > EVICT_WEIGHT_ABOVE_ELEMENTS)
        rank = 0.0
        if sched == "split_k_global":
            rank = t * (prof.gsk_few_tiles_factor if few else prof.gsk_rank_factor)
        plans.append(Plan(M=M, N=N, K=K, bm=bm, bn=bn, schedule=sched, stages=stages, grid=grid, splits=splits,
                          sk_tiles=sk_tiles, sk_ctas=sk_ctas, dtype=dt, out_dtype=odt, bias_dtype=bdt,
                          has_c=has_c, activation=activation, a_mn=a_mn, b_mn=b_mn, direct=direct,
                          predicted_s=t, swap_ab=swapped, tie_s=u, col_split=split, rank_s=rank,
                          evict_weight=evict))
    return plans


def weight_read_once(pm: int, pn: int, bm: int, bn: int, swapped: bool) -> bool:
    """Whether each weight box of the kernel's pm x pn problem is read by one CTA only: the tokens (pm rows,
    or pn columns when swapped) are one tile (``EVICT_WEIGHT_OFFERED``)."""
    return (pn <= bn) if swapped else (pm <= bm)


def rank_key(predicted_s: float, M: int, schedule: str, splits: int, bm: int, bn: int, stages: int,
             tie_s: float | None = None, ctas: float = 1.0) -> tuple:
    """How candidates are ordered: by predicted time, ties (at the HBM floor) broken for data-parallel
    before split or streamed, then by ``tie_s`` (``Plan.tie_s``: for swapped plans of up to SWAP_PREFER_M
    tokens the model's time without the floor, else the price), then the grid's ring in bytes (``ctas``,
    ``streaming_ctas``: the CTAs loading on average over the waves, x stages x (A rows loaded + bn): a weight
    streamed from HBM runs faster with more bytes in flight; 64 x 256 with 5 stages ran 3-7% faster than
    128 x 256 with 4 at M <= 32, broad set; counted over the grid rather than per CTA, the 18 changed ties
    of tie_break_probe.jsonl ran x1.029, none slower), then the tile that pads the rows less (ceil(M / bm) x bm
    rows multiplied), then the larger tile.

    The swapped plans' ``tie_s``: at the decode weight streams every swapped tile height is priced at the
    floor, but taller tiles re-read the tokens less and run fewer tiles a SM. Measured (H200,
    swap_tall_probe.jsonl, 16 shapes): 128 weight rows a tile against 64 at 32x14336x4096 1.014x torch.mm
    against 0.926, 8x28672x4096 0.994 / 0.934, 32x43008x5376 0.965 / 0.906 (its 256-row tiles, 1.27
    waves: 0.883); 64 rows where taller tiles leave SMs idle (32x8192x8192 0.991 / 0.973). The unfloored
    time ranks those the same way on 14 of the 16 shapes (the two others within 1%).

    The padded rows: where the price and the ring tie two plans that differ in tile height only, a 128-row
    tile over at most 64 rows multiplies a whole 64-row block of padding with a second consumer warpgroup.
    Measured (H200, the broad runs' records, every same-run pair of plain split-K plans at M <= 64 that
    differ only in the height): the 64-row plan ran faster in 418 of 456 pairs (x1.055 geomean) and in all
    32 pairs of 64 columns (x1.040; 64x4096x3584 in each of 21 runs, +0.1-7%). Ranked before the larger
    tile, it moves 14 of 1,703 drawn picks, all 128 x 64 split-K to 64 x 64 at M 40-64; timed against the old
    picks (H100, h100_tie_pad_probe.jsonl, two rounds) all 14 ran faster, x1.055 geomean (x1.038-1.077). The
    rows are the kernel's M (a swapped plan's are the weight's), so at such a tie a plain plan of few tokens
    also goes before a swapped one: padded MMA area instead (rows x columns multiplied over those wanted)
    would move 5 more picks at M = 48 to swapped 64 x 48 plans, which ran 0.5-3% slower on all 10 shapes
    timed (h100_tie_area_probe.jsonl)."""
    rows = min(bm, math.ceil((M - (math.ceil(M / bm) - 1) * bm) / 8) * 8)
    tie = predicted_s if tie_s is None else tie_s
    return (round(predicted_s, 9), SCHEDULES.index(schedule), splits, round(tie, 9), -ctas * stages * (rows + bn),
            math.ceil(M / bm) * bm, -bm * bn)


def plan_key(p: Plan) -> tuple:
    """``rank_key`` of a plan (by ``rank_s`` where it is set)."""
    return rank_key(p.rank_s or p.predicted_s, p.kernel_m, p.schedule, p.splits, p.bm, p.bn, p.stages, p.tie_s or None,
                    streaming_ctas(p.kernel_m, p.kernel_n, p.bm, p.bn, p.splits, p.grid))


def streaming_ctas(m: int, n: int, bm: int, bn: int, splits: int, grid: int) -> float:
    """The CTAs a plan of the kernel's m x n problem keeps streaming on average over its waves: its CTAs of
    work over the waves they take on its grid (a partial last wave leaves SMs without loads in flight)."""
    work = math.ceil(m / bm) * math.ceil(n / bn) * splits
    return work / math.ceil(work / max(1, grid))


def plan(M: int, N: int, K: int, *, dtype=None, out_dtype=None, device=None, profile: DeviceProfile | None = None,
         bias_dtype=None, has_c: bool = False, activation: str | None = None, a_mn: bool = False,
         b_mn: bool = False, direct: bool | None = None, swap_ab: bool | None = None,
         a_pitch: int | None = None, b_pitch: int | None = None) -> Plan:
    """The plan the engine kernel would run for out (M x N) = act(alpha A (M x K) @ B (K x N) + beta C + bias).

    dtype: the operands' (torch.bfloat16 (default) or torch.float16, or 'bf16' / 'fp16'); out_dtype: the
    output's (default: dtype; fp32 allowed). device: a torch device (or index) to plan for its SM count and
    L2; profile: a ``DeviceProfile`` (default: the visible GPU's, else the H200's). bias_dtype (None: no
    bias), has_c (beta != 0), activation: the fused epilogue. a_mn / b_mn: the operand is MN-major (A
    stored K x M, B stored N x K... i.e. its M or N dimension contiguous). direct: the output's rows are
    not 16-byte aligned (None: decided from N for a contiguous output). swap_ab: also weigh swapped plans
    (out^T = W @ A^T, at M <= SWAP_MAX_M; None: the module's SWAP_AB). a_pitch / b_pitch: elements between
    the rows the TMA reads of A / B where they are not contiguous (a view's leading stride; rows 16- but
    not 32-byte aligned load slower, ``plan_cost.misaligned_operands``). Pure Python; no GPU needed."""
    return candidates(M, N, K, dtype=dtype, out_dtype=out_dtype, profile=profile, device=device,
                      bias_dtype=bias_dtype, has_c=has_c, activation=activation, a_mn=a_mn, b_mn=b_mn,
                      direct=direct, swap_ab=swap_ab, a_pitch=a_pitch, b_pitch=b_pitch)[0]


def _profile(profile: DeviceProfile | None, device) -> DeviceProfile:
    if profile is not None:
        return profile
    if device is None:
        return H200
    import torch  # a device was named: read it (lazily; the module itself needs no torch)

    from .gpu import gpu_info

    idx = torch.device(device).index if not isinstance(device, int) else device
    info = gpu_info(idx)
    return gpu_profile(info)


# FP8 (e4m3) ---------------------------------------------------------------------------------------------
# The FP8 engine kernel (kernels/engine/gemm_fp8.cu): the same ring, producer, scheduler and epilogue, a
# k-step of 128 (one 128-byte swizzle row of e4m3), k32 wgmmas into a second set of accumulators that is
# promoted into fp32 every ``promote`` k-steps. Data-parallel only so far (no split-K / stream-K for fp8).

FP8_SOURCE = "engine/gemm_fp8.cu"
FP8_KERNEL = "engine_gemm_fp8"
FP8_BK = 128
FP8_SCALES = ("tensor", "block")  # Fp8ScaleMode: one fp32 scalar per operand, or 1x128 (A) / 128x128 (B)
FP8_BLOCK = 128  # block scales: K (and B's N) per scale
FP8_PROMOTE = 1  # default k-steps per promotion: every 128 of K, as DeepGEMM does

# Widths whose two accumulator sets (wgmma's and the promoted fp32) compile without spills, with the
# plainest and the heaviest epilogue (fp32 out, bias, gelu, DIRECT): a compile sweep, kept by
# tests/test_fp8.py (-m slow: all of them). One consumer (64 rows) up to 240 columns, two consumers of 64
# rows up to 224, two of 128 rows (two m64 blocks each) up to 96 (112 spills with the heavy epilogue).
# 128 x 256 with split promotion (FP8_PART_SPLIT): the wgmma's set covers half the columns.
FP8_TILES: tuple[tuple[int, int], ...] = (tuple((64, n) for n in range(16, 241, 16))
                                          + tuple((128, n) for n in range(64, 225, 16)) + ((128, 256),)
                                          + tuple((256, n) for n in range(64, 97, 16)))
# Tiles whose consumers run split promotion (Fp8GemmTraits::PART_SPLIT): per k-step the wgmmas of each
# column part in turn into one part-wide set of registers, each promoted after its own wait (a 64 x 256
# consumer tile in 128 + 64 registers). Needs a promotion every k-step.
FP8_PART_SPLIT = {(128, 256): 2}


def fp8_part_split(bm: int, bn: int) -> int:
    """Column parts of the wgmma's partial sums on this tile (1: the whole width)."""
    return FP8_PART_SPLIT.get((bm, bn), 1)


def fp8_sb_phases(bn: int) -> int:
    """Column offsets at which a bn-wide tile can start inside B's first 128-column scale block
    (Fp8GemmTraits::SB_PHASES, 1 where tiles never straddle a block boundary at a varying column)."""
    return 1 if 128 % bn == 0 or bn % 128 == 0 else 128 // math.gcd(bn, 128)


def fp8_sb_blocks(bn: int) -> int:
    """B scale blocks a bn-wide tile's columns can touch (Fp8GemmTraits::SB_BLOCKS)."""
    return (128 - math.gcd(bn, 128) + bn + 127) // 128


def fp8_scale_slot_bytes(bm: int, bn: int, scale: str = "tensor") -> int:
    """Block scales' slot per stage (Fp8GemmTraits::SCALE_SLOT floats): the tile's bm row scales and the
    B blocks its columns touch, rounded up to 128 bytes (the TMA's destination alignment); none with
    per-tensor scales."""
    if scale != "block":
        return 0
    return (bm + fp8_sb_blocks(bn) + 31) // 32 * 128


def fp8_smem_bytes(bm: int, bn: int, stages: int, scale: str = "tensor") -> int:
    """Dynamic shared memory of the FP8 kernel: alignment, the stages (bm + bn rows of 128 bytes, and the
    block scales' slot), and two output slabs per consumer."""
    return (1024 + stages * ((bm + bn) * FP8_BK + fp8_scale_slot_bytes(bm, bn, scale))
            + (1 if bm == 64 else 2) * 2 * SLAB_BYTES)


def fp8_stages_for(bm: int, bn: int, scale: str = "tensor") -> int:
    """The deepest FP8 ring that fits (up to MAX_STAGES); 0 if none."""
    for q in range(MAX_STAGES, 1, -1):
        if fp8_smem_bytes(bm, bn, q, scale) <= SMEM_LIMIT:
            return q
    return 0


def fp8_predict_s(M: int, N: int, K: int, bm: int, bn: int, stages: int, promote: int,
                  prof: DeviceProfile, part_split: int = 1, scale: str = "tensor") -> float:
    """A first, unfitted model of one data-parallel FP8 plan: the bf16 engine's constants with FP8's
    tensor rate (``flop_per_clk_sm['fp8']``). Per 128-deep k-step the larger of the MMAs and the TMA
    bytes at the SM's share of L2; per promotion the consumer drains its wgmmas (``kstep_turnaround_clk``,
    half hidden by the other consumer with two of them); per tile the fixed cost and the store; the
    busiest SM runs ceil(tiles / SMs) tiles; floored by the operands' HBM time. Split promotion
    (``part_split`` column parts) drains once per part. Block scales on a tile that keeps more than two
    copies of its k-loop (``fp8_sb_phases``: 96, 160, 224 wide) run their k-steps
    ``fp8_block_phases_factor`` slower: measured (H200, session 26, fp8_tiles_probe.jsonl) 128 x 224
    block-scaled plans 3-15% behind 128 x 192 / 128 x 256 ones on the same shapes (8192x6144x4096 385.7
    against 347.6 us) where the model priced them 0.2-5% ahead; per-tensor plans of the same tile do not
    lag so. Otherwise not yet checked against a measurement."""
    clock = prof.plan_clock_mhz * 1e6
    tiles = math.ceil(M / bm) * math.ceil(N / bn)
    active = min(tiles, prof.sm_count)
    k = math.ceil(K / FP8_BK)
    eff = prof.engine_mma_efficiency * (prof.one_consumer_efficiency if bm == 64 else 1.0)
    mma = 2 * bm * bn * FP8_BK / (prof.flop_per_clk_sm.get("fp8", 8192) * clock * eff)
    share = min(prof.sm_l2_bytes_per_s, prof.engine_l2_bytes_per_s / active)
    load = (bm + bn) * FP8_BK / share
    promotions = k if promote == 0 else math.ceil(k / promote)
    drain = prof.kstep_turnaround_clk / clock * (1.0 if bm == 64 else 0.5)
    out_bytes = 2
    phased = prof.fp8_block_phases_factor if scale == "block" and fp8_sb_phases(bn) > 2 else 1.0
    tile_s = k * max(mma, load) * phased + (promotions if promote else 1) * part_split * drain + prof.tile_fixed_s \
        + bm * bn * out_bytes / prof.store_bytes_per_s
    t = prof.launch_s + math.ceil(tiles / prof.sm_count) * tile_s
    hbm = (M * K + N * K + 2 * M * N) / prof.hbm_bytes_per_s
    return max(t, hbm)


@dataclass(frozen=True)
class Fp8Plan(_Tiling):
    """One launch of the FP8 engine kernel: out (M x N) = act(scale * A (M x K, e4m3) @ B (K x N, e4m3,
    stored as an N x K K-major weight) + bias).

    ``scale``: "tensor" (fp32 scalars, applied in the epilogue) or "block" (A 1 x 128, B 128 x 128,
    applied at each promotion). ``promote``: k-steps of 128 between promotions of the wgmma's partial sum
    into fp32 registers (0: once per tile; block scales need 1). ``part_split``: column parts the partial
    sum is computed in, one after the other (``fp8_part_split``; 2 needs promote = 1). Data-parallel over
    ``grid`` persistent CTAs; ``stages`` as many as fit. ``predicted_s``: ``fp8_predict_s`` (unfitted)."""

    M: int
    N: int
    K: int
    bm: int
    bn: int
    stages: int
    grid: int
    scale: str = "tensor"
    promote: int = FP8_PROMOTE
    part_split: int = 1
    out_dtype: str = "bf16"
    bias_dtype: str | None = None
    activation: str | None = None
    direct: bool = False
    predicted_s: float = 0.0
    dtype: str = "e4m3"
    schedule: str = "data_parallel"
    kernel: str = FP8_KERNEL

    BK = FP8_BK

    @property
    def smem_bytes(self) -> int:
        return fp8_smem_bytes(self.bm, self.bn, self.stages, self.scale)

    @property
    def a_rows(self) -> int:
        """Rows of the short A box for the last row of tiles (rounded up to 8)."""
        left = self.M - (self.tiles_m - 1) * self.bm
        return min(self.bm, math.ceil(left / 8) * 8)

    def template_args(self) -> tuple[str, ...]:
        """Fp8GemmTraits<TOut, TBias, BM, BN, STAGES, SCALE, PROMOTE, BIAS, ACT, DIRECT, PART_SPLIT>."""
        b = cpp_bool
        return (_CTYPE[self.out_dtype], _CTYPE[self.bias_dtype or "fp32"], str(self.bm), str(self.bn),
                str(self.stages), str(FP8_SCALES.index(self.scale)), str(self.promote), b(self.bias_dtype),
                str(ACTIVATIONS[self.activation]), b(self.direct), str(self.part_split))

    @property
    def name_expression(self) -> str:
        return f"{FP8_KERNEL}<Fp8GemmTraits<{', '.join(self.template_args())}>>"

    @property
    def compiled_name(self) -> str:
        return f"engine.gemm_fp8[{', '.join(self.template_args())}]"

    def __repr__(self) -> str:
        scale = "per-tensor scales" if self.scale == "tensor" else "1x128 / 128x128 block scales"
        promo = f"promoted every {self.promote * FP8_BK} of K" if self.promote else "promoted once per tile"
        if self.part_split > 1:
            promo += f" in {self.part_split} column parts"
        extra = [x for x in (self.direct and "direct stores", self.bias_dtype and "bias", self.activation) if x]
        return (f"Fp8Plan({self.M}x{self.N}x{self.K} e4m3->{self.out_dtype}: {self.kernel} {self.bm}x{self.bn} "
                f"tiles ({self.tiles}), {scale}, {promo}, data-parallel, {self.stages} stages, grid {self.grid}"
                + (f", {', '.join(extra)}" if extra else "") + f"; predicted {self.predicted_s * 1e6:.1f} us)")


def fp8_tile_problem(bm: int, bn: int, scale: str = "tensor", promote: int = FP8_PROMOTE) -> str | None:
    """Why the FP8 kernel should not run this tile and scale mode, or None. Block scales: a tile whose
    width neither divides 128 nor is a multiple of it straddles B's 128-column scale blocks, starting at
    one of ``fp8_sb_phases(bn)`` column offsets inside its first block; the kernel keeps one copy of its
    k-loop per offset, each with every column group's block known at compile time (no compares). Offered
    up to 4 phases (192: 2; 96, 160, 224: 4). Widths in steps of 16 (8 phases: 8 copies of the k-loop,
    ~2,800 instructions at 128 x 208) are not offered until measured: the run-time compare form they
    replaced ran at 0.57x of per-tensor (H200, 8bae228); 64 x 240 block spills. Split-promotion tiles
    (128 x 256) promote every k-step."""
    if (bm, bn) not in FP8_TILES:
        return f"{bm}x{bn} is not in the FP8 tile space (two accumulator sets per thread must fit)"
    if fp8_part_split(bm, bn) > 1 and promote != 1:
        return f"{bm}x{bn} promotes its column parts every k-step (promote = 1), not {promote}"
    if not fp8_stages_for(bm, bn, scale):
        return "no pipeline depth fits in shared memory"
    if scale == "block" and fp8_sb_phases(bn) > 4:
        return f"block scales on a {bm}x{bn} tile: {fp8_sb_phases(bn)} column phases against B's 128-column blocks"
    return None


def fp8_candidates(M: int, N: int, K: int, *, scale: str = "tensor", out_dtype=None, bias_dtype=None,
                   activation: str | None = None, direct: bool | None = None, promote: int | None = None,
                   profile: DeviceProfile | None = None, device=None) -> list[Fp8Plan]:
    """Every FP8 plan for the problem, fastest first by ``fp8_predict_s``. Arguments as for ``plan_fp8``."""
    prof = _profile(profile, device)
    if scale not in FP8_SCALES:
        raise ValueError(f"unknown scale mode {scale!r}; known: {list(FP8_SCALES)}")
    odt = dtype_name(out_dtype) if out_dtype is not None else "bf16"
    bdt = dtype_name(bias_dtype) if bias_dtype is not None else None
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; known: {[a for a in ACTIVATIONS if a]}")
    if min(M, N, K) < 1:
        raise ValueError(f"M, N, K must be >= 1, got {M}, {N}, {K}")
    if promote is None:
        promote = FP8_PROMOTE
    if promote < 0 or (scale == "block" and promote != 1):
        raise ValueError(f"promote must be >= 0 (block scales: 1, every 128 of K), got {promote}")
    if direct is None:
        direct = (N * plan_cost.in_bytes(odt)) % 16 != 0
    plans = []
    for bm, bn in FP8_TILES:
        if fp8_tile_problem(bm, bn, scale, promote):
            continue
        stages = fp8_stages_for(bm, bn, scale)
        tiles = math.ceil(M / bm) * math.ceil(N / bn)
        split = fp8_part_split(bm, bn)
        plans.append(Fp8Plan(M=M, N=N, K=K, bm=bm, bn=bn, stages=stages, grid=min(prof.sm_count, tiles),
                             scale=scale, promote=promote, part_split=split, out_dtype=odt, bias_dtype=bdt,
                             activation=activation, direct=direct,
                             predicted_s=fp8_predict_s(M, N, K, bm, bn, stages, promote, prof, split, scale)))
    plans.sort(key=lambda p: (round(p.predicted_s, 9), -p.bm * p.bn))
    return plans


def plan_fp8(M: int, N: int, K: int, *, scale: str = "tensor", out_dtype=None, bias_dtype=None,
             activation: str | None = None, direct: bool | None = None, promote: int | None = None,
             profile: DeviceProfile | None = None, device=None) -> Fp8Plan:
    """The plan the FP8 engine kernel would run for out (M x N) = act(scales x A (M x K) @ B (K x N) + bias).

    scale: "tensor" or "block"; out_dtype: torch.bfloat16 (default), torch.float16 or torch.float32 (or
    their names); bias_dtype: None (no bias) or the bias's dtype; promote: k-steps of 128 between
    promotions (default 1; 0 = none until the tile's end, for precision studies). direct: the output's
    rows are not 16-byte aligned (None: decided from N). Pure Python; no GPU needed."""
    return fp8_candidates(M, N, K, scale=scale, out_dtype=out_dtype, bias_dtype=bias_dtype, activation=activation,
                          direct=direct, promote=promote, profile=profile, device=device)[0]
