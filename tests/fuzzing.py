"""Randomized differential testing of ``gemmlab.matmul`` / ``gemmlab.linear`` (issue 15).

A seeded generator (``families``) draws calls aimed at every route of the library: the decode kernel
(M <= decode.MAX_M, its split-K, rows at any address), h11 (its split-K for few-tile shapes, the aligned copies for
unaligned rows or pointers, direct stores for unaligned output rows), the fp32 CUDA-core path, tiny,
large and empty shapes. Each call has its own layouts (row- or column-major views, padded leading
dimensions, storage offsets that break 16-byte alignment), dtypes (bf16, fp16, fp32 in; bf16, fp16,
fp32 out) and epilogue (bias in either dtype, activation, alpha, beta * c, ``out=``, ``out=c``). Calls
come in families that share (M, N, K) but change tensors, pointers, strides, dtypes, streams or the
epilogue, so that cached launch state can never be reused stale without a check failing.

Every tensor is a view into a larger buffer: inputs sit in NaN (a read out of bounds makes the result
NaN), outputs in a random sentinel pattern with the view itself NaN-poisoned (a missed element stays
NaN, a write out of bounds changes the pattern). After the call (``run_group``): inputs and padding are
bit-for-bit unchanged, the sentinels are too, and the result is within twice cuBLAS's error on the same
rounded inputs plus a floor (``value_problem``). NaN never passes.

``tests/test_fuzz_gpu.py`` runs it on the GPU; ``tests/test_fuzzing.py`` checks the generator and the
checker on the CPU. Seeds: ``GEMMLAB_FUZZ_SEED``; one case (with its family before it):
``GEMMLAB_FUZZ_CASE``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
ACTIVATIONS = (None, "relu", "gelu", "gelu_tanh", "silu")
ROUTES = ("decode", "decode-splitk", "decode-unaligned", "h11", "h11-splitk", "h11-copy", "h11-shallow", "fp32", "large", "tiny", "empty")
# Where the generator aims, and how often (the classification of what each call really hit is
# ``classify``'s; the records count both).
# Since engine.route weighs the engine kernel against h11, the "h11*" targets mostly reach the engine
# kernel (data-parallel and split-K); "h11-shallow" (large M x N, K <= 128: h11's overlapped epilogue
# wins) is where the router still runs h11. "decode-splitk" (few tokens, N <= 1024, deep K: shapes the decode
# kernel would split K for) reaches the engine kernel's swapped split-K plans: the router sends the decode
# kernel no call it would split. "decode-unaligned" (few tokens, any K, rows off 16 bytes) reaches the decode
# kernel's unaligned variants, which read such rows in place where the engine kernel would copy them.
ROUTE_WEIGHTS = {"decode": 20, "decode-splitk": 8, "decode-unaligned": 10, "h11": 18, "h11-splitk": 12, "h11-copy": 12, "h11-shallow": 8,
                 "fp32": 12, "large": 6, "tiny": 8, "empty": 4}
MUTATIONS = ("fresh", "layout", "offset", "dtype", "stream", "epilogue", "alias")
GUARD = 64  # elements of buffer past every view's last element
MAX_MNK = 2**36  # keeps one float64 reference under ~5 ms on an H200
UNIT = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}


def _settings():
    from gemmlab import decode, engine

    return (getattr(decode, "MAX_M", 32), getattr(engine, "DECODE_MAX_WEIGHT_DIM", 12288))


# The cases ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    """Where a logical (rows, cols) operand sits in its buffer. ``order`` "row": cols contiguous, "col":
    rows contiguous (a transposed view); the leading dimension is the contiguous extent plus ``pad``;
    ``offset`` elements precede it (NaN or sentinels)."""

    order: str = "row"
    pad: int = 0
    offset: int = 16

    def strides(self, rows: int, cols: int) -> tuple[int, int]:
        if self.order == "row":
            return (cols + self.pad, 1)
        return (1, rows + self.pad)

    def span(self, rows: int, cols: int) -> int:
        if rows == 0 or cols == 0:
            return 0
        s0, s1 = self.strides(rows, cols)
        return 1 + (rows - 1) * s0 + (cols - 1) * s1


@dataclass(frozen=True)
class Case:
    """One call. ``b`` is the logical (K, N) operand: order "col" is an nn.Linear weight (N, K) row-major
    seen through ``.t()``. ``api`` "linear" calls ``gemmlab.linear(x, b.t(), bias, activation)`` with x
    ``a`` reshaped to ``lead + (K,)``. ``alias``: reuse the previous call's buffers (same data pointers)."""

    index: int
    family: int
    target: str
    M: int
    N: int
    K: int
    dtype: str = "bf16"
    out_dtype: str = "bf16"
    a: Layout = Layout()
    b: Layout = Layout("col")
    bias: str | None = None  # None, "in" (the inputs' dtype) or "fp32"
    bias_layout: Layout = Layout()
    activation: str | None = None
    alpha: float = 1.0
    beta: float = 0.0
    c: Layout | None = None
    out: Layout | None = None  # None: the op allocates the result
    out_is_c: bool = False
    pass_out_dtype: bool = False
    api: str = "matmul"
    lead: tuple[int, ...] = ()
    stream: int = 0
    alias: bool = False
    mutation: str = ""

    def describe(self) -> str:
        parts = [f"#{self.index} fam {self.family} {self.target}{'/' + self.mutation if self.mutation else ''}",
                 f"{self.api} M={self.M} N={self.N} K={self.K} {self.dtype}->{self.out_dtype}",
                 f"a={_lay(self.a)} b={_lay(self.b)}"]
        if self.bias:
            parts.append(f"bias={self.bias}@{_lay(self.bias_layout)}")
        if self.activation:
            parts.append(f"act={self.activation}")
        if self.alpha != 1.0:
            parts.append(f"alpha={self.alpha}")
        if self.c is not None:
            parts.append(f"beta={self.beta} c={_lay(self.c)}" + (" out=c" if self.out_is_c else ""))
        if self.out is not None and not self.out_is_c:
            parts.append(f"out={_lay(self.out)}")
        if self.api == "linear":
            parts.append(f"lead={self.lead}")
        if self.stream:
            parts.append("side-stream")
        if self.alias:
            parts.append("alias")
        return " ".join(parts)


def _lay(layout: Layout) -> str:
    return f"{layout.order}+{layout.pad}@{layout.offset}"


class Generator:
    """Families of cases from one seed. ``quick``: the palette of the fixed-seed run (fewer activation
    and dtype combinations, so it compiles a bounded number of kernel variants); otherwise everything."""

    def __init__(self, seed: int, *, quick: bool = False):
        self.seed = seed
        self.rng = random.Random(seed)
        self.quick = quick
        self.index = 0
        self.family = 0
        self.max_m, self.max_weight = _settings()

    # sizes
    def dim(self, lo: int, hi: int) -> int:
        """Log-uniform in [lo, hi], snapped half the time to a multiple of 8, 64 or 128, +-1."""
        r = self.rng
        if hi <= lo:
            return lo
        v = int(round(math.exp(r.uniform(math.log(max(lo, 1)), math.log(hi + 1))))) if hi > 1 else lo
        if r.random() < 0.5:
            m = r.choice((8, 64, 128))
            v = max(m, round(v / m) * m) + r.choice((0, 0, 1, -1))
        return min(max(v, lo), hi)

    def mult8(self, lo: int, hi: int) -> int:
        return max(8, self.dim(lo, hi) // 8 * 8)

    # layouts
    def layout(self, rows: int, cols: int, *, order: str | None = None, aligned: bool = True,
               mostly_plain: bool = True) -> Layout:
        """A layout for a (rows, cols) operand. ``aligned``: a leading dimension of whole 16-byte rows
        (for every dtype: a multiple of 8 elements) and a 32-byte aligned start; otherwise the leading
        dimension, the start or both are off by a few elements."""
        r = self.rng
        order = order or r.choice(("row", "row", "col"))
        extent = cols if order == "row" else rows
        if aligned:
            pad = -extent % 8 + (0 if (mostly_plain and r.random() < 0.6) else 8 * r.randint(1, 4))
            offset = 16 * r.randint(1, 4)
        else:
            pad = r.choice((0, 0, 8)) + r.randint(1, 7) if r.random() < 0.7 else 0
            offset = 16 * r.randint(1, 3) + (r.randint(1, 7) if r.random() < 0.6 or pad == 0 else 0)
        return Layout(order, pad, offset)

    def dtypes(self, *, half: bool | None = None) -> tuple[str, str]:
        r = self.rng
        if half is None:
            half = r.random() < 0.85
        if not half:
            return "fp32", r.choice(("fp32", "fp32", "fp32", "bf16", "fp16"))
        dt = r.choice(("bf16", "bf16", "fp16"))
        if self.quick:
            return dt, r.choice((dt, dt, "fp32"))
        return dt, r.choice((dt, dt, dt, "fp32", "fp32", "bf16" if dt == "fp16" else "fp16"))

    def epilogue(self, case: Case) -> Case:
        r = self.rng
        acts = (None, "silu", "gelu_tanh") if self.quick else ACTIVATIONS
        bias = r.choice((None, None, "in", "fp32"))
        bias_layout = Layout("row", 0, r.choice((16, 16, 16 + r.randint(1, 7))))
        if bias and r.random() < 0.15:
            bias_layout = Layout("col", r.randint(1, 3), 16)  # a strided bias (made contiguous by the op)
        activation = r.choice(acts + (None,))
        alpha = 1.0 if r.random() < 0.6 else r.choice((0.5, -1.25, 2.0, 0.0, -0.75))
        c, beta = None, 0.0
        if r.random() < 0.3:
            c, beta = self.layout(case.M, case.N, aligned=r.random() < 0.7), r.choice((1.0, -0.5, 0.75, 2.0))
        return dataclasses.replace(case, bias=bias, bias_layout=bias_layout, activation=activation, alpha=alpha,
                                   beta=beta, c=c)

    def output(self, case: Case) -> Case:
        r = self.rng
        if r.random() < 0.5:
            return dataclasses.replace(case, out=None, out_is_c=False, pass_out_dtype=r.random() < 0.3)
        out_is_c = case.c is not None and r.random() < 0.35
        out = case.c if out_is_c else self.layout(case.M, case.N, order=r.choice(("row", "row", "row", "col")),
                                                  aligned=r.random() < 0.75)
        return dataclasses.replace(case, out=out, out_is_c=out_is_c, pass_out_dtype=r.random() < 0.3)

    def as_linear(self, case: Case) -> Case:
        """The case as a linear call: linear has no c, alpha, out or out dtype (dropped here)."""
        case = dataclasses.replace(case, c=None, beta=0.0, alpha=1.0, out=None, out_is_c=False,
                                   pass_out_dtype=False, out_dtype=case.dtype)
        M = case.M
        lead = (M,)
        if M == 1 and self.rng.random() < 0.4:
            lead = ()
        elif M % 2 == 0 and M > 2 and self.rng.random() < 0.5:
            lead = (2, M // 2)
        elif self.rng.random() < 0.3:
            lead = (1, M)
        return dataclasses.replace(case, api="linear", lead=lead)

    # one case aimed at a route
    def case(self, target: str) -> Case:
        r, mm = self.rng, self.max_m
        half = target != "fp32"
        aligned = target not in ("h11-copy", "decode-unaligned")
        a_order = b_order = None
        if target in ("decode", "decode-splitk"):
            M = self.dim(1, mm)
            N = self.dim(1, 1024) if target == "decode-splitk" else self.dim(1, self.max_weight)
            K = self.mult8(4096, self.max_weight) if target == "decode-splitk" else self.mult8(8, self.max_weight)
            a_order, b_order = "row", "col"
        elif target == "decode-unaligned":
            M, N, K = self.dim(1, mm), self.dim(1, self.max_weight), self.dim(1, self.max_weight)
            a_order, b_order = "row", "col"
        elif target == "h11":
            M, N, K = self.dim(mm + 1, 4096), self.dim(1, 4096), self.dim(1, 4096)
            N = N if r.random() < 0.5 else max(8, N // 8 * 8)  # half with whole 16-byte output rows
            if r.random() < 0.25:
                M, b_order = self.dim(1, mm), "row"  # decode M, but a layout the decode kernel does not take
        elif target == "h11-splitk":
            M, N, K = self.dim(1, 256), self.dim(1, 1024), self.dim(1024, 8192)
            if M <= mm:
                b_order = "row"
        elif target == "h11-copy":
            M, N, K = self.dim(1, 2048), self.dim(1, 2048), self.dim(1, 2048)
        elif target == "h11-shallow":
            M, N, K = self.dim(2048, 8192), self.dim(2048, 8192), self.dim(16, 128)
        elif target == "fp32":
            M, N, K = self.dim(1, 1536), self.dim(1, 1536), self.dim(1, 1536)
        elif target == "large":
            big = self.dim(4096, 16384 if not self.quick else 8192)
            M, N, K = (big, self.dim(1, 2048), self.dim(1, 2048))
            M, N, K = r.choice(((M, N, K), (N, M, K), (N, K, M)))
            half = r.random() < 0.85
        elif target == "tiny":
            M, N, K = self.dim(1, 8), self.dim(1, 8), self.dim(1, 16)
            half = r.random() < 0.8
        else:  # empty
            M, N, K = self.dim(1, 64), self.dim(1, 64), self.dim(1, 64)
            which = r.randrange(3)
            M, N, K = (0 if which == 0 else M, 0 if which == 1 else N, 0 if which == 2 else K)
            half = r.random() < 0.8
        while M * N * K > MAX_MNK:
            K = max(1, K // 2)
        dtype, out_dtype = self.dtypes(half=half)
        plain = target in ("decode", "decode-splitk", "decode-unaligned")
        case = Case(index=-1, family=self.family, target=target, M=M, N=N, K=K, dtype=dtype, out_dtype=out_dtype,
                    a=self.layout(M, K, order=a_order, aligned=aligned, mostly_plain=plain),
                    b=self.layout(K, N, order=b_order, aligned=aligned, mostly_plain=plain),
                    stream=int(r.random() < 0.15))
        case = self.output(self.epilogue(case))
        if r.random() < 0.25:
            case = self.as_linear(case)
        return case

    def mutate(self, case: Case, how: str) -> Case:
        r = self.rng
        if how == "layout":
            aligned = case.target not in ("h11-copy", "decode-unaligned")
            case = dataclasses.replace(case, a=self.layout(case.M, case.K, aligned=aligned),
                                       b=self.layout(case.K, case.N, aligned=aligned))
            return self.output(case) if case.api == "matmul" else case
        if how == "offset":
            return dataclasses.replace(case, a=dataclasses.replace(case.a, offset=case.a.offset + r.randint(1, 7)),
                                       b=dataclasses.replace(case.b, offset=16 * r.randint(1, 4)))
        if how == "dtype":
            dtype, out_dtype = self.dtypes()
            if case.api == "linear":
                out_dtype = dtype
            return dataclasses.replace(case, dtype=dtype, out_dtype=out_dtype)
        if how == "stream":
            return dataclasses.replace(case, stream=1 - case.stream)
        if how == "epilogue":
            if case.api == "linear":
                return dataclasses.replace(case, activation=r.choice(ACTIVATIONS if not self.quick else
                                                                       (None, "silu")),
                                           bias=r.choice((None, "in", "fp32")))
            return self.output(self.epilogue(case))
        if how == "alias":  # same buffers, so the same data pointers, but new strides or a new dtype
            dt = {"bf16": "fp16", "fp16": "bf16"}.get(case.dtype, case.dtype) if r.random() < 0.5 else case.dtype
            case = dataclasses.replace(case, dtype=dt, out_dtype=case.out_dtype if case.api == "matmul" else dt)
            if case.a.pad >= 8 and r.random() < 0.7:  # new strides over the same pointer (a smaller pad fits)
                case = dataclasses.replace(case, a=dataclasses.replace(case.a, pad=case.a.pad - 8))
            return dataclasses.replace(case, alias=True)
        return case  # "fresh": the same call on new tensors (new pointers)

    def families(self) -> Iterator[list[Case]]:
        routes, weights = zip(*ROUTE_WEIGHTS.items())
        while True:
            self.family += 1
            base = self.case(self.rng.choices(routes, weights)[0])
            fam = [base]
            for _ in range(self.rng.choice((0, 1, 1, 2, 3))):
                fam.append(self._mutation(fam[-1]))
            out = []
            for c in fam:
                out.append(dataclasses.replace(c, index=self.index))
                self.index += 1
            yield out

    def _mutation(self, prev: Case) -> Case:
        how = self.rng.choice(MUTATIONS)
        return dataclasses.replace(self.mutate(dataclasses.replace(prev, alias=False, mutation=""), how),
                                   mutation=how)


def take(seed: int, n: int, *, quick: bool = True) -> list[list[Case]]:
    """The first families of ``seed`` holding ``n`` cases in all."""
    fams, count = [], 0
    for fam in Generator(seed, quick=quick).families():
        if count >= n:
            return fams
        fams.append(fam)
        count += len(fam)
    return fams  # pragma: no cover - the generator never ends


# The tensors -------------------------------------------------------------------------------------------

@dataclass
class Tensors:
    """The operands of one case as views into their buffers (``buffers[name]`` holds ``views[name]``)."""

    a: torch.Tensor
    b: torch.Tensor
    bias: torch.Tensor | None
    c: torch.Tensor | None
    out: torch.Tensor | None
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    views: dict[str, torch.Tensor] = field(default_factory=dict)


def _view(buf: torch.Tensor, rows: int, cols: int, layout: Layout) -> torch.Tensor:
    return buf.as_strided((rows, cols), layout.strides(rows, cols), layout.offset)


def _buffer(name: str, numel: int, dtype: torch.dtype, device, fill: float, pool: dict | None) -> torch.Tensor:
    """A flat buffer of at least ``numel`` elements: the previous case's (``pool``, reinterpreted when
    the element size allows) or a new one; filled with ``fill``."""
    old = pool.get(name) if pool is not None else None
    if old is not None and old.element_size() == torch.empty((), dtype=dtype).element_size() and \
            old.numel() >= numel and old.device.type == torch.device(device).type:
        buf = old.view(dtype)
    else:
        buf = torch.empty(numel, dtype=dtype, device=device)
    return buf.fill_(fill)


def materialize(case: Case, device, gen: torch.Generator, pool: dict | None = None) -> Tensors:
    """Build the case's tensors. Inputs are random (randn) inside NaN; ``out`` is NaN inside a random
    sentinel pattern (or, with ``out_is_c``, c's values). ``pool``: buffers of the previous case, reused
    when ``case.alias``; the new buffers are written back to it."""
    dt, odt = DTYPES[case.dtype], DTYPES[case.out_dtype]
    M, N, K = case.M, case.N, case.K
    reuse = pool if case.alias else None
    nan = float("nan")

    def operand(name, rows, cols, layout, dtype, fill=nan):
        buf = _buffer(name, layout.offset + layout.span(rows, cols) + GUARD, dtype, device, fill, reuse)
        view = _view(buf, rows, cols, layout)
        view.copy_(torch.randn(rows, cols, generator=gen, device=device, dtype=torch.float32).to(dtype))
        return buf, view

    t = Tensors(a=None, b=None, bias=None, c=None, out=None)
    for name, rows, cols, layout, dtype in (("a", M, K, case.a, dt), ("b", K, N, case.b, dt)):
        t.buffers[name], view = operand(name, rows, cols, layout, dtype)
        t.views[name] = view
    t.a, t.b = t.views["a"], t.views["b"]
    if case.bias:
        bdt = dt if case.bias == "in" else torch.float32
        buf, view = operand("bias", 1, N, case.bias_layout, bdt)
        t.buffers["bias"], t.views["bias"], t.bias = buf, view, view[0]
    if case.c is not None:
        t.buffers["c"], t.views["c"] = operand("c", M, N, case.c, odt)
        t.c = t.views["c"]
    if case.out_is_c:
        t.out = t.c
    elif case.out is not None:
        buf = _buffer("out", case.out.offset + case.out.span(M, N) + GUARD, odt, device, 0.0, reuse)
        buf.copy_(torch.randn(buf.numel(), generator=gen, device=device, dtype=torch.float32).to(odt))  # sentinels
        t.buffers["out"], t.out = buf, _view(buf, M, N, case.out)
        t.views["out"] = t.out.fill_(nan)
    if pool is not None:
        pool.clear()
        pool.update(t.buffers)
    return t


def call_args(case: Case, t: Tensors):
    """(function name, args, kwargs) of the public call the case makes."""
    if case.api == "linear":
        x = t.a.unflatten(0, case.lead) if case.lead else t.a[0]
        return "linear", (x, t.b.t()), dict(bias=t.bias, activation=case.activation)
    kw = dict(bias=t.bias, activation=case.activation, alpha=case.alpha)
    if case.c is not None:
        kw.update(c=t.c, beta=case.beta)
    if case.out is not None:
        kw["out"] = t.out
    if case.pass_out_dtype or case.out_dtype != case.dtype and case.out is None:
        kw["out_dtype"] = DTYPES[case.out_dtype]
    return "matmul", (t.a, t.b), kw


# Which route a call takes ------------------------------------------------------------------------------

def classify(case: Case, t: Tensors, sm_count: int = 132, capacity=None) -> str:
    """The route the library takes for the case, from the engine's own router (``engine.route``,
    ``decode.plan``): "decode[-splitk][+unaligned]", "h11[-splitk][+copy][+direct]",
    "engine[-splitk|-streamk|-pingpong|-gsk][+copy][+direct]" (the engine kernel's schedule), "fp32",
    "empty", "epilogue-only"; "unknown" when the helpers moved (the call path is being refactored)."""
    M, N, K = case.M, case.N, case.K
    if M == 0 or N == 0:
        return "empty"
    if K == 0:
        return "epilogue-only"
    if case.dtype == "fp32":
        return "fp32"
    try:
        from gemmlab import decode, engine

        odt = DTYPES[case.out_dtype]
        dense = torch.empty_strided((M, N), (N, 1), dtype=odt, device="meta")
        bias = t.bias.to(torch.float32 if case.bias == "fp32" else DTYPES[case.dtype]) if t.bias is not None else None
        r = engine.route(t.a, t.b, dense, bias=bias, activation=case.activation,
                         has_c=case.c is not None and case.beta != 0, sm_count=sm_count, capacity=capacity)
        if r.kernel == "decode":
            route = "decode-splitk" if decode.plan(M, N, K, sm_count, decode.variant_for(t.a, t.b)).splits > 1 else "decode"
            return route if decode.aligned(t.a, t.b) else route + "+unaligned"
        if r.kernel == "engine":
            route = {"data_parallel": "engine", "split_k": "engine-splitk", "stream_k": "engine-streamk",
                     "pingpong": "engine-pingpong", "split_k_global": "engine-gsk"}[r.plan.schedule]
        else:
            route = "h11-splitk" if r.h11[1] > 1 else "h11"
        ok = engine._tma_ok
        copies = [not (ok(k) or ok(mn)) for k, mn in ((t.a, t.a.t()), (t.b.t(), t.b))]
        if any(copies):
            route += "+copy"
        if (N * odt.itemsize) % 16:
            route += "+direct"
        return route
    except Exception:  # noqa: BLE001 - classification must never fail a case
        return "unknown"


# The checks ---------------------------------------------------------------------------------------------

def _act(x: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation is None:
        return x
    if activation == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    return {"relu": F.relu, "gelu": F.gelu, "silu": F.silu}[activation](x)


def exact(a, b, bias=None, activation=None, alpha=1.0, beta=0.0, c=None) -> torch.Tensor:
    """``act(alpha * a @ b + beta * c + bias)`` in float64 on the given (already rounded) values."""
    acc = alpha * (a.double() @ b.double())
    if c is not None:
        acc = acc + beta * c.double()
    if bias is not None:
        acc = acc + bias.double()
    return _act(acc, activation)


def reference(case: Case, t: Tensors, c_before: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 result, float64 |terms|): the result on the same rounded inputs, and the sum of the
    magnitudes of what was added up (the scale of any rounding error)."""
    ref = exact(t.a, t.b, t.bias, case.activation, case.alpha, case.beta, c_before)
    mag = abs(case.alpha) * (t.a.double().abs() @ t.b.double().abs())
    if case.c is not None:
        mag = mag + abs(case.beta) * c_before.double().abs()
    if t.bias is not None:
        mag = mag + t.bias.double().abs()
    return ref, mag


@contextlib.contextmanager
def _no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def baseline(case: Case, t: Tensors, c_before: torch.Tensor | None) -> torch.Tensor:
    """What cuBLAS gives on the same inputs: ``torch.mm`` in the inputs' dtype for a 16-bit result, in
    fp32 (TF32 off) for an fp32 result or fp32 inputs; the epilogue in fp32 after it."""
    with _no_tf32():
        half_out = case.out_dtype != "fp32" and case.dtype != "fp32"
        prod = torch.mm(t.a, t.b).float() if half_out else torch.mm(t.a.float(), t.b.float())
    acc = case.alpha * prod
    if case.c is not None:
        acc = acc + case.beta * c_before.float()
    if t.bias is not None:
        acc = acc + t.bias.float()
    return _act(acc, case.activation).to(DTYPES[case.out_dtype])


# Smallest spacing of each output dtype (its subnormals): the absolute error a rounding can always make.
TINY = {torch.bfloat16: 2.0**-133, torch.float16: 2.0**-24, torch.float32: 2.0**-149}


def value_problem(case: Case, got: torch.Tensor, ref: torch.Tensor, mag: torch.Tensor,
                  base: torch.Tensor) -> tuple[str | None, float, float]:
    """(what is wrong or None, relative error, cuBLAS's relative error on the same inputs).

    Passes when every element is finite and, both over the whole result (2-norm) and element by element,
    |got - ref| <= 2 |cuBLAS - ref| + floor. The floor is what a correct fp32-accumulating kernel can
    always be off by: two roundings to the output dtype (plus a few fp32 ulps of activation math) and
    4 u32 sqrt(K) |terms| of accumulation, where |terms| = |alpha| |a| @ |b| + |beta c| + |bias| (typical
    accumulation error is about u32 |terms|: the floor is sqrt(K) times that, so it never flakes, yet a
    missing k-step or a wrong element is far above it)."""
    shape = ref.shape
    g = got.double().reshape(shape)
    bad = ~torch.isfinite(g)
    ref_norm = float(torch.linalg.vector_norm(ref))
    scale = max(ref_norm, 1e-300)
    if bool(bad.any()):
        where = [tuple(i) for i in bad.nonzero()[:4].tolist()]
        return f"{int(bad.sum())} non-finite elements, first at {where}", math.inf, math.nan
    odt = DTYPES[case.out_dtype]
    u_out, u32 = UNIT[odt], UNIT[torch.float32]
    rel = 2 * u_out + (8 * u32 if case.activation else 0.0)
    acc = 4 * u32 * math.sqrt(max(case.K, 1))
    diff = (g - ref).abs()
    diff_c = (base.double().reshape(shape) - ref).abs()
    diff_c = torch.where(torch.isfinite(diff_c), diff_c, torch.zeros_like(diff_c))
    err = float(torch.linalg.vector_norm(diff))
    err_c = float(torch.linalg.vector_norm(diff_c))
    bound = 2 * err_c + rel * ref_norm + acc * float(torch.linalg.vector_norm(mag)) + 1e-30
    if err > bound:
        return (f"error {err / scale:.3e} (relative, 2-norm) > bound {bound / scale:.3e} (cuBLAS "
                f"{err_c / scale:.3e})"), err / scale, err_c / scale
    over = diff - (2 * diff_c + rel * ref.abs() + acc * mag + TINY[odt])
    if bool((over > 0).any()):
        i = int(over.flatten().argmax())
        r, c = divmod(i, shape[1])
        return (f"{int((over > 0).sum())} elements past their bound, worst at ({r}, {c}): got "
                f"{float(g[r, c]):.6g}, want {float(ref[r, c]):.6g} (cuBLAS {float(base.double().reshape(shape)[r, c]):.6g})"
                ), err / scale, err_c / scale
    return None, err / scale, err_c / scale


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def outside(buf: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
    """A bool mask over ``buf`` of the elements that ``view`` does not address."""
    mask = torch.ones(buf.numel(), dtype=torch.bool, device=buf.device)
    if view.numel():
        idx = torch.arange(buf.numel(), device=buf.device).as_strided(view.shape, view.stride(),
                                                                     view.storage_offset())
        mask[idx.flatten()] = False
    return mask


# Running cases ----------------------------------------------------------------------------------------

@dataclass
class Outcome:
    case: Case
    route: str
    problem: str | None = None
    err: float = math.nan
    err_cublas: float = math.nan

    def record(self) -> dict:
        return {"case": self.case.describe(), "route": self.route, "problem": self.problem,
                "err": self.err, "err_cublas": self.err_cublas}


def gemmlab_call(name: str, args, kwargs):
    import gemmlab

    return getattr(gemmlab, name)(*args, **kwargs)


@dataclass
class Prepared:
    case: Case
    t: Tensors
    route: str
    snapshot: dict[str, torch.Tensor]
    c_before: torch.Tensor | None
    result: torch.Tensor | None = None
    error: BaseException | None = None


def prepare(case: Case, device, seed: int, pool: dict | None, sm_count: int, capacity=None) -> Prepared:
    gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + case.index)
    t = materialize(case, device, gen, pool)
    snap = {k: v.clone() for k, v in t.buffers.items()}
    c_before = t.c.clone() if t.c is not None else None
    return Prepared(case, t, classify(case, t, sm_count, capacity), snap, c_before)


def _stream_context(device, stream):
    if stream is None:
        return contextlib.nullcontext()
    return torch.cuda.stream(stream)


def launch_group(prepared: list[Prepared], device, streams: list | None,
                 impl: Callable = gemmlab_call) -> None:
    """Make each call: alone on the current stream, or (``case.stream``, or several calls at once) each on
    its own side stream, all in flight together."""
    cuda = torch.device(device).type == "cuda"
    side = cuda and streams and (len(prepared) > 1 or prepared[0].case.stream)
    if side:
        for s in streams[:len(prepared)]:
            s.wait_stream(torch.cuda.current_stream())
    for i, p in enumerate(prepared):
        name, args, kw = call_args(p.case, p.t)
        try:
            with _stream_context(device, streams[i] if side else None):
                p.result = impl(name, args, kw)
        except Exception as e:  # noqa: BLE001 - reported as the case's problem
            p.error = e
    if side:
        for s in streams[:len(prepared)]:
            torch.cuda.current_stream().wait_stream(s)
    if cuda:
        torch.cuda.synchronize(device)


def check(p: Prepared) -> Outcome:
    """Everything a call must get right, in order: no exception, the result's identity, shape, dtype and
    layout, inputs and their padding bit-for-bit unchanged, nothing written outside ``out``, values."""
    case, t = p.case, p.t
    out = Outcome(case, p.route)
    if p.error is not None:
        out.problem = f"raised {type(p.error).__name__}: {p.error}"
        return out
    y = p.result
    M, N = case.M, case.N
    shape = (*case.lead, N) if case.api == "linear" else (M, N)
    if case.api == "linear" and not case.lead:
        shape = (N,)
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != shape or y.dtype != DTYPES[case.out_dtype]:
        out.problem = f"result {type(y).__name__} {getattr(y, 'shape', None)} {getattr(y, 'dtype', None)}"
        return out
    if case.out is not None and y is not t.out:
        out.problem = "matmul(out=...) did not return out itself"
        return out
    if case.out is None and not y.is_contiguous():
        out.problem = f"the result is not contiguous (strides {y.stride()})"
        return out
    for name, before in p.snapshot.items():
        buf = t.buffers[name]
        if name == "out" or (name == "c" and case.out_is_c):
            keep = outside(buf, t.views[name])
            if not torch.equal(_bits(buf)[keep], _bits(before)[keep]):
                n = int((_bits(buf)[keep] != _bits(before)[keep]).sum())
                out.problem = f"{n} elements written outside the output view ({name} buffer)"
                return out
        elif not torch.equal(_bits(buf), _bits(before)):
            n = int((_bits(buf) != _bits(before)).sum())
            out.problem = f"input {name} (or its padding) changed: {n} elements"
            return out
    if M == 0 or N == 0:
        return out
    ref, mag = reference(case, t, p.c_before)
    base = baseline(case, t, p.c_before)
    out.problem, out.err, out.err_cublas = value_problem(case, y, ref, mag, base)
    return out


def run_group(cases: list[Case], device, seed: int, *, pool: dict | None = None, streams: list | None = None,
              sm_count: int = 132, capacity=None, impl: Callable = gemmlab_call) -> list[Outcome]:
    """Prepare, launch (together when several) and check cases; one Outcome each."""
    prepared = [prepare(c, device, seed, pool if len(cases) == 1 else None, sm_count, capacity) for c in cases]
    launch_group(prepared, device, streams, impl)
    return [check(p) for p in prepared]


def reproduce_hint(seed: int, case: Case, mode: str = "fixed") -> str:
    """The command that runs ``case`` again (after the cases of its family before it)."""
    test = {"soak": "-m slow -k soak", "pairs": "-k two_streams", "graphs": "-k cuda_graphs",
            "compile": "-k torch_compile"}.get(mode, "-k fixed_seed")
    extra = "GEMMLAB_FUZZ_SECONDS=1 " if mode == "soak" else ""
    return (f"reproduce: {extra}GEMMLAB_FUZZ_SEED={seed} GEMMLAB_FUZZ_CASE={case.index} "
            f"python -m pytest -q tests/test_fuzz_gpu.py {test}")


# The fixed-seed part and records ------------------------------------------------------------------------

FIXED_SEED = 15
FIXED_CASES = 250  # about 120 kernel variants to compile: well under a minute of NVRTC on the H200 machine


def regressions() -> list[Case]:
    """Calls that failed once, run first in every fixed-seed run."""
    lin = Case(index=-1, family=0, target="decode", M=7, N=14, K=256, api="linear", lead=(7,), bias="in")
    return [
        lin,  # decode.plan asserted (issue 15): K < 8 x MIN_WARP_K at N < 32
        dataclasses.replace(lin, index=-2, M=1, N=1, K=256, lead=(1,)),
        dataclasses.replace(lin, index=-3, M=32, N=17, K=1024, lead=(32,), bias=None, activation="silu"),
        Case(index=-4, family=0, target="tiny", M=1, N=1, K=1, b=Layout("row")),
        Case(index=-5, family=0, target="decode", M=3, N=1, K=8, out_dtype="fp32", out=Layout()),
    ]


def git_sha() -> str | None:
    """The records' sha: ``gemmlab.bench.git_sha`` (``GEMMLAB_GIT_SHA`` when the tree that ran has no
    usable .git, as on the device machine)."""
    from gemmlab.bench import git_sha as sha

    return sha()


def write_record(path, record: dict) -> None:
    """Append ``record`` as one JSON line to ``path`` (its folder created)."""
    import json
    from pathlib import Path

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")


@dataclass
class Tally:
    """What a fuzz run did: counts per route, target and mutation, the failures, the worst ratio of
    gemmlab's error to cuBLAS's."""

    seed: int
    mode: str
    cases: int = 0
    routes: dict = field(default_factory=dict)
    targets: dict = field(default_factory=dict)
    mutations: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)
    worst_ratio: float = 0.0
    lost_context: str | None = None

    def add(self, outcomes: list[Outcome]) -> None:
        for o in outcomes:
            self.cases += 1
            for key, counter in ((o.route, self.routes), (o.case.target, self.targets),
                                 (o.case.mutation or "base", self.mutations)):
                counter[key] = counter.get(key, 0) + 1
            if o.problem is not None:
                self.failures.append(o)
            elif o.err_cublas > 0 and math.isfinite(o.err):
                self.worst_ratio = max(self.worst_ratio, o.err / o.err_cublas)

    def report(self, limit: int = 12) -> str:
        lines = [f"{len(self.failures)} of {self.cases} fuzz cases failed (seed {self.seed}):"]
        for o in self.failures[:limit]:
            lines.append(f"  {o.case.describe()}\n    route {o.route}: {o.problem}\n    "
                         f"{reproduce_hint(self.seed, o.case, self.mode)}")
        if self.lost_context:
            lines.append(f"  stopped: {self.lost_context}")
        return "\n".join(lines)

    def record(self, **extra) -> dict:
        return {"suite": "fuzz", "mode": self.mode, "seed": self.seed, "cases": self.cases,
                "routes": dict(sorted(self.routes.items())), "targets": dict(sorted(self.targets.items())),
                "mutations": dict(sorted(self.mutations.items())), "failures": len(self.failures),
                "failed": [o.record() for o in self.failures[:20]], "worst_error_vs_cublas": self.worst_ratio,
                "stopped": self.lost_context, "git": git_sha(), **extra}


def run_families(families, device, tally: Tally, *, streams=None, sm_count: int = 132, capacity=None,
                 impl: Callable = gemmlab_call, keep_going: Callable[[], bool] = lambda: True) -> None:
    """Run each family's cases in order (one buffer pool per family, so ``alias`` cases reuse the previous
    call's pointers), until ``keep_going()`` is False or the CUDA context is lost."""
    for fam in families:
        pool: dict = {}
        for case in fam:
            try:
                tally.add(run_group([case], device, tally.seed, pool=pool, streams=streams, sm_count=sm_count,
                                    capacity=capacity, impl=impl))
            except Exception as e:  # noqa: BLE001 - a fault surfacing at synchronize: nothing after it is valid
                tally.add([Outcome(case, "?", f"raised {type(e).__name__} at synchronize: {e}")])
                tally.lost_context = f"after case #{case.index}: {type(e).__name__}: {e}"
                return
        if not keep_going():
            return


def run_pairs(pairs, device, tally: Tally, *, streams, sm_count: int = 132, capacity=None,
              impl: Callable = gemmlab_call) -> None:
    """Two calls at once, each on its own stream."""
    for pair in pairs:
        try:
            tally.add(run_group(list(pair), device, tally.seed, streams=streams, sm_count=sm_count,
                                capacity=capacity, impl=impl))
        except Exception as e:  # noqa: BLE001
            tally.lost_context = f"after pair #{pair[0].index}: {type(e).__name__}: {e}"
            return


def route_tags(routes) -> set[str]:
    """The parts of route names ("h11-splitk+copy" -> {"h11-splitk", "+copy"})."""
    return {tag for route in routes for tag in route.replace("+", " +").split()}


def selected(families: list[list[Case]], case_index: int | None) -> list[list[Case]]:
    """With ``case_index`` (GEMMLAB_FUZZ_CASE): only that case, after the cases of its family before it."""
    if case_index is None:
        return families
    for fam in families:
        if any(c.index == case_index for c in fam):
            return [[c for c in fam if c.index <= case_index]]
    raise ValueError(f"case {case_index} is not among the {sum(map(len, families))} cases of this run")
