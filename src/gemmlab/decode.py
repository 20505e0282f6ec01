"""The decode path of ``gemmlab.matmul``: small M (tokens) against an nn.Linear weight (issue 5).

``kernels/engine/decode.cu`` computes out^T = W . X^T with mma.sync, the weight as the 16-row MMA operand
and loaded straight from global memory (see that file's header). This module decides whether a problem
takes that path (``why_not``), how the work is split (``plan``), and launches it (``gemm``). The engine
(``gemmlab.engine.gemm``) calls it; everything except ``gemm`` runs without a GPU.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import torch

from .devices import H200, DeviceProfile
from .planner import cpp_bool
from .log import logger

SOURCE = "engine/decode.cu"
# The M cutoff: M <= MAX_M takes the decode kernel. The kernel runs up to KERNEL_MAX_M tokens (NT = 8),
# but at M = 33..64 h11 is predicted to win (docs/worklog.md, "Decode kernel"); benchmarks/decode_variants.py
# times NT = 8 against torch.mm and h11 to re-check.
MAX_M = 32
KERNEL_MAX_M = 64
WARPS = 8  # warps per CTA; must match decode::WARPS in decode.cu
CHUNK_K = 128  # K pieces are multiples of this (every U's 32 U k divides it)
# A warp's k piece at least (its even share of K otherwise). Until session 48 it was 256 ("8 KB of weight a
# warp, or the fixed costs dominate"): at K < 2048 that left each warp two serial iterations where one
# suffices. Measured (H100, h100_decode_splits.jsonl at 71f9635, unsplit plans, graph replay): pieces of 128
# against 256 ran 1x897x515 3.26 against 4.53 us, 1x1024x1024 2.80 / 3.26, 32x896x896 3.83 / 4.50,
# 32x1024x1024 3.93 / 4.59, 16x1152x1024 3.69 / 4.23, 1x2048x768 3.15 / 3.56. (Split plans kept 256 for a
# session, while ``plan_time`` priced a split's fix-up at ~0.2 us; priced as measured since session 49,
# ``DeviceProfile.decode_split_latency_s``, the one minimum serves both.)
MIN_WARP_K = CHUNK_K
_IDX_LIMIT = 2**31  # the kernel indexes X rows with 32-bit offsets


@dataclass(frozen=True)
class Variant:
    """The kernel's compile-time choices (template parameters of ``engine_decode``, see decode.cu):
    ``u`` 32-k chunks per iteration, ``rpw`` 16-row groups per warp, ``depth`` iterations of weight loads
    in flight (2: the next iteration's loads are issued before this one's mmas), ``pf`` the L2 prefetch
    distance in iterations (0: none), ``aligned`` the 16-byte contract (False: rows at any address, K any;
    a lane holds U + 1 windows a row for U used, see ``UNALIGNED_VARIANTS``), ``strided`` (unaligned only) a
    warp's 16 rows 8 apart, so that they share one shift and only X is cut (decode.cu's ``strided_row``)."""

    u: int = 4
    rpw: int = 1
    depth: int = 1
    pf: int = 1
    aligned: bool = True
    strided: bool = False

    def __post_init__(self):
        assert self.u in (1, 2, 4) and self.rpw in (1, 2) and self.depth in (1, 2) and self.pf in (0, 1, 2)
        assert not self.strided or (not self.aligned and self.rpw == 1), "strided: unaligned rows, rpw 1"

    @property
    def rows(self) -> int:
        """Weight rows per warp."""
        return 16 * self.rpw

    @property
    def in_flight_bytes(self) -> int:
        """Weight bytes a warp has requested into registers while it waits (32 lanes x 2 rows x 16 B per
        chunk and row group)."""
        return 1024 * self.u * self.rpw * self.depth

    def min_blocks(self, nt: int) -> int:
        """CTAs per SM the register budget is sized for: decode::min_blocks in decode.cu."""
        if nt == 1 and self.rpw == 1 and self.depth == 1:
            return 3
        return 1 if nt * self.rpw >= 16 else 2

    def max_registers(self, nt: int) -> int:
        """ptxas's cap from the launch bounds: 64 K registers over min_blocks CTAs of 256 threads, in 8s."""
        return min(255, 65536 // (WARPS * 32 * self.min_blocks(nt)) // 8 * 8)


# Per NT, the variant predicted fastest (docs/worklog.md, "Decode kernel"); all fit their register cap
# without local memory (tests/test_decode.py checks every one in VARIANTS).
#  NT = 1: two buffers of 4 chunks: 8 KB of weight loads per warp always in flight (123 registers).
#  NT = 2: two buffers of 2 chunks (~96 registers; U = 4 needs more than 128 and spills).
#  NT = 4: the first kernel (U = 4, 16 rows per warp): on the H200 (benchmarks/results/decode_variants.jsonl,
#  sha afb5635) it beat the predicted 32-rows-per-warp variant on 6 of the 8 Llama shapes at M = 32
#  (0.68-0.97x torch against 0.59-0.75x).
#  NT = 8 (benchmarks only: M > MAX_M goes to h11, which measured 0.60-0.84x at M = 64 against the
#  decode kernel's 0.33-0.64x): the first kernel. The 32-rows-per-warp NT = 8 variants needed 72 KB of
#  dynamic shared memory and failed to launch (CUDA_ERROR_INVALID_VALUE) on the H200; not offered.
DEFAULT_VARIANTS = {1: Variant(u=4, rpw=1, depth=2), 2: Variant(u=2, rpw=1, depth=2),
                    4: Variant(u=4), 8: Variant(u=2)}
# Rows at any address (``why_not`` allows them, ``aligned`` says which contract a call gets): a lane holds
# U + 1 aligned 16-byte windows a row for the U chunks it uses (decode.cu's ``WRow``), one iteration of four
# chunks at every NT (at NT = 1 three CTAs an SM). Measured against the trials below (decode_variants.jsonl
# at edda661, H200; h100_decode_variants.jsonl at eec817f, H100, 10 more shapes): NT = 1 u=4 depth 1 best or
# within 2% on four of five H200 shapes (1x4095x4095 14.3 us against 16.9 for u=4 depth 2 and 16.1 for
# session 42's u=2 depth 2 of two windows a chunk, ``Straddle``), on the H100 1.3% behind u=4 depth 2 in
# geomean over eight (up to 15% at 1x28673x4095, 14% ahead at 4x6145x2047); NT = 2 u=4 6-9% ahead of u=2
# depth 2 on two H100 shapes, 3% behind on one H200 shape (session 42's u=2 pf=2 23.0 us at 16x4095x4095,
# against 17.7); NT = 4 u=4 21.7 us at 32x4095x4095 (session 42's 29.7). Still 1.4-1.5x the aligned
# kernel's time on the same bytes: each 16 bytes a lane uses costs ~23 instructions to cut. Up to MAX_M
# tokens only: at NT = 8 the unaligned variants spill.
UNALIGNED_VARIANTS = {1: Variant(u=4, aligned=False), 2: Variant(u=4, aligned=False), 4: Variant(u=4, aligned=False)}
# Weights of STRIDED_MIN_BYTES or more read at any address run the strided variants instead (a warp's rows 8
# apart, one shift a tile: only X is cut; decode.cu's ``strided_row``), at NT = 1 two iterations deep from
# STRIDED_DEEP_BYTES. First GPU run (H100, h100_decode_variants.jsonl at d93081b, 26 unaligned shapes, M 1-32):
# from 33 MB up the best strided variant beat the variant above on all 15 shapes, by 0.78-0.99x its time
# (1x28673x4095 92.3 us against 118.4, 1x8198x13828 89.8 against 111.0, 1x11008x4095 38.5 against 46.3;
# at NT = 2-4 0.94-0.98x); below 30 MB it won 4 of 11 and lost up to 1.26x (32x2049x2049 17.0 against 13.5,
# 1x4613x771 7.5 against 6.2). At NT = 1 depth 2 led from 47 MB (0.78-0.97x of depth 1's time but for two
# 117 MB shapes within 2%), depth 1 at 33 MB (15.0 against 15.7 us). Not yet timed on the H200.
STRIDED_MIN_BYTES = 30_000_000
STRIDED_DEEP_BYTES = 45_000_000
STRIDED_VARIANTS = {1: Variant(u=4, aligned=False, strided=True), 2: Variant(u=4, aligned=False, strided=True),
                    4: Variant(u=4, pf=2, aligned=False, strided=True)}
# What benchmarks/decode_variants.py times against them on unaligned shapes (the SASS tests compile each).
UNALIGNED_TRIALS = {
    1: (Variant(u=4, depth=2, aligned=False), Variant(u=4, rpw=2, aligned=False),
        Variant(u=2, depth=2, aligned=False), Variant(u=4, aligned=False, strided=True),
        Variant(u=4, depth=2, aligned=False, strided=True)),
    2: (Variant(u=2, depth=2, aligned=False), Variant(u=4, rpw=2, aligned=False), Variant(u=2, pf=2, aligned=False),
        Variant(u=4, aligned=False, strided=True)),
    4: (Variant(u=4, pf=2, aligned=False), Variant(u=2, pf=0, aligned=False), Variant(u=1, rpw=2, aligned=False),
        Variant(u=4, pf=2, aligned=False, strided=True)),
}


# What benchmarks/decode_variants.py times against the defaults (and the SASS tests compile): the
# previous kernel (``Variant(u=4)``, ``Variant(u=2)`` at NT = 8) and one step along each axis.
VARIANTS = {
    1: (Variant(u=4), Variant(u=4, depth=2), Variant(u=4, depth=2, pf=0), Variant(u=4, depth=2, pf=2),
        Variant(u=2, rpw=2, depth=2)),
    2: (Variant(u=4), Variant(u=2, depth=2), Variant(u=2, depth=2, pf=0), Variant(u=2, depth=2, pf=2),
        Variant(u=1, rpw=2, depth=2)),
    4: (Variant(u=4), Variant(u=1, rpw=2, depth=2), Variant(u=1, rpw=2), Variant(u=2, depth=2)),
    8: (Variant(u=2),),
}


def default_variant(nt: int, aligned: bool = True, weight_bytes: int = 0) -> Variant:
    """The variant a call of ``nt`` token tiles runs, of the 16-byte contract or (``aligned`` False) not; a
    weight of ``weight_bytes`` (N x K x the element size) read at any address takes the strided variants
    from ``STRIDED_MIN_BYTES``."""
    if aligned:
        return DEFAULT_VARIANTS[nt]
    if nt not in UNALIGNED_VARIANTS:
        raise ValueError(f"rows at any address are read up to {8 * max(UNALIGNED_VARIANTS)} tokens, not {8 * nt}")
    if weight_bytes < STRIDED_MIN_BYTES:
        return UNALIGNED_VARIANTS[nt]
    v = STRIDED_VARIANTS[nt]
    return dataclasses.replace(v, depth=2) if nt == 1 and weight_bytes >= STRIDED_DEEP_BYTES else v


def unroll(nt: int) -> int:
    """U of the default variant at ``nt`` token tiles."""
    return DEFAULT_VARIANTS[nt].u


def token_tiles(M: int) -> int:
    """NT, the number of 8-token MMA columns: M padded to 8, 16, 32 or 64."""
    for nt in (1, 2, 4, 8):
        if M <= 8 * nt:
            return nt
    raise ValueError(f"M={M} is past the decode kernel's {KERNEL_MAX_M} tokens")


def why_not(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> str | None:
    """None if ``a @ b`` can take the decode kernel, else the first reason it cannot.

    a: (M, K), b: (K, N), bf16 or fp16 (checked by the engine). Needs M <= MAX_M; a and the weight
    ``b.t()`` K-contiguous (``a.stride(1) == 1``, ``b.stride(0) == 1``); ``out`` with unit column stride.
    Rows at any address and any K are read (``aligned`` says which variants a call gets). Only metadata is
    read (works on meta tensors).
    """
    M, K = a.shape
    if M > MAX_M:
        return f"M={M} > {MAX_M}"
    if M == 0 or K == 0 or b.shape[1] == 0:
        return "empty problem"
    if a.stride(1) != 1 and K > 1:
        return "a is not K-contiguous"
    if b.stride(0) != 1 and K > 1:
        return "the weight (b.t()) is not K-contiguous"
    if M * leads(a, b)[0] >= _IDX_LIMIT:
        return "a spans 2^31 elements or more"
    if out is not None and out.stride(1) != 1 and b.shape[1] > 1:
        return "out does not have unit column stride"
    return None


def leads(a: torch.Tensor, b: torch.Tensor) -> tuple[int, int]:
    """Elements between the K-contiguous rows of a (M, K) and of the weight b.t() (b: (K, N)); K where there
    is one row (its stride is then any value)."""
    M, K = a.shape
    return (a.stride(0) if M > 1 else K), (b.stride(1) if b.shape[1] > 1 else K)


def aligned(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a call ``why_not`` allows keeps the kernel's 16-byte contract: K % 8 == 0 and 16-byte aligned
    bases and row strides of a and the weight (one 16-byte load a lane and row: ``DEFAULT_VARIANTS``); else it
    runs ``UNALIGNED_VARIANTS``, which read rows at any address."""
    per16 = 16 // a.element_size()
    lda, ldw = leads(a, b)
    return (a.shape[1] % 8 == 0 and a.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0 and lda % per16 == 0
            and ldw % per16 == 0)


def variant_for(a: torch.Tensor, b: torch.Tensor) -> Variant:
    """The variant a call ``why_not`` allows runs: the default for its token tiles, of the 16-byte contract
    where ``aligned`` holds, else the unaligned one for its weight's size."""
    return default_variant(token_tiles(a.shape[0]), aligned(a, b), b.shape[0] * b.shape[1] * b.element_size())


@dataclass(frozen=True)
class DecodePlan:
    """How one problem is split. A warp owns ``variant.rows`` weight rows x ``piece`` k; a CTA is ``rw`` row
    groups (of variant.rows) x ``kw = WARPS / rw`` k pieces; ``splits`` CTAs share each row block's K
    (reduced by the last one)."""

    nt: int
    rw: int
    splits: int
    piece: int
    row_blocks: int
    variant: Variant = Variant()

    @property
    def kw(self) -> int:
        return WARPS // self.rw

    @property
    def rows_cta(self) -> int:
        return self.variant.rows * self.rw

    @property
    def grid(self) -> tuple[int, int]:
        return (self.row_blocks, self.splits)

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory: the CTA's fp32 partials, kw pieces x 8 nt tokens x (rows_cta + 4)."""
        return 4 * self.kw * 8 * self.nt * (self.rows_cta + 4)


# The split model's constants are the device profile's (``DeviceProfile.decode_split_*``,
# ``decode_in_flight_per_sm``, ``l2_smem_bytes_per_s``): the H200's, with the caller's SM count.
_PROF = H200
MAX_SPLITS = 16


def _terms(M: int, N: int, K: int, sm_count: int, rw: int, splits: int,
           v: Variant) -> tuple[float, float, float, int, int] | None:
    """``plan_time``'s pieces: (weight bytes over the share of in-flight loads the busy warps keep, X's L2
    seconds, the split-K fix-up's seconds, the warp's k piece, row blocks); None if a CTA is left without k."""
    kw = WARPS // rw
    # (Returning None for a piece below the minimum instead, as before, left K < kw x MIN_WARP_K without
    # any plan at small N: linear(x(7, 256), w(14, 256)) asserted in ``plan``.)
    piece = max(math.ceil(math.ceil(K / (splits * kw)) / CHUNK_K) * CHUNK_K,
                min(MIN_WARP_K, math.ceil(K / CHUNK_K) * CHUNK_K))
    if math.ceil(math.ceil(K / piece) / kw) != splits:
        return None
    if v.strided:  # each 128-row block transposed: 8 row groups a block, one residue class mod 8 each, and
        full, rem = divmod(N, 128)  # in a ragged last block only the classes of its first rows have work
        row_groups, working = 8 * math.ceil(N / 128), 8 * full + min(8, rem)
    else:
        row_groups = working = math.ceil(N / v.rows)
    row_blocks = math.ceil(row_groups / rw)
    busy_warps = working * math.ceil(K / piece)
    warps_needed = math.ceil(_PROF.decode_in_flight_per_sm / v.in_flight_bytes)
    fill = min(1.0, busy_warps / (sm_count * warps_needed))
    l2 = _PROF.l2_smem_bytes_per_s
    x_l2 = row_blocks * 2.0 * M * K / l2
    fixup = 0.0 if splits == 1 else _PROF.decode_split_latency_s + splits * (M * v.rows * rw * 4 / (l2 / sm_count)
                                                                             + _PROF.decode_split_overhead_s)
    return 2.0 * N * K / fill, x_l2, fixup, piece, row_blocks


def plan_time(M: int, N: int, K: int, sm_count: int, rw: int, splits: int,
              variant: Variant | None = None) -> tuple[float, DecodePlan] | None:
    """Modelled seconds for one CTA shape (``rw`` row groups per CTA) and ``splits`` CTAs per row block;
    None if that leaves a CTA without k. A warp's piece is the even share of K, but at least MIN_WARP_K
    (or all of K rounded up to CHUNK_K when K is shorter): when that leaves
    warps of a CTA without k (small K: K = 256 with 8 k pieces per CTA), they idle, and the
    one split that covers K is the only valid one.

    Three terms: the weight stream at HBM bandwidth, slowed when the warps with work cannot keep
    ``decode_in_flight_per_sm`` bytes per SM requested (each keeps ``variant.in_flight_bytes``); X's L2
    traffic (each CTA and k piece reads M x piece x 2 B of X once, its warps share it through L1); and the
    split-K fixup,
    which one SM does alone at the end (splits partials of M x rows_cta fp32, at its share of L2 bandwidth).
    """
    nt = token_tiles(M)
    v = variant or default_variant(nt)
    got = _terms(M, N, K, sm_count, rw, splits, v)
    if got is None:
        return None
    weight_bytes, x_l2, fixup, piece, row_blocks = got
    t = max(weight_bytes / _PROF.decode_split_hbm_bytes_per_s, x_l2) + fixup
    return t, DecodePlan(nt=nt, rw=rw, splits=splits, piece=piece, row_blocks=row_blocks, variant=v)


def cost_s(M: int, N: int, K: int, sm_count: int, prof: DeviceProfile, aligned: bool = True) -> float:
    """The decode kernel's time for (M, N, K) as ``engine.route`` prices it against the engine kernel's
    plan: ``plan``'s split (for the ``aligned`` or the unaligned variants), priced with the profile's fitted
    decode constants (``DeviceProfile.decode_*``):
    a fixed cost per call, one per 8-token column (NT), the weight stream (at the plan's fill of in-flight
    loads; each column past the first slows it by ``decode_token_stream_share``) and the split-K fix-up.
    ``plan_time`` alone ran 1.2-7.5x below the measured times (sha ac16df0: 3.3 us measured at 1 x 256 x 2048
    against 1.1 priced, 11.4 against 2.9 at 32 x 1024 x 5120): it only has to rank splits against each
    other, this has to rank kernels. Unaligned (``aligned`` False), the weight
    stream is slower by ``unaligned_factor``."""
    p = plan(M, N, K, sm_count, default_variant(token_tiles(M), aligned, 2 * N * K))  # bf16 or fp16
    weight_bytes, _, fixup, _, _ = _terms(M, N, K, sm_count, p.rw, p.splits, p.variant)
    stream = (weight_bytes / prof.decode_hbm_bytes_per_s * (1.0 + prof.decode_token_stream_share * (p.nt - 1))
              * (1.0 if aligned else unaligned_factor(p.nt, prof, p.variant)))
    return prof.decode_fixed_s + prof.decode_token_tile_s * p.nt + stream + prof.decode_fixup_factor * fixup


def unaligned_factor(nt: int, prof: DeviceProfile, variant: Variant | None = None) -> float:
    """How much slower an unaligned variant (default: ``UNALIGNED_VARIANTS``' at ``nt``) streams the weight
    than the aligned ones at ``nt`` token tiles: every 16 bytes a lane uses is cut out of two windows, for
    each of its two weight rows and NT token rows (``DeviceProfile.decode_unaligned_per_cut`` a cut). A
    strided variant cuts the token rows only, but its transposed blocks cost some of that back: it streams at
    ``DeviceProfile.decode_strided_share`` of the other variants' time (measured, not counted in cuts)."""
    v = variant or default_variant(nt, aligned=False)
    return (1.0 + prof.decode_unaligned_per_cut * (2 + nt)) * (prof.decode_strided_share if v.strided else 1.0)


@functools.lru_cache(maxsize=4096)
def plan(M: int, N: int, K: int, sm_count: int, variant: Variant | None = None) -> DecodePlan:
    """The split for (M, N, K) on ``sm_count`` SMs with ``variant`` (default: ``default_variant``): the CTA
    shape and split count with the least ``plan_time``. Ties (the weight stream's term alone, equal for every
    CTA shape that keeps the loads in flight) go to fewer splits, then to the most CTAs up to
    ``DeviceProfile.decode_fill_ctas_per_sm`` an SM, else the fewest.
    Needs no GPU. Every M in 1..KERNEL_MAX_M and N, K >= 1 has a plan (``rw = 1, splits = 1`` always fits);
    ValueError for sizes outside those.

    What it trades: k pieces inside a CTA (small ``rw``) are reduced cheaply in shared memory, but each
    piece's warps read their own X (at M = 64, X is 4x the weight's bytes per warp); row groups inside a
    CTA (large ``rw``) share X through L1 but need split-K across CTAs to fill the GPU when N is small,
    and the last CTA's fixup grows with splits x M x rows.
    """
    if min(M, N, K) < 1:
        raise ValueError(f"decode.plan needs M, N, K >= 1, got M={M} N={N} K={K}")
    v = variant or default_variant(token_tiles(M))
    best = None
    for rw in (8, 4, 2, 1):
        # Half the row groups past N: skipped, unless no smaller CTA gives a warp MIN_WARP_K (tiny N and K).
        if rw > 1 and v.rows * rw // 2 >= N and (rw == 2 or v.rows * rw // 4 >= N):
            continue
        for splits in range(1, MAX_SPLITS + 1):
            got = plan_time(M, N, K, sm_count, rw, splits, v)
            if got is None:
                continue
            ctas = got[1].row_blocks * splits
            over = ctas > _PROF.decode_fill_ctas_per_sm * sm_count
            key = (got[0], splits, over, ctas if over else -ctas)
            if best is None or key < best[0]:
                best = (key, got[1])
    if best is None:  # unreachable: kept so that a future change fails with a message, also under -O
        raise RuntimeError(f"decode.plan found no split for M={M} N={N} K={K} variant={v}")
    return best[1]


def kernel_expr(in_ctype: str, out_ctype: str, bias_ctype: str, nt: int, epi: int, split: bool,
                variant: Variant | None = None) -> str:
    """The template instantiation of ``engine_decode``: C++ type names, NT, the variant, the epilogue by name
    (``epi``, ``gemmlab.epilogue.epi_bits``' code, spelled out as HAS_BIAS, HAS_C and ACT) and split."""
    v = variant or default_variant(nt)
    has_bias, has_c, act = (cpp_bool(epi & 1), cpp_bool(epi & 2), (epi >> 2) & 7)
    return (f"engine_decode<{in_ctype}, {out_ctype}, {bias_ctype}, {nt}, {v.u}, {v.rpw}, {v.depth}, {v.pf}, "
            f"{cpp_bool(v.aligned)}, {cpp_bool(v.strided)}, {has_bias}, {has_c}, {act}, {cpp_bool(split)}>")



# Split-K buffers, one pair per (device, stream): two streams running decode launches at once must not
# share counters or partials. Buffers are only ever replaced by bigger ones and the old ones are kept
# alive (_RETIRED), because a CUDA graph captured earlier still holds their addresses.
_BUFFERS: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
_RETIRED: list[torch.Tensor] = []
# Counters allocated while the stream was capturing a graph (their data pointers): their zeroing is a node
# of that graph, so until something zeroes them outside a capture they hold whatever the memory held.
# Counters allocated eagerly are zero from the start and every launch leaves them at zero.
_CAPTURED: set[int] = set()


# Zeroed counters made outside any capture and handed to no stream yet, per device (SPARE_COUNTERS of them):
# a stream first seen during a capture (torch.cuda.graph's own capture stream) takes one instead of
# allocating, so that its graph carries no memset node (~2 us each replay).
_SPARE: dict[int, list[torch.Tensor]] = {}
SPARE_COUNTERS = 2
COUNTERS_MIN = 1024


def split_buffers(device: torch.device, ws_floats: int, counters: int, stream: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 workspace and int32 counters (zero when handed out; the kernel leaves them at zero) for
    ``stream`` (a raw stream handle) on ``device``, grown as needed. During a capture a new stream's counters
    are a spare (``_SPARE``, stocked by the eager calls here) where one is big enough; counters allocated
    during a capture are noted in _CAPTURED (``DecodeLaunch`` zeroes them before use)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    key = (idx, stream)
    ws, ctr = _BUFFERS.get(key, (None, None))
    if ws is not None and ws.numel() >= ws_floats and ctr.numel() >= counters:
        return ws, ctr
    capturing = torch.cuda.is_current_stream_capturing()
    if ws is None or ws.numel() < ws_floats:
        if ws is not None:
            _RETIRED.append(ws)
        ws = torch.empty(max(ws_floats, 1 << 16), dtype=torch.float32, device=device)
    if ctr is None or ctr.numel() < counters:
        if ctr is not None:
            _RETIRED.append(ctr)
        spare = _SPARE.get(idx, [])
        fit = next((t for t in spare if t.numel() >= counters), None) if capturing else None
        if fit is not None:
            spare.remove(fit)
            ctr = fit
        else:
            ctr = torch.zeros(max(counters, COUNTERS_MIN), dtype=torch.int32, device=device)
            if capturing:
                _CAPTURED.add(ctr.data_ptr())
    if not capturing:  # spares at least this call's size (smaller ones were never handed out: dropped)
        size = max(counters, COUNTERS_MIN)
        spare = _SPARE[idx] = [t for t in _SPARE.get(idx, []) if t.numel() >= size]
        spare += [torch.zeros(size, dtype=torch.int32, device=device) for _ in range(SPARE_COUNTERS - len(spare))]
    _BUFFERS[key] = (ws, ctr)
    return ws, ctr


# engine_decode's kernel parameters, in order (kernels/engine/decode.cu).
_PARAMS = ("ptr", "i64", "ptr", "i64", "i32", "i32", "i32", "i32", "i32", "f32", "f32", "ptr", "i64", "i64",
           "ptr", "ptr", "ptr", "ptr", "i64")
_W, _X, _ALPHA, _BETA, _CIN, _BIAS, _WS, _CTR, _OUT = 0, 2, 9, 10, 11, 14, 15, 16, 17


class DecodeLaunch:
    """One decode launch, decided and built once (``prepare``): the split, the instantiation, the launch
    shape and the parameter block; ``run`` sets the addresses and scalars of a call and launches."""

    def __init__(self, a, b, out, *, epi: int, ctypes: tuple[str, str, str], c, bias, sm_count: int,
                 variant: Variant | None = None, split: DecodePlan | None = None):
        from .jit.compiler import compile_kernel
        from .jit.launch import Launcher

        M, K = a.shape
        N = b.shape[1]
        variant = variant or variant_for(a, b)
        if variant.aligned and not aligned(a, b):
            raise ValueError(f"{variant} keeps the 16-byte contract, which this call does not (decode.aligned)")
        if split is not None and (split.nt, split.variant) != (token_tiles(M), variant):
            raise ValueError(f"{split} is not a plan of {variant} for M={M}")
        p = self.plan = split or plan(M, N, K, sm_count, variant)
        logger.debug("decode plan %s", p)
        expr = kernel_expr(*ctypes, p.nt, epi, p.splits > 1, p.variant)
        compiled = compile_kernel(SOURCE, expr, arch="sm_90a", name=f"engine.decode[{expr[14:-1]}]")
        self.device = a.device
        self.split = p.splits > 1
        self.ws_floats = p.row_blocks * p.splits * M * p.rows_cta
        self.has_c, self.has_bias = bool(epi & 2), bias is not None
        lda, ldw = leads(a, b)
        cin = c if self.has_c else out
        L = self.launcher = Launcher(compiled, _PARAMS, grid=p.grid, block=WARPS * 32, smem=p.smem_bytes,
                                     device_index=a.get_device(), pdl=True)
        L.set_args((b, ldw, a, lda, M, N, K, p.rw, p.piece, 1.0, 0.0, cin, cin.stride(0), cin.stride(1),
                    bias if bias is not None else out, out, out, out, out.stride(0)))
        # Split-K: the parameter block holds the workspace and counters of one stream (``_bind``), bound here
        # for the stream this call is prepared on, so that a later capture of it allocates nothing; ``run``
        # binds again only when called on another stream. Without split-K they are never touched.
        self._stream: int | None = None
        self._counters: torch.Tensor | None = None
        self._dirty = False  # the bound counters were allocated during a capture and not zeroed since
        if self.split:
            from .jit.launch import raw_stream

            self._bind(raw_stream(a.get_device()))

    def _bind(self, stream: int) -> None:
        ws, ctr = split_buffers(self.device, self.ws_floats, self.plan.row_blocks, stream)
        self.launcher.set_ptr(_WS, ws.data_ptr())
        self.launcher.set_ptr(_CTR, ctr.data_ptr())
        self._stream, self._counters, self._dirty = stream, ctr, ctr.data_ptr() in _CAPTURED

    def run(self, stream: int, a, b, out, bias, c, alpha: float, beta: float) -> None:
        L = self.launcher
        with L.lock:
            po = out.data_ptr()
            L.set_ptr(_W, b.data_ptr())
            L.set_ptr(_X, a.data_ptr())
            L.set_f32(_ALPHA, alpha)
            L.set_f32(_BETA, beta)
            L.set_ptr(_CIN, c.data_ptr() if self.has_c else po)
            L.set_ptr(_BIAS, bias.data_ptr() if self.has_bias else po)
            L.set_ptr(_OUT, po)
            if self.split:
                if stream != self._stream:
                    self._bind(stream)
                if self._dirty:
                    self._zero_counters()
            L.launch(stream)

    def _zero_counters(self) -> None:
        """Counters allocated during a capture: that capture's graph zeroes them when replayed, nothing else
        does. Under a capture, this graph zeroes them too (a memset node, ~2 us; a graph captured later and
        replayed alone would otherwise start from whatever they hold); outside one they are zeroed now, in
        stream order, and stay zero (every launch leaves them so): no later call or capture zeroes them."""
        ctr = self._counters
        ctr.zero_()  # all of it: another launch may share these counters with more row blocks
        if not torch.cuda.is_current_stream_capturing():
            _CAPTURED.discard(ctr.data_ptr())
            self._dirty = False


def prepare(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, *, epi: int, ctypes: tuple[str, str, str],
            c: torch.Tensor | None, bias: torch.Tensor | None, sm_count: int,
            variant: Variant | None = None, split: DecodePlan | None = None) -> DecodeLaunch:
    """The decode launch for tensors with the metadata of these (``DecodeLaunch``), for the engine to keep.

    Called by ``gemmlab.engine.prepare`` after ``why_not(a, b, out)`` returned None. ``epi`` is the
    engine's epilogue bit field (bias | c << 1 | activation << 2), ``ctypes`` the C++ names of the input,
    output and bias types. ``run`` does no host synchronisation and no data-dependent allocation
    (graph-capturable). ``variant`` (default: ``default_variant``) is for benchmarks; so are M up to
    KERNEL_MAX_M, past MAX_M, and ``split``, a plan of that variant other than ``plan``'s (``plan_time``'s)."""
    return DecodeLaunch(a, b, out, epi=epi, ctypes=ctypes, c=c, bias=bias, sm_count=sm_count, variant=variant,
                        split=split)


def gemm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, *, epi: int, ctypes: tuple[str, str, str],
         alpha: float, beta: float, c: torch.Tensor | None, bias: torch.Tensor | None, sm_count: int,
         variant: Variant | None = None, split: DecodePlan | None = None) -> None:
    """Launch the decode kernel on torch's current stream: out = act(alpha * a @ b + beta * c + bias)
    (``prepare`` and ``run`` once; see ``prepare``)."""
    from .jit.launch import raw_stream

    call = prepare(a, b, out, epi=epi, ctypes=ctypes, c=c, bias=bias, sm_count=sm_count, variant=variant,
                   split=split)
    call.run(raw_stream(a.get_device()), a, b, out, bias, c if epi & 2 else None, alpha, beta)


def run_variant(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, variant: Variant | None = None, *,
                bias: torch.Tensor | None = None, activation: str | None = None, alpha: float = 1.0,
                beta: float = 0.0, c: torch.Tensor | None = None, split: DecodePlan | None = None) -> None:
    """``engine.gemm``'s decode branch with an explicit ``variant`` (and ``split``, a plan of it other than
    ``plan``'s) and M up to KERNEL_MAX_M (past MAX_M): for tests and benchmarks (benchmarks/decode_variants.py,
    decode_splits.py). Same operands and contract as engine.gemm, plus ``why_not``'s layout rules other than
    the M cutoff."""
    from .epilogue import ctypes as ctype_names
    from .epilogue import epi_bits

    if a.shape[0] > KERNEL_MAX_M:
        raise ValueError(f"M={a.shape[0]} > {KERNEL_MAX_M}")
    epi = epi_bits(bias is not None, c is not None and beta != 0.0, activation)
    ctypes = ctype_names(a.dtype, out.dtype, None if bias is None else bias.dtype)
    sm = torch.cuda.get_device_properties(a.device).multi_processor_count
    gemm(a, b, out, epi=epi, ctypes=ctypes, alpha=alpha, beta=beta, c=c, bias=bias, sm_count=sm, variant=variant,
         split=split)
