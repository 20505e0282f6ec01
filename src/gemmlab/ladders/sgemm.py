"""The fp32 CUDA-core ladder: C = alpha * A @ B + beta * C, row-major fp32, any M, N, K.

Steps k01 to k09 (see ``docs/ladder.md`` and the README table). Each step is one ``.cu`` file under
``gemmlab/kernels/sgemm`` and one ``register`` call here.
"""

from __future__ import annotations

import numpy as np
import torch

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
    if max(M * K, K * N, M * N) >= 2**31:
        return "an operand has 2^31 or more elements (32-bit index math)"
    return None


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
    launcher=_launch_k01, supports=any_shape,
    threads=lambda c: c["BLOCK"] ** 2, smem_bytes=lambda c: 0, tile=lambda c: (c["BLOCK"], c["BLOCK"], 1),
))
