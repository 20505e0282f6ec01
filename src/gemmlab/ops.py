"""``gemmlab.matmul`` and ``gemmlab.linear``: the GEMM users call, on torch tensors, any shape and layout.

    out[M, N] = act(alpha * a @ b + beta * c + bias)

The public functions validate everything from tensor metadata first (before any device work, so every bad
input gets a specific error, on any machine), then call the ``gemmlab::matmul`` custom op. The op's real
implementation sends bf16/fp16 problems to the Hopper engine (``gemmlab.engine``, loaded lazily) and fp32
problems to the fp32 route (``gemmlab.fp32``: the CUDA-core ladder's last step); its fake implementation
only states the output's shape and dtype, which is what ``torch.compile(fullgraph=True)`` traces. Nothing
in the launch path reads a device value back to the host (no ``.item()``, no synchronisation) and every
buffer comes from torch's allocator, so the op can be captured in a CUDA graph (after one warm-up call has
compiled the kernel).

Which exception means what:

- ``TypeError``: a non-tensor where a tensor belongs, an unsupported or mixed dtype (inputs, ``out_dtype``,
  ``bias``, ``c``, ``out``), a non-number ``alpha``/``beta``, a non-string ``activation``.
- ``gemmlab.errors.UnsupportedProblem`` (a ``ValueError``): wrong rank or shape, mismatched inner dimensions,
  an unknown activation, ``c`` without ``beta`` (or ``beta`` without ``c``), sizes past the index limits,
  mixed devices, CPU tensors on a machine with a GPU, ``out`` overlapping an input, a non-strided layout.
- ``gemmlab.errors.NoGPUError``: torch sees no GPU (and the inputs are not CUDA tensors), or bf16/fp16 on a
  GPU the Hopper engine cannot run on (fp32 inputs run on any CUDA GPU).

Eager calls skip the op's dispatch (~20-60 us of host time on the H200's host, benchmarks/results/eager.jsonl):
a call on plain CUDA tensors outside tracing, torch modes and the profiler looks up its prepared call by
a key of everything the validation and the launch depend on (shapes, strides, dtypes, devices, 16-byte
alignment of the data pointers, which optional tensors are given, the activation, whether beta is 0), so a
repeated call validates nothing again and pays an allocation and one driver launch. The op's
implementation (what ``torch.compile`` and the paths around the fast one run) uses the same cache, and
so does ``gemmlab.linear``'s own fast path (keyed on the un-flattened input and the weight).

Meta tensors are accepted and give a meta result (shape and dtype only), like any torch op.
Autograd: ``gemmlab.autograd`` is the op's backward formula (registered when this module loads). An eager
call that needs a gradient runs its prepared call inside that module's autograd Function, which shares
the formula; the backward GEMMs are ``gemmlab.matmul`` calls again.
"""

from __future__ import annotations

import contextlib
import numbers
import sys
import time
from dataclasses import dataclass
from typing import Optional

import torch

from .errors import GemmlabError, NoGPUError, UnsupportedProblem

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")
INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
OUTPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# Index limits. Kernels index rows and columns with 32-bit integers and element offsets with 64-bit ones;
# these bounds leave headroom for tile edges on both. Every dimension must be below MAX_DIM and no operand
# (a, b, c, out: M*K, K*N, M*N elements when dense; the memory span for strided views) may reach MAX_SPAN.
MAX_DIM = 2**31
MAX_SPAN = 2**40

_NAME = "gemmlab.matmul"


@dataclass(frozen=True)
class Problem:
    """A validated matmul: sizes, dtypes and the device everything lives on."""

    M: int
    N: int
    K: int
    in_dtype: torch.dtype
    out_dtype: torch.dtype
    device: torch.device


# Validation -----------------------------------------------------------------------------------------

def _span(t: torch.Tensor) -> int:
    """Elements between the first and one past the last element ``t`` addresses (0 if empty)."""
    if t.numel() == 0:
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))


def _is_number(x) -> bool:
    return isinstance(x, (int, float, torch.SymInt, torch.SymFloat)) and not isinstance(x, bool)


def _as_float(x):
    """Plain real numbers (int, numpy scalars) as Python floats, which the op's schema takes; anything else
    (symbolic values under torch.compile, or wrong types for _validate to refuse) unchanged."""
    if isinstance(x, numbers.Real) and not isinstance(x, (bool, torch.SymInt, torch.SymFloat)):
        return float(x)
    return x


def _check_device(device: torch.device) -> None:
    """Accept CUDA (and meta) tensors; say what is missing otherwise. Tests replace this to run on CPU."""
    if device.type in ("cuda", "meta"):
        return
    if not torch.cuda.is_available():
        raise NoGPUError(f"{_NAME} runs on NVIDIA GPUs and torch sees none (torch {torch.__version__}, "
                         f"CUDA build: {torch.version.cuda}); the inputs are on {device}. "
                         "On the CPU use torch.matmul / torch.nn.functional.linear.")
    raise UnsupportedProblem(f"{_NAME} takes CUDA tensors; the inputs are on {device}. "
                             "Move them with .cuda() (or .to('cuda:N')).")


def _validate(a, b, bias, activation, alpha, beta, c, out_dtype, out=None) -> Problem:
    """Every check that needs only metadata, in the order: types, ranks, dtypes, shapes, scalars, limits,
    devices. Works on real, meta and fake tensors alike (nothing here touches device memory)."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{_NAME}: {name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("bias", bias), ("c", c), ("out", out)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{_NAME}: {name} must be a torch.Tensor or None, got {type(t).__name__}")
    tensors = [(n, t) for n, t in (("a", a), ("b", b), ("bias", bias), ("c", c), ("out", out)) if t is not None]
    for name, t in tensors:
        if t.layout != torch.strided:
            raise UnsupportedProblem(f"{_NAME}: {name} is a {t.layout} tensor; only dense (strided) tensors "
                                     "are supported (convert with .to_dense())")

    if a.dim() != 2 or b.dim() != 2:
        bad, t = ("a", a) if a.dim() != 2 else ("b", b)
        raise UnsupportedProblem(f"{_NAME}: a must be 2-D (M, K) and b 2-D (K, N); {bad} has shape "
                                 f"{tuple(t.shape)}. For batched inputs (..., K) use gemmlab.linear.")

    if a.dtype not in INPUT_DTYPES:
        raise TypeError(f"{_NAME}: a has dtype {a.dtype}; supported: bfloat16, float16 (tensor cores) "
                        "and float32 (CUDA-core path)")
    if b.dtype != a.dtype:
        raise TypeError(f"{_NAME}: a and b must share one dtype, got a {a.dtype} and b {b.dtype} "
                        "(cast one of them first)")
    if out_dtype is None:
        out_dtype = out.dtype if out is not None else a.dtype
    elif not isinstance(out_dtype, torch.dtype):
        raise TypeError(f"{_NAME}: out_dtype must be a torch.dtype or None, got {out_dtype!r}")
    if out_dtype not in OUTPUT_DTYPES:
        raise TypeError(f"{_NAME}: out_dtype {out_dtype} is not supported; use bfloat16, float16 or float32")
    if out is not None and out.dtype != out_dtype:
        raise TypeError(f"{_NAME}: out has dtype {out.dtype} but the result is {out_dtype} "
                        "(out_dtype, or the inputs' dtype when out_dtype is None)")

    M, K = a.shape
    K_b, N = b.shape
    if K != K_b:
        raise UnsupportedProblem(f"{_NAME}: inner dimensions differ: a is (M, K) = {tuple(a.shape)}, b is "
                                 f"(K, N) = {tuple(b.shape)}; a.shape[1] must equal b.shape[0] (for an "
                                 "nn.Linear weight w of shape (N, K) pass b=w.t(), or use gemmlab.linear)")

    if not _is_number(alpha) or not _is_number(beta):
        bad = "alpha" if not _is_number(alpha) else "beta"
        val = alpha if bad == "alpha" else beta
        raise TypeError(f"{_NAME}: {bad} must be a Python number, got {type(val).__name__} (a tensor "
                        "scalar would need a device-to-host read)")
    if activation is not None and not isinstance(activation, str):
        raise TypeError(f"{_NAME}: activation must be a string or None, got {type(activation).__name__}")
    if activation is not None and activation not in ACTIVATIONS:
        raise UnsupportedProblem(f"{_NAME}: unknown activation {activation!r}; choose one of "
                                 f"{', '.join(ACTIVATIONS)} or None")

    if bias is not None:
        if bias.dim() != 1 or bias.shape[0] != N:
            raise UnsupportedProblem(f"{_NAME}: bias must have shape (N,) = ({N},), got {tuple(bias.shape)}")
        if bias.dtype not in (a.dtype, torch.float32):
            raise TypeError(f"{_NAME}: bias must be {a.dtype} (the inputs' dtype) or float32, got {bias.dtype}")
    if c is not None:
        if c.dim() != 2 or tuple(c.shape) != (M, N):
            raise UnsupportedProblem(f"{_NAME}: c must have shape (M, N) = ({M}, {N}), got {tuple(c.shape)} "
                                     "(broadcast it explicitly with c.expand(M, N))")
        if c.dtype != out_dtype:
            raise TypeError(f"{_NAME}: c must have the output's dtype {out_dtype}, got {c.dtype}")
        if beta == 0:
            raise UnsupportedProblem(f"{_NAME}: c is given but beta=0, so c would be ignored; pass beta "
                                     "(e.g. beta=1.0) or drop c")
    elif beta != 0:
        raise UnsupportedProblem(f"{_NAME}: beta={beta} needs c (the (M, N) tensor it scales)")
    if out is not None and (out.dim() != 2 or tuple(out.shape) != (M, N)):
        raise UnsupportedProblem(f"{_NAME}: out must have shape (M, N) = ({M}, {N}), got {tuple(out.shape)}")
    if out is not None and _overlaps_itself(out):
        raise UnsupportedProblem(f"{_NAME}: out (shape {tuple(out.shape)}, strides {out.stride()}) overlaps "
                                 "itself: its elements share memory (e.g. an expanded tensor), so results would "
                                 "overwrite each other; pass a tensor with distinct elements (out=c.contiguous(), "
                                 "or no out)")

    check_dims(M, N, K)
    for name, t in tensors:
        if name != "bias" and _span(t) >= MAX_SPAN:
            raise UnsupportedProblem(f"{_NAME}: {name} (shape {tuple(t.shape)}, strides {t.stride()}) spans "
                                     f"{_span(t)} elements; the limit is 2^40")

    devices = {t.device for _, t in tensors}
    if len(devices) > 1:
        where = ", ".join(f"{n} on {t.device}" for n, t in tensors)
        raise UnsupportedProblem(f"{_NAME}: all tensors must be on one device; got {where}")
    _check_device(a.device)
    return Problem(M, N, K, a.dtype, out_dtype, a.device)


def check_dims(M: int, N: int, K: int, name: str = _NAME) -> None:
    """UnsupportedProblem where a dimension reaches MAX_DIM or the output MAX_SPAN elements."""
    for dim_name, d in (("M", M), ("N", N), ("K", K)):
        if d >= MAX_DIM:
            raise UnsupportedProblem(f"{name}: {dim_name}={d} is too large: every dimension must be below "
                                     f"2^31 ({MAX_DIM}) for the kernels' 32-bit row/column indices")
    if M * N >= MAX_SPAN:
        raise UnsupportedProblem(f"{name}: the output has M*N = {M * N} elements; the limit is 2^40")


def _overlaps_itself(t: torch.Tensor) -> bool:
    """Whether two elements of 2-D ``t`` share memory: a dimension of more than one element with stride 0,
    or the larger-stride dimension stepping inside the span of the other (metadata only). An empty
    tensor has no elements to share."""
    if t.numel() == 0:
        return False
    dims = sorted((abs(st), n) for n, st in zip(t.shape, t.stride()) if n > 1)
    if not dims:
        return False
    if dims[0][0] == 0:
        return True
    return len(dims) == 2 and dims[1][0] < dims[0][0] * dims[0][1]


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    start = t.data_ptr()
    return start, start + _span(t) * t.element_size()


def _same_view(x: torch.Tensor, y: torch.Tensor) -> bool:
    return x.data_ptr() == y.data_ptr() and x.shape == y.shape and x.stride() == y.stride()


def _check_out_overlap(out: torch.Tensor, a, b, bias, c) -> None:
    """``out`` must not share memory with an input (a conservative test on address ranges). The one
    exception is ``out`` being exactly ``c`` (in-place ``beta * c`` accumulation), which is computed
    into a temporary first."""
    if out.numel() == 0:
        return
    o0, o1 = _byte_range(out)
    for name, t in (("a", a), ("b", b), ("bias", bias), ("c", c)):
        if t is None or t.numel() == 0:
            continue
        if name == "c" and _same_view(out, t):
            continue
        t0, t1 = _byte_range(t)
        if o0 < t1 and t0 < o1:
            raise UnsupportedProblem(f"{_NAME}: out overlaps {name} in memory (bytes [{o0:#x}, {o1:#x}) and "
                                     f"[{t0:#x}, {t1:#x})); the kernel would read what it has overwritten. "
                                     "Pass a separate out (out=c exactly is allowed).")


# The paths ------------------------------------------------------------------------------------------

def _activate_(x: torch.Tensor, activation: str | None) -> torch.Tensor:
    """The epilogue's activations as torch ops, in place (the reference the fused epilogue must match)."""
    F = torch.nn.functional
    if activation == "relu":
        return F.relu(x, inplace=True)
    if activation == "gelu":
        return x.copy_(F.gelu(x))
    if activation == "gelu_tanh":
        return x.copy_(F.gelu(x, approximate="tanh"))
    if activation == "silu":
        return F.silu(x, inplace=True)
    return x


def _on_device(device: torch.device):
    """Make ``device`` current for a launch (kernels launch on the current device's stream)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _run_fp32(p: Problem, a, b, bias, activation, alpha, beta, c, out) -> None:
    """fp32 inputs on the CUDA-core route (``gemmlab.fp32``: the fp32 ladder's last step, any CUDA GPU).
    The kernel computes ``alpha * a @ b + beta * c`` (c staged in an fp32 buffer); bias, activation and
    the cast to the output dtype are separate torch ops after it (not fused). a and b are made contiguous
    (copied when they are not), as the kernel takes row-major operands."""
    from . import fp32

    cfg = fp32.config_for(p.M, p.N, p.K, _sm_count(p.device))
    direct = out.dtype == torch.float32 and out.stride() == (p.N, 1)
    acc = out if direct else torch.empty((p.M, p.N), dtype=torch.float32, device=p.device)
    if c is not None:
        acc.copy_(c)
    else:
        beta = 0.0  # the kernel then never reads acc
    with _on_device(p.device):
        fp32.run(a.contiguous(), b.contiguous(), acc, alpha=float(alpha), beta=float(beta), config=cfg)
    if bias is not None:
        acc.add_(bias)
    _activate_(acc, activation)
    if acc is not out:
        out.copy_(acc)


def _load_engine():
    """The Hopper engine module (imported on first use; tests replace this with a fake engine)."""
    try:
        from . import engine
    except ImportError as e:
        raise GemmlabError(f"{_NAME}: bf16/fp16 need the Hopper engine (gemmlab.engine), which this build "
                           f"lacks: {e}") from e
    return engine


def _engine_for(p: Problem):
    """The engine module, or ``NoGPUError`` saying why it cannot run ``p`` here."""
    eng = _load_engine()
    why = eng.hopper_available(p.device)
    if why:
        raise NoGPUError(f"{_NAME} on {p.in_dtype} inputs needs the Hopper (sm_90) engine, which cannot run "
                         f"here: {why}. float32 inputs run on any CUDA GPU (the CUDA-core path).")
    return eng


def _epilogue_only(p: Problem, bias, activation, c, beta, out) -> None:
    """K == 0: a @ b is all zeros, so the result is act(beta * c + bias) (no kernel launch)."""
    acc = torch.zeros((p.M, p.N), dtype=torch.float32, device=p.device)
    if c is not None:
        acc.add_(c.float(), alpha=beta)
    if bias is not None:
        acc.add_(bias.float())
    _activate_(acc, activation)
    out.copy_(acc)


def _compute(p: Problem, a, b, bias, activation, alpha, beta, c, out) -> None:
    """Write the result into ``out`` ((M, N), dtype ``p.out_dtype``, dense row-major, 16-byte aligned,
    sharing no memory with the inputs) on a path other than the engine's: empty, K = 0, or fp32."""
    if p.M == 0 or p.N == 0:
        return
    if p.K == 0:
        _epilogue_only(p, bias, activation, c, beta, out)
    else:
        _run_fp32(p, a, b, bias, activation, alpha, beta, c, out)


# Prepared calls: validated and decided once per metadata key -----------------------------------------

def _meta(t: torch.Tensor) -> tuple:
    return (t.shape, t.stride(), t.dtype, t.get_device(), t.data_ptr() & 15)


def _call_key(a, b, bias, activation, beta, c, out_dtype, out) -> tuple:
    """Everything ``_validate`` checks and the launch depends on, except the tensors' addresses and the
    values of alpha and beta (the callers make sure alpha and beta are plain numbers): calls with one key
    validate alike and run alike."""
    return (_meta(a), _meta(b), None if bias is None else _meta(bias), None if c is None else _meta(c),
            activation, beta != 0, out_dtype,
            None if out is None else (_meta(out), c is not None and out.data_ptr() == c.data_ptr()))


class _Call:
    """A validated call with its launch prepared: ``gemmlab.matmul`` runs this for every call whose
    ``_call_key`` is the same. On the engine's route the launch is the engine's prepared one (plan,
    instantiation, descriptors whose addresses follow the tensors); elsewhere ``_compute``."""

    __slots__ = ("p", "shape", "device", "dev", "launch", "activation", "bias_contiguous", "temporary", "grads")

    def __init__(self, p: Problem, a, b, bias, activation, beta, c, out):
        self.p, self.shape, self.device, self.activation = p, (p.M, p.N), p.device, activation
        self.grads = {}  # the backward GEMMs' prepared calls (gemmlab.autograd._KeptGemms)
        self.dev = a.get_device()
        self.bias_contiguous = bias is None or bias.is_contiguous()
        self.temporary = out is not None and _needs_temporary(out, p, c)
        self.launch = None
        if p.in_dtype != torch.float32 and p.M and p.N and p.K:
            eng = _engine_for(p)
            example = torch.empty(self.shape, dtype=p.out_dtype, device=p.device) if out is None or self.temporary else out
            has_c = c is not None and beta != 0
            with _on_device(p.device):
                self.launch = eng.prepare(a, b, example, bias=bias if self.bias_contiguous else bias.contiguous(),
                                          activation=activation, has_c=has_c, c=c if has_c else None)

    def __call__(self, a, b, bias, alpha, beta, c, out):
        """Run for these tensors (the key's metadata) and scalars; returns ``out``, or a new result."""
        if out is None:
            # empty(M, N, ...) parses faster than empty((M, N), ...): 1.1 against 1.7 us on the development
            # machine (the same as view(*sizes) against view(sizes))
            out = target = torch.empty(*self.shape, dtype=self.p.out_dtype, device=self.device)
        else:
            _check_out_overlap(out, a, b, bias, c)
            target = torch.empty(self.shape, dtype=self.p.out_dtype, device=self.device) if self.temporary else out
        self._run(a, b, bias, alpha, beta, c, target)
        if target is not out:
            out.copy_(target)
        return out

    def shaped(self, shape, a, b, bias):
        """The result of ``gemmlab.linear``'s call (alpha 1, no c, no ``out``) as a new tensor of ``shape``
        (the (M, N) result with its rows unflattened, (..., N)), written through a 2-D view of it. A caller
        that returns it from an autograd Function gets a tensor that is not a view: views made inside a
        Function's forward are outputs that refuse in-place changes."""
        y = torch.empty(*shape, dtype=self.p.out_dtype, device=self.device)
        self._run(a, b, bias, 1.0, 0.0, None, y.view(self.shape))
        return y

    def _run(self, a, b, bias, alpha, beta, c, target) -> None:
        if self.launch is None:
            _compute(self.p, a, b, bias, self.activation, alpha, beta, c, target)
        else:
            if not self.bias_contiguous:
                bias = bias.contiguous()
            dev = self.dev
            if dev >= 0 and dev != torch.cuda.current_device():
                with torch.cuda.device(dev):
                    self.launch.run(_stream(dev), a, b, target, bias, c, float(alpha), float(beta))
            else:
                self.launch.run(_stream(dev), a, b, target, bias, c, float(alpha), float(beta))


def _stream(dev: int) -> int:
    """torch's current stream on device ``dev``, as a raw handle (tests on CPU replace this)."""
    return torch._C._cuda_getCurrentRawStream(dev)


def keep_prepared(calls: dict, key, call, device: torch.device, limit: int) -> None:
    """Keep a prepared call (``gemmlab.scaled_mm``'s, ``gemmlab.grouped_mm``'s) under its metadata ``key``
    in ``calls``, emptied first when it holds ``limit`` keys (keys without end, e.g. every sequence
    length: start over). Not kept without a key, nor when prepared during a CUDA graph capture: what it
    allocated then belongs to the graph's pool, and its descriptors point at the capture's tensors."""
    if key is None or (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        return
    if len(calls) >= limit:
        calls.clear()
    calls[key] = call


def run_on(dev: int, launch, *args) -> None:
    """``launch.run(stream, *args)`` on device ``dev`` (-1: a CPU test's tensors) and its current stream,
    making ``dev`` current first where it is not (a prepared launch's kernel is loaded on its device)."""
    if dev >= 0 and dev != torch.cuda.current_device():
        with torch.cuda.device(dev):
            launch.run(_stream(dev), *args)
    else:
        launch.run(_stream(dev), *args)


class _CallCache:
    """Prepared calls by key. A tuned plan saved after a call was prepared must reach the next call, so the
    engine's tuned-plan files are watched (``engine.tuned_plans_stamp``): a save in this process is seen
    by the next call (a counter), a save by another process within WATCH_S (one ``stat`` per file per
    WATCH_S, never one per call); a change empties the cache."""

    WATCH_S = 1.0
    MAX_CALLS = 4096  # keys without end (e.g. every sequence length): start over

    def __init__(self):
        self.calls: dict[tuple, _Call] = {}
        self.next_watch = 0.0
        self.saves = -1
        self.stamp = None

    def get(self, key: tuple) -> _Call | None:
        eng = sys.modules.get("gemmlab.engine")
        if eng is not None and (eng.tuned.SAVES != self.saves or time.monotonic() >= self.next_watch):
            self._watch(eng)
        return self.calls.get(key)

    def _watch(self, eng) -> None:
        self.next_watch = time.monotonic() + self.WATCH_S
        stamp = eng.tuned_plans_stamp()
        if stamp != self.stamp or eng.tuned.SAVES != self.saves:
            self.calls.clear()
            self.stamp, self.saves = stamp, eng.tuned.SAVES

    def put(self, key: tuple, call: _Call) -> None:
        if len(self.calls) >= self.MAX_CALLS:
            self.calls.clear()
        self.calls[key] = call

    def clear(self) -> None:
        self.calls.clear()


_CALLS = _CallCache()


def _prepared(a, b, bias, activation, alpha, beta, c, out_dtype, out) -> _Call:
    """The prepared call for these arguments: from the cache, else validated (every error raised here,
    before any device work) and prepared. Not kept while a CUDA graph is being captured (the tile-order
    table it would build there is not the one an eager call wants)."""
    try:
        key = _call_key(a, b, bias, activation, beta, c, out_dtype, out)
        call = _CALLS.get(key)
    except (RuntimeError, TypeError, AttributeError):  # no strides (sparse), unhashable arguments...
        key = call = None
    if call is not None:
        return call
    p = _validate(a, b, bias, activation, alpha, beta, c, out_dtype, out)
    if out is not None:
        _check_out_overlap(out, a, b, bias, c)
    call = _Call(p, a, b, bias, activation, beta, c, out)
    if key is not None and not (p.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        _CALLS.put(key, call)
    return call


_PLAIN = (torch.Tensor, torch.nn.Parameter)
_NUMBERS = (float, int)
_GRAD = "autograd"  # _eager's answer for an eager call that needs a gradient


def _eager(a, b, bias, alpha, beta, c, out) -> bool | str:
    """Whether a ``gemmlab.matmul`` call can skip the op: plain CUDA tensors (no subclass, no fake or meta
    tensor), plain numbers, and nothing that must see the op (tracing, a torch function or dispatch mode,
    the profiler). True: the prepared call; ``_GRAD`` when it also needs a gradient (the prepared call in
    ``gemmlab.autograd``'s Function); False: the op. ``torch.compiler.is_compiling`` comes first, so a
    trace sees only that."""
    mode = eager_mode(a, b, bias, c, out=out)
    if mode and (type(alpha) not in _NUMBERS or type(beta) not in _NUMBERS):
        return False
    return mode


def eager_mode(a, *inputs, out=None) -> bool | str:
    """Whether a call on tensor ``a`` and ``inputs`` (None where absent) and ``out`` may skip its custom
    op (``gemmlab.matmul``'s and ``gemmlab.scaled_mm``'s eager paths): True where every tensor is a plain
    tensor (no subclass, fake or meta tensor), ``a`` lives where the eager path runs and nothing must see
    the op (tracing, a torch function or dispatch mode, the profiler); ``_GRAD`` where it also needs a
    gradient (``a`` or an input requires one); else False. ``torch.compiler.is_compiling`` comes first,
    so a trace sees only that."""
    if torch.compiler.is_compiling():
        return False
    if type(a) not in _PLAIN or not _fast_device(a):
        return False
    for t in inputs:
        if t is not None and type(t) not in _PLAIN:
            return False
    if out is not None and type(out) not in _PLAIN:
        return False
    if _modes_active():
        return False
    if torch.is_grad_enabled():
        if a.requires_grad:
            return _GRAD
        for t in inputs:
            if t is not None and t.requires_grad:
                return _GRAD
    return True


def _modes_active() -> bool:
    """Whether something must see the op: a torch function or dispatch mode, or the profiler."""
    return bool(torch._C._is_torch_function_mode_enabled() or torch._C._len_torch_dispatch_stack()
                or torch.autograd._profiler_enabled())


def _fast_device(a: torch.Tensor) -> bool:
    """Whether ``a`` lives where the eager path runs: a CUDA device (tests on CPU replace this)."""
    return a.is_cuda


def clear_prepared_calls() -> None:
    """Forget every prepared call (the next call of each key validates and prepares again)."""
    _CALLS.clear()


# The custom op ----------------------------------------------------------------------------------------

@torch.library.custom_op("gemmlab::matmul", mutates_args=())
def _matmul_op(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor], activation: Optional[str],
               alpha: float, beta: float, c: Optional[torch.Tensor],
               out_dtype: Optional[torch.dtype]) -> torch.Tensor:
    return _prepared(a, b, bias, activation, alpha, beta, c, out_dtype, None)(a, b, bias, alpha, beta, c, None)


@_matmul_op.register_fake
def _matmul_fake(a, b, bias, activation, alpha, beta, c, out_dtype):
    p = _validate(a, b, bias, activation, alpha, beta, c, out_dtype)
    return a.new_empty((p.M, p.N), dtype=p.out_dtype)


def _is_fake(t: torch.Tensor) -> bool:
    try:
        from torch._subclasses.fake_tensor import is_fake
    except ImportError:  # pragma: no cover - older torch
        return False
    return is_fake(t)


def _needs_temporary(out: torch.Tensor, p: Problem, c) -> bool:
    """Whether the kernels cannot write ``out`` directly: not dense row-major, not 16-byte aligned
    (TMA stores), or exactly ``c`` (read and written by one launch)."""
    return (out.stride() != (p.N, 1) or out.data_ptr() % 16 != 0
            or (c is not None and _same_view(out, c)))


def gemm(a: torch.Tensor, b: torch.Tensor, *, bias: torch.Tensor | None = None, activation: str | None = None,
         alpha: float = 1.0, beta: float = 0.0, c: torch.Tensor | None = None,
         out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``act(alpha * a @ b + beta * c + bias)`` for gemmlab's own callers (the backward's GEMMs,
    ``gemmlab.autograd``): the prepared call where an eager call may skip the op, else the op (which
    traces under torch.compile and carries the autograd formula once ``gemmlab.autograd`` is loaded)."""
    if _eager(a, b, bias, alpha, beta, c, None) is True:
        return _prepared(a, b, bias, activation, alpha, beta, c, out_dtype, None)(a, b, bias, alpha, beta, c, None)
    return torch.ops.gemmlab.matmul(a, b, bias, activation, float(alpha), float(beta), c, out_dtype)

