"""The decode path of ``gemmlab.matmul``: small M (tokens) against an nn.Linear weight (issue 5).

``kernels/engine/decode.cu`` computes out^T = W . X^T with mma.sync, the weight as the 16-row MMA operand
and loaded straight from global memory (see that file's header). This module decides whether a problem
takes that path (``why_not``), how the work is split (``plan``), and launches it (``gemm``). The engine
(``gemmlab.engine.gemm``) calls it; everything except ``gemm`` runs without a GPU.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

SOURCE = "engine/decode.cu"
MAX_M = 64  # the M cutoff: M <= MAX_M takes the decode kernel (to re-check against h11 at M = 128)
WARPS = 8  # warps per CTA; must match decode::WARPS in decode.cu
CHUNK_K = 128  # K pieces are multiples of this: 4 chunks of 32 k (U = 4) or 2 iterations of U = 2


def unroll(nt: int) -> int:
    """U, the 32-k chunks per warp iteration (2U 16-byte weight loads per lane): 4, or 2 at NT = 8, where
    four would not fit in 128 registers without local memory."""
    return 2 if nt >= 8 else 4
MIN_WARP_K = 256  # at least 16 rows x 256 k x 2 B = 8 KB of weight per warp, or the fixed costs dominate
_IDX_LIMIT = 2**31  # the kernel indexes X rows with 32-bit offsets


def token_tiles(M: int) -> int:
    """NT, the number of 8-token MMA columns: M padded to 8, 16, 32 or 64."""
    for nt in (1, 2, 4, 8):
        if M <= 8 * nt:
            return nt
    raise ValueError(f"M={M} is past the decode kernel's {MAX_M} tokens")


def why_not(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> str | None:
    """None if ``a @ b`` can take the decode kernel, else the first reason it cannot.

    a: (M, K), b: (K, N), bf16 or fp16 (checked by the engine). Needs M <= MAX_M; a and the weight
    ``b.t()`` K-contiguous (``a.stride(1) == 1``, ``b.stride(0) == 1``); K % 8 == 0; 16-byte aligned base
    pointers and row strides (the kernel reads 8 k per 16-byte load); ``out`` with unit column stride.
    Only metadata is read (works on meta tensors).
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
    if K % 8:
        return f"K={K} is not a multiple of 8"
    per16 = 16 // a.element_size()
    lda = a.stride(0) if M > 1 else K
    ldw = b.stride(1) if b.shape[1] > 1 else K
    if a.data_ptr() % 16 or b.data_ptr() % 16:
        return "a or b is not 16-byte aligned"
    if lda % per16 or ldw % per16:
        return "a row stride or weight row stride is not a multiple of 16 bytes"
    if M * lda >= _IDX_LIMIT:
        return "a spans 2^31 elements or more"
    if out is not None and out.stride(1) != 1 and b.shape[1] > 1:
        return "out does not have unit column stride"
    return None


@dataclass(frozen=True)
class DecodePlan:
    """How one problem is split. A warp owns 16 weight rows x ``piece`` k; a CTA is ``rw`` row groups x
    ``kw = WARPS / rw`` k pieces; ``splits`` CTAs share each row block's K (reduced by the last one)."""

    nt: int
    rw: int
    splits: int
    piece: int
    row_blocks: int

    @property
    def kw(self) -> int:
        return WARPS // self.rw

    @property
    def grid(self) -> tuple[int, int]:
        return (self.row_blocks, self.splits)


# Constants of the split model (H200; to re-fit from measurements): HBM copy bandwidth (issue 5), the
# L2 -> SM bandwidth (gemmlab.model's DeviceProfile, 10 TB/s over all SMs), and what one more split
# costs besides its bytes (a partial write, a fence and an atomic).
HBM_BYTES_PER_S = 4.0e12
L2_BYTES_PER_S = 10.0e12
SPLIT_OVERHEAD_S = 0.05e-6
MAX_SPLITS = 16
FULL_WARPS_PER_SM = 8  # 8 warps x 2-4 KB of weight loads (+ as much prefetched) per SM: ~30 KB in flight


def plan_time(M: int, N: int, K: int, sm_count: int, rw: int, splits: int) -> tuple[float, DecodePlan] | None:
    """Modelled seconds for one CTA shape (``rw`` row groups per CTA) and ``splits`` CTAs per row block;
    None if that leaves a CTA without k or a warp with less than MIN_WARP_K of K (when K allows).

    Three terms: the weight stream at HBM bandwidth, slowed when fewer than FULL_WARPS_PER_SM warps per SM
    have work; X's L2 traffic (each CTA and k piece reads M x piece x 2 B of X once, its warps share it
    through L1); and the split-K fixup, which one SM does alone at the end (splits partials of
    M x 16 rw fp32, at its share of L2 bandwidth).
    """
    kw = WARPS // rw
    piece = math.ceil(math.ceil(K / (splits * kw)) / CHUNK_K) * CHUNK_K
    if piece < min(MIN_WARP_K, math.ceil(K / CHUNK_K) * CHUNK_K):
        return None
    if math.ceil(math.ceil(K / piece) / kw) != splits:
        return None
    row_groups = math.ceil(N / 16)
    row_blocks = math.ceil(row_groups / rw)
    busy_warps = row_groups * math.ceil(K / piece)
    fill = min(1.0, busy_warps / (sm_count * FULL_WARPS_PER_SM))
    weight = 2.0 * N * K / HBM_BYTES_PER_S / fill
    x_l2 = row_blocks * 2.0 * M * K / L2_BYTES_PER_S
    fixup = 0.0 if splits == 1 else splits * (M * 16 * rw * 4 / (L2_BYTES_PER_S / sm_count) + SPLIT_OVERHEAD_S)
    return max(weight, x_l2) + fixup, DecodePlan(nt=token_tiles(M), rw=rw, splits=splits, piece=piece,
                                                  row_blocks=row_blocks)


@functools.lru_cache(maxsize=4096)
def plan(M: int, N: int, K: int, sm_count: int) -> DecodePlan:
    """The split for (M, N, K) on ``sm_count`` SMs: the CTA shape and split count with the least
    ``plan_time`` (ties: fewer splits, then more row groups per CTA). Needs no GPU.

    What it trades: k pieces inside a CTA (small ``rw``) are reduced cheaply in shared memory, but each
    piece's warps read their own X (at M = 64, X is 4x the weight's bytes per warp); row groups inside a
    CTA (large ``rw``) share X through L1 but need split-K across CTAs to fill the GPU when N is small,
    and the last CTA's fixup grows with splits x M x rows.
    """
    best = None
    for rw in (8, 4, 2, 1):
        if rw > 1 and 16 * rw // 2 >= N:  # half the row groups would be past N
            continue
        for splits in range(1, MAX_SPLITS + 1):
            got = plan_time(M, N, K, sm_count, rw, splits)
            if got is None:
                continue
            key = (got[0], splits, -rw)
            if best is None or key < best[0]:
                best = (key, got[1])
    assert best is not None, "splits = 1 with the largest piece always fits"
    return best[1]


def kernel_expr(in_ctype: str, out_ctype: str, bias_ctype: str, nt: int, epi: int, split: bool) -> str:
    """The template instantiation of ``engine_decode`` (C++ type names, NT, epilogue bits, split)."""
    return f"engine_decode<{in_ctype}, {out_ctype}, {bias_ctype}, {nt}, {unroll(nt)}, {epi}, {int(split)}>"


# Split-K buffers, one pair per (device, stream): two streams running decode launches at once must not
# share counters or partials. Buffers are only ever replaced by bigger ones and the old ones are kept
# alive (_RETIRED), because a CUDA graph captured earlier still holds their addresses.
_BUFFERS: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
_RETIRED: list[torch.Tensor] = []


def split_buffers(device: torch.device, ws_floats: int, counters: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 workspace and int32 counters (zeroed once; the kernel leaves them at zero) for the current
    stream of ``device``, grown as needed."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    key = (idx, torch.cuda.current_stream(idx).cuda_stream)
    ws, ctr = _BUFFERS.get(key, (None, None))
    if ws is None or ws.numel() < ws_floats:
        if ws is not None:
            _RETIRED.append(ws)
        ws = torch.empty(max(ws_floats, 1 << 16), dtype=torch.float32, device=device)
    if ctr is None or ctr.numel() < counters:
        if ctr is not None:
            _RETIRED.append(ctr)
        ctr = torch.zeros(max(counters, 1024), dtype=torch.int32, device=device)
    _BUFFERS[key] = (ws, ctr)
    return ws, ctr


def gemm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, *, epi: int, ctypes: tuple[str, str, str],
         alpha: float, beta: float, c: torch.Tensor | None, bias: torch.Tensor | None, sm_count: int) -> None:
    """Launch the decode kernel on torch's current stream: out = act(alpha * a @ b + beta * c + bias).

    Called by ``gemmlab.engine.gemm`` after ``why_not(a, b, out)`` returned None. ``epi`` is the
    engine's epilogue bit field (bias | c << 1 | activation << 2), ``ctypes`` the C++ names of the input,
    output and bias types. No host synchronisation and no data-dependent allocation (graph-capturable).
    """
    from .jit.compiler import compile_kernel
    from .jit.launch import launch

    M, K = a.shape
    N = b.shape[1]
    p = plan(M, N, K, sm_count)
    expr = kernel_expr(*ctypes, p.nt, epi, p.splits > 1)
    compiled = compile_kernel(SOURCE, expr, arch="sm_90a", name=f"engine.decode[{expr[14:-1]}]")
    rows_cta = 16 * p.rw
    if p.splits > 1:
        workspace, counters = split_buffers(a.device, p.row_blocks * p.splits * M * rows_cta, p.row_blocks)
    else:
        workspace, counters = out, out  # never touched without split-K
    lda = a.stride(0) if M > 1 else K
    ldw = b.stride(1) if N > 1 else K
    cin = c if (epi & 2) else out
    args = (b, np.int64(ldw), a, np.int64(lda), np.int32(M), np.int32(N), np.int32(K), np.int32(p.rw),
            np.int32(p.piece), np.float32(alpha), np.float32(beta), cin, np.int64(cin.stride(0)),
            np.int64(cin.stride(1)), bias if bias is not None else out, workspace, counters, out,
            np.int64(out.stride(0)))
    launch(compiled, grid=p.grid, block=WARPS * 32, args=args)
