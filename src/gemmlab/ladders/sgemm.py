"""The fp32 CUDA-core ladder: C = alpha * A @ B + beta * C, row-major fp32, any M, N, K.

Steps k01 to k10 (see the README table and ``docs/worklog.md``). Each step is one ``.cu`` file under
``gemmlab/kernels/sgemm`` and one ``register`` call here.
"""

from __future__ import annotations

import numpy as np
import torch

from ..devices import H200
from ..jit.launch import launch
from ..registry import KernelSpec, Ladder, Param, register, register_ladder
from ..sass import SassExpect


def make_inputs(M: int, N: int, K: int, device="cuda", generator=None):
    """Fresh random A (M,K), B (K,N), C (M,N), fp32, entries ~ U(-1, 1)."""
    def rnd(*shape):
        return torch.rand(*shape, device=device, generator=generator, dtype=torch.float32) * 2 - 1
    return rnd(M, K), rnd(K, N), rnd(M, N)


def reference(a, b, c, alpha, beta):
    return alpha * (a.double() @ b.double()) + beta * c.double()


def baseline(a, b):
    """cuBLAS SGEMM through torch.mm, full fp32 (TF32 must be off: ``torch.backends.cuda.matmul.allow_tf32``)."""
    return torch.mm(a, b)


LADDER = register_ladder(Ladder(
    name="sgemm",
    title="fp32 on CUDA cores",
    dtype="fp32",
    layout="NN",
    layout_doc="A (M,K), B (K,N), C (M,N): fp32, row-major, contiguous; C = alpha*A@B + beta*C in place",
    make_inputs=make_inputs,
    reference=reference,
    baseline=baseline,
    rel_tolerance=1e-5,
))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def any_shape(cfg, M, N, K):
    """Every sgemm step handles any M, N, K >= 1 (edges are guarded in the kernels)."""
    if min(M, N, K) < 1:
        return "M, N and K must be >= 1"
    if max(M * K, K * N, M * N) >= 2**31 - 1024:
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
        if _cdiv(extent, tile) > MAX_GRID_Y:
            return f"{dim}={extent} needs more than {MAX_GRID_Y} tiles of {tile} on gridDim.y"
        return None
    return supports


def _args(a, b, c, alpha, beta):
    M, K = a.shape
    N = b.shape[1]
    return (np.int32(M), np.int32(N), np.int32(K), np.float32(alpha), a, b, np.float32(beta), c)


# k01 -----------------------------------------------------------------------------------------------

def _launch_k01(spec, compiled, cfg, a, b, c, alpha, beta):
    bs = cfg["BLOCK"]
    M, N = c.shape
    launch(compiled, grid=(_cdiv(M, bs), _cdiv(N, bs)), block=(bs, bs), args=_args(a, b, c, alpha, beta))


register(KernelSpec(
    name="sgemm.k01_naive", ladder="sgemm", step=1,
    technique="one thread per output element; threadIdx.x walks rows (uncoalesced)",
    source="sgemm/k01_naive.cu", template="sgemm_naive",
    params=(Param("BLOCK", (32, 16), "threads per block side"),),
    arch="sm_90", constraints="any M, N, K >= 1",
    sass=SassExpect(contains=(r"^FFMA", r"^LDG"), no_local_memory=True),
    launcher=_launch_k01, supports=grid_y_fits("N", lambda c: c["BLOCK"]),
    threads=lambda c: c["BLOCK"] ** 2, smem_bytes=lambda c: 0, tile=lambda c: (c["BLOCK"], c["BLOCK"], 1),
    # for gemmlab.model: a warp's A load walks 32 rows (32 lines), its B load is one address (1 line)
    extra={"lines_per_load": (32, 1)},
))


# k02 -----------------------------------------------------------------------------------------------

def _launch_k02(spec, compiled, cfg, a, b, c, alpha, beta):
    bs = cfg["BLOCK"]
    M, N = c.shape
    launch(compiled, grid=(_cdiv(N, bs), _cdiv(M, bs)), block=(bs, bs), args=_args(a, b, c, alpha, beta))


register(KernelSpec(
    name="sgemm.k02_coalesced", ladder="sgemm", step=2,
    technique="threadIdx.x walks columns: a warp reads one A value and 128 contiguous bytes of B",
    source="sgemm/k02_coalesced.cu", template="sgemm_coalesced",
    params=(Param("BLOCK", (32, 16), "threads per block side"),),
    arch="sm_90", constraints="any M, N, K >= 1",
    sass=SassExpect(contains=(r"^FFMA", r"^LDG"), no_local_memory=True),
    launcher=_launch_k02, supports=grid_y_fits("M", lambda c: c["BLOCK"]),
    threads=lambda c: c["BLOCK"] ** 2, smem_bytes=lambda c: 0, tile=lambda c: (c["BLOCK"], c["BLOCK"], 1),
))


# k03 -----------------------------------------------------------------------------------------------

def _launch_k03(spec, compiled, cfg, a, b, c, alpha, beta):
    t = cfg["TILE"]
    M, N = c.shape
    launch(compiled, grid=(_cdiv(N, t), _cdiv(M, t)), block=(t, t), args=_args(a, b, c, alpha, beta))


register(KernelSpec(
    name="sgemm.k03_smem_tiling", ladder="sgemm", step=3,
    technique="TILE x TILE tiles of A and B staged in shared memory, each global value loaded once per block",
    source="sgemm/k03_smem_tiling.cu", template="sgemm_smem_tiling",
    params=(Param("TILE", (32, 16), "tile side = threads per block side"),),
    arch="sm_90", constraints="any M, N, K >= 1",
    sass=SassExpect(contains=(r"^LDS", r"^STS", r"^BAR"), min_loop_ffma=16, no_local_memory=True),
    launcher=_launch_k03, supports=grid_y_fits("M", lambda c: c["TILE"]),
    threads=lambda c: c["TILE"] ** 2, smem_bytes=lambda c: 0, tile=lambda c: (c["TILE"], c["TILE"], c["TILE"]),
))


# k04 onwards: a 1-D block of threads, grid = (column tiles, row tiles) -------------------------------

def _tiled_launcher(threads_of):
    def launcher(spec, compiled, cfg, a, b, c, alpha, beta):
        M, N = c.shape
        bm, bn, _ = spec.tile(cfg)
        launch(compiled, grid=(_cdiv(N, bn), _cdiv(M, bm)), block=(threads_of(cfg),),
               args=_args(a, b, c, alpha, beta))
    return launcher


def _tile_bmbnbk(c):
    return c["BM"], c["BN"], c["BK"]


def _loads_divide(cfg, threads, vec):
    """The tile loads of k04..k07 give every thread the same number of elements (float4s if vec)."""
    width = 4 if vec else 1
    for what, n in (("A", cfg["BM"] * cfg["BK"]), ("B", cfg["BK"] * cfg["BN"])):
        if (n // width) % threads:
            return f"{threads} threads do not divide the {n // width} loads of the {what} tile"
    return None


def _threads_k04(c):
    return c["BM"] // c["TM"] * c["BN"]


def _check_k04(c):
    if c["BM"] % c["TM"]:
        return "TM must divide BM"
    if _threads_k04(c) > 1024:
        return f"{_threads_k04(c)} threads per block > 1024"
    return _loads_divide(c, _threads_k04(c), vec=False)


register(KernelSpec(
    name="sgemm.k04_blocktile_1d", ladder="sgemm", step=4,
    technique="each thread computes TM results down a column, reusing one B value from a register",
    source="sgemm/k04_blocktile_1d.cu", template="sgemm_blocktile_1d",
    params=(Param("BM", (64, 128), "block tile rows"), Param("BN", (64, 128), "block tile columns"),
            Param("BK", (8, 16), "block tile depth"), Param("TM", (8, 16), "results per thread (rows)")),
    arch="sm_90", constraints="any M, N, K >= 1",
    sass=SassExpect(contains=(r"^LDS", r"^STS", r"^BAR"), min_loop_ffma=64, no_local_memory=True),
    launcher=_tiled_launcher(_threads_k04), supports=grid_y_fits("M", lambda c: c["BM"]),
    threads=_threads_k04, smem_bytes=lambda c: 0, tile=_tile_bmbnbk, check_config=_check_k04,
))


def _threads_2d(c):
    return (c["BM"] // c["TM"]) * (c["BN"] // c["TN"])


def _check_2d(vec):
    def check(c):
        if c["BM"] % c["TM"] or c["BN"] % c["TN"]:
            return "TM must divide BM and TN must divide BN"
        t = _threads_2d(c)
        if t > 1024 or t % 32:
            return f"{t} threads per block: need a multiple of 32 up to 1024"
        return _loads_divide(c, t, vec)
    return check


_PARAMS_2D = (Param("BM", (128, 64), "block tile rows"), Param("BN", (128, 64), "block tile columns"),
              Param("BK", (8, 16), "block tile depth"), Param("TM", (8, 4), "thread tile rows"),
              Param("TN", (8, 4), "thread tile columns"))

register(KernelSpec(
    name="sgemm.k05_blocktile_2d", ladder="sgemm", step=5,
    technique="each thread computes a TM x TN outer product per k from register fragments of A and B",
    source="sgemm/k05_blocktile_2d.cu", template="sgemm_blocktile_2d",
    params=_PARAMS_2D,
    arch="sm_90", constraints="any M, N, K >= 1",
    sass=SassExpect(contains=(r"^LDS", r"^STS", r"^BAR"), min_loop_ffma=512, no_local_memory=True),
    launcher=_tiled_launcher(_threads_2d), supports=grid_y_fits("M", lambda c: c["BM"]),
    threads=_threads_2d, smem_bytes=lambda c: 0, tile=_tile_bmbnbk, check_config=_check_2d(vec=False),
))


# The vectorized steps' SASS: 128-bit global loads and 128-bit shared loads.
VEC_SASS = (r"LDG\.E\.128", r"LDS\.128")

register(KernelSpec(
    name="sgemm.k06_vectorized", ladder="sgemm", step=6,
    technique="float4 global loads/stores; A tile stored transposed so both operands load with LDS.128",
    source="sgemm/k06_vectorized.cu", template="sgemm_vectorized",
    params=_PARAMS_2D,
    arch="sm_90", constraints="any M, N, K >= 1 (float4 fast path when rows are 16-byte aligned)",
    sass=SassExpect(contains=VEC_SASS, min_loop_ffma=512, no_local_memory=True),
    launcher=_tiled_launcher(_threads_2d), supports=grid_y_fits("M", lambda c: c["BM"]),
    threads=_threads_2d, smem_bytes=lambda c: 0, tile=_tile_bmbnbk, check_config=_check_2d(vec=True),
))


def _check_conflict_free(c):
    why = _check_2d(vec=True)(c)
    if why:
        return why
    if c["TM"] % 4 or c["TN"] % 4:
        return "TM and TN must be multiples of 4 (float4 groups)"
    if c["BK"] not in (8, 16, 32) or c["BM"] % 32:
        return "the A-tile swizzle needs BK in (8, 16, 32) and BM a multiple of 32"
    return None


register(KernelSpec(
    name="sgemm.k07_bank_conflicts", ladder="sgemm", step=7,
    technique="XOR-swizzled A tile and float4-strided thread tiles: conflict-free shared stores and loads",
    source="sgemm/k07_bank_conflicts.cu", template="sgemm_bank_conflicts",
    params=_PARAMS_2D,
    arch="sm_90", constraints="any M, N, K >= 1 (float4 fast path when rows are 16-byte aligned)",
    sass=SassExpect(contains=VEC_SASS, min_loop_ffma=512, no_local_memory=True),
    launcher=_tiled_launcher(_threads_2d), supports=grid_y_fits("M", lambda c: c["BM"]),
    threads=_threads_2d, smem_bytes=lambda c: 0, tile=_tile_bmbnbk, check_config=_check_conflict_free,
))


# k08 -----------------------------------------------------------------------------------------------

STATIC_SMEM_LIMIT = 48 * 1024  # static __shared__ arrays cannot exceed 48 KB per block


def _register_cap(threads: int, min_blocks: int) -> int:
    """The per-thread register ceiling ptxas gets from __launch_bounds__(threads, min_blocks)."""
    return min(255, H200.regs_per_sm // (threads * min_blocks) // 8 * 8)  # compute capability 9.0's 64 K


def _fits_registers(c, threads, accumulators, fragments, prefetch=False):
    """None if the accumulators, the fragments, the tile values a thread stages from global memory and
    ~32 registers of addresses and loop state fit under the __launch_bounds__ cap (else ptxas spills).
    With ``prefetch`` (k10) the staged values stay live across the FFMAs, and count twice: ptxas
    hoists the next loads early and keeps both. A rule of thumb calibrated on ptxas 13.0 for sm_90:
    no config it accepts spills (checked by compiling the whole search space of k08, k09 and k10)."""
    staged = (c["BM"] + c["BN"]) * c["BK"] // threads * (2 if prefetch else 1)
    need = accumulators + fragments + staged + 32
    cap = _register_cap(threads, c["MIN_BLOCKS"])
    if need > cap:
        return f"~{need} registers needed, {cap} allowed by MIN_BLOCKS={c['MIN_BLOCKS']}"
    return None


def _check_k08(c):
    if c["BM"] % c["TM"] or c["BN"] % c["TN"]:
        return "TM must divide BM and TN must divide BN"
    t = _threads_2d(c)
    if t > 1024 or t < 64 or t % 32:
        return f"{t} threads per block: need a multiple of 32 in 64..1024"
    if (c["BM"] + c["BN"]) * c["BK"] * 4 > STATIC_SMEM_LIMIT:
        return "the A and B tiles exceed 48 KB of static shared memory"
    return _fits_registers(c, t, accumulators=c["TM"] * c["TN"], fragments=c["TM"] + c["TN"])


register(KernelSpec(
    name="sgemm.k08_autotuned", ladder="sgemm", step=8,
    technique="k07 opened up for search: block/thread tile shapes and blocks per SM as template parameters",
    source="sgemm/k08_autotuned.cu", template="sgemm_autotuned",
    params=(Param("BM", (128, 64, 256), "block tile rows"), Param("BN", (128, 64, 256), "block tile columns"),
            Param("BK", (16, 8, 32), "block tile depth"), Param("TM", (8, 4), "thread tile rows"),
            Param("TN", (8, 4), "thread tile columns"),
            Param("MIN_BLOCKS", (2, 1), "blocks per SM asked of __launch_bounds__ (caps registers)")),
    arch="sm_90", constraints="any M, N, K >= 1 (float4 fast path when rows are 16-byte aligned)",
    sass=SassExpect(contains=VEC_SASS, min_loop_ffma=1024, no_local_memory=True),
    launcher=_tiled_launcher(_threads_2d), supports=grid_y_fits("M", lambda c: c["BM"]),
    threads=_threads_2d, smem_bytes=lambda c: 0, tile=_tile_bmbnbk, check_config=_check_k08,
))


# k09 -----------------------------------------------------------------------------------------------

WARP_SUB_M, WARP_SUB_N = 16, 32  # a warp's sub-tile: lanes as 4 rows x 8 columns, 4 x 4 each


def _threads_warps(c):
    return (c["BM"] // c["WM"]) * (c["BN"] // c["WN"]) * 32


def _check_warptiling(stages):
    def check(c):
        if c["BM"] % c["WM"] or c["BN"] % c["WN"]:
            return "warp tiles (WM x WN) must tile the block tile (BM x BN)"
        if c["WM"] % WARP_SUB_M or c["WN"] % WARP_SUB_N:
            return f"WM must be a multiple of {WARP_SUB_M} and WN of {WARP_SUB_N}"
        t = _threads_warps(c)
        if t > 1024 or t < 128:
            return f"{t} threads per block: need 128..1024 (4 to 32 warps)"
        if stages * (c["BM"] + c["BN"]) * c["BK"] * 4 > STATIC_SMEM_LIMIT:
            return "the A and B tiles exceed 48 KB of static shared memory"
        frags = c["WM"] // WARP_SUB_M * 4 + c["WN"] // WARP_SUB_N * 4
        return _fits_registers(c, t, accumulators=c["WM"] * c["WN"] // 32, fragments=frags, prefetch=stages > 1)
    return check


_PARAMS_WARP = (Param("BM", (128, 64, 256), "block tile rows"), Param("BN", (128, 64, 256), "block tile columns"),
                Param("BK", (16, 8, 32), "block tile depth"),
                Param("WM", (64, 32), "warp tile rows (multiple of 16)"),
                Param("WN", (64, 32), "warp tile columns (multiple of 32)"),
                Param("MIN_BLOCKS", (2, 1), "blocks per SM asked of __launch_bounds__ (caps registers)"))

register(KernelSpec(
    name="sgemm.k09_warptiling", ladder="sgemm", step=9,
    technique="block tile -> warp tiles -> 4x4 lane pieces: compact per-warp smem footprint, all in registers",
    source="sgemm/k09_warptiling.cu", template="sgemm_warptiling",
    params=_PARAMS_WARP,
    arch="sm_90", constraints="any M, N, K >= 1 (float4 fast path when rows are 16-byte aligned)",
    sass=SassExpect(contains=VEC_SASS, min_loop_ffma=1024, no_local_memory=True),
    launcher=_tiled_launcher(_threads_warps), supports=grid_y_fits("M", lambda c: c["BM"]),
    threads=_threads_warps, smem_bytes=lambda c: 0, tile=_tile_bmbnbk, check_config=_check_warptiling(stages=1),
))


# k10 -----------------------------------------------------------------------------------------------

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


register(KernelSpec(
    name="sgemm.k10_double_buffered", ladder="sgemm", step=10,
    technique="two smem stages: the next tiles' global loads fly in registers while this tile's FFMAs run",
    source="sgemm/k10_double_buffered.cu", template="sgemm_double_buffered",
    params=_PARAMS_WARP,
    arch="sm_90", constraints="any M, N, K >= 1 (float4 fast path when rows are 16-byte aligned)",
    sass=SassExpect(contains=VEC_SASS, min_loop_ffma=1024, no_local_memory=True),
    launcher=_tiled_launcher(_threads_warps), supports=grid_y_fits("M", lambda c: c["BM"]),
    threads=_threads_warps, smem_bytes=lambda c: 0, tile=_tile_bmbnbk, check_config=_check_warptiling(stages=2),
    heuristic=k10_heuristic,
    # for gemmlab.model: the next tile's global loads are in flight during this tile's FFMAs
    extra={"prefetch": True},
))
