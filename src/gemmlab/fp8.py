"""FP8 (e4m3) GEMM with scales: ``gemmlab.scaled_mm``, its torch custom op, and the references it is checked by.

    out = scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16, bias=None)

follows ``torch._scaled_mm``'s convention: ``a`` is (M, K) e4m3 row-major, ``b`` is (K, N) given as the
transpose of an (N, K) row-major e4m3 weight (``w.t()``), so both operands are K-major, which is what the
FP8 wgmma reads. Two scale modes:

* per-tensor: ``scale_a`` and ``scale_b`` are fp32 tensors of one element (0-dim):
  out = scale_a * scale_b * (a @ b), the scales read on the device (no host sync).
* block (DeepSeek-V3): ``scale_a`` (M, K / 128) fp32, one scale per row and 128 of K (1 x 128, per token
  group); ``scale_b`` (ceil(N / 128), K / 128) fp32, one per 128 x 128 block of the (N, K) weight:
  out[m, n] = sum_kb scale_a[m, kb] * scale_b[n // 128, kb] * sum_{k in kb} a[m, k] b[k, n].

The kernel is ``kernels/engine/gemm_fp8.cu`` (plan: ``gemmlab.planner.plan_fp8``, launch:
``gemmlab.engine2.launch_fp8``); its wgmma partial sums are promoted into fp32 registers every 128 of K.
``reference_scaled_mm`` is the float64 reference of the dequantized inputs (runs on any device, CPU
included); ``quantize_per_tensor`` / ``quantize_blocks`` make e4m3 operands and their scales.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from . import ops, planner
from .errors import UnsupportedProblem

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # the largest finite e4m3 value
_OUT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
_BIAS = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


@dataclass(frozen=True)
class Fp8Problem:
    """What the arguments of ``scaled_mm`` ask for, once checked."""

    M: int
    N: int
    K: int
    scale: str  # "tensor" or "block"
    out_dtype: torch.dtype
    bias_dtype: Optional[str]


def check_scale_tensors(scale_a, scale_b, device: torch.device) -> None:
    """Both scales fp32 tensors on ``device`` (their shapes are the caller's to check): TypeError for the
    type, UnsupportedProblem for the device."""
    for name, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        if not isinstance(s, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of float32, got {type(s).__name__}")
        if s.dtype != torch.float32:
            raise TypeError(f"{name} must be float32, got {s.dtype}")
        if s.device != device:
            raise UnsupportedProblem(f"{name} is on {s.device}, the operands on {device}")


def validate(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
             out_dtype: Optional[torch.dtype], bias: Optional[torch.Tensor],
             activation: Optional[str]) -> Fp8Problem:
    """Check ``scaled_mm``'s arguments; raise TypeError for a dtype (as ``gemmlab.matmul`` does) and
    UnsupportedProblem (a ValueError) for shapes, layouts, devices and scale shapes, saying what is wrong
    and what is taken. Reads no data (runs on fake tensors)."""
    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype != E4M3:
            raise TypeError(f"{name} must be torch.float8_e4m3fn, got {x.dtype}")
        if x.dim() != 2:
            raise UnsupportedProblem(f"{name} must be 2-D, got shape {tuple(x.shape)}")
    M, K = a.shape
    if b.shape[0] != K:
        raise UnsupportedProblem(f"inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)}")
    N = b.shape[1]
    if a.device != b.device:
        raise UnsupportedProblem(f"a is on {a.device}, b on {b.device}")
    # Layouts: the FP8 wgmma reads K-major A and B only (no transpose for 8-bit types).
    if K > 1 and a.stride(1) != 1:
        raise UnsupportedProblem(f"a must be row-major (M, K) with unit stride along K, got strides {a.stride()}; "
                                 "pass a.contiguous()")
    if K > 1 and b.stride(0) != 1:
        raise UnsupportedProblem(f"b must be the transpose of a row-major (N, K) weight (strides (1, K)), got "
                                 f"strides {b.stride()}; pass w.t() for an (N, K) weight w, or b.t().contiguous().t()")
    if K % 16:
        raise UnsupportedProblem(f"K = {K}: FP8 rows must be a multiple of 16 bytes (TMA), so K % 16 == 0")
    if a.stride(0) % 16 or b.stride(1) % 16:
        raise UnsupportedProblem(f"row strides of a ({a.stride(0)}) and of b's (N, K) weight ({b.stride(1)}) must be "
                                 "multiples of 16 bytes (TMA)")
    check_scale_tensors(scale_a, scale_b, a.device)
    if scale_a.numel() == 1 and scale_b.numel() == 1 and scale_a.dim() <= 1 and scale_b.dim() <= 1:
        scale = "tensor"
    elif scale_a.dim() == 2 and scale_b.dim() == 2:
        scale = "block"
        kb, nb = K // planner.FP8_BLOCK, math.ceil(N / planner.FP8_BLOCK)
        if K % planner.FP8_BLOCK:
            raise UnsupportedProblem(f"block scales need K % {planner.FP8_BLOCK} == 0, got K = {K}")
        if tuple(scale_a.shape) != (M, kb):
            raise UnsupportedProblem(f"block scales: scale_a must be (M, K / 128) = ({M}, {kb}) (1 x 128 per "
                                     f"token group), got {tuple(scale_a.shape)} (row-wise (M, 1) x (1, N) "
                                     "scaling is not supported)")
        if tuple(scale_b.shape) != (nb, kb):
            raise UnsupportedProblem(f"block scales: scale_b must be (ceil(N / 128), K / 128) = ({nb}, {kb}) "
                                     f"(128 x 128 blocks of the (N, K) weight), got {tuple(scale_b.shape)}")
    else:
        raise UnsupportedProblem(f"scales of shapes {tuple(scale_a.shape)} and {tuple(scale_b.shape)}: take two "
                                 f"0-dim tensors (per-tensor) or (M, K / 128) and (ceil(N / 128), K / 128) (block); "
                                 "row-wise (M, 1) x (1, N) scaling is not supported")
    out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
    if out_dtype not in _OUT:
        raise TypeError(f"out_dtype must be torch.bfloat16, torch.float16 or torch.float32, got {out_dtype}")
    bias_dtype = None
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or bias.dtype not in _BIAS:
            raise TypeError("bias must be a bf16, fp16 or fp32 tensor")
        if tuple(bias.shape) != (N,):
            raise UnsupportedProblem(f"bias must have shape (N,) = ({N},), got {tuple(bias.shape)}")
        if bias.device != a.device:
            raise UnsupportedProblem(f"bias is on {bias.device}, the operands on {a.device}")
        bias_dtype = _BIAS[bias.dtype]
    if activation not in planner.ACTIVATIONS:
        raise UnsupportedProblem(f"unknown activation {activation!r}; known: {[x for x in planner.ACTIVATIONS if x]}")
    return Fp8Problem(M=M, N=N, K=K, scale=scale, out_dtype=out_dtype, bias_dtype=bias_dtype)


def plan_for(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, *,
             out_dtype: torch.dtype = torch.bfloat16, bias: Optional[torch.Tensor] = None,
             activation: Optional[str] = None, promote: Optional[int] = None) -> planner.Fp8Plan:
    """The FP8 plan ``scaled_mm`` would run for these arguments (a contiguous output)."""
    p = validate(a, b, scale_a, scale_b, out_dtype, bias, activation)
    profile = None
    if a.is_cuda:
        from .engine2 import _profile

        profile = _profile(a.device)
    return planner.plan_fp8(p.M, p.N, p.K, scale=p.scale, out_dtype=_OUT[p.out_dtype], bias_dtype=p.bias_dtype,
                            activation=activation, promote=promote, profile=profile)


def gemm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, *,
         out_dtype: torch.dtype = torch.bfloat16, bias: Optional[torch.Tensor] = None,
         activation: Optional[str] = None, plan: Optional[planner.Fp8Plan] = None,
         promote: Optional[int] = None) -> torch.Tensor:
    """``scaled_mm`` without the custom op, with a chosen ``plan`` (or ``promote`` interval): for the tests
    and the benchmark. Arguments as for ``scaled_mm``."""
    p = validate(a, b, scale_a, scale_b, out_dtype, bias, activation)
    if not _runs_here(a):
        raise UnsupportedProblem(f"scaled_mm runs on a CUDA (Hopper) device; the operands are on {a.device}")
    out = torch.empty((p.M, p.N), dtype=p.out_dtype, device=a.device)
    if p.M == 0 or p.N == 0:
        return out
    if p.K == 0:  # nothing to multiply: the epilogue of zeros
        out.copy_(_epilogue(torch.zeros((p.M, p.N), dtype=torch.float32, device=a.device), bias, activation))
        return out
    if a.data_ptr() % 16 or b.data_ptr() % 16:
        raise UnsupportedProblem("a and b must start 16-byte aligned (TMA)")
    pl = plan or plan_for(a, b, scale_a, scale_b, out_dtype=p.out_dtype, bias=bias, activation=activation,
                          promote=promote)
    from .engine2 import launch_fp8

    launch_fp8(pl, a, b.t(), scale_a, scale_b, out, bias=bias)
    return out


def _runs_here(a: torch.Tensor) -> bool:
    """Whether the kernel can run on ``a``'s device: a CUDA device (CPU tests replace this)."""
    return a.is_cuda


def scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, *,
              out_dtype: torch.dtype = torch.bfloat16, bias: Optional[torch.Tensor] = None,
              activation: Optional[str] = None) -> torch.Tensor:
    """FP8 e4m3 GEMM with scales: (M, N) = act(dequant(a) @ dequant(b) + bias).

    a: (M, K) torch.float8_e4m3fn, row-major (unit stride along K). b: (K, N) torch.float8_e4m3fn, the
    transpose of a row-major (N, K) weight (strides (1, K'), K' >= K). K % 16 == 0 and row strides multiples
    of 16 (TMA reads 16-byte rows); any M, N. scale_a / scale_b: float32, either one element each
    (per-tensor) or (M, K / 128) and (ceil(N / 128), K / 128) (1 x 128 / 128 x 128 block scales; K % 128
    == 0). out_dtype: bf16 (default), fp16 or fp32. bias: (N,) bf16 / fp16 / fp32, added in fp32.
    activation: None, "relu", "gelu", "gelu_tanh", "silu". A torch custom op (``gemmlab::scaled_mm``) with a
    fake implementation: traces under torch.compile. Raises TypeError for dtypes and UnsupportedProblem for
    what else it does not take, before any GPU work.

    Eager calls on plain CUDA tensors (outside tracing, torch modes, the profiler and autograd) skip the
    op's dispatch and run the call prepared for their metadata key (``_key``): validated, planned and
    built once (``engine2.Fp8Launch``), then a repeat call allocates the output and launches."""
    if ops.eager_mode(a, b, scale_a, scale_b, bias) is True:
        return _prepared(a, b, scale_a, scale_b, bias, out_dtype, activation)(a, b, scale_a, scale_b, bias)
    validate(a, b, scale_a, scale_b, out_dtype, bias, activation)
    return _scaled_mm_op(a, b, scale_a, scale_b, bias, out_dtype, activation)


@torch.library.custom_op("gemmlab::scaled_mm", mutates_args=())
def _scaled_mm_op(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                  bias: Optional[torch.Tensor], out_dtype: Optional[torch.dtype],
                  activation: Optional[str]) -> torch.Tensor:
    return _prepared(a, b, scale_a, scale_b, bias, out_dtype, activation)(a, b, scale_a, scale_b, bias)


@_scaled_mm_op.register_fake
def _scaled_mm_fake(a, b, scale_a, scale_b, bias, out_dtype, activation):
    p = validate(a, b, scale_a, scale_b, out_dtype, bias, activation)
    return a.new_empty((p.M, p.N), dtype=p.out_dtype)


# Prepared calls: validated, planned and built once per metadata key --------------------------------------

def _key(a, b, scale_a, scale_b, bias, out_dtype, activation) -> tuple:
    """Everything ``validate``, the plan and the launch depend on, except the tensors' addresses: each
    tensor's shape, strides, dtype, device and 16-byte alignment (``ops._meta``; the scales' strides and
    alignment decide whether block scales are read in place or re-laid), the out dtype, the activation."""
    return (ops._meta(a), ops._meta(b), ops._meta(scale_a), ops._meta(scale_b),
            None if bias is None else ops._meta(bias), out_dtype, activation)


class _Prepared:
    """A validated ``scaled_mm`` call and its launch (``engine2.Fp8Launch``), run for every call with the
    same ``_key``. Empty and K = 0 problems keep no launch: they run ``gemm``."""

    __slots__ = ("shape", "out_dtype", "device", "dev", "launch", "activation")

    def __init__(self, p: Fp8Problem, a, b, scale_a, scale_b, bias, activation):
        self.shape, self.out_dtype, self.device, self.activation = (p.M, p.N), p.out_dtype, a.device, activation
        self.dev = a.get_device()
        self.launch = None
        if not _runs_here(a):
            raise UnsupportedProblem(f"scaled_mm runs on a CUDA (Hopper) device; the operands are on {a.device}")
        if p.M and p.N and p.K:
            if a.data_ptr() % 16 or b.data_ptr() % 16:
                raise UnsupportedProblem("a and b must start 16-byte aligned (TMA)")
            from . import engine2

            plan = plan_for(a, b, scale_a, scale_b, out_dtype=p.out_dtype, bias=bias, activation=activation)
            example = torch.empty(self.shape, dtype=p.out_dtype, device=a.device)
            with ops._on_device(a.device):  # the kernel loads and its smem limit is set on a's device
                self.launch = engine2.Fp8Launch(plan, a, b.t(), scale_a, scale_b, example, bias=bias)

    def __call__(self, a, b, scale_a, scale_b, bias) -> torch.Tensor:
        if self.launch is None:
            return gemm(a, b, scale_a, scale_b, out_dtype=self.out_dtype, bias=bias, activation=self.activation)
        out = torch.empty(*self.shape, dtype=self.out_dtype, device=self.device)
        ops.run_on(self.dev, self.launch, a, b, scale_a, scale_b, out, bias)
        return out


_PREPARED: dict[tuple, _Prepared] = {}
MAX_PREPARED = 4096  # keys without end (e.g. every sequence length): start over


def _prepared(a, b, scale_a, scale_b, bias, out_dtype, activation) -> _Prepared:
    """The prepared call for these arguments: from the cache, else validated (every error raised here,
    before any device work) and prepared. Not kept when prepared during a CUDA graph capture (its tile
    order is then built on the device in row-major order, not the one an eager call wants)."""
    try:
        key = _key(a, b, scale_a, scale_b, bias, out_dtype, activation)
        call = _PREPARED.get(key)
    except (RuntimeError, TypeError, AttributeError):  # unhashable arguments, tensors without strides...
        key = call = None
    if call is not None:
        return call
    p = validate(a, b, scale_a, scale_b, out_dtype, bias, activation)
    call = _Prepared(p, a, b, scale_a, scale_b, bias, activation)
    ops.keep_prepared(_PREPARED, key, call, a.device, MAX_PREPARED)
    return call


def clear_prepared_calls() -> None:
    """Forget every prepared ``scaled_mm`` call (the next call of each key validates and prepares again)."""
    _PREPARED.clear()


# References and quantizers (pure torch: any device) -----------------------------------------------------

def _epilogue(x: torch.Tensor, bias: Optional[torch.Tensor], activation: Optional[str]) -> torch.Tensor:
    if bias is not None:
        x = x + bias.to(x.dtype)
    if activation == "relu":
        x = torch.relu(x)
    elif activation == "gelu":
        x = torch.nn.functional.gelu(x)
    elif activation == "gelu_tanh":
        x = torch.nn.functional.gelu(x, approximate="tanh")
    elif activation == "silu":
        x = torch.nn.functional.silu(x)
    return x


def dequantize(x: torch.Tensor, scale: torch.Tensor, *, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """An (R, K) e4m3 tensor times its scale in ``dtype``: one element (per-tensor) or (ceil(R / r),
    K / 128) blocks of r x 128, r = 1 when the scale has R rows (A's 1 x 128) else 128 (B's 128 x 128)."""
    v = x.to(dtype)
    s = scale.to(dtype)
    if s.numel() == 1 and s.dim() <= 1:
        return v * s.reshape(())
    R, K = v.shape
    rows = 1 if s.shape[0] == R else planner.FP8_BLOCK
    full = s.repeat_interleave(rows, dim=0)[:R].repeat_interleave(planner.FP8_BLOCK, dim=1)[:, :K]
    return v * full


def reference_scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, *,
                        bias: Optional[torch.Tensor] = None, activation: Optional[str] = None,
                        dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """What ``scaled_mm`` computes, in ``dtype`` (float64 by default) from the dequantized inputs: the
    reference the GPU tests compare with. Same arguments as ``scaled_mm``; runs on CPU too."""
    validate(a, b, scale_a, scale_b, None, bias, activation)
    A = dequantize(a, scale_a, dtype=dtype)
    W = dequantize(b.t(), scale_b, dtype=dtype)  # (N, K)
    return _epilogue(A @ W.t(), bias, activation)


def quantize_per_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 tensor, 0-dim fp32 scale) with x ~ e4m3 * scale; the largest |x| maps to 448."""
    amax = x.abs().amax().float().clamp(min=1e-12)
    scale = amax / E4M3_MAX
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale.reshape(())


def quantize_blocks(x: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 tensor, fp32 scales) for an (R, K) tensor with K % 128 == 0, one scale per block of
    ``rows`` x 128: rows = 1 for activations (scales (R, K / 128)), 128 for weights ((ceil(R / 128),
    K / 128)). The scales are stored MN-major (unit stride along the first dimension, 16-byte aligned
    columns): the layout the kernel's TMA reads in place, as DeepGEMM keeps them."""
    R, K = x.shape
    if K % planner.FP8_BLOCK:
        raise UnsupportedProblem(f"block quantization needs K % 128 == 0, got K = {K}")
    Rp = math.ceil(R / rows) * rows
    xp = torch.zeros((Rp, K), dtype=torch.float32, device=x.device)
    xp[:R] = x.float()
    blocks = xp.reshape(Rp // rows, rows, K // planner.FP8_BLOCK, planner.FP8_BLOCK)
    amax = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12)  # (Rp / rows, K / 128)
    scale = amax / E4M3_MAX
    q = (blocks / scale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).reshape(Rp, K)[:R].to(E4M3)
    n = Rp // rows
    mn = torch.empty((K // planner.FP8_BLOCK, (n + 3) // 4 * 4), dtype=torch.float32, device=x.device)
    return q, mn[:, :n].copy_(scale.t()).t()


def quantize_expert_blocks(x: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_blocks`` for a stack of G matrices (G, R, K), K % 128 == 0, each quantized on its own
    (one at a time: the fp32 temporaries stay one matrix large): (e4m3 (G, R, K), fp32 scales (G,
    ceil(R / rows), K / 128)). rows = 1: activations in masked slabs (scales (G, C, K / 128)); rows = 128:
    experts' (N, K) weights (scales (G, ceil(N / 128), K / 128), a block never spanning two experts). The
    scales are stored MN-major over all G x ceil(R / rows) rows (unit stride along them, 16-byte aligned
    columns): the layout ``gemmlab.grouped_mm``'s TMA reads in place."""
    G, R, K = x.shape
    if K % planner.FP8_BLOCK:
        raise UnsupportedProblem(f"block quantization needs K % 128 == 0, got K = {K}")
    n, kb = math.ceil(R / rows), K // planner.FP8_BLOCK
    q = torch.empty((G, R, K), dtype=E4M3, device=x.device)
    mn = torch.empty((kb, (G * n + 3) // 4 * 4), dtype=torch.float32, device=x.device)
    for g in range(G):
        q[g], s = quantize_blocks(x[g], rows)
        mn[:, g * n:(g + 1) * n] = s.t()
    return q, mn[:, :G * n].t().view(G, n, kb)
