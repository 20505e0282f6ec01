"""The backward of ``gemmlab.matmul`` (and so of ``gemmlab.linear``): one formula, registered on the
``gemmlab::matmul`` custom op with ``torch.library.register_autograd``.

    y = act(z),   z = alpha * a @ b + beta * c + bias

    dz    = dy * act'(z)                    (dy itself without an activation)
    da    = alpha * dz @ b^T                gemmlab.matmul(dz, b.t(), alpha=alpha)
    db    = alpha * a^T @ dz                gemmlab.matmul(a.t(), dz, alpha=alpha)
    dbias = dz summed over the rows
    dc    = beta * dz

The two backward GEMMs are ``gemmlab.matmul`` calls with other layouts, so they run on the same engine
(bf16/fp16 on Hopper, fp32 on the CUDA-core ladder) and, in a backward pass without ``create_graph``, on
its eager fast path. Each gradient is computed in the layout of its input (the weight's gradient of
``b = w.t()`` is written as a row-major (N, K) matrix and returned transposed), so autograd's
accumulation into ``w.grad`` copies nothing. Gradients come in the inputs' dtypes; ``dz`` is rounded to
the inputs' dtype for the GEMMs (as torch's own bf16 backward does) and kept in fp32 for ``dbias``.

Who runs it: calls that need a gradient (grad mode on and an input requiring grad) go through the op,
whose autograd kernel is this formula, or, when eager (``gemmlab.ops._eager`` says ``_GRAD``), through
``_EagerMatmul``, an autograd Function around the prepared call with this same formula; under
``torch.compile`` AOTAutograd traces it into the backward graph (every step here is a torch op or
``gemmlab.matmul``, which traces as the op). Double backward (``create_graph=True``) is not tested.
"""

from __future__ import annotations

import torch

from . import ops

F = torch.nn.functional

# Inputs of gemmlab::matmul, in schema order (a, b, bias, activation, alpha, beta, c, out_dtype).
_A, _B, _BIAS, _C = 0, 1, 2, 6


def setup_context(ctx, inputs, output) -> None:
    a, b, bias, activation, alpha, beta, c, out_dtype = inputs
    ctx.activation, ctx.alpha, ctx.beta = activation, alpha, beta
    ctx.bias_dtype = None if bias is None else bias.dtype
    ctx.c_dtype = None if c is None else c.dtype
    # The pre-activation z is recomputed in backward, not saved. Saving it means a forward that writes z
    # and applies the activation as a second pass (the fused epilogue writes only y), plus an (M, N)
    # buffer held from forward to backward per layer; recomputing costs one more GEMM in backward (about
    # a third more GEMM time for that layer's training step) and holds nothing: a, b, bias and c are
    # inputs, saved by reference. relu needs neither: its derivative is y > 0, from the output, which is
    # saved instead. Only fused gelu/gelu_tanh/silu layers pay the recompute (nn.Linear modules swapped
    # by gemmlab.patch have no fused activation, so models patched in place never do).
    needs_z = activation not in (None, "relu")
    ctx.save_for_backward(a, b, bias if needs_z else None, c if needs_z else None,
                          output if activation == "relu" else None)


def backward(ctx, dy):
    return _backward(ctx, dy, _op_gemm)


def _backward(ctx, dy, gemm):
    """The formula; ``gemm(which, dz, x, y, alpha, out_dtype)`` runs dA's and dB's GEMMs (x @ y)."""
    a, b, bias, c, y = ctx.saved_tensors
    need = ctx.needs_input_grad
    dz, dz32 = _dz(ctx, dy, a, b, bias, c, y)
    da = db = dbias = dc = None
    if need[_A]:
        da = _grad_a(dz, a, b, ctx.alpha, gemm)
    if need[_B]:
        db = _grad_b(dz, a, b, ctx.alpha, gemm)
    if need[_BIAS]:
        dbias = (dz32 if dz32 is not None else dy).sum(0, dtype=torch.float32).to(ctx.bias_dtype)
    if need[_C]:
        dc = (dz32 if dz32 is not None else dy) * ctx.beta
        dc = dc.to(ctx.c_dtype)
    return da, db, dbias, None, None, None, dc, None


def _dz(ctx, dy, a, b, bias, c, y):
    """(dz in the inputs' dtype for the GEMMs, dz in fp32 or None when it is dy itself)."""
    act = ctx.activation
    if act is None:
        return dy.to(a.dtype), None
    if act == "relu":
        dz32 = torch.where(y > 0, dy.float(), 0.0)
    else:
        # z in fp32: the GEMM and bias at full precision, beta * c added after (c has the output's dtype,
        # which the GEMM's fp32 output cannot take as its c).
        z = ops.gemm(a, b, bias=bias, alpha=ctx.alpha, out_dtype=torch.float32)
        if c is not None:
            z = z + ctx.beta * c.float()
        dz32 = dy.float() * _act_grad(z, act)
    return dz32.to(a.dtype), dz32


def _act_grad(z: torch.Tensor, activation: str) -> torch.Tensor:
    """d act / dz at z (fp32), for the activations of the fused epilogue (gemmlab.ops.ACTIVATIONS)."""
    if activation == "silu":
        s = torch.sigmoid(z)
        return s * (1 + z * (1 - s))
    if activation == "gelu":  # 0.5 (1 + erf(z / sqrt 2)) + z * N(z)
        return 0.5 * (1 + torch.erf(z * 0.7071067811865476)) + z * torch.exp(-0.5 * z * z) * 0.3989422804014327
    if activation == "gelu_tanh":  # 0.5 (1 + tanh u) + 0.5 z (1 - tanh^2 u) u',  u = sqrt(2/pi) (z + 0.044715 z^3)
        k = 0.7978845608028654
        t = torch.tanh(k * (z + 0.044715 * z * z * z))
        return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * k * (1 + 3 * 0.044715 * z * z)
    raise ValueError(f"no derivative for activation {activation!r}")


def _column_major(t: torch.Tensor) -> bool:
    """Whether 2-D ``t`` is a transposed row-major matrix (``w.t()``): its gradient is made the same way."""
    return t.stride(0) == 1 and t.stride(1) != 1


def _grad_a(dz, a, b, alpha, gemm):
    """alpha * dz @ b^T, (M, K) in a's dtype, laid out like a."""
    if _column_major(a):
        return gemm("a", dz, b, dz.t(), alpha, a.dtype).t()
    return gemm("a", dz, dz, b.t(), alpha, a.dtype)


def _grad_b(dz, a, b, alpha, gemm):
    """alpha * a^T @ dz, (K, N) in b's dtype, laid out like b (for b = w.t(): a row-major (N, K), transposed)."""
    if _column_major(b):
        return gemm("b", dz, dz.t(), a, alpha, b.dtype).t()
    return gemm("b", dz, a.t(), dz, alpha, b.dtype)


def _op_gemm(which, dz, x, y, alpha, out_dtype):
    return ops.gemm(x, y, alpha=alpha, out_dtype=out_dtype)


class _KeptGemms:
    """dA's and dB's GEMMs for ``_EagerMatmul``'s backward, their prepared calls kept on the forward's
    prepared call (``ops._Call.grads``). That call's key fixes a's and b's metadata, so the operands of
    each backward GEMM are fixed up to dz's metadata: (which gradient, dz's shape, strides, dtype, device,
    16-byte alignment) finds the prepared call that ``ops._prepared`` validated for them. Used only where
    ``ops.gemm`` would take the prepared call too (see ``_gemms_for``); saves its ``_eager`` test and the
    two-operand key per GEMM."""

    MAX = 16  # dz layouts per forward key (autograd hands one or two in practice)

    __slots__ = ("kept",)

    def __init__(self, kept: dict):
        self.kept = kept

    def __call__(self, which, dz, x, y, alpha, out_dtype):
        if type(dz) not in ops._PLAIN:
            return ops.gemm(x, y, alpha=alpha, out_dtype=out_dtype)
        key = (which, dz.shape, dz.stride(), dz.dtype, dz.get_device(), dz.data_ptr() & 15)
        call = self.kept.get(key)
        if call is None:
            call = ops._prepared(x, y, None, None, alpha, 0.0, None, out_dtype, None)
            if not (x.is_cuda and torch.cuda.is_current_stream_capturing()):  # as ops._prepared keeps calls
                if len(self.kept) >= self.MAX:
                    self.kept.clear()
                self.kept[key] = call
        return call(x, y, None, alpha, 0.0, None, None)


def _gemms_for(call):
    """The backward GEMMs of an ``_EagerMatmul``: kept prepared calls where ``ops.gemm`` would take the
    prepared call (no grad mode, i.e. no ``create_graph``; no tracing; no torch mode), else ``ops.gemm``."""
    if torch.is_grad_enabled() or torch.compiler.is_compiling() or ops._modes_active():
        return _op_gemm
    return _KeptGemms(call.grads)


torch.library.register_autograd("gemmlab::matmul", backward, setup_context=setup_context)


class _EagerMatmul(torch.autograd.Function):
    """Eager calls that need a gradient (``gemmlab.ops._eager`` says ``_GRAD``): the prepared call (validated
    and looked up by the caller, passed last) as the forward, then the op's ``setup_context``; the op's
    ``backward``. It skips the op's dispatch around the op's own autograd Function.

    The forward takes ``ctx`` itself (the combined form) rather than declaring ``setup_context``: with a
    ``setup_context``, ``Function.apply`` binds the arguments through ``inspect.signature`` on every call,
    which cost ~100 us of host time per call on the development machine, against ~11 us for the combined
    form (an empty forward either way). functorch transforms (``torch.func.grad``, vmap) accept only the
    ``setup_context`` form: ``_EagerMatmulTransforms`` is the same Function in it, for calls under them."""

    @staticmethod
    def forward(ctx, a, b, bias, activation, alpha, beta, c, out_dtype, call):
        y = call(a, b, bias, alpha, beta, c, None)
        setup_context(ctx, (a, b, bias, activation, alpha, beta, c, out_dtype), y)
        ctx.call = call
        return y

    @staticmethod
    def backward(ctx, dy):
        return (*_backward(ctx, dy, _gemms_for(ctx.call)), None)


class _EagerMatmulTransforms(torch.autograd.Function):
    """``_EagerMatmul`` with a ``setup_context``, as functorch transforms require (slower to apply)."""

    @staticmethod
    def forward(a, b, bias, activation, alpha, beta, c, out_dtype, call):
        return call(a, b, bias, alpha, beta, c, None)

    @staticmethod
    def setup_context(ctx, inputs, output):
        setup_context(ctx, inputs[:-1], output)

    @staticmethod
    def backward(ctx, dy):
        return (*backward(ctx, dy), None)


def eager_matmul(a, b, bias, activation, alpha, beta, c, out_dtype, call=None):
    """``gemmlab.matmul``'s result with the op's gradient formula, through ``_EagerMatmul``. ``call``: the
    prepared call for these arguments (``ops._prepared``), when the caller has it already."""
    if call is None:
        call = ops._prepared(a, b, bias, activation, alpha, beta, c, out_dtype, None)
    if torch._C._are_functorch_transforms_active():
        return _EagerMatmulTransforms.apply(a, b, bias, activation, alpha, beta, c, out_dtype, call)
    return _apply(a, b, bias, activation, alpha, beta, c, out_dtype, call)


# Function.apply is a Python prelude (functorch's checks, done above) around the C++ apply of
# torch._C._FunctionBase: take the C++ one directly (~2 us less per call here), where this torch has it.
_base_apply = getattr(torch._C._FunctionBase, "__dict__", {}).get("apply")
_apply = _base_apply.__get__(None, _EagerMatmul) if hasattr(_base_apply, "__get__") else _EagerMatmul.apply
