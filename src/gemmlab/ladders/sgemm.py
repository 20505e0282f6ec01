"""The fp32 CUDA-core ladder: C = alpha * A @ B + beta * C, row-major fp32, any M, N, K.

Steps k01 to k10 (see the README table and ``docs/worklog.md``). Each step is one ``.cu`` file under
``gemmlab/kernels/sgemm`` and one ``register`` call here.
"""

from __future__ import annotations

import torch

from ..fp32 import (K10, STATIC_SMEM_LIMIT, VEC_SASS, WARP_PARAMS, cdiv, check_warptiling, fits_registers,
                    grid_y_fits, launch_args, threads_warps, tile_bmbnbk, tiled_launcher)
from ..jit.launch import launch
from ..kernelspec import KernelSpec, Param
from ..registry import Ladder, register, register_ladder
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


# k01 -----------------------------------------------------------------------------------------------

def _launch_k01(spec, compiled, cfg, a, b, c, alpha, beta):
    bs = cfg["BLOCK"]
    M, N = c.shape
    launch(compiled, grid=(cdiv(M, bs), cdiv(N, bs)), block=(bs, bs), args=launch_args(a, b, c, alpha, beta))


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
    launch(compiled, grid=(cdiv(N, bs), cdiv(M, bs)), block=(bs, bs), args=launch_args(a, b, c, alpha, beta))


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
    launch(compiled, grid=(cdiv(N, t), cdiv(M, t)), block=(t, t), args=launch_args(a, b, c, alpha, beta))


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
    launcher=tiled_launcher(_threads_k04), supports=grid_y_fits("M", lambda c: c["BM"]),
    threads=_threads_k04, smem_bytes=lambda c: 0, tile=tile_bmbnbk, check_config=_check_k04,
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
    launcher=tiled_launcher(_threads_2d), supports=grid_y_fits("M", lambda c: c["BM"]),
    threads=_threads_2d, smem_bytes=lambda c: 0, tile=tile_bmbnbk, check_config=_check_2d(vec=False),
))


register(KernelSpec(
    name="sgemm.k06_vectorized", ladder="sgemm", step=6,
    technique="float4 global loads/stores; A tile stored transposed so both operands load with LDS.128",
    source="sgemm/k06_vectorized.cu", template="sgemm_vectorized",
    params=_PARAMS_2D,
    arch="sm_90", constraints="any M, N, K >= 1 (float4 fast path when rows are 16-byte aligned)",
    sass=SassExpect(contains=VEC_SASS, min_loop_ffma=512, no_local_memory=True),
    launcher=tiled_launcher(_threads_2d), supports=grid_y_fits("M", lambda c: c["BM"]),
    threads=_threads_2d, smem_bytes=lambda c: 0, tile=tile_bmbnbk, check_config=_check_2d(vec=True),
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
    launcher=tiled_launcher(_threads_2d), supports=grid_y_fits("M", lambda c: c["BM"]),
    threads=_threads_2d, smem_bytes=lambda c: 0, tile=tile_bmbnbk, check_config=_check_conflict_free,
))


# k08 -----------------------------------------------------------------------------------------------

def _check_k08(c):
    if c["BM"] % c["TM"] or c["BN"] % c["TN"]:
        return "TM must divide BM and TN must divide BN"
    t = _threads_2d(c)
    if t > 1024 or t < 64 or t % 32:
        return f"{t} threads per block: need a multiple of 32 in 64..1024"
    if (c["BM"] + c["BN"]) * c["BK"] * 4 > STATIC_SMEM_LIMIT:
        return "the A and B tiles exceed 48 KB of static shared memory"
    return fits_registers(c, t, accumulators=c["TM"] * c["TN"], fragments=c["TM"] + c["TN"])


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
    launcher=tiled_launcher(_threads_2d), supports=grid_y_fits("M", lambda c: c["BM"]),
    threads=_threads_2d, smem_bytes=lambda c: 0, tile=tile_bmbnbk, check_config=_check_k08,
))


# k09 -----------------------------------------------------------------------------------------------

register(KernelSpec(
    name="sgemm.k09_warptiling", ladder="sgemm", step=9,
    technique="block tile -> warp tiles -> 4x4 lane pieces: compact per-warp smem footprint, all in registers",
    source="sgemm/k09_warptiling.cu", template="sgemm_warptiling",
    params=WARP_PARAMS,
    arch="sm_90", constraints="any M, N, K >= 1 (float4 fast path when rows are 16-byte aligned)",
    sass=SassExpect(contains=VEC_SASS, min_loop_ffma=1024, no_local_memory=True),
    launcher=tiled_launcher(threads_warps), supports=grid_y_fits("M", lambda c: c["BM"]),
    threads=threads_warps, smem_bytes=lambda c: 0, tile=tile_bmbnbk, check_config=check_warptiling(stages=1),
))


# k10 -----------------------------------------------------------------------------------------------

# The step gemmlab.matmul runs for float32 operands: its spec (and the config the H200 tuned for it) is
# gemmlab.fp32's, which the runtime imports without the registry.
register(K10)
