"""The fp32 route of ``gemmlab.matmul``: float32 operands on CUDA cores, and the rules its kernels share.

``gemmlab.matmul`` runs float32 inputs on the fp32 ladder's last step, ``sgemm.k10_double_buffered``
(``kernels/sgemm/k10_double_buffered.cu``: warp tiles, two shared-memory stages), with the config its
heuristic picks or the one ``gemmlab tune k10`` saved for the shape on this GPU. That step's spec (``K10``)
is defined here and registered by ``gemmlab.ladders.sgemm``, so a call imports nothing that registers,
times or serves kernels. The launch rules the CUDA-core steps share (any shape, the grid, the register
and shared-memory budgets of a config) live here too; the ladder's other steps use them.

Past one launch's reach the route runs row blocks of A and C as separate launches of the same kernel
(``row_blocks``): gridDim.y holds 65,535 tiles (8.4 million rows of 128), and the kernel's index math
is 32-bit (an operand of 2^31 - 1024 elements or more). So any M works whose B (K x N) is below that.
"""

from __future__ import annotations

import numpy as np

from .devices import H200
from .errors import UnsupportedProblem
from .jit.launch import launch
from .kernelspec import KernelSpec, Param
from .sass import SassExpect


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


INDEX_LIMIT = 2**31 - 1024  # elements an operand may have under the kernels' 32-bit index math, tile edges included


def any_shape(cfg, M, N, K):
    """Every sgemm step handles any M, N, K >= 1 (edges are guarded in the kernels)."""
    if min(M, N, K) < 1:
        return "M, N and K must be >= 1"
    if max(M * K, K * N, M * N) >= INDEX_LIMIT:
        return "an operand has 2^31 - 1024 or more elements (32-bit index math, tile edges included)"
    return None


MAX_GRID_Y = 65535  # CUDA's limit on gridDim.y


def grid_y_fits(dim: str, tile_of):
    """``supports`` for a step whose gridDim.y counts tiles of ``tile_of(cfg)`` along ``dim`` ("M" or
    "N"): any shape up to MAX_GRID_Y such tiles (8.3 million rows for 128-row tiles)."""
    def supports(cfg, M, N, K):
        why = any_shape(cfg, M, N, K)
        if why:
            return why
        extent, tile = {"M": M, "N": N}[dim], tile_of(cfg)
        if cdiv(extent, tile) > MAX_GRID_Y:
            return f"{dim}={extent} needs more than {MAX_GRID_Y} tiles of {tile} on gridDim.y"
        return None
    return supports


def launch_args(a, b, c, alpha, beta):
    """The arguments every sgemm step takes: (M, N, K, alpha, A, B, beta, C)."""
    M, K = a.shape
    N = b.shape[1]
    return (np.int32(M), np.int32(N), np.int32(K), np.float32(alpha), a, b, np.float32(beta), c)


def tiled_launcher(threads_of):
    """The launch of the steps from k04 on: a 1-D block of ``threads_of(cfg)`` threads, grid = (column
    tiles, row tiles)."""
    def launcher(spec, compiled, cfg, a, b, c, alpha, beta):
        M, N = c.shape
        bm, bn, _ = spec.tile(cfg)
        launch(compiled, grid=(cdiv(N, bn), cdiv(M, bm)), block=(threads_of(cfg),),
               args=launch_args(a, b, c, alpha, beta))
    return launcher


def tile_bmbnbk(c):
    return c["BM"], c["BN"], c["BK"]


# The vectorized steps' SASS: 128-bit global loads and 128-bit shared loads.
VEC_SASS = (r"LDG\.E\.128", r"LDS\.128")

STATIC_SMEM_LIMIT = 48 * 1024  # static __shared__ arrays cannot exceed 48 KB per block


def register_cap(threads: int, min_blocks: int) -> int:
    """The per-thread register ceiling ptxas gets from __launch_bounds__(threads, min_blocks)."""
    return min(255, H200.regs_per_sm // (threads * min_blocks) // 8 * 8)  # compute capability 9.0's 64 K


def fits_registers(c, threads, accumulators, fragments, prefetch=False):
    """None if the accumulators, the fragments, the tile values a thread stages from global memory and
    ~32 registers of addresses and loop state fit under the __launch_bounds__ cap (else ptxas spills).
    With ``prefetch`` (k10) the staged values stay live across the FFMAs, and count twice: ptxas
    hoists the next loads early and keeps both. A rule of thumb calibrated on ptxas 13.0 for sm_90:
    no config it accepts spills (checked by compiling the whole search space of k08, k09 and k10)."""
    staged = (c["BM"] + c["BN"]) * c["BK"] // threads * (2 if prefetch else 1)
    need = accumulators + fragments + staged + 32
    cap = register_cap(threads, c["MIN_BLOCKS"])
    if need > cap:
        return f"~{need} registers needed, {cap} allowed by MIN_BLOCKS={c['MIN_BLOCKS']}"
    return None


# The warp-tiled steps (k09, k10) ------------------------------------------------------------------------

WARP_SUB_M, WARP_SUB_N = 16, 32  # a warp's sub-tile: lanes as 4 rows x 8 columns, 4 x 4 each


def threads_warps(c):
    return (c["BM"] // c["WM"]) * (c["BN"] // c["WN"]) * 32


def check_warptiling(stages):
    def check(c):
        if c["BM"] % c["WM"] or c["BN"] % c["WN"]:
            return "warp tiles (WM x WN) must tile the block tile (BM x BN)"
        if c["WM"] % WARP_SUB_M or c["WN"] % WARP_SUB_N:
            return f"WM must be a multiple of {WARP_SUB_M} and WN of {WARP_SUB_N}"
        t = threads_warps(c)
        if t > 1024 or t < 128:
            return f"{t} threads per block: need 128..1024 (4 to 32 warps)"
        if stages * (c["BM"] + c["BN"]) * c["BK"] * 4 > STATIC_SMEM_LIMIT:
            return "the A and B tiles exceed 48 KB of static shared memory"
        frags = c["WM"] // WARP_SUB_M * 4 + c["WN"] // WARP_SUB_N * 4
        return fits_registers(c, t, accumulators=c["WM"] * c["WN"] // 32, fragments=frags, prefetch=stages > 1)
    return check


WARP_PARAMS = (Param("BM", (128, 64, 256), "block tile rows"), Param("BN", (128, 64, 256), "block tile columns"),
               Param("BK", (16, 8, 32), "block tile depth"),
               Param("WM", (64, 32), "warp tile rows (multiple of 16)"),
               Param("WN", (64, 32), "warp tile columns (multiple of 32)"),
               Param("MIN_BLOCKS", (2, 1), "blocks per SM asked of __launch_bounds__ (caps registers)"))

# The config `gemmlab tune k10 --shape 4096,4096,4096` found on the H200 (1.041x the default there; in one
# interleaved run 0.908 / 0.913 of cuBLAS at 4096^3 / 8192^3 against the default's 0.869 / 0.884): one
# 256 x 128 block of 8 warps per SM. It needs enough tiles for every SM twice over; smaller problems
# keep the default's 128 x 128 tiles.
K10_LARGE = {"BM": 256, "BN": 128, "BK": 8, "WM": 64, "WN": 64, "MIN_BLOCKS": 1}


def k10_heuristic(M: int, N: int, K: int, sm_count: int) -> dict:
    """The tuned 256 x 128 config when it gives at least two tiles per SM, else the defaults."""
    if -(-M // 256) * -(-N // 128) >= 2 * sm_count:
        return dict(K10_LARGE)
    return {}


K10 = KernelSpec(
    name="sgemm.k10_double_buffered", ladder="sgemm", step=10,
    technique="two smem stages: the next tiles' global loads fly in registers while this tile's FFMAs run",
    source="sgemm/k10_double_buffered.cu", template="sgemm_double_buffered",
    params=WARP_PARAMS,
    arch="sm_90", constraints="any M, N, K >= 1 (float4 fast path when rows are 16-byte aligned)",
    sass=SassExpect(contains=VEC_SASS, min_loop_ffma=1024, no_local_memory=True),
    launcher=tiled_launcher(threads_warps), supports=grid_y_fits("M", lambda c: c["BM"]),
    threads=threads_warps, smem_bytes=lambda c: 0, tile=tile_bmbnbk, check_config=check_warptiling(stages=2),
    heuristic=k10_heuristic,
    # for gemmlab.model: the next tile's global loads are in flight during this tile's FFMAs
    extra={"prefetch": True},
)


# The route ----------------------------------------------------------------------------------------------

def config_for(M: int, N: int, K: int, sm_count: int) -> dict[str, int]:
    """The config ``gemmlab.matmul`` runs (M, N, K) with: K10's tuned or heuristic one (its
    ``config_for``). Raises ``UnsupportedProblem`` when no launch can run it (``row_blocks``). Needs no GPU."""
    cfg = K10.config_for(M, N, K, sm_count)
    row_blocks(M, N, K, cfg)
    return cfg


def row_blocks(M: int, N: int, K: int, cfg: dict) -> list[tuple[int, int]]:
    """The (first row, rows) of each launch for an (M, N, K) problem at ``cfg``: one block unless M passes a
    launch's reach (MAX_GRID_Y tiles of BM rows, or an A or C of INDEX_LIMIT elements); then blocks of a
    whole number of tiles, each the most one launch can take. B is the same in every launch, so its K x N
    must stay under INDEX_LIMIT (``UnsupportedProblem`` if not)."""
    if min(M, N, K) < 1:
        raise UnsupportedProblem(f"the fp32 route needs M, N, K >= 1, got M={M} N={N} K={K}")
    if K * N >= INDEX_LIMIT:
        raise UnsupportedProblem(f"the fp32 route cannot run M={M} N={N} K={K}: B (K x N) has 2^31 - 1024 or more "
                                 "elements (the CUDA-core kernels' index math is 32-bit)")
    bm = cfg["BM"]
    if K10.supports(cfg, M, N, K) is None:
        return [(0, M)]
    # Blocks of whole tiles: the last tile's rows past M are indexed too (guarded in the kernel).
    rows = min(MAX_GRID_Y, (INDEX_LIMIT - 1) // max(K, N) // bm) * bm
    if rows < 1:
        raise UnsupportedProblem(f"the fp32 route cannot run M={M} N={N} K={K}: one tile of {bm} rows of A or C "
                                 "passes the kernels' 32-bit index math")
    return [(m0, min(rows, M - m0)) for m0 in range(0, M, rows)]


def run(a, b, c, *, alpha: float = 1.0, beta: float = 0.0, config: dict | None = None) -> None:
    """``c = alpha * a @ b + beta * c`` with K10 on torch tensors: a (M, K), b (K, N), c (M, N), float32,
    contiguous, one CUDA device; c is not read when beta is 0. ``config``: what ``config_for`` returned
    (each launch checks it), None for k10's defaults. One launch per ``row_blocks`` block (row slices of a
    contiguous tensor are contiguous tensors)."""
    cfg = config if config is not None else K10.default_config()  # K10.run resolves it (once a launch)
    M, K = a.shape
    N = c.shape[1]
    for m0, rows in row_blocks(M, N, K, cfg):
        K10.run(a[m0:m0 + rows], b, c[m0:m0 + rows], alpha=alpha, beta=beta, config=cfg)
