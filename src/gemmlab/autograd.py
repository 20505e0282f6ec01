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
        return (dy if dy.dtype == a.dtype else dy.to(a.dtype)), None
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


def _row_major(t: torch.Tensor) -> bool:
    """``_column_major(t.t())`` without making the view: ``t``'s rows are contiguous (an nn.Linear weight)."""
    return t.stride(1) == 1 and t.stride(0) != 1


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


def _grad_x(dz, a, w, alpha, gemm):
    """``_grad_a`` for b = w.t() given w ((N, K), an nn.Linear weight): the same GEMM, without the
    transposes a row-major a would take (b.t() is w)."""
    if _column_major(a):
        return _grad_a(dz, a, w.t(), alpha, gemm)
    return gemm("a", dz, dz, w, alpha, a.dtype)


def _grad_w(dz, a, w, alpha, gemm):
    """``_grad_b`` for b = w.t(), transposed: the (N, K) gradient of w itself, laid out like w. For a
    row-major w (b column-major) that is the row-major product dz^T @ a, with no transpose taken."""
    if _row_major(w):
        return gemm("b", dz, dz.t(), a, alpha, w.dtype)
    return _grad_b(dz, a, w.t(), alpha, gemm).t()


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

    __slots__ = ("kept", "dz", "meta")

    def __init__(self, kept: dict):
        self.kept, self.dz, self.meta = kept, None, None

    def __call__(self, which, dz, x, y, alpha, out_dtype):
        if type(dz) not in ops._PLAIN:
            return ops.gemm(x, y, alpha=alpha, out_dtype=out_dtype)
        if dz is not self.dz:  # dA's and dB's GEMMs share dz: its metadata is read once per backward
            self.dz, self.meta = dz, (dz.shape, dz.stride(), dz.dtype, dz.get_device(), dz.data_ptr() & 15)
        key = (which, self.meta)
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


class _EagerLinear(torch.autograd.Function):
    """``gemmlab.linear``'s fast path when it needs a gradient: ``_EagerMatmul`` with x (..., K) and the
    weight (N, K) themselves as the inputs. ``_EagerMatmul`` on ``x.view(rows, K)`` and ``weight.t()``,
    with the result viewed back to (..., N), puts three view nodes around the Function (x's view,
    ``weight.t()``, the result's view) that autograd creates in forward and runs in backward; here the
    views are taken inside (no autograd), the result is made in its final shape (``ops._Call.shaped``), and
    backward returns x's gradient in x's shape and the weight's as (N, K). The formula's pieces are the
    op's (``_dz``, ``_grad_x`` / ``_grad_w`` = ``_grad_a`` / ``_grad_b`` for b = w.t()), and its GEMMs are
    the same products on the same operands, so they share the kept prepared calls (``_KeptGemms``)."""

    @staticmethod
    def forward(ctx, x, weight, bias, activation, call, flat, out_shape):
        if flat is None:
            y = call(x, weight.t(), bias, 1.0, 0.0, None, None)
        else:
            y = call.shaped(out_shape, x.view(*flat), weight.t(), bias)
        setup_context(ctx, (x, weight, bias, activation, 1.0, 0.0, None, None), y)
        ctx.call, ctx.flat = call, flat
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, bias, _, y = ctx.saved_tensors
        need = ctx.needs_input_grad
        flat = ctx.flat
        if flat is None:
            a = x
        else:
            a = x.view(*flat)
            dy = dy.reshape(flat[0], w.shape[0])  # a view unless autograd handed a dy that cannot be one
            if y is not None:  # relu's output, (..., N)
                y = y.view(dy.shape)
        gemm = _gemms_for(ctx.call)
        dz, dz32 = _dz(ctx, dy, a, w.t() if ctx.activation not in (None, "relu") else None, bias, None, y)
        dx = dw = dbias = None
        if need[0]:
            dx = _grad_x(dz, a, w, 1.0, gemm)
            if flat is not None:
                dx = dx.view(x.shape)  # dense (row- or column-major): splitting its rows is always a view
        if need[1]:
            dw = _grad_w(dz, a, w, 1.0, gemm)
        if need[2]:
            dbias = (dz32 if dz32 is not None else dy).sum(0, dtype=torch.float32).to(ctx.bias_dtype)
        return dx, dw, dbias, None, None, None, None


def eager_linear(x, weight, bias, activation, call, flat, out_shape):
    """``gemmlab.linear(x, weight, bias, activation)`` with the op's gradient formula, through
    ``_EagerLinear``: ``call`` is the prepared call of ``matmul(x2, weight.t(), bias=bias,
    activation=activation)`` for x's 2-D view x2 = ``x.view(*flat)`` (``flat`` None: x is 2-D itself),
    ``out_shape`` the result's (..., N). Under functorch transforms: ``eager_matmul`` on the views."""
    if torch._C._are_functorch_transforms_active():
        x2 = x if flat is None else x.view(*flat)
        y = eager_matmul(x2, weight.t(), bias, activation, 1.0, 0.0, None, None, call)
        return y if flat is None else y.view(*out_shape)
    return _apply_linear(x, weight, bias, activation, call, flat, out_shape)


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
_apply_linear = _base_apply.__get__(None, _EagerLinear) if hasattr(_base_apply, "__get__") else _EagerLinear.apply
