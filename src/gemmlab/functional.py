"""``gemmlab.matmul`` and ``gemmlab.linear``: the GEMM users call, on torch tensors, any shape and layout.

    out[M, N] = act(alpha * a @ b + beta * c + bias)

The rules, the errors and the custom op behind them are ``gemmlab.ops``'s (see its docstring). These two
functions choose the path of a call: the prepared call for eager calls that may skip the op, the same in
``gemmlab.autograd``'s Function when it needs a gradient, the op otherwise (tracing, modes, fake tensors),
and torch's own ops when the caller asked for ``fallback=True`` where gemmlab cannot run
(``gemmlab.fallback``).
"""

from __future__ import annotations

import operator

import torch

from . import autograd as _autograd  # registers the op's backward formula
from . import fallback as _fallback
from . import fp32, ops
from .devices import H200
from .errors import UnsupportedProblem

def matmul(a: torch.Tensor, b: torch.Tensor, *, bias: torch.Tensor | None = None, activation: str | None = None,
           alpha: float = 1.0, beta: float = 0.0, c: torch.Tensor | None = None,
           out_dtype: torch.dtype | None = None, out: torch.Tensor | None = None,
           fallback: bool = False) -> torch.Tensor:
    """``act(alpha * a @ b + beta * c + bias)`` on a CUDA GPU, accumulated in fp32.

    Args:
        a: (M, K); b: (K, N). Any strides: ``w.t()`` of an nn.Linear weight, transposed views, row- or
            column-major, unaligned leading dimensions or data pointers all work without the caller
            copying. Both bfloat16 or both float16 (Hopper tensor cores, sm_90), or both float32.
        bias: optional (N,), in the inputs' dtype or float32, added after ``beta * c``.
        activation: None, "relu", "gelu" (erf), "gelu_tanh" or "silu", applied last.
        alpha, beta: Python numbers. ``beta`` must be nonzero exactly when ``c`` is given.
        c: optional (M, N) tensor in the output dtype, any strides.
        out_dtype: bfloat16, float16 or float32; default the inputs' dtype (or ``out``'s dtype).
        out: optional (M, N) tensor of the output dtype on the same device, sharing no memory with the
            inputs, except that ``out=c`` (exactly the same view) is allowed for in-place accumulation.

    Returns: (M, N), contiguous, ``out_dtype``; ``out`` itself when given.

    Paths: bf16/fp16 run on the Hopper engine with the whole epilogue fused. float32 inputs run on the
    fp32 ladder's last step, k10 (``gemmlab.fp32``; any CUDA GPU; row blocks past one launch's reach):
    ``alpha`` and ``beta * c`` are applied by the kernel, bias and activation by torch ops after it (not
    fused). Zero-size problems launch nothing: an
    empty result when M or N is 0, ``act(beta * c + bias)`` when K is 0.

    The result without ``out`` comes from the ``gemmlab::matmul`` custom op, so it traces under
    ``torch.compile(fullgraph=True)`` and can be captured in a CUDA graph (warm up once first: the first
    call compiles the kernel). ``out=`` is a plain Python path in eager mode (custom ops cannot return
    an alias of an argument): the kernel writes ``out`` directly (through a temporary when ``out`` is not
    dense row-major, not 16-byte aligned, or is ``c``); under torch.compile, or for fake/meta tensors, it
    becomes the op followed by ``out.copy_``.

    Autograd: gradients of a, b, bias and c (``gemmlab.autograd``: the backward GEMMs run on gemmlab's
    kernels too), also under torch.compile. ``out=`` does not support autograd (like torch's out=).

    Raises: ``TypeError`` for dtype and argument-type problems; ``UnsupportedProblem`` (a ``ValueError``)
    for shapes, limits (each dimension < 2^31, each operand < 2^40 elements), devices and overlap;
    ``NoGPUError`` when no GPU, or no Hopper GPU for bf16/fp16, is available. See ``gemmlab.ops``.
    ``fallback=True``: where gemmlab cannot run (CPU tensors, float64, bf16/fp16 off Hopper) compute with
    torch instead, with one ``gemmlab.FallbackWarning`` per reason (``gemmlab.nn.fallback_reason``).
    """
    if fallback and isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and \
            not _fallback.route(a.dtype, a.device, b.dtype, "gemmlab.matmul", 3):
        y = _fallback.torch_matmul(a, b, bias=bias, activation=activation, alpha=alpha, beta=beta, c=c,
                                   out_dtype=out_dtype)
        return y if out is None else out.copy_(y)
    fast = ops._eager(a, b, bias, alpha, beta, c, out)
    if fast is True:
        return ops._prepared(a, b, bias, activation, alpha, beta, c, out_dtype, out)(a, b, bias, alpha, beta, c, out)
    if fast and out is None:  # _GRAD: the same prepared call, with the op's backward formula
        return _autograd.eager_matmul(a, b, bias, activation, alpha, beta, c, out_dtype)
    alpha, beta = ops._as_float(alpha), ops._as_float(beta)
    p = ops._validate(a, b, bias, activation, alpha, beta, c, out_dtype, out)
    if out is not None and torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (a, b, bias, c)):
        raise RuntimeError(f"{ops._NAME}(out=...) does not support automatic differentiation, but an input "
                           "requires grad; call it without out= (or under torch.no_grad())")
    if out is None:
        return torch.ops.gemmlab.matmul(a, b, bias, activation, alpha, beta, c, p.out_dtype)
    if torch.compiler.is_compiling() or p.device.type == "meta" or ops._is_fake(out) or ops._is_fake(a):
        return out.copy_(torch.ops.gemmlab.matmul(a, b, bias, activation, alpha, beta, c, p.out_dtype))
    return ops._prepared(a, b, bias, activation, alpha, beta, c, out_dtype, out)(a, b, bias, alpha, beta, c, out)


def plan(M: int, N: int, K: int, *, dtype: torch.dtype = torch.bfloat16, out_dtype: torch.dtype | None = None,
         bias_dtype: torch.dtype | None = None, has_c: bool = False, activation: str | None = None,
         b_mn: bool = False, sm_count: int | None = None):
    """What ``gemmlab.matmul`` runs for a (M, K) row-major ``a`` and a (K, N) ``b`` of ``dtype`` (``b_mn``:
    b row-major, N contiguous; default K-contiguous, as ``w.t()`` of an nn.Linear weight), a contiguous
    output of ``out_dtype`` (default: dtype), a bias of ``bias_dtype`` (None: no bias), ``c`` when
    ``has_c`` and ``activation``: an ``engine.Route`` naming the kernel, its plan and the model's price.

    bf16 / fp16: the Hopper engine's router (``engine.route``: the decode kernel, the engine kernel's plan
    or h11). float32: the fp32 route's step and config (``gemmlab.fp32``; ``kernel == "sgemm"``). Needs no GPU:
    ``sm_count`` defaults to the visible GPU's (whose memory's peak then also decides whether the engine kernel
    may plan stream-K: ``devices.stream_k_offered``), else the H200's 132. The arguments are checked by the same
    rules as ``gemmlab.matmul``'s, with the same errors (``TypeError`` for dtypes, ``UnsupportedProblem``
    for sizes past the kernels' limits); M, N, K and ``sm_count`` must be integers >= 1 (``ValueError``).
    FP8 operands are ``gemmlab.scaled_mm``'s: ``gemmlab.planner.plan_fp8`` (or ``gemmlab model --dtype fp8``)
    plans those."""
    for name, n in (("M", M), ("N", N), ("K", K)):
        if operator.index(n) < 1:
            raise ValueError(f"{name} must be >= 1, got {n}")
    ops.check_dims(M, N, K, "gemmlab.plan")
    for name, dt in (("dtype", dtype), ("out_dtype", out_dtype), ("bias_dtype", bias_dtype)):
        if (dt is not None or name == "dtype") and not isinstance(dt, torch.dtype):
            raise TypeError(f"gemmlab.plan: {name} must be a torch.dtype, got {dt!r}")
    if sm_count is not None and (isinstance(sm_count, bool) or operator.index(sm_count) < 1):
        raise ValueError(f"gemmlab.plan: sm_count must be a positive integer (the GPU's SMs), got {sm_count!r}")
    if dtype.is_floating_point and dtype.itemsize == 1:
        raise TypeError(f"gemmlab.plan: {dtype} operands are gemmlab.scaled_mm's, not gemmlab.matmul's; "
                        "gemmlab.planner.plan_fp8(M, N, K, scale='tensor' or 'block') gives its plan")
    meta = {"device": "meta"}
    a = torch.empty((M, K), dtype=dtype, **meta)
    b = torch.empty((K, N), dtype=dtype, **meta) if b_mn else torch.empty((N, K), dtype=dtype, **meta).t()
    bias = torch.empty(N, dtype=bias_dtype, **meta) if bias_dtype is not None else None
    c = torch.empty((M, N), dtype=out_dtype or dtype, **meta) if has_c else None
    p = ops._validate(a, b, bias, activation, 1.0, 1.0 if has_c else 0.0, c, out_dtype)
    engine = ops._load_engine()
    if p.in_dtype == torch.float32:
        if sm_count is None:
            sm_count = (ops._sm_count(torch.device("cuda", torch.cuda.current_device())) if torch.cuda.is_available()
                        else H200.sm_count)
        cfg = fp32.config_for(M, N, K, sm_count)
        n = len(fp32.row_blocks(M, N, K, cfg))
        how = "fp32 inputs" if n == 1 else f"{n} launches over row blocks"
        return engine.Route("sgemm", M, N, K, how, step=fp32.K10.name, config=tuple(cfg.items()))
    return engine.plan(M, N, K, dtype=dtype, out_dtype=p.out_dtype, bias_dtype=bias_dtype, has_c=has_c,
                       activation=activation, b_mn=b_mn, sm_count=sm_count)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           activation: str | None = None, *, fallback: bool = False) -> torch.Tensor:
    """``act(x @ weight.T + bias)``, like ``torch.nn.functional.linear`` with a fused activation.

    x: (..., K), any number of leading dimensions (also none: (K,) gives (N,)); weight: (N, K) (an
    nn.Linear weight, any strides); bias: optional (N,). Returns (..., N) in x's dtype. The leading
    dimensions are flattened with ``reshape`` (a view whenever x's strides allow, else one copy), and
    the product is ``gemmlab.matmul(x2d, weight.t(), ...)``, whose rules and errors apply.
    ``fallback=True``: ``torch.nn.functional.linear`` where gemmlab cannot run (as ``gemmlab.nn.Linear``).

    Eager calls whose x and weight metadata was seen before (``_linear_fast``) go straight to the
    prepared call that the first such call validated and prepared.
    """
    y = _linear_fast(x, weight, bias, activation)
    if y is not None:
        return y
    if fallback and isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor) and \
            not _fallback.route(x.dtype, x.device, weight.dtype, "gemmlab.linear", 3):
        return _fallback.torch_linear(x, weight, bias, activation)
    if not isinstance(x, torch.Tensor) or not isinstance(weight, torch.Tensor):
        bad = x if not isinstance(x, torch.Tensor) else weight
        raise TypeError(f"gemmlab.linear: x and weight must be torch.Tensors, got {type(bad).__name__}")
    if x.dim() < 1:
        raise UnsupportedProblem("gemmlab.linear: x must have at least one dimension (..., K), got a scalar")
    if weight.dim() != 2:
        raise UnsupportedProblem(f"gemmlab.linear: weight must be 2-D (N, K), got shape {tuple(weight.shape)}")
    K = x.shape[-1]
    if weight.shape[1] != K:
        raise UnsupportedProblem(f"gemmlab.linear: x has {K} features (last dimension) but weight (N, K) has "
                                 f"shape {tuple(weight.shape)}; weight.shape[1] must equal x.shape[-1]")
    if x.dim() == 2:
        y = matmul(x, weight.t(), bias=bias, activation=activation)
        _remember_linear(x, x, weight, bias, activation)
        return y
    lead = tuple(x.shape[:-1])
    rows = 1
    for d in lead:
        rows *= d
    x2 = x.reshape(rows, K)
    y = matmul(x2, weight.t(), bias=bias, activation=activation)
    _remember_linear(x, x2, weight, bias, activation)
    return y.reshape(*lead, weight.shape[0])


# gemmlab.linear's fast path -----------------------------------------------------------------------------
#
# A model calls each nn.Linear with the same metadata every step (shapes, strides, dtypes, devices, the
# weight's layout) and fresh tensors: new activations, new data pointers. Where ``x`` flattens to its 2-D
# (rows, K) by a view, the flattened shape and strides, ``weight.t()``'s and everything ``ops._call_key``
# holds are functions of x's and the weight's metadata, so one key of those (the same fields as
# ``ops._meta``: shape, strides, dtype, device, 16-byte alignment of the data pointer; the bias's; the
# activation) finds the prepared call the general path validated for them. Such a key is stored (in
# ``ops._CALLS``, so it is emptied with the prepared calls) only after the general path ran that call
# eagerly, so a hit implies every check passed. The hit skips gemmlab.linear's checks and flattening
# arithmetic, ``gemmlab.matmul``'s keyword call and ``ops._call_key``'s second key.

class _Linear:
    """A ``gemmlab.linear`` shape seen before: the 2-D view of x (None: x is 2-D), the output's shape, and
    the prepared call of ``matmul(x2d, weight.t(), bias=bias, activation=activation)``."""

    __slots__ = ("flat", "out_shape", "call")

    def __init__(self, flat, out_shape, call):
        self.flat, self.out_shape, self.call = flat, out_shape, call


_LINEAR = object()  # first field of a fast-path key: no ops._call_key starts with it


def _linear_key(x, w, bias, activation) -> tuple:
    return (_LINEAR, x.shape, x.stride(), x.dtype, x.get_device(), x.data_ptr() & 15, w.shape, w.stride(),
            w.dtype, w.get_device(), w.data_ptr() & 15, None if bias is None else ops._meta(bias), activation)


def _linear_fast(x, weight, bias, activation) -> torch.Tensor | None:
    """The result of ``linear(x, weight, bias, activation)`` where its key was stored (``_remember_linear``)
    and the call may skip the op (``ops._eager``'s conditions, with x and the weight for a and b); None
    otherwise (the caller takes the general path, which raises any error)."""
    P = ops._PLAIN
    if torch.compiler.is_compiling() or type(x) not in P or type(weight) not in P or \
            (bias is not None and type(bias) not in P) or not ops._fast_device(x) or ops._modes_active():
        return None
    try:
        entry = ops._CALLS.get(_linear_key(x, weight, bias, activation))
    except (RuntimeError, TypeError):  # no storage or strides, an unhashable activation...
        return None
    if entry is None:
        return None
    flat = entry.flat
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or
                                    (bias is not None and bias.requires_grad)):
        # x and the weight themselves into the Function: no view nodes in the graph (autograd._EagerLinear)
        return _autograd.eager_linear(x, weight, bias, activation, entry.call, flat, entry.out_shape)
    x2 = x if flat is None else x.view(*flat)  # (view(*sizes) parses faster than view(tuple): ~0.5 us each)
    y = entry.call(x2, weight.t(), bias, 1.0, 0.0, None, None)
    return y if flat is None else y.view(*entry.out_shape)


def _remember_linear(x, x2, weight, bias, activation) -> None:
    """After the general path ran ``linear``: store its key for ``_linear_fast`` when the 2-D product took
    the eager path (its prepared call is in ``ops._CALLS``) and ``x2`` is a view of x (not a copy)."""
    wt = weight.t()
    if not ops._eager(x2, wt, bias, 1.0, 0.0, None, None):
        return
    try:
        if x2 is not x and x2.untyped_storage().data_ptr() != x.untyped_storage().data_ptr():
            return  # reshape copied: the fast path's view would fail (and a copy's metadata is not x's)
        call = ops._CALLS.get(ops._call_key(x2, wt, bias, activation, 0.0, None, None, None))
        key = _linear_key(x, weight, bias, activation)
    except (RuntimeError, TypeError):
        return
    if call is not None:
        flat = None if x2 is x else tuple(x2.shape)
        ops._CALLS.put(key, _Linear(flat, (*x.shape[:-1], weight.shape[0]), call))
