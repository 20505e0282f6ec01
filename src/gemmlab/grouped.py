"""Grouped GEMM for mixture-of-experts layers: ``gemmlab.grouped_mm``, its plan, launch, torch custom ops and
float64 reference.

    out = grouped_mm(a, b, offsets)              # contiguous: a (T, K) sorted by expert, b (G, N, K)
    out = grouped_mm(a, b, counts=counts)        # masked: a (G, C, K), counts (G,) valid rows per slab

For every group (expert) g: out_g = a_g @ b[g].T, with b[g] the expert's (N, K) weight in nn.Linear's
layout (K-major). One persistent launch of ``kernels/engine/gemm_grouped.cu`` covers all groups; the
groups' rows are read on the device (``offsets`` / ``counts`` are int32 CUDA tensors), so the call makes
no host sync and can be captured in a CUDA graph and replayed with new offsets or counts.

Layouts:

* contiguous: a (T, K); ``offsets`` int32, either (G + 1,) boundaries (group g is rows
  [offsets[g], offsets[g + 1])) or (G,) ends as ``torch._grouped_mm``'s ``offs`` (group g is rows
  [offsets[g - 1], offsets[g]), group 0 from row 0). Groups of any size, 0 included. out (T, N).
* masked (decode under CUDA graphs): a (G, C, K), ``counts`` int32 (G,): rows [0, counts[g]) of slab g
  are valid. out (G, C, N).

Rows of ``out`` that no group covers (contiguous) or past a slab's count (masked) are not written: they
keep what ``out`` held (pass ``out=`` to rely on it; a fresh output leaves them uninitialized).

FP8: e4m3 ``a`` and ``b`` with fp32 ``scale_a`` (one) and ``scale_b`` (one, or one per group): out_g =
scale_a x scale_b[g] x a_g @ b[g].T, the same kernel instantiated with Fp8GemmTraits (the FP8 main loop,
promotion into fp32 every 128 of K); bf16 output by default. Or DeepSeek-V3's block scales (K % 128 ==
0): ``scale_a`` one per row and 128 of K, (T, K / 128) contiguous or (G, C, K / 128) masked; ``scale_b``
one per 128 x 128 block of each expert's weight, (G, ceil(N / 128), K / 128); applied to each 128-deep
partial sum as it is promoted (DeepGEMM's "m-grouped" FP8 GEMMs).

Compared with ``torch._grouped_mm(a, b_t, offs, bias=None, out_dtype=None)`` (2-D x 3-D case): the same
``offs`` convention is accepted (G ends), but ``b`` here is (G, N, K), the weights as stored (torch's
``mat2`` is (G, K, N), i.e. ``b.transpose(-2, -1)``); no bias yet; masked slabs are gemmlab's own.

Checked on the host (before any GPU work; works on fake tensors): dtypes (TypeError), shapes, devices,
strides (offsets / counts contiguous: not copied, so a graph replay reads the tensor the caller
updates), G <= ``MAX_GROUPS`` (UnsupportedProblem). Not checked (that would need a host sync): the values
of offsets / counts. The kernel clamps them: offsets into [0, T], a group ending before it starts is
empty, counts into [0, C]; so bad values give wrong or missing rows, never a read or write outside
a, b or out. Non-monotonic offsets make overlapping or empty groups (overlapping groups both write
their rows; which result lands is unspecified).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

import torch

from . import ops, plan_cost
from .devices import DeviceProfile
from .engine import OutputMaps, _index, point_maps, store_boxes, stream_k_workspace
from .errors import UnsupportedProblem
from .fp8 import check_scale_tensors
from .jit.launch import Launcher, MapSlot, raw_stream
from .planner import Warpgroups, consumer_count, cpp_bool

SOURCE = "engine/gemm_grouped.cu"
KERNEL = "engine_gemm_grouped"
BK = 64
MAX_GROUPS = 512  # the largest group table's capacity: GroupTable<512> in shared memory
TABLES = (128, 512)  # the kernel's group-table capacities (MAX_G); the smallest that holds G is used
MAX_STAGES = 9
SLAB_BYTES = 64 * 128
LAYOUTS = ("contiguous", "masked")
SCHEDULES = ("data_parallel", "stream_k", "pingpong")
_SCHEDULE_INDEX = {"data_parallel": 0, "stream_k": 2, "pingpong": 3}  # gemm_traits.cuh's Schedule
_SCHEDULE_NOTE = {"data_parallel": "", "stream_k": ", stream-K", "pingpong": ", ping-pong"}
# Ping-pong (bf16 / fp16): two consumers, each with whole tiles in turn, so one's epilogue runs under the
# other's k-loop (the dense engine's PINGPONG). A consumer holds a whole tile's accumulators: 64 x 256 and
# 128 x 128 (128 floats a thread, as the cooperative 128 x 256), and 128 x 160 / 128 x 176 (160 / 176
# floats; the dense planner's pick for experts of ~300-2000 rows at N 21504-32768, Mixtral's and DBRX's
# gate/up), whose last 32 / 48 columns go out through a tail piece. 128 x 192 spills 24-32 bytes (the
# grouped epilogue keeps both store paths), 128 x 176 8 where every block is thread-stored
# (``pingpong_problem``).
PINGPONG_TILES = ((64, 256), (128, 128), (128, 160), (128, 176))
# Tiles with a tail piece (bn % 64 columns) are listed by ``candidates``; ``plan`` takes one only when
# offered. Not offered: priced 1-5% ahead of the pick on the 8-16-expert gate/up shapes, they measured
# behind it (H200, abf9e72, grouped_bench --all-tiles, 12 shapes of Mixtral, Mixtral 8x22B, DBRX and
# Qwen1.5-MoE): 128 x 176 ping-pong 0.965x the pick in geomean (0.92-1.00x), 128 x 160 0.919x.
TAIL_TILES_OFFERED = False
# Offered: measured beside the rest (H200, 5074ec4, grouped.jsonl, --all-tiles on 10 MoE shapes) 128 x 128
# ping-pong was the fastest plan on the many-expert shapes (Qwen1.5-MoE / DeepSeek-V2-Lite, 1.05-1.15x
# the data-parallel pick), 64 x 256 ping-pong within noise of 128 x 256 on Mixtral gate/up.
PINGPONG_OFFERED = True
# Stream-K plans (bf16 / fp16) are listed by ``candidates`` beside the data-parallel ones; ``plan`` (what
# grouped_mm runs) picks one only where it is priced at most STREAM_K_MARGIN of the best data-parallel
# plan. Measured (H200, c386676, grouped.jsonl, 128 x 256): Mixtral's down projection at T = 4096 (4.4
# waves) ran 0.828 ms stream-K against 0.960 data-parallel (0.914 for the 256 x 128 pick; priced 0.667 /
# 0.713); where the price saw nothing to stream the stream-K kernel ran 2.5-8% slower than its twin
# (Mixtral T = 16384, Qwen1.5-MoE gate/up): a real tile count differs from the priced one, and the
# kernel's hybrid then streams a wave that gains nothing. Hence the margin: priced 0.936, 0.973 and 0.984
# of the data-parallel pick (Mixtral down T = 4096, Mixtral 8x22B down T = 8192, DBRX down T = 8192;
# 3d23197+) stream-K measured 10%, 5.6% and 3% faster; priced equal, 2.5-8% slower.
STREAM_K_OFFERED = True
STREAM_K_MARGIN = 0.99
# The tile space: one or two consumers, 128 or 256 columns (MoE intermediates are 1408 .. 14336 wide), and
# 256 x 128 (two consumers of 128 rows each: the dense planner's pick for some large-group problems).
TILES = ((64, 128), (64, 256), (128, 128), (128, 256), (256, 128))
# Tiles in claim order (GroupedPlan.claim) compile clean on every tile but 256 x 128 (NVRTC 13.5: its
# two-block accumulators go to local memory, 512 bytes).
CLAIM_REFUSED = ((256, 128),)
# On, the planner's plans would claim their tiles wherever ``claimable``. Off: under the profiler claiming
# halved the DRAM reads of ragged groups, but replayed launches ran no faster (grouped_claim.jsonl).
CLAIM_OFFERED = False
# FP8: two accumulator sets per consumer thread (the wgmma's partial and the promoted fp32 sum) must fit
# (planner.FP8_TILES: up to 224 columns with 64-row consumers), and whole 64-column store pieces.
FP8_TILES = ((64, 128), (64, 192), (128, 128), (128, 192))
# The fitted form (kernels/engine/gemm_grouped_fit.cu): the operands swapped, FIT_BM weight rows a tile (two
# consumers of 64), each group's rows in token tiles of one width fitted on the device (a multiple of
# FIT_Q up to FIT_WMAX), stored by the threads (transposed). Listed by ``candidates`` for contiguous bf16 /
# fp16 launches with 16-bit output and K-major b at up to FIT_MAX_ROWS rows a group on average and
# FIT_MAX_GROUPS groups; ``plan`` takes it there (FIT_OFFERED). Measured (H200): 1.012-1.087x the pick
# before it on the 10 shapes of 60-128 experts at 4-8 rows an expert (Qwen1.5-MoE, OLMoE, Qwen2-57B,
# Qwen3-30B, DeepSeek-V2-Lite at T = 256 / 512; probe_grouped_fit.py, 99368d4), again 1.006-1.086x on six
# of them (grouped_bench --all-tiles, 3b6ce4c); behind it wherever a group needs several token tiles
# (0.80-0.99x) and at 256 experts (0.94-0.96x), where it is not listed. With ping-pong consumers it is taken at
# many rows a group instead (FIT_PINGPONG_OFFERED, below).
FIT_SOURCE = "engine/gemm_grouped_fit.cu"
FIT_KERNEL = "engine_gemm_grouped_fit"
FIT_BM, FIT_WMAX, FIT_Q, FIT_STAGES = 128, 128, 16, 5
FIT_MAX_ROWS = 16
FIT_MAX_GROUPS = 128
FIT_OFFERED = True
# The kernel's SHARED_STORE: one epilogue at FIT_WMAX for every width, its stores bounded at the token tile's
# end, where the shipped build has one a width (2,840 SASS instructions against 5,968; docs/worklog.md,
# session 31). Off until timed on the GPU.
FIT_SHARED_STORE = False
FIT_MAP_SLOTS = 12  # the kernel's token maps (tmT1 .. tmT12): widths FIT_Q .. 12 FIT_Q
FIT_MAX_TILE_ROWS = FIT_WMAX * 0x7FFF  # a group's token tiles, ceil(rows / FIT_WMAX), fit 15 bits of FitTable.shape
# The fitted form with ping-pong consumers (``schedule="pingpong"``, gemm_traits.cuh's schedule 3): each
# consumer a whole FIT_BM x W tile in turn, its thread-stored epilogue under the other's k-loop; the same ring,
# stages, table and grid as the data-parallel form. Measured (H200, 0be9b20, grouped_fit_probe.jsonl, probe
# variant fitpp128_q16, graph replay interleaved with the pick on grouped_bench's routing, 1365-1785 MHz),
# TFLOP/s pick -> fitted ping-pong on 12 shapes of 8-64 experts at 128-512 rows an expert:
#   K >= 2048, pick not stream-K (7, all ahead, x1.067 geomean): 128 rows an expert, G = 64: K 3584
#   374 -> 411 (x1.099), K 2560 387 -> 411 (x1.062), K 2048 359 -> 394 (x1.097); 256-273 rows, G = 60 / 64,
#   K 2048: 466 -> 488 (x1.047), 462 -> 491 (x1.063); 512 rows, G = 8 / 16, K 4096 / 6144: 560 -> 596
#   (x1.064), 560 -> 580 (x1.036);
#   K 1024-1408 (22 k-steps or fewer): 312 -> 314 (x1.006), 454 -> 435 (x0.958), 416 -> 427 (x1.026);
#   the pick stream-K (512 rows, K 14336 / 10752): 567 -> 560 (x0.988), 557 -> 585 (x1.050).
# So ``plan`` takes it (FIT_PINGPONG_OFFERED) where it was ahead by a margin, on the classes measured:
# contiguous bf16 / fp16 with 16-bit output and K-major b, <= FIT_MAX_GROUPS groups, at least
# FIT_PINGPONG_MIN_ROWS rows a group on average (FIT_PINGPONG_MIN_ROWS_WIDE where N >= 2 K: below), K >=
# FIT_PINGPONG_MIN_K (a short k-loop hides less of the thread-stored epilogue: the plan model's k-loop of 16-22
# k-steps is 1.3-1.8x the epilogue, 2.4x or more at K >= 2048; the three short-K shapes x0.958-1.026), the
# tiled pick not stream-K (its partial last wave streamed; the fitted form has none: x0.988 / x1.050, mixed),
# and at most FIT_PINGPONG_ROW_SHARE of the tiled pick's padded rows (``fitted_rows``): each token tile pads
# ~Q / 2 rows where a tiled group pads ~bm / 2, so the saving falls with the rows (x0.95 at 512 rows an
# expert against 128-row tiles, none at ~1024: not measured there, not taken). The plan model does not
# explain the lead (``_fit_pingpong_price`` ties the form with the pick at the HBM floor at 128 rows an expert,
# prices it 5-11% faster at 256-273 rows, where it measured x0.958-1.063, and 8-12% slower at 512 rows, where
# it measured x0.988-1.064): listed at its model price, taken by rule.
# At 64-127 rows a group, only where N >= 2 K (the gate/up class). Measured (H200, 6428b37,
# grouped_fit64_probe.jsonl, graph replay interleaved with the pick on grouped_bench's routing, 1470-1770 MHz),
# TFLOP/s pick -> fitted ping-pong on 12 shapes of 8 / 16 experts at 64 / 96 rows an expert, K 4096-16384
# (Mixtral T = 512 / 768, Mixtral 8x22B T = 512 / 768, DBRX T = 1024 / 1536):
#   gate/up (N = 2 x intermediate, 3.5-7 K; the pick 64 x 256 ping-pong; all 6 ahead, x1.056 geomean): Mixtral
#   255 -> 268 (x1.052), 345 -> 376 (x1.089); 8x22B 332 -> 352 (x1.058), 342 -> 369 (x1.079); DBRX 287 -> 296
#   (x1.031), 353 -> 363 (x1.028);
#   down (N = hidden < K; mixed, x0.987 geomean): Mixtral 278 -> 310 (x1.116, the pick 64 x 128 data-parallel),
#   402 -> 358 (x0.890); 8x22B 262 -> 245 (x0.937, the pick 64 x 128 data-parallel), 361 -> 365 (x1.012); DBRX
#   283 -> 274 (x0.971), 366 -> 369 (x1.008).
# So the line is drawn at N >= 2 K, where all 6 were ahead; elsewhere FIT_PINGPONG_MIN_ROWS stands (N between K
# and 2 K was not measured). It rests on this one probe of 12 shapes, and the plan model does not explain it: it
# prices the pick and the form alike, at the HBM floor, on all 12, gate/up and down.
FIT_PINGPONG_OFFERED = True
FIT_PINGPONG_MIN_ROWS = 128
FIT_PINGPONG_MIN_ROWS_WIDE = 64  # where N >= 2 K
FIT_PINGPONG_MIN_K = 2048
FIT_PINGPONG_ROW_SHARE = 0.96
# The ping-pong form's widest token tile (its plan's bn; the data-parallel form's is FIT_WMAX): 176, the width of
# the dense planner's swapped 128 x 176 ping-pong plan that a loop of dense launches runs per expert
# (docs/worklog.md, sessions 29 and 61; the kernel compiles clean at 5 stages, 192 spills); FIT_PINGPONG_WIDTHS,
# the widths a ping-pong fitted plan may carry (compiled, GPU-tested). Its epilogues (the plan's store_step,
# FIT_STORE_STEPS): 0, one a width, from K = FIT_PINGPONG_WIDE_MIN_K on; below, FIT_PINGPONG_SHORT_K_STORE_STEP =
# 64, one a bucket of widths stored at the bucket's widest (the kernel's STORE_STEP: 16..64 at 64, 80..128 at 128,
# 144..176 at 176), at FIT_PINGPONG_SHORT_K_WMAX wide (176 too). Measured on an H100 (session 61;
# h100_grouped.jsonl), each comparison in one call:
# - 176 against 128, one epilogue a width each (850ac9f, grouped_bench --fitted): at K >= 2560 x1.01-x1.28
#   (Mixtral T = 4096 gate/up x1.10, down x1.13; DBRX T = 8192 x1.12 / x1.23; Qwen2-57B T = 8192 x1.02 / x1.01);
#   at K <= 2048 (64-128 experts of 128-270 rows: OLMoE, Qwen1.5-MoE, Qwen3-30B, DeepSeek-V2-Lite) x0.86-0.97.
#   With every group under 128 rows the two builds ran level: the loss comes from switching among eleven
#   epilogues when one SM runs tiles of many widths, which a deep k-loop hides (the probes).
# - 176 in steps of 64 against 128 with one epilogue a width, through the planner (e211c3f, short_k_store_step):
#   the 7 suite shapes it moves (gate/ups of 128-273 rows a group at K = 2048: OLMoE, Qwen1.5-MoE,
#   DeepSeek-V2-Lite at T = 8192 and 16384, Qwen3-30B at 16384) x1.016-x1.072 (OLMoE T = 8192 x1.037), the 7
#   others within 1.3%.
# - At K >= 2560 the plain 176 build ran 2-4% ahead of the stepped one in two probe runs (within noise): deep K
#   keeps one epilogue a width.
FIT_PINGPONG_WMAX = 176
FIT_PINGPONG_SHORT_K_WMAX = 176
FIT_PINGPONG_WIDE_MIN_K = 2560
FIT_PINGPONG_WIDTHS = (128, 176)
FIT_STORE_STEPS = (0, 64)
FIT_PINGPONG_SHORT_K_STORE_STEP = 64
FIT_SCHEDULES = ("data_parallel", "pingpong")
# The ping-pong fitted form's tile order (the plan's widest_first, the kernel's WIDEST_FIRST): the groups by their
# token tiles' width, the widest first, so the last wave runs the narrowest tiles (longest first, as in list
# scheduling); up to FIT_WIDEST_FIRST_MAX_GROUPS groups (fit_widest_first). Measured on an H100 (session 63,
# docs/worklog.md), each against the same build in group order in one call:
# - grouped_bench --group-order (568904b and 3791eb1, h100_grouped.jsonl), the 5 suite shapes of 8-16 experts it
#   moves: Mixtral down T = 4096 x1.17 / x1.15, DBRX down T = 8192 x1.11 / x1.13, Mixtral gate/up T = 4096
#   x1.04 / x1.03, DBRX gate/up T = 8192 x1.02 / x1.00, Mixtral 8x22B gate/up T = 512 x1.01 / x1.02;
# - probe_grouped_fit.py _wide (568904b, h100_grouped_fit_probe.jsonl): 8-16 experts x1.035 / x1.032 geomean
#   (10 shapes, one epilogue a width / steps of 64), 60-128 experts x1.005 / x0.995 (8 shapes, 0.93-1.05);
# - at 60-128 experts through the planner (f629657, three passes): OLMoE gate/up T = 8192 x1.06-x1.07 but
#   Qwen1.5-MoE gate/up T = 16384 x0.94-x0.96, four others x1.00-x1.03: so the rule stays where it gains.
#   Untimed between 17 and 59 groups.
FIT_WIDEST_FIRST_MAX_GROUPS = 16
E4M3 = torch.float8_e4m3fn
FP8_BLOCK = 128  # block scales: A 1 x 128 (a row's 128 of K), B 128 x 128
_CTYPE = {"bf16": "__nv_bfloat16", "fp16": "__half", "fp32": "float"}
_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
_DTYPES = {v: k for k, v in _NAMES.items()}


def claimable(bm: int, bn: int, dtype: str, schedule: str) -> bool:
    """Whether a plan may take its tiles in claim order (GroupedPlan.claim)."""
    return schedule != "stream_k" and (bm, bn) not in CLAIM_REFUSED and dtype != "e4m3"


def table_groups(groups: int) -> int:
    """The group table's capacity for ``groups`` groups: the smallest of ``TABLES`` that holds them."""
    return next(c for c in TABLES if groups <= c)


def table_bytes(table: int) -> int:
    """GroupTable<table> in static shared memory: first[table + 1], start[table], rows[table] ints."""
    return 4 * (3 * table + 1)


TABLE_BYTES = table_bytes(MAX_GROUPS)


def smem_limit(table: int) -> int:
    """Dynamic shared memory left beside the ring's barriers (256 B) and a group table of ``table`` groups."""
    return 227 * 1024 - 256 - table_bytes(table)


SMEM_LIMIT = smem_limit(MAX_GROUPS)  # the limit with the largest table (every plan fits it at its stages)


def scale_slot_bytes(bm: int, scale: str = "tensor") -> int:
    """FP8 block scales' slot per stage (gemm_grouped.cu's GroupedScales::SCALE_SLOT = bm + 64 floats: a
    box of bm + 4 row scales from the tile's first row rounded down to a multiple of 4, TMA's 16-byte rule
    for a box's innermost coordinate; then, at a 128-byte boundary, a box of 8 column-block scales); none
    for per-tensor scales or bf16."""
    return (bm + 64) * 4 if scale == "block" else 0


def smem_bytes(bm: int, bn: int, stages: int, scale: str = "tensor", schedule: str = "data_parallel") -> int:
    """Dynamic shared memory: alignment, the stages (with FP8 block scales' slots), two output slabs per
    consumer (the group table is static)."""
    return (1024 + stages * ((bm + bn) * BK * 2 + scale_slot_bytes(bm, scale))
            + consumer_count(bm, schedule) * 2 * SLAB_BYTES)


def stages_for(bm: int, bn: int, table: int = MAX_GROUPS, scale: str = "tensor",
               schedule: str = "data_parallel") -> int:
    """The deepest ring that fits beside a group table of ``table`` groups (up to MAX_STAGES). With the
    128-group table 128 x 128 gets 6 stages and 128 x 256 gets 4, as in the dense engine; with 512, 5 and 3.
    FP8 block scales (``scale="block"``) add a slot per stage: 128 x 128 then gets 5 with either table."""
    return next(q for q in range(MAX_STAGES, 1, -1) if smem_bytes(bm, bn, q, scale, schedule) <= smem_limit(table))


def panel_tiles(bm: int, bn: int, K: int, prof: DeviceProfile, in_bytes: int = 2) -> int:
    """m-tiles per panel of the in-group tile order (group_scheduler.cuh). A group of tm m-tiles, tn
    column tiles, run m-fastest, holds tm A tiles (a = bm K bytes each) in L2 while a wave of S = SMs
    tiles covers S / tm column tiles (b = bn K bytes each). If its A rows do not fit in L2 (budget: half
    of it) every wave streams them from HBM again: ~tm a x tm tn / S bytes; in panels of P m-tiles
    (P a <= budget) A is read once and B once per panel: ~tn b x tm / P. Panels win when tm a P > S b,
    i.e. tm > S b / budget. So P = the most m-tiles whose A fits the budget, but at least S b / budget:
    a group of at most P m-tiles runs plain m-fastest. (The kernel evens the panels out: ceil(tm / P)
    panels of equal height.)"""
    budget = prof.l2_bytes / 2
    a, b = bm * K * in_bytes, bn * K * in_bytes
    return max(1, int(budget // a), math.ceil(prof.sm_count * b / budget))


@dataclass(frozen=True)
class GroupedPlan(Warpgroups):
    """One launch of the grouped kernel: ``groups`` groups, ``rows`` = T (contiguous) or C (masked),
    N, K; ``bm`` x ``bn`` tiles, ``stages``, ``grid`` persistent CTAs; ``table`` the group table's
    capacity (``table_groups``); ``panel`` m-tiles per panel of the in-group order (``panel_tiles``);
    ``direct``: every block stored by the threads (out's rows not 16-byte aligned, or at least
    ``ALL_DIRECT_SHARE`` of the blocks cross a group's end; else the blocks inside a group are
    TMA-stored). ``expected_rows``: the rows per group the plan was priced for (the
    real ones are on the device); ``predicted_s`` the model's time for them. ``scale`` (e4m3 only):
    "tensor" (per-tensor scales, in the epilogue) or "block" (1 x 128 / 128 x 128 block scales, at each
    promotion). ``schedule``: "data_parallel", or (bf16 / fp16) "stream_k": the kernel splits the k-steps
    of a partial last wave over every CTA, decided on the device from the real tile count (the dense
    engine's hybrid stream-K; its partials go through ``engine.stream_k_workspace``). ``claim``
    (data-parallel, ping-pong): each CTA's tiles after its first are claimed from a counter in that
    workspace's flags (ClaimedTiles), so the tiles in flight stay consecutive however unevenly they run."""

    layout: str
    groups: int
    rows: int
    N: int
    K: int
    bm: int
    bn: int
    stages: int
    grid: int
    dtype: str = "bf16"
    out_dtype: str = "bf16"
    table: int = MAX_GROUPS
    panel: int = 1 << 30
    direct: bool = False
    expected_rows: float = 0.0
    predicted_s: float = 0.0
    kernel: str = KERNEL
    scale: str = "tensor"
    schedule: str = "data_parallel"
    b_mn: bool = False
    claim: bool = False
    store_step: int = 0  # the fitted ping-pong form's epilogues (FIT_STORE_STEPS): 0 one a width, else a bucket
    widest_first: bool = False  # the fitted form's tiles by token width, widest first (fit_widest_first)

    def __post_init__(self):
        if self.schedule not in SCHEDULES or (self.schedule != "data_parallel" and self.dtype == "e4m3") or (
                self.schedule == "pingpong" and self.bm > 128):
            raise ValueError(f"schedule must be one of {SCHEDULES} (stream_k, pingpong: bf16 / fp16 only; "
                             f"pingpong: 64- or 128-row tiles), got {self.schedule!r} for {self.dtype} "
                             f"{self.bm}x{self.bn}")
        if self.b_mn and (self.dtype == "e4m3" or self.bn % 64):
            raise ValueError(f"MN-major b: bf16 / fp16 operands and tiles 64 columns wide at a time, got "
                             f"{self.dtype} {self.bm}x{self.bn}")
        if self.claim and not claimable(self.bm, self.bn, self.dtype, self.schedule):
            raise ValueError(f"claim: whole bf16 / fp16 tiles in claim order (data-parallel or ping-pong), not "
                             f"stream-K, not "
                             f"{' / '.join(f'{m} x {n}' for m, n in CLAIM_REFUSED)}; got {self.bm} x {self.bn} "
                             f"{self.schedule}")
        if self.fit and (self.layout != "contiguous" or self.dtype not in ("bf16", "fp16") or
                         self.out_dtype not in ("bf16", "fp16") or self.b_mn or self.schedule not in FIT_SCHEDULES
                         or (self.bm, self.stages) != (FIT_BM, FIT_STAGES)
                         or self.bn not in (FIT_PINGPONG_WIDTHS if self.schedule == "pingpong" else (FIT_WMAX,))
                         or not self.direct
                         or self.claim):
            raise ValueError(f"the fitted form ({FIT_KERNEL}): contiguous bf16 / fp16 operands, K-major b, 16-bit "
                             f"output, {FIT_BM} x {FIT_WMAX} data-parallel or {FIT_BM} x "
                             f"{' / '.join(map(str, FIT_PINGPONG_WIDTHS))} ping-pong at {FIT_STAGES} stages, "
                             f"direct stores; got {self!r}")
        if self.store_step and (not self.fit or self.schedule != "pingpong" or self.store_step not in FIT_STORE_STEPS):
            raise ValueError(f"store_step: the fitted form's ping-pong schedule only, one of {FIT_STORE_STEPS}; got "
                             f"{self.store_step} for {self!r}")
        if self.widest_first and not self.fit:
            raise ValueError(f"widest_first: the fitted form's table order only; got {self!r}")
        if self.fit and self.rows > FIT_MAX_TILE_ROWS:
            raise ValueError(f"the fitted form counts a group's token tiles in 15 bits (FitTable): at most "
                             f"{FIT_MAX_TILE_ROWS} rows, got {self.rows}")
        if self.scale not in ("tensor", "block") or (self.scale == "block" and self.dtype != "e4m3"):
            raise ValueError(f"scale must be 'tensor' or 'block' (block: e4m3 only), got {self.scale!r} "
                             f"for {self.dtype}")

    @property
    def fit(self) -> bool:
        """The fitted form (``FIT_KERNEL``): bm weight rows x token tiles of a width fitted to each group."""
        return self.kernel == FIT_KERNEL

    @property
    def smem_bytes(self) -> int:
        return smem_bytes(self.bm, self.bn, self.stages, self.scale, self.schedule)

    @property
    def tiles_n(self) -> int:
        return math.ceil(self.N / self.bn)

    @property
    def sk_ctas(self) -> int:
        """CTAs that may write a stream-K partial (all of them), 0 for data-parallel plans."""
        return self.grid if self.schedule == "stream_k" else 0

    @property
    def workspace_floats(self) -> int:
        """fp32 partial slots a stream-K launch needs: one bm x bn tile per CTA."""
        return self.sk_ctas * self.bm * self.bn

    def template_args(self) -> tuple[str, ...]:
        """GemmTraits<TIn, TOut, TBias, BM, BN, STAGES, A_MN, B_MN, BIAS, C, ACT, DIRECT, SCHEDULE>:
        K-major operands, no epilogue terms, data-parallel (0), stream-K (2) or ping-pong (3); DIRECT only
        where out has no TMA map. e4m3:
        Fp8GemmTraits<TOut, TBias, BM, BN, STAGES, SCALE (0 per-tensor, 1 block), PROMOTE (every 128 of K),
        BIAS, ACT, DIRECT>."""
        direct = cpp_bool(self.direct)
        if self.fit:  # TRANS_OUT (the tile is a block of out^T), DIRECT, data-parallel or ping-pong
            t, o = _CTYPE[self.dtype], _CTYPE[self.out_dtype]
            return (t, o, o, str(self.bm), str(self.bn), str(self.stages), "false", "false", "false", "false", "0",
                    "true", str(_SCHEDULE_INDEX[self.schedule]), "true")
        if self.dtype == "e4m3":
            return (_CTYPE[self.out_dtype], "float", str(self.bm), str(self.bn), str(self.stages),
                    "1" if self.scale == "block" else "0", "1", "false", "0", direct)
        return (_CTYPE[self.dtype], _CTYPE[self.out_dtype], "float", str(self.bm), str(self.bn), str(self.stages),
                "false", cpp_bool(self.b_mn), "false", "false", "0", direct,
                str(_SCHEDULE_INDEX[self.schedule]))

    @property
    def name_expression(self) -> str:
        if self.fit:
            shared = ", true" if FIT_SHARED_STORE else (f", false, {self.store_step}" if self.store_step else "")
            if self.widest_first:  # <.., SHARED_STORE, STORE_STEP, WIDEST_FIRST>
                shared = f", {cpp_bool(FIT_SHARED_STORE)}, {0 if FIT_SHARED_STORE else self.store_step}, true"
            return f"{FIT_KERNEL}<GemmTraits<{', '.join(self.template_args())}>, {self.table}, {FIT_Q}{shared}>"
        traits = "Fp8GemmTraits" if self.dtype == "e4m3" else "GemmTraits"
        return (f"{self.kernel}<{traits}<{', '.join(self.template_args())}>, {LAYOUTS.index(self.layout)}, "
                f"{self.table}{', true' if self.claim else ''}>")

    @property
    def compiled_name(self) -> str:
        if self.fit:
            shared = (", shared store" if FIT_SHARED_STORE else
                      (f", store step {self.store_step}" if self.store_step else ""))
            shared += ", widest first" if self.widest_first else ""
            return f"engine.gemm_grouped_fit[{', '.join(self.template_args())}, {self.table}, {FIT_Q}{shared}]"
        name = "engine.gemm_grouped_fp8" if self.dtype == "e4m3" else "engine.gemm_grouped"
        return f"{name}[{', '.join(self.template_args())}, {self.layout}, {self.table}{', claim' if self.claim else ''}]"

    def __repr__(self) -> str:
        tiles = (f"{self.bm} weight rows x token tiles fitted per group ({FIT_Q}..{self.bn} wide"
                 f"{f', stored in steps of {self.store_step}' if self.store_step else ''}"
                 f"{', widest groups first' if self.widest_first else ''})"
                 f"{_SCHEDULE_NOTE[self.schedule]}" if self.fit else
                 f"{self.bm}x{self.bn} tiles{_SCHEDULE_NOTE[self.schedule]}{', claimed' if self.claim else ''}")
        return (f"GroupedPlan({self.layout}: {self.groups} groups x {self.rows} rows, N={self.N}, K={self.K}, "
                f"{self.dtype}{' block scales' if self.scale == 'block' else ''}{', MN-major b' if self.b_mn else ''}"
                f"->{self.out_dtype}: {self.kernel} {tiles}, {self.stages} stages, "
                f"grid {self.grid}, table {self.table}, panel {min(self.panel, 9999)}"
                f"{', direct stores' if self.direct else ''}; priced for {self.expected_rows:.1f} rows a group: "
                f"{self.predicted_s * 1e6:.1f} us)")


def tiles_m_per_group(rows_per_group: float, bm: int, uneven: bool) -> float:
    """m-tiles of a group of ``rows_per_group`` rows; ``uneven`` (contiguous: the router's sizes vary
    about the mean): each group's last tile is on average half empty, so at least rows / bm + 1/2."""
    if rows_per_group <= 0:
        return 0.0
    even = math.ceil(rows_per_group / bm)
    return max(even, rows_per_group / bm + 0.5) if uneven else float(even)


def crossing_share(rows_per_group: float, bm: int, uneven: bool) -> float:
    """The share of a plan's 64-row blocks that cross a group's end (the last block of each group's m-tiles;
    none when every group ends on a block)."""
    tm = tiles_m_per_group(rows_per_group, bm, uneven)
    if tm == 0 or not (uneven or rows_per_group % 64 != 0):
        return 0.0
    return min(1.0, 64.0 / (tm * bm))


# Where at least this share of the blocks crosses a group's end, every block is stored by the threads: a
# crossing block waits for the earlier TMA stores to leave the shared slabs first, and with groups of ~64
# rows that is most blocks. Measured (H200): DeepSeek-V3's down projection at T = 16384 (256 experts, 64
# rows each on average) ran 64 x 256 in 1.99 ms storing every block directly (6417c0c) and 2.61 ms with
# the mixed stores (d107e97); at 16-68 rows a group (DeepSeek-V2-Lite, Qwen1.5-MoE at T = 4096, T = 256)
# the two were within the runs' noise. The price stays the mixed one: `tile_epilogue_s(direct=True)` is
# fitted to the dense kernel's unaligned rows (scalar stores), not to these 16-byte row stores.
ALL_DIRECT_SHARE = 0.5


def predict_s(groups: int, rows_per_group: float, N: int, K: int, bm: int, bn: int, stages: int,
              prof: DeviceProfile, out_bytes: int = 2, *, uneven: bool = False, direct: bool = False,
              schedule: str = "data_parallel") -> float:
    """The plan model's price of a grouped launch whose groups have ``rows_per_group`` rows on average:
    the dense engine's data-parallel terms of ``plan_cost`` (``kstep_s`` per k-step loading whole bm-row
    boxes, ``tile_epilogue_s``), with the dense model's waves (full waves at all SMs' k-step, the partial
    last wave at its own), floored by the HBM time of A, every expert's weight and out. The epilogue is
    the TMA-stored one except for the 64-row block at each group's end (``tile_epilogue_s(direct=True)``
    for that share of the blocks; all of them with ``direct``). ``uneven``: see ``tiles_m_per_group``.
    Not fitted to grouped records; for one group of M rows (M a multiple of bm) it is
    ``plan_cost.predict_s``'s data-parallel price at the grouped kernel's stages. ``stream_k``: a partial
    last wave's k-steps spread over all SMs (the kernel's device-side hybrid), priced with the dense
    model's stream-K terms (``plan_cost.predict_s``): its k-steps at ``stream_k_kstep_factor``, one owned
    epilogue, the partials written and read, a unit's restart and ``stream_k_fixed_s``."""
    return _price(groups, rows_per_group, N, K, bm, bn, stages, prof, out_bytes, uneven, direct, schedule)[0]


def _price(groups, rows_per_group, N, K, bm, bn, stages, prof, out_bytes, uneven, direct,
           schedule="data_parallel") -> tuple[float, float]:
    """(predict_s, the SMs' busy time without the HBM floor: what breaks a tie at the floor)."""
    tm = tiles_m_per_group(rows_per_group, bm, uneven)
    tiles = math.ceil(groups * tm * math.ceil(N / bn))
    if tiles == 0:
        return prof.launch_s, 0.0
    k = math.ceil(K / BK)
    unique = _unique_bytes(groups, rows_per_group, N, K, out_bytes)
    loaded = tiles * k * (bm + bn) * BK * 2
    share = min(1.0, unique / max(1.0, loaded))

    def ks(active: int) -> float:
        # Ping-pong: the consumers alternate, so a 64-row tile does not pay the lone consumer's penalty, and
        # its k-steps ran at the L2 byte rate with the 4-stage ring of 64 x 256 (measured 461 ns a k-step at
        # Mixtral gate/up, T = 4096, 5074ec4: the byte term 466, the ring's round trip 579), so no ring term.
        pp = schedule == "pingpong"
        return plan_cost.kstep_s(bm, bn, bm, stages, active, share, prof, prof.plan_clock_mhz,
                                 one_consumer=False if pp else None, ring_latency=not pp)

    # Blocks stored by the threads: the one crossing each group's end (none if the groups end on a block).
    f = 1.0 if direct else crossing_share(rows_per_group, bm, uneven)
    epi = ((1.0 - f) * plan_cost.tile_epilogue_s(bm, bn, out_bytes, prof, direct=False)
           + f * plan_cost.tile_epilogue_s(bm, bn, out_bytes, prof, direct=True))
    full, rem = divmod(tiles, prof.sm_count)
    if schedule == "stream_k" and full and rem and rem * k >= prof.sm_count:  # the kernel's rule (gemm_grouped.cu)
        per = math.ceil(rem * k / prof.sm_count)  # every SM's share of the last wave's k-steps
        partial = bm * bn * 4 / prof.partial_bytes_per_s
        reads = math.ceil(k / per) if per < k else 1  # partials the busiest owner adds
        t = (full * (k * ks(prof.sm_count) + epi) + per * ks(prof.sm_count) * prof.stream_k_kstep_factor + epi
             + partial * (1 + reads) + prof.tile_fixed_s + prof.stream_k_fixed_s)
    elif schedule == "pingpong" and full:
        # Past a CTA's first tile an epilogue runs under the other consumer's k-loop, so a tile costs
        # max(k-loop, epilogue); the SM's last epilogue shows. Unlike the dense model's ping-pong price no
        # turn's fixed cost: measured (H200, 5074ec4, 10 MoE shapes) 128 x 128 ping-pong ran ahead of its
        # data-parallel twin by the whole epilogue (Qwen1.5-MoE down, T = 16384: 0.195 against 0.244 ms,
        # ~2.6 us a tile over 19 waves; the model's epilogue there is 2.3 us).
        t = full * max(k * ks(prof.sm_count), epi) + (k * ks(rem) if rem else 0.0) + epi
    else:
        t = full * (k * ks(prof.sm_count) + epi) + (k * ks(rem) + epi if rem else 0.0)
    return prof.launch_s + max(t, unique / prof.hbm_read_bytes_per_s), t


def _unique_bytes(groups, rows_per_group, N, K, out_bytes) -> float:
    """What a grouped launch must move through HBM at least: A and every expert's weight read once (16-bit
    operands), out written once."""
    rows = groups * rows_per_group
    return 2 * (rows * K + groups * N * K) + out_bytes * rows * N


def _hbm_floor_s(groups, rows_per_group, N, K, out_bytes, prof: DeviceProfile) -> float:
    return _unique_bytes(groups, rows_per_group, N, K, out_bytes) / prof.hbm_read_bytes_per_s


def _fit_operands_problem(layout: str, dtype: str, out_dtype: str, b_mn: bool) -> str | None:
    """Why the fitted kernel cannot take these operands (layout, dtypes, b's layout), or None."""
    if layout != "contiguous" or dtype not in ("bf16", "fp16") or out_dtype not in ("bf16", "fp16") or b_mn:
        return "the fitted form takes contiguous bf16 / fp16 operands, K-major b and 16-bit output"
    return None


def fit_kernel_problem(layout: str, dtype: str, out_dtype: str, b_mn: bool, groups: int, rows: int) -> str | None:
    """Why the fitted kernel (``FIT_KERNEL``, either schedule) cannot run a problem, or None where it can."""
    why = _fit_operands_problem(layout, dtype, out_dtype, b_mn)
    if why:
        return why
    if groups > FIT_MAX_GROUPS:
        return f"the fitted form's group table holds {FIT_MAX_GROUPS} groups at {FIT_STAGES} stages"
    if rows > FIT_MAX_TILE_ROWS:
        return f"the fitted form counts a group's token tiles in 15 bits: at most {FIT_MAX_TILE_ROWS} rows"
    return None


def fit_problem(layout: str, dtype: str, out_dtype: str, b_mn: bool, groups: int,
                rows_per_group: float) -> str | None:
    """Why the fitted form (``FIT_KERNEL``, data-parallel) is not listed for a problem, or None where it is."""
    why = _fit_operands_problem(layout, dtype, out_dtype, b_mn)
    if why:
        return why
    if groups > FIT_MAX_GROUPS or rows_per_group > FIT_MAX_ROWS:
        return (f"the fitted form is listed up to {FIT_MAX_GROUPS} groups of {FIT_MAX_ROWS} rows on average "
                f"(measured ahead there only)")
    return None


def fit_pingpong_problem(layout: str, dtype: str, out_dtype: str, b_mn: bool, groups: int, rows: int, N: int,
                         K: int, rows_per_group: float) -> str | None:
    """Why the fitted form with ping-pong consumers is not listed for a problem (``rows`` = T, priced at
    ``rows_per_group``), or None where it is: the classes it was measured ahead on (FIT_PINGPONG_OFFERED's
    comment). ``plan`` takes it where listed unless the tiled pick is stream-K or pads no more rows
    (``fit_pingpong_beats``)."""
    why = fit_kernel_problem(layout, dtype, out_dtype, b_mn, groups, rows)
    if why:
        return why
    least = FIT_PINGPONG_MIN_ROWS_WIDE if N >= 2 * K else FIT_PINGPONG_MIN_ROWS
    if rows_per_group < least or K < FIT_PINGPONG_MIN_K:
        return (f"the ping-pong fitted form is listed from {FIT_PINGPONG_MIN_ROWS} rows a group on average "
                f"({FIT_PINGPONG_MIN_ROWS_WIDE} where N >= 2 K) and K >= {FIT_PINGPONG_MIN_K} "
                f"(measured ahead there only)")
    return None


def fit_store_step(schedule: str, K: int) -> int:
    """The fitted form's store step at ``schedule`` and depth ``K`` (its plan's store_step): ping-pong below
    FIT_PINGPONG_WIDE_MIN_K, FIT_PINGPONG_SHORT_K_STORE_STEP; else 0 (one epilogue a width)."""
    return FIT_PINGPONG_SHORT_K_STORE_STEP if schedule == "pingpong" and K < FIT_PINGPONG_WIDE_MIN_K else 0


def fit_widest_first(schedule: str, groups: int) -> bool:
    """Whether the fitted form at ``schedule`` orders its tiles by token width, widest first (its plan's
    widest_first): ping-pong, up to FIT_WIDEST_FIRST_MAX_GROUPS groups."""
    return schedule == "pingpong" and groups <= FIT_WIDEST_FIRST_MAX_GROUPS


def fit_wmax(schedule: str, K: int) -> int:
    """The fitted form's widest token tile at ``schedule`` and depth ``K`` (its plan's bn): FIT_WMAX
    data-parallel; ping-pong, FIT_PINGPONG_WMAX from K = FIT_PINGPONG_WIDE_MIN_K on, else
    FIT_PINGPONG_SHORT_K_WMAX (never wider than FIT_PINGPONG_WMAX)."""
    if schedule != "pingpong":
        return FIT_WMAX
    return FIT_PINGPONG_WMAX if K >= FIT_PINGPONG_WIDE_MIN_K else min(FIT_PINGPONG_WMAX, FIT_PINGPONG_SHORT_K_WMAX)


def fitted_rows(rows_per_group: float, wmax: int = FIT_WMAX) -> float:
    """Rows a group the fitted form multiplies on average: its nt token tiles (``tiles_m_per_group`` at
    ``wmax``, uneven) each pad ~FIT_Q / 2 rows (the width rounded up to a multiple of FIT_Q)."""
    if rows_per_group <= 0:
        return 0.0
    nt = tiles_m_per_group(rows_per_group, wmax, True)
    return nt * min(wmax, rows_per_group / nt + FIT_Q / 2)


def fit_pingpong_beats(tiled: GroupedPlan) -> bool:
    """Where a listed ping-pong fitted plan is taken over ``tiled`` (the tiled kernel's pick for the same
    problem): the pick not stream-K, and its padded rows at least 1 / FIT_PINGPONG_ROW_SHARE the fitted ones."""
    r = tiled.expected_rows
    padded = tiles_m_per_group(r, tiled.bm, tiled.layout == "contiguous") * tiled.bm
    fitted = fitted_rows(r, fit_wmax("pingpong", tiled.K))
    return tiled.schedule != "stream_k" and fitted <= FIT_PINGPONG_ROW_SHARE * padded


def _fit_pingpong_price(groups, rows_per_group, N, K, wmax, prof, out_bytes) -> tuple[float, float]:
    """(predict_s, busy time) of the ping-pong fitted form with token tiles up to ``wmax`` wide: ``_price``'s
    ping-pong terms on FIT_BM x W tiles, W the average fitted width, ``fitted_rows`` multiplied, every epilogue
    thread-stored. Not fitted to its records (FIT_PINGPONG_OFFERED: it prices the form below the measured
    speed)."""
    nt = tiles_m_per_group(rows_per_group, wmax, True)
    tiles = math.ceil(groups * nt * math.ceil(N / FIT_BM))
    if tiles == 0:
        return prof.launch_s, 0.0
    w = fitted_rows(rows_per_group, wmax) / nt
    k = math.ceil(K / BK)
    unique = _unique_bytes(groups, rows_per_group, N, K, out_bytes)
    share = min(1.0, unique / max(1.0, tiles * k * (FIT_BM + w) * BK * 2))

    def ks(active: int) -> float:  # as _price's ping-pong k-step (w need not be a whole wgmma width: an average)
        return plan_cost.kstep_s(FIT_BM, w, FIT_BM, FIT_STAGES, active, share, prof, prof.plan_clock_mhz,
                                 one_consumer=False, ring_latency=False)

    epi = plan_cost.tile_epilogue_s(FIT_BM, w, out_bytes, prof, direct=True)
    full, rem = divmod(tiles, prof.sm_count)
    t = full * max(k * ks(prof.sm_count), epi) + (k * ks(rem) if rem else 0.0) + epi
    return prof.launch_s + max(t, unique / prof.hbm_read_bytes_per_s), t


def _fitted(layout, groups, rows, N, K, dt, odt, expected_rows, K_priced, out_bytes, prof,
            schedule, wmax=None, store_step=None, widest_first=None) -> tuple[float, GroupedPlan]:
    """(busy time, plan) of the fitted form at ``schedule``, token tiles up to ``wmax`` wide (default
    ``fit_wmax``), epilogues at ``store_step`` (default ``fit_store_step``; not priced), tiles widest first
    where ``widest_first`` (default ``fit_widest_first``; not priced). Data-parallel: priced
    at the HBM floor of every plan (each expert's weight read once, A and out), where at its few rows a group
    the others' prices sit too; ``plan`` takes it by rule (FIT_OFFERED), not price. Ping-pong:
    ``_fit_pingpong_price``."""
    wmax = fit_wmax(schedule, K) if wmax is None else wmax
    store_step = fit_store_step(schedule, K) if store_step is None else store_step
    widest_first = fit_widest_first(schedule, groups) if widest_first is None else widest_first
    if schedule == "pingpong":
        t, busy = _fit_pingpong_price(groups, expected_rows, N, K_priced, wmax, prof, out_bytes)
    else:
        t = busy = prof.launch_s + _hbm_floor_s(groups, expected_rows, N, K_priced, out_bytes, prof)
    most = (math.ceil(rows / wmax) + groups) * math.ceil(N / FIT_BM)
    return busy, GroupedPlan(layout=layout, groups=groups, rows=rows, N=N, K=K, bm=FIT_BM, bn=wmax,
                             stages=FIT_STAGES, grid=min(prof.sm_count, most), dtype=dt, out_dtype=odt,
                             table=table_groups(groups), direct=True, expected_rows=float(expected_rows),
                             predicted_s=t, kernel=FIT_KERNEL, schedule=schedule, store_step=store_step,
                             widest_first=widest_first)


def _dtype_names(dtype, out_dtype) -> tuple[str, str]:
    """(operand, output) dtype names of ``candidates``' arguments (names or torch dtypes); ValueError else."""
    dt = dtype if dtype in ("bf16", "fp16", "e4m3") else ("e4m3" if dtype == E4M3 else _NAMES.get(dtype))
    if dt not in ("bf16", "fp16", "e4m3"):
        raise ValueError(f"grouped_mm takes bf16, fp16 or e4m3 operands, got {dtype!r}")
    default_out = "bf16" if dt == "e4m3" else dt
    odt = default_out if out_dtype is None else (out_dtype if out_dtype in _CTYPE else _NAMES.get(out_dtype))
    if odt not in _CTYPE:
        raise ValueError(f"out_dtype must be bf16, fp16 or fp32, got {out_dtype!r}")
    return dt, odt


def fitted_plan(layout: str, groups: int, rows: int, N: int, K: int, *, schedule: str = "data_parallel",
                dtype="bf16", out_dtype=None, expected_rows: float | None = None,
                profile: DeviceProfile | None = None, b_mn: bool = False, wmax: int | None = None,
                store_step: int | None = None, widest_first: bool | None = None) -> GroupedPlan:
    """The fitted form at ``schedule`` ("data_parallel" or "pingpong") for any problem its kernel runs
    (``fit_kernel_problem``; UnsupportedProblem else), listed by ``candidates`` or not, priced as there: for
    probes, benchmarks and tests that run it beside the pick. ``wmax``: its widest token tile (default
    ``fit_wmax``'s; ping-pong, one of FIT_PINGPONG_WIDTHS), ``store_step`` its epilogues (default
    ``fit_store_step``'s; ping-pong, one of FIT_STORE_STEPS), ``widest_first`` its tile order (default
    ``fit_widest_first``'s). Other arguments as ``candidates``'."""
    from .planner import _profile

    dt, odt = _dtype_names(dtype, out_dtype)
    why = fit_kernel_problem(layout, dt, odt, b_mn, groups, rows)
    if why or schedule not in FIT_SCHEDULES or min(groups, rows, N, K) < 1:
        raise UnsupportedProblem(why or f"the fitted form: schedule one of {FIT_SCHEDULES}, groups, rows, N, K >= 1; "
                                        f"got {schedule!r}, {groups}, {rows}, {N}, {K}")
    r = rows / groups if expected_rows is None else expected_rows
    return _fitted(layout, groups, rows, N, K, dt, odt, r, K, plan_cost.in_bytes(odt), _profile(profile, None),
                   schedule, wmax, store_step, widest_first)[1]


def candidates(layout: str, groups: int, rows: int, N: int, K: int, *, dtype="bf16", out_dtype=None,
               expected_rows: float | None = None, profile: DeviceProfile | None = None,
               scale: str = "tensor", b_mn: bool = False) -> list[GroupedPlan]:
    """Every grouped plan for the problem, cheapest first. rows: T (contiguous) or C (masked).
    b_mn: b stored MN-major (``mn_major``; bf16 / fp16), loaded in 64-column boxes at the same bytes, so
    priced as K-major.
    expected_rows: rows per group to price (default: T / G contiguous, C masked: the slabs' capacity).
    scale (e4m3): "tensor" or "block" (DeepSeek-V3's block scales: K % 128 == 0; the same tiles, a scale
    slot per stage, priced as per-tensor at those stages: not fitted to block-scaled records)."""
    from .planner import _profile

    prof = _profile(profile, None)
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; known: {list(LAYOUTS)}")
    dt, odt = _dtype_names(dtype, out_dtype)
    fp8 = dt == "e4m3"
    if scale not in ("tensor", "block") or (scale == "block" and (not fp8 or K % FP8_BLOCK)):
        raise ValueError(f"scale must be 'tensor' or 'block' (e4m3 operands, K % {FP8_BLOCK} == 0); got {scale!r} "
                         f"for {dt}, K = {K}")
    if not 1 <= groups <= MAX_GROUPS or min(rows, N, K) < 1:
        raise ValueError(f"need 1 <= groups <= {MAX_GROUPS} and rows, N, K >= 1; got {groups}, {rows}, {N}, {K}")
    if expected_rows is None:
        expected_rows = rows / groups if layout == "contiguous" else rows
    out_bytes = plan_cost.in_bytes(odt)
    direct = (N * out_bytes) % 16 != 0  # out's rows not 16-byte aligned: no TMA map over out
    table = table_groups(groups)
    # e4m3 is priced as bf16 at half the depth: the same bytes, and the same k-step time at twice the
    # tensor rate (one 128-deep FP8 k-step moves and multiplies what a 64-deep bf16 one does).
    K_priced = math.ceil(K / 2) if fp8 else K
    plans = []
    for bm, bn, schedule in tile_schedules(fp8, odt):
        if b_mn and bn % 64:  # MN-major b is loaded in 64-column boxes
            continue
        # The dense engine's stream-K scheduler (tile_scheduler.cuh): not where the profile's GPU has a memory
        # slower than the line the dense engine's stream-K lost under (devices.stream_k_offered; the grouped
        # kernel's stream-K itself was not timed on such a GPU).
        if schedule == "stream_k" and not prof.stream_k_offered:
            continue
        stages = stages_for(bm, bn, table, scale, schedule)
        # Tiles there can be: contiguous, sum ceil(rows_g / bm) <= ceil(T / bm) + G; masked, G ceil(C / bm).
        if layout == "contiguous":
            most = (math.ceil(rows / bm) + groups) * math.ceil(N / bn)
        else:
            most = groups * math.ceil(rows / bm) * math.ceil(N / bn)
        uneven = layout == "contiguous"
        all_direct = direct or crossing_share(expected_rows, bm, uneven) >= ALL_DIRECT_SHARE
        if schedule == "pingpong" and pingpong_problem(bm, bn, odt, all_direct):
            continue
        t, busy = _price(groups, expected_rows, N, K_priced, bm, bn, stages, prof, out_bytes, uneven, direct,
                         schedule)
        plans.append((busy, GroupedPlan(layout=layout, groups=groups, rows=rows, N=N, K=K, bm=bm, bn=bn,
                                        stages=stages, grid=min(prof.sm_count, most), dtype=dt, out_dtype=odt,
                                        table=table, panel=panel_tiles(bm, bn, K, prof, 1 if fp8 else 2),
                                        direct=all_direct, expected_rows=float(expected_rows), predicted_s=t,
                                        scale=scale, schedule=schedule, b_mn=b_mn,
                                        claim=CLAIM_OFFERED and claimable(bm, bn, dt, schedule))))
    # The fitted forms where listed (``plan`` takes them by rule, not price: ``_fitted``).
    if fit_problem(layout, dt, odt, b_mn, groups, expected_rows) is None:
        plans.append(_fitted(layout, groups, rows, N, K, dt, odt, expected_rows, K_priced, out_bytes, prof,
                             "data_parallel"))
    if fit_pingpong_problem(layout, dt, odt, b_mn, groups, rows, N, K, expected_rows) is None:
        plans.append(_fitted(layout, groups, rows, N, K, dt, odt, expected_rows, K_priced, out_bytes, prof,
                             "pingpong"))
    # Ties (at the HBM floor): the tile that multiplies the fewest rows (padding each group to whole tiles;
    # within 5% of the fewest counts as fewest), then the plan that keeps the SMs busy the shortest
    # (epilogues hidden by ping-pong), then data-parallel first (stream-K only where it is priced faster).
    # Measured (H200, 886e76f, --all-tiles): at 4-16 rows an expert (T = 256; DeepSeek-V3 at 4096) 64-row
    # tiles ran 1.15-1.25x 128 x 128 ping-pong, which the busy time alone ranked first; at ~68 rows
    # (Qwen1.5-MoE, T = 4096: 64- and 128-row tiles multiply 128 and 132 rows a group) ping-pong led.
    # The ping-pong fitted form does not set the fewest: ``plan`` weighs it against the tiled pick
    # (``fit_pingpong_beats``), so listing it must not move that pick (at 68 rows its 77 would rank the 64-row
    # tiles' 128 ahead of the 128-row tiles' 132). At 128 rows and more, where it was listed before, leaving it
    # out changed no ranking on a grid of 150k problems.
    def multiplied(p: GroupedPlan) -> float:
        if p.fit:
            return fitted_rows(expected_rows, p.bn) if p.schedule == "pingpong" else max(expected_rows, FIT_Q)
        return tiles_m_per_group(expected_rows, p.bm, layout == "contiguous") * p.bm

    rows = {id(p): groups * multiplied(p) for _, p in plans}
    fewest = min((rows[id(p)] for _, p in plans if not (p.fit and p.schedule == "pingpong")), default=0.0)
    def padded(p: GroupedPlan) -> float:
        return 0.0 if rows[id(p)] <= 1.05 * fewest else rows[id(p)]

    plans.sort(key=lambda bp: (round(bp[1].predicted_s, 9), padded(bp[1]), round(bp[0], 9),
                               bp[1].schedule != "data_parallel", -bp[1].bm * bp[1].bn))
    return [p for _, p in plans]


def tile_schedules(fp8: bool, out_dtype: str):
    """(bm, bn, schedule) of every grouped instantiation the planner may price: e4m3, FP8_TILES
    data-parallel; bf16 / fp16, TILES data-parallel and stream-K (except ``stream_k_problem``'s) and
    PINGPONG_TILES ping-pong."""
    if fp8:
        yield from ((bm, bn, "data_parallel") for bm, bn in FP8_TILES)
        return
    for bm, bn in TILES:
        yield bm, bn, "data_parallel"
        if stream_k_problem(bm, bn, out_dtype) is None:
            yield bm, bn, "stream_k"
    yield from ((bm, bn, "pingpong") for bm, bn in PINGPONG_TILES)


def pingpong_problem(bm: int, bn: int, out_dtype: str, direct: bool) -> str | None:
    """Why a ping-pong tile has no plan, or None. The compile sweep (tests/test_grouped.py, ``-m slow``):
    128 x 176 with every block stored by the threads (DIRECT) and 16-bit output spills 8 bytes."""
    if (bm, bn) == (128, 176) and direct and out_dtype != "fp32":
        return "128 x 176 ping-pong spills with every block thread-stored (16-bit output)"
    return None


def stream_k_problem(bm: int, bn: int, out_dtype: str) -> str | None:
    """Why a tile has no stream-K plan, or None. The compile sweep (tests/test_grouped.py, ``-m slow``):
    with the partials' code the one-consumer 64 x 256 tile spills 4 bytes (16-bit output), 128 x 256
    with fp32 output 8 (DIRECT stores, the 512-group table)."""
    if (bm, bn) == (64, 256):
        return "64 x 256 spills with stream-K's partials"
    if (bm, bn) == (128, 256) and out_dtype == "fp32":
        return "128 x 256 with fp32 output spills with stream-K's partials"
    return None


def plan(layout: str, groups: int, rows: int, N: int, K: int, **kw) -> GroupedPlan:
    """The cheapest plan of ``candidates`` (same arguments) among the offered schedules: a stream-K one only
    where it is priced at most ``STREAM_K_MARGIN`` of the cheapest data-parallel one (and
    ``STREAM_K_OFFERED``), ping-pong only with ``PINGPONG_OFFERED``, tiles with a tail piece only with
    ``TAIL_TILES_OFFERED``; the data-parallel fitted form where listed and ``FIT_OFFERED``; the ping-pong fitted
    form where listed, ``FIT_PINGPONG_OFFERED`` and ``fit_pingpong_beats`` that pick. Pure Python; no GPU
    needed."""
    listed = candidates(layout, groups, rows, N, K, **kw)
    fitted = {c.schedule: c for c in listed if c.fit}
    if FIT_OFFERED and "data_parallel" in fitted:
        return fitted["data_parallel"]
    tiled = _tiled_pick(listed)
    pp = fitted.get("pingpong")
    return pp if FIT_PINGPONG_OFFERED and pp is not None and fit_pingpong_beats(tiled) else tiled


def tiled_plan(layout: str, groups: int, rows: int, N: int, K: int, **kw) -> GroupedPlan:
    """``plan``'s pick among the tiled kernel's plans only (what it runs where it takes no fitted form): for
    benchmarks that time a fitted pick against it. Same arguments."""
    return _tiled_pick(candidates(layout, groups, rows, N, K, **kw))


def _tiled_pick(listed: list[GroupedPlan]) -> GroupedPlan:
    ranked = [c for c in listed if not c.fit and (c.schedule != "pingpong" or PINGPONG_OFFERED)
              and (c.bn % 64 == 0 or TAIL_TILES_OFFERED)]
    dp = next(c for c in ranked if c.schedule == "data_parallel")
    return next(c for c in ranked if c.schedule != "stream_k" or (
        STREAM_K_OFFERED and c.predicted_s <= STREAM_K_MARGIN * dp.predicted_s))


# Validation --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GroupedProblem:
    layout: str
    groups: int
    rows: int  # T (contiguous) or C (masked)
    N: int
    K: int
    lead: int  # contiguous: 1 if offsets has G + 1 entries (boundaries), 0 for G ends
    dtype: torch.dtype
    out_dtype: torch.dtype
    sb_step: int = 0  # e4m3: 1 where scale_b holds one scale per group, else 0
    scale: str = "tensor"  # e4m3: "tensor" (per-tensor scales) or "block" (1 x 128 / 128 x 128 block scales)
    b_mn: bool = False  # b MN-major: each b[g] stored as its (K, N) transpose, N contiguous

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.rows, self.N) if self.layout == "contiguous" else (self.groups, self.rows, self.N)


def _packed(x: torch.Tensor) -> bool:
    """Unit inner stride and, for 3-D, slabs packed so the tensor is one 2-D matrix of rows."""
    if x.stride(-1) != 1 and x.shape[-1] > 1:
        return False
    return x.dim() == 2 or x.shape[0] <= 1 or x.stride(0) == x.shape[1] * x.stride(1)


# MN-major b (bf16 / fp16): each b[g] stored as its (K, N) transpose with N contiguous, i.e. the
# b.transpose(1, 2) of a contiguous (G, K, N) tensor (torch._grouped_mm's mat_b layout; the backward's
# dy_g @ w[g]). The kernel loads it in 64-column boxes from one (G K, N) map, so K must be a multiple of the
# 64-deep k-step (no k-step of a group may read the next group's rows) and N of 8 (16-byte rows). Offered
# since its GPU tests passed (every tile and schedule, 12 and 200 groups, H200, 3e4604c); the switch stays
# so that a GPU where it fails can be told apart.
MN_MAJOR_B_OFFERED = True


def mn_major(b: torch.Tensor) -> bool:
    """Whether 3-D ``b`` (G, N, K) is stored MN-major and packed: unit stride along N, rows of K ... of N."""
    if b.dim() != 3:
        return False
    G, N, K = b.shape
    return N > 1 and K > 1 and b.stride(1) == 1 and b.stride(2) == N and (G <= 1 or b.stride(0) == N * K)


def _check_mn_major_b(b: torch.Tensor, fp8: bool) -> None:
    G, N, K = b.shape
    if fp8:
        raise UnsupportedProblem("e4m3 b must be K-major (unit stride along K): the FP8 wgmma reads both operands "
                                 "K-major")
    if not MN_MAJOR_B_OFFERED:
        raise UnsupportedProblem("b must have unit stride along K (MN-major b, b.transpose(1, 2) of a (G, K, N) "
                                 "tensor, is built but not offered yet: pass b.contiguous())")
    if K % BK or N % 8:
        raise UnsupportedProblem(f"MN-major b needs K a multiple of {BK} (whole k-steps in each group) and N a "
                                 f"multiple of 8 (16-byte rows); got N = {N}, K = {K}: pass b.contiguous()")


def validate(a, b, offsets=None, counts=None, out=None, out_dtype=None, *, scale_a=None,
             scale_b=None) -> GroupedProblem:
    """Check ``grouped_mm``'s arguments (see the module docstring); TypeError for dtypes, UnsupportedProblem
    (a ValueError) for the rest. Reads no data: runs on fake tensors, never syncs."""
    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in (torch.bfloat16, torch.float16, E4M3):
            raise TypeError(f"{name} must be torch.bfloat16, torch.float16 or torch.float8_e4m3fn, got {x.dtype}")
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    fp8 = a.dtype == E4M3
    if fp8 and (scale_a is None or scale_b is None):
        raise UnsupportedProblem("e4m3 operands need scale_a and scale_b: per-tensor (one fp32 scale for a; one, "
                                 "or one per group, for b) or block scales (a: (T, K / 128) or (G, C, K / 128); "
                                 "b: (G, ceil(N / 128), K / 128))")
    if not fp8 and (scale_a is not None or scale_b is not None):
        raise UnsupportedProblem(f"scale_a / scale_b go with e4m3 operands; a and b are {a.dtype}")
    if (offsets is None) == (counts is None):
        raise UnsupportedProblem("pass exactly one of offsets (contiguous layout: a is (T, K)) and counts "
                                 "(masked layout: a is (G, C, K))")
    layout = "contiguous" if offsets is not None else "masked"
    ranges = offsets if offsets is not None else counts
    rname = "offsets" if offsets is not None else "counts"
    if not isinstance(ranges, torch.Tensor):
        raise TypeError(f"{rname} must be an int32 torch.Tensor on a's device, got {type(ranges).__name__}")
    if ranges.dtype != torch.int32:
        raise TypeError(f"{rname} must be torch.int32, got {ranges.dtype}")
    if ranges.dim() == 1 and ranges.shape[0] > 1 and ranges.stride(0) != 1:
        # Not copied: a graph replay must read the caller's tensor, which the caller updates in place.
        raise UnsupportedProblem(f"{rname} must be contiguous (the kernel reads it with unit stride); got stride "
                                 f"{ranges.stride(0)}: pass {rname}.contiguous() and update that tensor")
    if b.dim() != 3:
        raise UnsupportedProblem(f"b must be 3-D (G, N, K): each expert's (N, K) weight; got shape {tuple(b.shape)}")
    G, N, K = b.shape
    if not 1 <= G <= MAX_GROUPS:
        raise UnsupportedProblem(f"grouped_mm takes 1 .. {MAX_GROUPS} groups, b has {G}")
    if layout == "contiguous":
        if a.dim() != 2:
            raise UnsupportedProblem(f"with offsets, a must be 2-D (T, K) (tokens sorted by group); got shape "
                                     f"{tuple(a.shape)} (a 3-D a takes counts: the masked layout)")
        rows = a.shape[0]
        if ranges.dim() != 1 or ranges.shape[0] not in (G, G + 1):
            raise UnsupportedProblem(f"offsets must be 1-D of G + 1 = {G + 1} boundaries or G = {G} ends "
                                     f"(torch._grouped_mm's offs); got shape {tuple(ranges.shape)}")
        lead = 1 if ranges.shape[0] == G + 1 else 0
    else:
        if a.dim() != 3 or a.shape[0] != G:
            raise UnsupportedProblem(f"with counts, a must be 3-D (G, C, K) with G = {G} (b's groups); got "
                                     f"shape {tuple(a.shape)}")
        rows = a.shape[1]
        if ranges.dim() != 1 or ranges.shape[0] != G:
            raise UnsupportedProblem(f"counts must be 1-D of G = {G} entries; got shape {tuple(ranges.shape)}")
        lead = 0
    if a.shape[-1] != K:
        raise UnsupportedProblem(f"inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)} (G, N, K)")
    if K % (16 // a.element_size()) or K == 0:
        raise UnsupportedProblem(f"K must be a positive multiple of {16 // a.element_size()} (TMA reads 16-byte "
                                 f"rows of {a.dtype}), got K = {K}")
    b_mn = mn_major(b)
    if b_mn:
        _check_mn_major_b(b, fp8)
    for name, x in (("a", a),) if b_mn else (("a", a), ("b", b)):
        if not _packed(x):
            raise UnsupportedProblem(f"{name} must have unit stride along K and packed leading dimensions (one "
                                     f"matrix of rows); got strides {x.stride()}: pass {name}.contiguous()"
                                     + ("" if name == "a" or fp8 else "; or b MN-major: b.transpose(1, 2) of a "
                                        "contiguous (G, K, N)"))
        if (x.stride(-2) * x.element_size()) % 16:
            raise UnsupportedProblem(f"{name}'s row stride ({x.stride(-2)} elements) must be a multiple of 16 "
                                     "bytes (TMA)")
    for name, x in (("b", b), (rname, ranges)):
        if x.device != a.device:
            raise UnsupportedProblem(f"{name} is on {x.device}, a on {a.device}")
    sb_step, scale = 0, "tensor"
    if fp8:
        check_scale_tensors(scale_a, scale_b, a.device)
        if scale_a.dim() >= 2 or scale_b.dim() >= 2:
            scale = "block"
            _check_block_scales(scale_a, scale_b, layout, G, rows, N, K)
        elif scale_a.numel() != 1:
            raise UnsupportedProblem(f"scale_a must hold one scale (per-tensor), got shape {tuple(scale_a.shape)}")
        elif G > 1 and tuple(scale_b.shape) == (G,):  # one per group, read at scale_b[g]
            if scale_b.stride(0) != 1:
                raise UnsupportedProblem(f"scale_b (one per group) must be contiguous, got stride {scale_b.stride(0)}")
            sb_step = 1
        elif not (scale_b.numel() == 1 and scale_b.dim() <= 1):
            raise UnsupportedProblem(f"scale_b must hold one scale or one per group (G = {G},), got shape "
                                     f"{tuple(scale_b.shape)}")
    if G * N >= 2**31 or a.numel() // max(K, 1) >= 2**31 - 256:  # the kernel rounds rows up to a tile in int32
        raise UnsupportedProblem("grouped_mm's row coordinates must fit in int32 (fewer than 2^31 - 256 rows of a "
                                 "and 2^31 rows of b)")
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
        if out_dtype is not None and out.dtype != out_dtype:
            raise TypeError(f"out is {out.dtype} but out_dtype is {out_dtype}")
        out_dtype = out.dtype
    out_dtype = (torch.bfloat16 if fp8 else a.dtype) if out_dtype is None else out_dtype
    if out_dtype not in _NAMES:
        raise TypeError(f"out_dtype must be torch.bfloat16, torch.float16 or torch.float32, got {out_dtype}")
    p = GroupedProblem(layout=layout, groups=G, rows=rows, N=N, K=K, lead=lead, dtype=a.dtype, out_dtype=out_dtype,
                       sb_step=sb_step, scale=scale, b_mn=b_mn)
    if out is not None:
        if tuple(out.shape) != p.out_shape:
            raise UnsupportedProblem(f"out must have shape {p.out_shape}, got {tuple(out.shape)}")
        if out.device != a.device:
            raise UnsupportedProblem(f"out is on {out.device}, a on {a.device}")
        if not _packed(out):
            raise UnsupportedProblem(f"out must have unit stride along N and packed leading dimensions; got "
                                     f"strides {out.stride()}")
    return p


def _check_block_scales(scale_a, scale_b, layout: str, G: int, rows: int, N: int, K: int) -> None:
    """Block scales' shapes (their dtype and device are checked already): a 1 x 128 per row and 128 of K,
    b 128 x 128 per expert; both block-shaped (no mixing with a per-tensor scale); K % 128 == 0. Any
    strides: ``launch`` reads them through (K / 128, rows) views, copied where not stored that way."""
    kb, nb = K // FP8_BLOCK, math.ceil(N / FP8_BLOCK)
    want_a = (rows, kb) if layout == "contiguous" else (G, rows, kb)
    if scale_a.dim() < 2 or scale_b.dim() < 2:
        per, blk = ("scale_a", "scale_b") if scale_a.dim() < 2 else ("scale_b", "scale_a")
        shape = tuple((scale_a if blk == "scale_a" else scale_b).shape)
        raise UnsupportedProblem(f"{blk} has block-scale shape {shape} "
                                 f"but {per} is per-tensor: mixing per-tensor and block scales is not supported "
                                 f"(block: scale_a {want_a}, scale_b {(G, nb, kb)})")
    if K % FP8_BLOCK:
        raise UnsupportedProblem(f"block scales need K % {FP8_BLOCK} == 0, got K = {K}")
    if tuple(scale_a.shape) != want_a:
        what = "(T, K / 128)" if layout == "contiguous" else "(G, C, K / 128)"
        raise UnsupportedProblem(f"block scales: scale_a must be {what} = {want_a} (1 x 128 per token group), "
                                 f"got {tuple(scale_a.shape)}")
    if tuple(scale_b.shape) != (G, nb, kb):
        raise UnsupportedProblem(f"block scales: scale_b must be (G, ceil(N / 128), K / 128) = {(G, nb, kb)} "
                                 f"(128 x 128 blocks of each expert's (N, K) weight), got {tuple(scale_b.shape)}")


# The call ----------------------------------------------------------------------------------------------

def _rows2d(x: torch.Tensor) -> torch.Tensor:
    """A packed 2-D or 3-D tensor as the 2-D matrix of its rows (a view)."""
    return x if x.dim() == 2 else x.reshape(-1, x.shape[-1])


def compile_plan(p: GroupedPlan):
    """The compiled instantiation of ``p`` (cached in memory and on disk; works without a GPU)."""
    from .jit.compiler import compile_kernel

    return compile_kernel(FIT_SOURCE if p.fit else SOURCE, p.name_expression, arch="sm_90a", name=p.compiled_name)


def _launch_fn():
    from .jit.launch import launch

    return launch


def _tensor_map(t, box, swizzle_bytes: int = 128):
    from .jit.launch import tensor_map_2d

    return tensor_map_2d(t, box, swizzle_bytes=swizzle_bytes)


def launch(p: GroupedPlan, a: torch.Tensor, b: torch.Tensor, ranges: torch.Tensor, lead: int,
           out: torch.Tensor, scale_a: torch.Tensor | None = None, scale_b: torch.Tensor | None = None,
           sb_step: int = 0) -> None:
    """Run plan ``p``. a: (T, K) or (G, C, K); b: (G, N, K); ranges: offsets (contiguous; ``lead`` = 1
    for G + 1 boundaries, 0 for G ends) or counts (masked), int32 on the device; out: (T, N) or (G, C, N)
    in ``p.out_dtype``. All packed (``validate``), a and b 16-byte aligned. e4m3 plans: fp32 ``scale_a``
    (one) and ``scale_b`` (one, or one per group with ``sb_step`` = 1); block-scaled plans (``p.scale``):
    ``scale_a`` (T, K / 128) or (G, C, K / 128) and ``scale_b`` (G, ceil(N / 128), K / 128), any strides
    (``scale_rows_mn_major``). Checks what the plan fixes."""
    import numpy as np

    G, N, K = b.shape
    rows = a.shape[0] if a.dim() == 2 else a.shape[1]
    if (G, rows, N, K) != (p.groups, p.rows, p.N, p.K) or (a.dim() == 2) != (p.layout == "contiguous"):
        raise UnsupportedProblem(f"plan is for {p.layout} {p.groups} x {p.rows} x {p.N} x {p.K}, the operands "
                                 f"are a {tuple(a.shape)}, b {tuple(b.shape)}")
    if mn_major(b) != p.b_mn:
        raise UnsupportedProblem(f"plan is for {'MN' if p.b_mn else 'K'}-major b; b has strides {b.stride()}")
    a2, o2 = _rows2d(a), _rows2d(out)
    if not p.direct and not tma_storable(out):
        raise UnsupportedProblem("this plan TMA-stores out, whose rows or start are not 16-byte aligned: use "
                                 "a plan with direct=True (plan_for picks one)")
    fp8 = p.dtype == "e4m3"
    if fp8 != (a.dtype == E4M3) or (fp8 and (scale_a is None or scale_b is None)):
        raise UnsupportedProblem(f"plan is for {p.dtype} operands, a is {a.dtype}; e4m3 needs scale_a and scale_b")
    block = p.scale == "block"
    if fp8 and block != (scale_a.dim() >= 2):
        raise UnsupportedProblem(f"plan is for {p.scale} scales, scale_a has shape {tuple(scale_a.shape)}")
    compiled = compile_plan(p)
    if p.fit:  # the weights' rows (a box of bm) and the tokens' rows in a box of each width
        row = 128 // a2.element_size()
        maps_t = tuple(_tensor_map(a2, (w, row)) for w in fit_widths(p.bn))
        maps_t += (maps_t[0],) * (FIT_MAP_SLOTS - len(maps_t))  # the slots past bn are never read
        maps = (_tensor_map(_rows2d(b), (p.bm, row)),) + maps_t
        la = p.launch_args()
        args = maps + (ranges, np.int32(lead), np.int32(G), np.int32(rows), np.int32(N), np.int32(K), o2,
                       np.int64(o2.stride(0)))
        _launch_fn()(compiled, grid=la["grid"], block=la["block"], smem=la["smem"], args=args, cluster=None)
        return
    if fp8:  # TMA moves bytes; the wgmma reads them as e4m3. A k-step is one 128-byte row either way.
        a2, b = a2.view(torch.uint8), b.view(torch.uint8)
    row = 128 // a2.element_size()
    map_a = _tensor_map(a2, (p.bm, row))
    maps_a_short = tuple(_tensor_map(a2, (h, row)) for h in short_a_rows(p.bm))
    map_b = _tensor_map(*_b_rows(b, p))
    # out's maps: 64-row x one-128-byte-swizzle-row pieces and the tail piece (bn % piece columns,
    # unswizzled), as the dense engine's (A's map where unused; the full piece's where no tail).
    box, tail, _ = store_boxes(p.bn, o2)
    map_c = map_a if p.direct else _tensor_map(o2, box)
    map_ct = map_c if p.direct or not tail else _tensor_map(o2, tail, swizzle_bytes=0)
    if block:  # per k-step one box of each (from multiples of 4): A's bm + 4 row scales, B's 8 column blocks
        map_sa = _tensor_map_flat(scale_rows_mn_major(scale_a), (1, p.bm + 4))
        map_sb = _tensor_map_flat(scale_rows_mn_major(scale_b), (1, 8))
    else:
        map_sa = map_sb = map_a  # unread
    la = p.launch_args()
    head = (map_a, map_b, map_c, map_sa, map_sb, ranges, np.int32(lead), np.int32(G), np.int32(rows), np.int32(N),
            np.int32(K), np.int32(min(p.panel, 2**31 - 1)))
    scales = (scale_a, scale_b, np.int32(sb_step)) if fp8 else (o2, o2, np.int32(0))  # (bf16 reads none)
    # stream-K: partials and flags; claimed tiles: the counter in the flags; else neither is read.
    ws, flags = _workspace(p, a.device) if p.schedule == "stream_k" or p.claim else (o2, o2)
    args = head + scales + (o2, np.int64(o2.stride(0)), ws, flags) + maps_a_short + (map_ct,)
    _launch_fn()(compiled, grid=la["grid"], block=la["block"], smem=la["smem"], args=args, cluster=None)


def fit_widths(wmax: int = FIT_WMAX) -> tuple[int, ...]:
    """The fitted form's token-tile widths up to ``wmax`` (a plan's ``bn``), one k-loop and one token map each
    (gemm_grouped_fit.cu)."""
    return tuple(range(FIT_Q, wmax + 1, FIT_Q))


def short_a_rows(bm: int) -> tuple[int, int, int, int]:
    """Rows of A's four short boxes (kernels/engine/gemm_grouped.cu's short_a_rows): bm / 16, bm / 8, bm / 4,
    bm / 2, at least 8. A tile over a group's last rows loads the fewest that hold them."""
    return tuple(max(8, bm >> s) for s in (4, 3, 2, 1))


def _b_rows(b: torch.Tensor, p: GroupedPlan) -> tuple[torch.Tensor, tuple[int, int]]:
    """B as the 2-D matrix the kernel's map covers, and the map's box: K-major, the (G N, K) rows of every
    expert's weight, a box of bn rows x one 128-byte row; MN-major (``p.b_mn``), the (G K, N) rows of the
    experts' transposes, 64 x 64 boxes (one k-step of 64 columns)."""
    if p.b_mn:
        return b.transpose(1, 2).reshape(-1, b.shape[1]), (BK, 64)
    b2 = _rows2d(b)
    return b2, (p.bn, 128 // b2.element_size())


def _workspace(p: GroupedPlan, device) -> tuple[torch.Tensor, torch.Tensor]:
    """A stream-K plan's partial slots and flags on torch's current stream (``engine.stream_k_workspace``,
    shared with the dense kernel's stream-K plans on that stream): ``engine2.workspace``, which needs only
    the plan's ``workspace_floats`` and ``sk_ctas``."""
    from .engine2 import workspace

    return workspace(p, device)


def _tensor_map_flat(t, box):
    """A TMA map without swizzle (the scale views: plain float rows)."""
    from .jit.launch import tensor_map_2d

    return tensor_map_2d(t, box, swizzle_bytes=0)


def scale_rows_mn_major(scale: torch.Tensor) -> torch.Tensor:
    """Block scales (..., K / 128), every leading index a row (a's token rows, T or G x C; b's experts'
    column blocks, G x ceil(N / 128), expert g's block j at row g ceil(N / 128) + j), as the (K / 128,
    rows) view the kernel's TMA reads: unit stride along the rows, 16-byte aligned start and pitch. In
    place where stored so (``fp8.quantize_blocks`` on a's rows, ``fp8.quantize_expert_blocks``); else one
    copy into a padded buffer (``engine2.block_scales_mn_major``, which the dense FP8 path uses)."""
    from .engine2 import block_scales_mn_major

    KB = scale.shape[-1]
    R = math.prod(scale.shape[:-1])
    try:
        flat = scale.view(R, KB)
    except RuntimeError:  # leading dimensions not mergeable: copy straight into the (K / 128, rows) buffer
        buf = torch.empty((KB, (R + 3) // 4 * 4), dtype=torch.float32, device=scale.device)[:, :R]
        buf.view(KB, *scale.shape[:-1]).copy_(scale.movedim(-1, 0))
        return buf
    return block_scales_mn_major(flat)


def tma_storable(out: torch.Tensor) -> bool:
    """Whether a TMA map can cover ``out`` (packed): 16-byte aligned start and rows."""
    return out.data_ptr() % 16 == 0 and (out.stride(-2) * out.element_size()) % 16 == 0


def _runs_here(a: torch.Tensor) -> bool:
    """Whether the kernel can run on ``a``'s device: a CUDA device (CPU tests replace this)."""
    return a.is_cuda


def plan_for(a, b, offsets=None, counts=None, *, out_dtype=None, scale_a=None, scale_b=None) -> GroupedPlan:
    """The plan ``grouped_mm`` runs for these arguments (priced for evenly filled groups)."""
    p = validate(a, b, offsets, counts, None, out_dtype, scale_a=scale_a, scale_b=scale_b)
    profile = None
    if a.is_cuda:
        from .engine2 import _profile

        profile = _profile(a.device)
    return plan(p.layout, p.groups, p.rows, p.N, p.K, dtype="e4m3" if p.dtype == E4M3 else _NAMES[p.dtype],
                out_dtype=_NAMES[p.out_dtype], profile=profile, scale=p.scale, b_mn=p.b_mn)


def run(a, b, offsets=None, counts=None, out=None, *, out_dtype=None, scale_a=None, scale_b=None,
        plan: Optional[GroupedPlan] = None) -> torch.Tensor:
    """``grouped_mm`` without the custom op, optionally with a chosen ``plan`` (tests, benchmark)."""
    p = validate(a, b, offsets, counts, out, out_dtype, scale_a=scale_a, scale_b=scale_b)
    if not _runs_here(a):
        raise UnsupportedProblem(f"grouped_mm runs on a CUDA (Hopper) device; the operands are on {a.device}")
    if out is None:
        out = torch.empty(p.out_shape, dtype=p.out_dtype, device=a.device)
    if p.rows == 0 or p.N == 0:
        return out
    if a.data_ptr() % 16 or b.data_ptr() % 16:
        raise UnsupportedProblem("a and b must start 16-byte aligned (TMA)")
    pl = plan or plan_for(a, b, offsets, counts, out_dtype=p.out_dtype, scale_a=scale_a, scale_b=scale_b)
    if not pl.direct and not tma_storable(out):  # an out= view at an odd start: store every row directly
        pl = dataclasses.replace(pl, direct=True)
    launch(pl, a, b, offsets if offsets is not None else counts, p.lead, out, scale_a, scale_b, p.sb_step)
    return out


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offsets: Optional[torch.Tensor] = None, *,
               counts: Optional[torch.Tensor] = None, out: Optional[torch.Tensor] = None,
               out_dtype: Optional[torch.dtype] = None, scale_a: Optional[torch.Tensor] = None,
               scale_b: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Grouped GEMM: for each group g, out_g = a_g @ b[g].T (mixture-of-experts experts in one launch).

    a: contiguous layout (T, K) with tokens sorted by group and ``offsets`` int32 (G + 1 boundaries, or G
    ends as torch._grouped_mm's offs); masked layout (G, C, K) with ``counts`` int32 (G,). b: (G, N, K),
    each group's nn.Linear weight. bf16 or fp16 (both the same); K a multiple of 8; unit stride along K,
    packed leading dimensions, 16-byte aligned. out / out_dtype: (T, N) or (G, C, N) in bf16, fp16 or fp32
    (default a's dtype). Rows outside every group / past a count are not written (keep ``out``'s values;
    uninitialized in a fresh output). offsets / counts are read on the device: no host sync, CUDA-graph
    capturable; their values are clamped, not checked (module docstring). torch custom ops
    ``gemmlab::grouped_mm`` / ``gemmlab::grouped_mm_out`` with fake implementations.

    FP8: a and b torch.float8_e4m3fn (K a multiple of 16) with fp32 ``scale_a`` (one scale) and ``scale_b``
    (one, or one per group: (G,)): out_g = scale_a x scale_b[g] x a_g @ b[g].T, promoted into fp32 every
    128 of K as ``gemmlab.scaled_mm``; out_dtype default bf16 (no ``out=``); custom op
    ``gemmlab::grouped_scaled_mm``. Block scales (K % 128 == 0): fp32 ``scale_a`` (T, K / 128) (masked:
    (G, C, K / 128)), one per row and 128 of K, and ``scale_b`` (G, ceil(N / 128), K / 128), one per
    128 x 128 block of b[g]: out[r, n] = sum_kb scale_a[r, kb] scale_b[g, n // 128, kb] (a_g @ b[g].T over
    k-block kb). Any strides; stored MN-major (``fp8.quantize_blocks`` on a, ``fp8.quantize_expert_blocks``)
    they are read in place, else copied once per call. Both scales block-shaped or both per-tensor.

    Eager calls on plain CUDA tensors (outside tracing, torch modes, the profiler and autograd) skip the
    op's dispatch and run the call prepared for their metadata key (``_key``): validated, planned and
    built once (``GroupedLaunch``), then a repeat call allocates the output and launches.

    Autograd (bf16 / fp16, either layout, no ``out=``): da on this kernel (b read MN-major), db on torch's
    GEMMs, on the device; see ``_grouped_backward``. Eager calls that need a gradient run the prepared call
    inside ``_EagerGrouped`` (the same formula) instead of the op's dispatch."""
    mode = ops.eager_mode(a, b, offsets, counts, scale_a, scale_b, out=out)
    if mode is True:
        return _prepared(a, b, offsets, counts, out, out_dtype, scale_a, scale_b)(a, b, offsets, counts, out,
                                                                                 scale_a, scale_b)
    if mode and out is None and a.dtype != E4M3:
        # Needs a gradient (ops._GRAD): the prepared call inside _EagerGrouped, the op's formula.
        call = _prepared(a, b, offsets, counts, None, out_dtype, None, None)
        return _EagerGrouped.apply(a, b, offsets, counts, call)
    _check_call(a, b, offsets, counts, out, out_dtype, scale_a, scale_b)
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad) and (a.dtype == E4M3 or out is not None):
        raise UnsupportedProblem("grouped_mm has a gradient for bf16 / fp16 operands without out= (FP8 and "
                                 "out= calls are forward only): drop out=, or call it under torch.no_grad()")
    if a.dtype == E4M3:
        return _grouped_scaled_mm_op(a, b, offsets, counts, scale_a, scale_b, out_dtype)
    if out is not None:
        _grouped_mm_out_op(a, b, offsets, counts, out)
        return out
    return _grouped_mm_op(a, b, offsets, counts, out_dtype)


@torch.library.custom_op("gemmlab::grouped_mm", mutates_args=())
def _grouped_mm_op(a: torch.Tensor, b: torch.Tensor, offsets: Optional[torch.Tensor],
                   counts: Optional[torch.Tensor], out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    return _prepared(a, b, offsets, counts, None, out_dtype, None, None)(a, b, offsets, counts, None, None, None)


@_grouped_mm_op.register_fake
def _grouped_mm_fake(a, b, offsets, counts, out_dtype):
    p = validate(a, b, offsets, counts, None, out_dtype)
    return a.new_empty(p.out_shape, dtype=p.out_dtype)


@torch.library.custom_op("gemmlab::grouped_scaled_mm", mutates_args=())
def _grouped_scaled_mm_op(a: torch.Tensor, b: torch.Tensor, offsets: Optional[torch.Tensor],
                          counts: Optional[torch.Tensor], scale_a: torch.Tensor, scale_b: torch.Tensor,
                          out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    call = _prepared(a, b, offsets, counts, None, out_dtype, scale_a, scale_b)
    return call(a, b, offsets, counts, None, scale_a, scale_b)


@_grouped_scaled_mm_op.register_fake
def _grouped_scaled_mm_fake(a, b, offsets, counts, scale_a, scale_b, out_dtype):
    p = validate(a, b, offsets, counts, None, out_dtype, scale_a=scale_a, scale_b=scale_b)
    return a.new_empty(p.out_shape, dtype=p.out_dtype)


@torch.library.custom_op("gemmlab::grouped_mm_out", mutates_args=("out",))
def _grouped_mm_out_op(a: torch.Tensor, b: torch.Tensor, offsets: Optional[torch.Tensor],
                       counts: Optional[torch.Tensor], out: torch.Tensor) -> None:
    _prepared(a, b, offsets, counts, out, None, None, None)(a, b, offsets, counts, out, None, None)


@_grouped_mm_out_op.register_fake
def _grouped_mm_out_fake(a, b, offsets, counts, out):
    validate(a, b, offsets, counts, out, None)


# Autograd (bf16 / fp16, both layouts) ------------------------------------------------------------------------
#
#   out_g = a_g @ b[g]^T    =>   da_g = dout_g @ b[g]        db[g] = dout_g^T @ a_g
#
# No host sync (a compiled backward traces it), and as few device ops as there can be: in eager mode a small
# layer's backward is bound by the host's launches. da runs on this kernel with b[g] read MN-major in place
# (``Tr::B_MN``; K a multiple of 64, N of 8) into zeros: it reads dout's rows inside the groups (clamped as
# the forward clamps them) and writes only those, so rows outside every group (or past a count) stay 0 with
# no masking. db runs on torch's GEMMs: contiguous, torch._grouped_mm's 2-D x 2-D form over the groups'
# clamped ends (it reads the rows up to the last end and no further; the rows before the first group, where
# offsets[0] > 0, go to a leading dummy group whose result is dropped, or are zeroed in a where that is
# cheaper); masked, a batched GEMM over the slabs with the rows past each count zeroed in both operands.
# A transposed copy of b (2.4 ms for 64 experts of 2816 x 2048, measured) is never made where MN-major b
# fits; elsewhere da is torch._grouped_mm's (2-D x 3-D) with the rows outside the groups zeroed, or, where
# torch has no _grouped_mm for the call, this kernel over that copy, and db one GEMM per group (offsets read
# on the host). Offsets that decrease are not supported in backward (a router's never do).


def _row_ranges(offsets: torch.Tensor, T: int, G: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(starts, ends) of the contiguous layout's groups as the kernel reads them (group_scheduler.cuh):
    G + 1 boundaries or G ends, clamped to [0, T], each end at least its start."""
    o = offsets.to(torch.int64)
    lead = o.numel() == G + 1
    b = o[:G] if lead else torch.cat([o.new_zeros(1), o[:G - 1]])
    e = o[1:G + 1] if lead else o[:G]
    s = b.clamp(0, T)
    return s, torch.maximum(e, s).clamp(max=T)


def _mn_major_da(dy, b, offsets, counts, like):
    """da on this kernel, b[g] read MN-major in place, into zeros (rows outside the groups stay 0); None where
    MN-major b does not fit (not offered, K not a multiple of 64, N not of 8)."""
    if not (MN_MAJOR_B_OFFERED and b.shape[1] % BK == 0 and b.shape[2] % 8 == 0):
        return None
    da = torch.zeros_like(like, memory_format=torch.contiguous_format)
    grouped_mm(dy.contiguous(), b.transpose(1, 2), offsets, counts=counts, out=da)
    return da


def _grads_contiguous(dy, a, b, offsets, need_a: bool, need_b: bool):
    G, T = b.shape[0], a.shape[0]
    da = _mn_major_da(dy, b, offsets, None, a) if need_a else None
    need_a = need_a and da is None
    gmm = getattr(torch, "_grouped_mm", None)
    if gmm is not None:
        try:
            db = _db_torch(gmm, dy, a, offsets, G, T) if need_b else None
            if need_a:
                starts, ends = _row_ranges(offsets, T, G)
                inside = _inside(starts, ends, T)
                da = torch.where(inside, gmm(torch.where(inside, dy, 0), b, offs=ends.to(torch.int32)), 0)
            return da, db
        except (RuntimeError, NotImplementedError):
            pass  # this dtype or GPU: below
    starts, ends = _row_ranges(offsets, T, G)
    inside = _inside(starts, ends, T)
    dyz = torch.where(inside, dy, 0)
    db = None
    if need_a:
        da = torch.zeros_like(a, memory_format=torch.contiguous_format)
        pad = -b.shape[1] % 8  # N is this GEMM's reduction: a multiple of 8 (zero columns add nothing)
        bt = torch.nn.functional.pad(b.transpose(1, 2), (0, pad)) if pad else b.transpose(1, 2).contiguous()
        grouped_mm(torch.nn.functional.pad(dyz, (0, pad)) if pad else dyz.contiguous(), bt, offsets, out=da)
    if need_b:
        az = torch.where(inside, a, 0)
        db = a.new_zeros(G, dy.shape[1], a.shape[1])
        for g, (s, n) in enumerate(group_rows("contiguous", offsets, G, T)):
            if n:
                db[g] = dyz[s:s + n].t() @ az[s:s + n]
    return da, db


def _inside(starts, ends, T):
    """(T, 1) mask of the rows inside the groups (from the first group's start to the last one's end)."""
    r = torch.arange(T, device=starts.device)
    return ((r >= starts[:1]) & (r < ends[-1:]))[:, None]


def _db_torch(gmm, dy, a, offsets, G: int, T: int):
    """db[g] = dy_g^T a_g by torch._grouped_mm (2-D x 2-D, groups cut at their ends, clamped to the rows).
    G ends: group 0 starts at row 0, nothing to mask. G + 1 boundaries: the rows before offsets[0] belong
    to no group; a leading dummy group takes them (its N x K result dropped) where that writes fewer bytes
    than zeroing a's rows (T x K read and written), else they are zeroed."""
    bounds = offsets.clamp(0, T)
    if offsets.numel() == G:
        return gmm(dy.t(), a, offs=bounds)
    N, K = dy.shape[1], a.shape[1]
    if N * K <= 2 * T * K:
        return gmm(dy.t(), a, offs=bounds)[1:]
    first = torch.arange(T, device=a.device)[:, None] >= bounds[:1]
    return gmm(dy.t(), torch.where(first, a, 0), offs=bounds[1:])


def _grouped_setup(ctx, inputs, output) -> None:
    a, b, offsets, counts, out_dtype = inputs
    ctx.save_for_backward(a, b, offsets, counts)


def _grouped_backward(ctx, dout):
    a, b, offsets, counts = ctx.saved_tensors
    dy = dout.to(a.dtype)
    need_a, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    if counts is None:
        da, db = _grads_contiguous(dy, a, b, offsets, need_a, need_b)
    else:
        da = _mn_major_da(dy, b, None, counts, a) if need_a else None
        db = None
        if need_b or (need_a and da is None):
            C = a.shape[1]
            live = (torch.arange(C, device=a.device)[None, :] < counts.clamp(0, C)[:, None])[..., None]
            dyz = torch.where(live, dy, 0)
            if need_a and da is None:
                da = torch.bmm(dyz, b)
            if need_b:
                db = torch.bmm(dyz.transpose(1, 2), torch.where(live, a, 0))
    return (None if da is None else da.to(a.dtype)), (None if db is None else db.to(b.dtype)), None, None, None


torch.library.register_autograd("gemmlab::grouped_mm", _grouped_backward, setup_context=_grouped_setup)


class _EagerGrouped(torch.autograd.Function):
    """Eager ``grouped_mm`` calls that need a gradient (``ops.eager_mode`` says ``_GRAD``; bf16 / fp16, no
    ``out=``): the prepared call (validated and looked up by the caller, passed last) as the forward and
    ``_grouped_backward`` as the backward, without the op's dispatch around torch.library's autograd
    Function: a training step's host time on the dev machine (launches stubbed) 341 -> ~150 us. The
    combined forward (``ctx`` first, no ``setup_context``, as ``autograd._EagerMatmul``). Like the op's
    registered formula, it does not run under functorch transforms (torch.func.grad, vmap)."""

    @staticmethod
    def forward(ctx, a, b, offsets, counts, call):
        ctx.save_for_backward(a, b, offsets, counts)
        return call(a, b, offsets, counts, None, None, None)

    @staticmethod
    def backward(ctx, dout):
        return *_grouped_backward(ctx, dout)[:4], None


def _check_call(a, b, offsets, counts, out, out_dtype, scale_a, scale_b) -> GroupedProblem:
    """``validate``, and what ``grouped_mm`` refuses on top of it (FP8 with ``out=``)."""
    p = validate(a, b, offsets, counts, out, out_dtype, scale_a=scale_a, scale_b=scale_b)
    if p.dtype == E4M3 and out is not None:
        raise UnsupportedProblem("FP8 grouped_mm returns a new tensor (out_dtype=...), it takes no out=")
    return p


# Prepared calls: validated, planned and built once per metadata key --------------------------------------

# The grouped kernel's parameters, in order (engine_gemm_grouped in kernels/engine/gemm_grouped.cu).
PARAMS = ("tmap", "tmap", "tmap", "tmap", "tmap", "ptr", "i32", "i32", "i32", "i32", "i32", "i32", "ptr", "ptr", "i32",
          "ptr", "i64", "ptr", "ptr", "tmap", "tmap", "tmap", "tmap", "tmap")
_P_A, _P_B, _P_C, _P_SA_MAP, _P_SB_MAP, _P_RANGES = range(6)
_P_SA, _P_SB, _P_OUT, _P_WS, _P_FLAGS = 12, 13, 15, 17, 18
_P_A_SHORT = (19, 20, 21, 22)  # A's short boxes (short_a_rows)
_P_C_TAIL = 23  # out's tail piece (bn % piece columns), or out's map again


class GroupedLaunch:
    """``launch`` prepared once, as ``engine2.Fp8Launch`` is for the dense FP8 kernel: the instantiation, a
    ``Launcher`` whose parameter block is built once, and descriptors (``MapSlot``) that follow the
    tensors passed to ``run`` (an address replaced only when it changed). ``grouped_mm`` keeps one per
    metadata key (``_key``).

    Built from tensors with the metadata of every later call's (shapes, strides, dtypes, device, 16-byte
    alignment), arguments as ``launch``'s. The offsets / counts are a pointer: their values are read on
    the device, never here. Block scales are read where they are when ``scale_rows_mn_major`` takes them
    in place; otherwise each ``run`` re-lays them into a buffer from torch's allocator (stream-ordered,
    and a CUDA graph's pool during capture: no buffer of this launch's own is shared between streams or
    graphs)."""

    def __init__(self, p: GroupedPlan, a: torch.Tensor, b: torch.Tensor, ranges: torch.Tensor, lead: int,
                 out: torch.Tensor, scale_a: torch.Tensor | None = None, scale_b: torch.Tensor | None = None,
                 sb_step: int = 0):
        G, N, K = b.shape
        rows = a.shape[0] if a.dim() == 2 else a.shape[1]
        if (G, rows, N, K) != (p.groups, p.rows, p.N, p.K) or (a.dim() == 2) != (p.layout == "contiguous"):
            raise UnsupportedProblem(f"plan is for {p.layout} {p.groups} x {p.rows} x {p.N} x {p.K}, the operands "
                                     f"are a {tuple(a.shape)}, b {tuple(b.shape)}")
        o2 = _rows2d(out)
        if not p.direct and not tma_storable(out):
            raise UnsupportedProblem("this plan TMA-stores out, whose rows or start are not 16-byte aligned: use "
                                     "a plan with direct=True (plan_for picks one)")
        self.plan = p
        self.fp8 = p.dtype == "e4m3"
        self.block = p.scale == "block"
        self.dev = _index(a.device)
        self.stream_k = p.schedule == "stream_k"
        la = p.launch_args()
        L = self.launcher = Launcher(compile_plan(p), PARAMS, grid=la["grid"], block=la["block"], smem=la["smem"],
                                     cluster=None, device_index=self.dev, pdl=True)
        if self.stream_k or p.claim:  # grown now, before a graph capture of a later call could need it to grow
            stream_k_workspace(p, self.dev, raw_stream(self.dev))
        for i, v in ((6, lead), (7, G), (8, rows), (9, N), (10, K), (11, min(p.panel, 2**31 - 1)), (14, sb_step)):
            L.set_i32(i, v)
        L.set_i64(16, o2.stride(0))
        if mn_major(b) != p.b_mn:
            raise UnsupportedProblem(f"plan is for {'MN' if p.b_mn else 'K'}-major b; b has strides {b.stride()}")
        a2, (b2, b_box) = _rows2d(a), _b_rows(b, p)
        dt = torch.uint8 if self.fp8 else a.dtype  # TMA moves FP8 as bytes; a k-step is one 128-byte row
        row = 128 // a2.element_size()
        self.map_a = self.map_a_short = MapSlot(L, _P_A, a2.data_ptr(), *a2.shape, a2.stride(0), dt, (p.bm, row))
        self.maps_a_short = [MapSlot(L, i, a2.data_ptr(), *a2.shape, a2.stride(0), dt, (h, row))
                             for i, h in zip(_P_A_SHORT, short_a_rows(p.bm))]
        self.map_b = self.map_b_short = MapSlot(L, _P_B, b2.data_ptr(), *b2.shape, b2.stride(0), dt, b_box)
        self.maps_c = OutputMaps(L, _P_C, _P_C_TAIL, o2, store_boxes(p.bn, o2), p.direct, self.map_a)
        self.map_sa = self.map_sb = None
        if self.block:  # per k-step one box of each (from multiples of 4): A's bm + 4 row scales, B's 8 blocks
            self.map_sa, self.sa_in_place = self._scale_map(_P_SA_MAP, scale_a, (1, p.bm + 4))
            self.map_sb, self.sb_in_place = self._scale_map(_P_SB_MAP, scale_b, (1, 8))
        else:
            L.set_map(_P_SA_MAP, self.map_a.tmap)  # unread
            L.set_map(_P_SB_MAP, self.map_a.tmap)

    def _scale_map(self, index: int, scale: torch.Tensor, box: tuple[int, int]) -> tuple[MapSlot, bool]:
        from .engine2 import scale_map

        return scale_map(self.launcher, index, scale, scale_rows_mn_major(scale), box)

    def run(self, stream: int, a: torch.Tensor, b: torch.Tensor, ranges: torch.Tensor, out: torch.Tensor,
            scale_a: torch.Tensor | None, scale_b: torch.Tensor | None) -> None:
        """Launch on ``stream`` (a raw handle) for tensors with the metadata this launch was built for."""
        from .engine2 import point_scale_maps, scale_views

        views = scale_views(self, scale_rows_mn_major, scale_a, scale_b)  # kept alive until enqueued
        ws = stream_k_workspace(self.plan, self.dev, stream) if self.stream_k or self.plan.claim else None
        L = self.launcher
        with L.lock:
            po = out.data_ptr()
            pa = a.data_ptr()
            point_maps(self, pa, b.data_ptr(), po)
            for m in self.maps_a_short:
                m.point_at(pa)
            point_scale_maps(self, views)
            L.set_ptr(_P_RANGES, ranges.data_ptr())
            L.set_ptr(_P_SA, scale_a.data_ptr() if self.fp8 else po)  # bf16 reads no scales
            L.set_ptr(_P_SB, scale_b.data_ptr() if self.fp8 else po)
            L.set_ptr(_P_OUT, po)
            L.set_ptr(_P_WS, ws[0].data_ptr() if ws else po)  # data-parallel reads neither
            L.set_ptr(_P_FLAGS, ws[1].data_ptr() if ws else po)
            L.launch(stream)


# The fitted form's parameters (engine_gemm_grouped_fit): the weights' map, FIT_MAP_SLOTS token maps (one a
# width up to the plan's bn; the slots past it are never read and hold the first width's), then ranges, lead,
# G, limit, N, K, out, ldo.
FIT_PARAMS = ("tmap",) * (1 + FIT_MAP_SLOTS) + ("ptr", "i32", "i32", "i32", "i32", "i32", "ptr", "i64")
_F_RANGES = 1 + FIT_MAP_SLOTS
_F_OUT = _F_RANGES + 6


class FitLaunch:
    """``GroupedLaunch`` for the fitted form (``GroupedPlan.fit``): its own parameter block and descriptors
    (the weights' rows, the tokens' rows in a box of each of ``fit_widths``) following the tensors passed
    to ``run``."""

    def __init__(self, p: GroupedPlan, a: torch.Tensor, b: torch.Tensor, lead: int, out: torch.Tensor):
        G, N, K = b.shape
        if not p.fit or (G, a.shape[0], N, K) != (p.groups, p.rows, p.N, p.K) or a.dim() != 2:
            raise UnsupportedProblem(f"plan {p!r} is not the fitted form for a {tuple(a.shape)}, b {tuple(b.shape)}")
        self.plan = p
        self.dev = _index(a.device)
        la = p.launch_args()
        L = self.launcher = Launcher(compile_plan(p), FIT_PARAMS, grid=la["grid"], block=la["block"],
                                     smem=la["smem"], cluster=None, device_index=self.dev, pdl=True)
        for i, v in enumerate((lead, G, a.shape[0], N, K), _F_RANGES + 1):
            L.set_i32(i, v)
        L.set_i64(_F_OUT + 1, _rows2d(out).stride(0))
        b2, row = _rows2d(b), 128 // a.element_size()
        self.map_w = MapSlot(L, 0, b2.data_ptr(), *b2.shape, b2.stride(0), b.dtype, (p.bm, row))
        self.maps_t = [MapSlot(L, 1 + i, a.data_ptr(), *a.shape, a.stride(0), a.dtype, (w, row))
                       for i, w in enumerate(fit_widths(p.bn))]
        for i in range(len(self.maps_t), FIT_MAP_SLOTS):  # never read: the first width's (valid) descriptor
            L.set_map(1 + i, self.maps_t[0].tmap)

    def run(self, stream: int, a: torch.Tensor, b: torch.Tensor, ranges: torch.Tensor, out: torch.Tensor,
            scale_a=None, scale_b=None) -> None:
        L = self.launcher
        with L.lock:
            self.map_w.point_at(b.data_ptr())
            for m in self.maps_t:
                m.point_at(a.data_ptr())
            L.set_ptr(_F_RANGES, ranges.data_ptr())
            L.set_ptr(_F_OUT, out.data_ptr())
            L.launch(stream)


def _key(a, b, offsets, counts, out, out_dtype, scale_a, scale_b) -> tuple:
    """Everything ``validate``, the plan and the launch depend on, except the tensors' addresses and the
    offsets' / counts' values (read on the device; the plan is priced for evenly filled groups, from the
    shapes alone): each tensor's shape, strides, dtype, device and 16-byte alignment (``ops._meta``: the
    offsets' length says boundaries or ends; the scales' shapes say per-tensor, per-group or block, their
    strides and alignment whether block scales are read in place; out's alignment whether TMA stores
    it), which of offsets / counts (the layout), and the out dtype."""
    m = ops._meta
    return (m(a), m(b), None if offsets is None else m(offsets), None if counts is None else m(counts),
            None if out is None else m(out), out_dtype, None if scale_a is None else m(scale_a),
            None if scale_b is None else m(scale_b))


class _Prepared:
    """A validated ``grouped_mm`` call and its launch (``GroupedLaunch``), run for every call with the
    same ``_key``. Problems without rows or columns keep no launch."""

    __slots__ = ("shape", "out_dtype", "device", "dev", "launch")

    def __init__(self, p: GroupedProblem, a, b, offsets, counts, out, scale_a, scale_b):
        self.shape, self.out_dtype, self.device = p.out_shape, p.out_dtype, a.device
        self.dev = a.get_device()
        self.launch = None
        if not _runs_here(a):
            raise UnsupportedProblem(f"grouped_mm runs on a CUDA (Hopper) device; the operands are on {a.device}")
        if p.rows and p.N:
            if a.data_ptr() % 16 or b.data_ptr() % 16:
                raise UnsupportedProblem("a and b must start 16-byte aligned (TMA)")
            example = out if out is not None else torch.empty(p.out_shape, dtype=p.out_dtype, device=a.device)
            pl = plan_for(a, b, offsets, counts, out_dtype=p.out_dtype, scale_a=scale_a, scale_b=scale_b)
            if not pl.direct and not tma_storable(example):  # an out= view at an odd start: store directly
                pl = dataclasses.replace(pl, direct=True)
            ranges = offsets if offsets is not None else counts
            with ops._on_device(a.device):  # the kernel loads and its smem limit is set on a's device
                self.launch = (FitLaunch(pl, a, b, p.lead, example) if pl.fit else
                               GroupedLaunch(pl, a, b, ranges, p.lead, example, scale_a, scale_b, p.sb_step))

    def __call__(self, a, b, offsets, counts, out, scale_a, scale_b) -> torch.Tensor:
        if out is None:
            out = torch.empty(*self.shape, dtype=self.out_dtype, device=self.device)
        if self.launch is not None:
            ops.run_on(self.dev, self.launch, a, b, offsets if offsets is not None else counts, out, scale_a, scale_b)
        return out


_PREPARED: dict[tuple, _Prepared] = {}
MAX_PREPARED = 4096  # keys without end (e.g. every token count): start over


def _prepared(a, b, offsets, counts, out, out_dtype, scale_a, scale_b) -> _Prepared:
    """The prepared call for these arguments: from the cache, else validated (every error raised here,
    before any device work) and prepared (``ops.keep_prepared``: not kept under CUDA graph capture)."""
    try:
        key = _key(a, b, offsets, counts, out, out_dtype, scale_a, scale_b)
        call = _PREPARED.get(key)
    except (RuntimeError, TypeError, AttributeError):  # unhashable arguments, lists for offsets...
        key = call = None
    if call is not None:
        return call
    p = _check_call(a, b, offsets, counts, out, out_dtype, scale_a, scale_b)
    call = _Prepared(p, a, b, offsets, counts, out, scale_a, scale_b)
    ops.keep_prepared(_PREPARED, key, call, a.device, MAX_PREPARED)
    return call


def clear_prepared_calls() -> None:
    """Forget every prepared ``grouped_mm`` call (the next call of each key validates and prepares again)."""
    _PREPARED.clear()


# The reference (pure torch, any device) -----------------------------------------------------------------

def group_rows(layout: str, ranges: torch.Tensor, groups: int, rows: int) -> list[tuple[int, int]]:
    """(first row, row count) of each group, clamped as the kernel clamps them (reads ``ranges`` on the host;
    contiguous: ``_row_ranges``, the rule the backward applies on the device)."""
    if layout == "masked":
        return [(g * rows, min(max(int(c), 0), rows)) for g, c in enumerate(ranges.cpu().tolist()[:groups])]
    starts, ends = _row_ranges(ranges.cpu(), rows, groups)
    return [(s, e - s) for s, e in zip(starts.tolist(), ends.tolist())]


def reference_grouped_mm(a, b, offsets=None, counts=None, *, fill: float = float("nan"),
                         dtype: torch.dtype = torch.float64, scale_a=None, scale_b=None) -> torch.Tensor:
    """What ``grouped_mm`` writes, in ``dtype`` (float64 by default), with ``fill`` in the rows it does not
    write. Same arguments as ``grouped_mm`` (e4m3: of the dequantized inputs, per-tensor or block scales:
    a[r, k] x scale_a[r, k // 128], b[g, n, k] x scale_b[g, n // 128, k // 128]); reads offsets / counts on
    the host; runs on CPU too."""
    p = validate(a, b, offsets, counts, None, None, scale_a=scale_a, scale_b=scale_b)
    a2 = _rows2d(a).to(dtype)
    if p.scale == "block":
        a2 = a2 * _rows2d(scale_a).to(dtype).repeat_interleave(FP8_BLOCK, dim=1)
    elif p.dtype == E4M3:
        a2 = a2 * scale_a.to(dtype).reshape(())
    ref = torch.full((a2.shape[0], p.N), fill, dtype=dtype, device=a.device)
    for g, (s, n) in enumerate(group_rows(p.layout, offsets if offsets is not None else counts, p.groups, p.rows)):
        if n:
            w = b[g].to(dtype)
            if p.scale == "block":
                w = w * scale_b[g].to(dtype).repeat_interleave(FP8_BLOCK, 0)[:p.N].repeat_interleave(FP8_BLOCK, 1)
            elif p.dtype == E4M3:
                w = w * scale_b.to(dtype).reshape(-1)[g if p.sb_step else 0]
            ref[s:s + n] = a2[s:s + n] @ w.t()
    return ref.reshape(p.out_shape)


# What the SASS must show ------------------------------------------------------------------------------

def sass_expect(p: GroupedPlan):
    """The grouped kernel's SASS: bf16/fp16 wgmma (HGMMA; e4m3: QGMMA and no HGMMA), TMA loads, the group
    table's warp scan (SHFL.UP), TMA stores (UTMASTG) for the blocks inside a group unless the plan is
    ``direct`` (then none), no mma.sync, no local memory, no GPU-wide fence in a loop; setmaxnreg with two
    consumers; programmatic dependent launch's wait and trigger; stream-K's flag release (RED), its
    partials' fence allowed where data-parallel plans (and the fitted form's, either schedule) have none."""
    from .sass import PDL_OPCODES, SassExpect

    mma = r"^QGMMA" if p.dtype == "e4m3" else r"^HGMMA"  # FP8 wgmma prints as QGMMA
    contains = [mma, r"^UTMALDG", r"^SHFL\.UP", *PDL_OPCODES] + ([r"^USETMAXREG"] if p.consumers > 1 else [])
    contains += [r"^RED"] if p.schedule == "stream_k" else []
    contains += [] if p.direct else [r"^UTMASTG"]
    absent = (r"^HMMA",) + ((r"^UTMASTG",) if p.direct else ()) + ((r"^HGMMA",) if p.dtype == "e4m3" else ())
    absent += (r"^LDGSTS",) if p.scale == "block" else ()  # block scales ride the ring by TMA: no cp.async
    return SassExpect(contains=tuple(contains), absent=absent, no_local_memory=True,
                      loop_absent=(r"^MEMBAR\.ALL\.GPU",) if p.schedule == "data_parallel" or p.fit else ())
