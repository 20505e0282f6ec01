"""The bf16 Hopper ladder: TMA, 128B swizzle, wgmma, warp specialization, persistence, clusters.

TN layout throughout: A (M,K) row-major, B (N,K) row-major (an nn.Linear weight), C = A @ B^T (M,N),
bf16 in and out, fp32 accumulation. Ladder steps need tile-multiple sizes (``gemmlab.matmul`` lifts
that). Each step is one ``.cu`` file under ``gemmlab/kernels/hopper`` and one ``register`` call here.
"""

from __future__ import annotations

import numpy as np
import torch

from ..jit.launch import launch, require_gpu, tensor_map_2d
from ..registry import KernelSpec, Ladder, Param, register, register_ladder
from ..sass import SassExpect

BK = 64  # one 128-byte swizzle row of bf16: every step's k-slab


def make_inputs(M: int, N: int, K: int, device="cuda", generator=None):
    """Fresh random A (M,K), B (N,K), C (M,N), bf16, entries ~ U(-1, 1)."""
    def rnd(*shape):
        return (torch.rand(*shape, device=device, generator=generator, dtype=torch.float32) * 2 - 1).to(torch.bfloat16)
    return rnd(M, K), rnd(N, K), rnd(M, N)


def reference(a, b, c, alpha, beta):
    return alpha * (a.double() @ b.double().t()) + beta * c.double()


def baseline(a, b):
    """cuBLAS through torch.mm in the same TN layout (what F.linear calls)."""
    return torch.mm(a, b.t())


LADDER = register_ladder(Ladder(
    name="hopper",
    title="bf16 on Hopper tensor cores",
    dtype="bf16",
    layout="TN",
    layout_doc="A (M,K) bf16 row-major, B (N,K) bf16 row-major, C (M,N) bf16 = A @ B^T (alpha=1, beta=0)",
    make_inputs=make_inputs,
    reference=reference,
    baseline=baseline,
    rel_tolerance=1e-2,
))


def tile_multiple(cfg, M, N, K, bm, bn):
    if min(M, N, K) < 1:
        return "M, N and K must be >= 1"
    if M % bm or N % bn or K % BK:
        return f"needs M % {bm} == 0, N % {bn} == 0, K % {BK} == 0 (ladder steps take tile multiples)"
    if max(M, N, K) >= 2**31 // 2 or M * N >= 2**40:
        return "sizes beyond the ladder's index range"
    return None


def _plain_only(spec, alpha, beta):
    if alpha != 1.0 or beta != 0.0:
        from ..errors import UnsupportedProblem

        raise UnsupportedProblem(f"{spec.name} computes C = A @ B^T only (alpha=1, beta=0)")


# SASS claims shared by all Hopper steps: tensor cores through wgmma, TMA loads, no local memory.
HOPPER_SASS = dict(contains=(r"^HGMMA", r"^UTMALDG"), absent=(r"^HMMA",), no_local_memory=True)


# h01 ---------------------------------------------------------------------------------------------

def _smem_h01(cfg):
    return (64 + cfg["BN"]) * BK * 2 + 1024


def _launch_h01(spec, compiled, cfg, a, b, c, alpha, beta):
    _plain_only(spec, alpha, beta)
    M, K = a.shape
    N = b.shape[0]
    bn = cfg["BN"]
    ta = tensor_map_2d(a, (64, BK))
    tb = tensor_map_2d(b, (bn, BK))
    launch(compiled, grid=(N // bn, M // 64), block=128, smem=_smem_h01(cfg),
           args=(ta, tb, c, np.int32(M), np.int32(N), np.int32(K)))


register(KernelSpec(
    name="hopper.h01_tma_wgmma", ladder="hopper", step=1,
    technique="TMA loads into 128B-swizzled smem on an mbarrier; one warpgroup issues wgmma (64-row tile)",
    source="hopper/h01_tma_wgmma.cu", template="hopper_h01",
    params=(Param("BN", (128, 64, 256), "tile width (wgmma N)"),),
    arch="sm_90a", constraints="M % 64 == 0, N % BN == 0, K % 64 == 0; alpha=1, beta=0",
    sass=SassExpect(**HOPPER_SASS),
    launcher=_launch_h01, supports=lambda cfg, M, N, K: tile_multiple(cfg, M, N, K, 64, cfg["BN"]),
    threads=lambda c: 128, smem_bytes=_smem_h01, tile=lambda c: (64, c["BN"], BK),
))
