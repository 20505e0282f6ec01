"""Warm-up: compile every kernel a set of ``gemmlab.matmul`` calls will need before they are made
(``gemmlab.warmup``), so CUDA-graph capture and serving never compile on the hot path.

    report = gemmlab.warmup([(16, 4096, 4096), (2048, 14336, 4096)])            # (M, N, K), bf16, TN
    report = gemmlab.warmup(model, tokens=[1, 16, 2048], backward=True)          # its Linear modules
    print(report.summary())

What a call needs is what the engine would decide for it (``kernels_for``): the decode kernel or h11 with
its plan (tile width, split-K), operand layouts, epilogue and pipeline depth, the aligned-copy kernels of
operands TMA cannot read; the fp32 route's k10 step for fp32 inputs. The decisions take only metadata,
so they run on meta tensors: without a GPU, warm-up plans for an H200 (132 SMs, its cluster capacity,
heuristic plans) and fills the disk cache ahead of time (``GEMMLAB_CACHE_DIR``, e.g. in a Docker build);
on a Hopper GPU it plans for that GPU (its tuned plans included), then prepares each call for real
(module loads, launch blocks, descriptors: the prepared-call cache of ``gemmlab.ops``), which also checks
that nothing was left to compile (``WarmupReport.unplanned``).

Compiles run in threads: NVRTC releases the GIL (a Python thread kept running with pauses of at most
12-20 ms during a 1 s compile on the development machine), so kernels compile side by side, one per core.

``python -m gemmlab.warm 16x4096x4096 2048x14336x4096 --backward`` does the same from a shell.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from . import decode, engine, fp32, functional, ops, planner
from .epilogue import CTYPES, epi_bits
from .jit import compiler

LAYOUTS = {  # name: (a row-major (M, K)?, b row-major (K, N)?); b column-major is w.t() of an (N, K) weight
    "TN": (True, False),  # x @ w.t(): nn.Linear
    "NN": (True, True),
    "NT": (False, True),
    "TT": (False, False),
}


@dataclass(frozen=True)
class GemmCall:
    """One ``gemmlab.matmul`` call, without data: ``a`` (M, K), ``b`` (K, N) in ``layout`` (see LAYOUTS; TN is
    ``x @ w.t()``), inputs of ``dtype``, an optional ``bias`` of that dtype, ``activation``, whether
    ``beta * c`` is added (``c``), and ``out_dtype`` (None: the inputs' dtype). Every tensor dense and
    16-byte aligned, as fresh torch tensors are."""

    M: int
    N: int
    K: int
    dtype: torch.dtype = torch.bfloat16
    layout: str = "TN"
    bias: torch.dtype | None = None
    activation: str | None = None
    c: bool = False
    out_dtype: torch.dtype | None = None

    @classmethod
    def of(cls, desc) -> GemmCall:
        """A GemmCall from itself, an ``(M, N, K)`` tuple or a dict of GemmCall's fields."""
        if isinstance(desc, GemmCall):
            return desc
        if isinstance(desc, dict):
            return cls(**desc)
        M, N, K = desc
        return cls(int(M), int(N), int(K))

    def meta_args(self, requires_grad: bool = False) -> tuple:
        """The arguments of the ``gemmlab::matmul`` op for this call, as meta tensors."""
        a_row, b_row = LAYOUTS[self.layout]

        def t(*shape, dtype=self.dtype):
            return torch.empty(shape, dtype=dtype, device="meta", requires_grad=requires_grad)

        a = t(self.M, self.K) if a_row else t(self.K, self.M).t()
        b = t(self.K, self.N) if b_row else t(self.N, self.K).t()
        bias = None if self.bias is None else t(self.N, dtype=self.bias)
        c = t(self.M, self.N, dtype=self.out_dtype or self.dtype) if self.c else None
        return a, b, bias, self.activation, 1.0, 1.0 if self.c else 0.0, c, self.out_dtype


@dataclass(frozen=True)
class Kernel:
    """A kernel instantiation: ``compiler.compile_kernel(source, name_expression, arch=arch)``."""

    source: str
    name_expression: str
    name: str
    arch: str = "sm_90a"

    def compile(self) -> compiler.CompiledKernel:
        return compiler.compile_kernel(self.source, self.name_expression, arch=self.arch, name=self.name)


@dataclass(frozen=True)
class Target:
    """The GPU the plans are for: its SM count, the clusters it holds at once (a dict, or a function asked
    only when a split-K plan is weighed), the key of its tuned plans (None: heuristic plans only) and its
    memory's peak (whether the engine kernel may plan stream-K)."""

    name: str
    sm_count: int
    capacity: dict | Callable[[], dict]
    gpu: object = None
    device: torch.device | None = None  # the visible GPU planned for (None: planning ahead of time)
    memory_peak: float | None = None  # its memory's peak in bytes/s (None: unknown, as the H200's)

    @classmethod
    def h200(cls) -> Target:
        return cls("H200 (planned without a GPU: 132 SMs, heuristic plans)", 132, engine.H200_CLUSTER_CAPACITY)

    @classmethod
    def visible(cls, device: torch.device | None = None) -> Target:
        """The current GPU when the Hopper engine runs on it, else ``h200()``."""
        if not torch.cuda.is_available():
            return cls.h200()
        device = device or torch.device("cuda", torch.cuda.current_device())
        if engine.hopper_available(device) is not None:
            return cls.h200()
        idx = engine._index(device)
        return cls(torch.cuda.get_device_name(idx), engine._sm_count(device),
                   lambda: engine.cluster_capacity(device), engine.tuned.device_gpu(idx), device,
                   engine._memory_peak(device))


def kernels_for(args: tuple, target: Target) -> list[Kernel]:
    """The kernels one ``gemmlab::matmul`` call (its op arguments; meta tensors will do) needs on
    ``target``: the same decisions as ``ops._Call`` and ``engine.prepare`` (kept equal by
    tests/test_warm.py, which runs the real ``engine.prepare`` with a recording compiler)."""
    a, b, bias, activation, alpha, beta, c, out_dtype = args
    p = ops._validate(a, b, bias, activation, alpha, beta, c, out_dtype)
    if not (p.M and p.N and p.K):
        return []  # nothing launches
    if p.in_dtype == torch.float32:
        spec, cfg = fp32.K10, fp32.config_for(p.M, p.N, p.K, target.sm_count)
        return [Kernel(spec.source, spec.name_expression(cfg), f"{spec.name}{spec.config_tag(cfg)}", spec.arch)]
    out = torch.empty((p.M, p.N), dtype=p.out_dtype, device="meta")  # ops allocates a fresh output
    has_c = c is not None and beta != 0
    epi = epi_bits(bias is not None, has_c, activation)
    tbias = CTYPES[bias.dtype] if bias is not None else "float"
    r = engine.route(a, b, out, bias=bias, activation=activation, has_c=has_c, sm_count=target.sm_count,
                     capacity=target.capacity, gpu=lambda: target.gpu, memory_peak=target.memory_peak)
    if r.kernel == "decode":
        dp = decode.plan(p.M, p.N, p.K, target.sm_count, decode.variant_for(a, b))
        expr = decode.kernel_expr(CTYPES[a.dtype], CTYPES[out.dtype], tbias, dp.nt, epi,
                                  dp.splits > 1, dp.variant)
        return [Kernel(decode.SOURCE, expr, f"engine.decode[{expr[14:-1]}]")]
    a_mn, copy_a = _operand(a, 1)
    b_mn, copy_b = _operand(b, 0)
    if r.kernel == "engine":
        first, second = (copy_b, copy_a) if r.plan.swap_ab else (copy_a, copy_b)  # the kernel's A, B
        return _copies(first, second) + [Kernel(planner.SOURCE, r.plan.name_expression, r.plan.compiled_name)]
    copies = _copies(copy_a, copy_b)
    bn, splits = r.h11
    direct = not engine._tma_ok(out)
    q = engine._qsize(bn, a.element_size(), split=splits > 1)
    overlap = out.element_size() == 2 and not direct and splits == 1
    expr = (f"hopper_h11<{CTYPES[a.dtype]}, {CTYPES[out.dtype]}, {tbias}, {bn}, {q}, {int(a_mn)}, "
            f"{int(b_mn)}, {epi | int(direct) << 5}, {int(splits > 1)}, {int(overlap)}>")
    h11 = Kernel(engine.SOURCE, expr, f"hopper.h11_general[{expr[11:-1]}]")
    return copies + [h11]


def _operand(x: torch.Tensor, k_dim: int) -> tuple[bool, tuple[int, int] | None]:
    """``engine._operand_plan``'s choice for one operand: (read MN-major?, None where TMA reads it as it
    is or torch's copy makes it, else (element bytes, 16-byte source loads) of its ``pad_copy_operands`` job)."""
    k_major = x.t() if k_dim == 0 else x
    mn_major = x if k_dim == 0 else x.t()
    if k_major.stride(1) == 1 and engine._tma_ok(k_major):
        return False, None
    if mn_major.stride(1) == 1 and engine._tma_ok(mn_major):
        return True, None
    view, mn = (mn_major, True) if mn_major.stride(1) == 1 and k_major.stride(1) != 1 else (k_major, False)
    es = view.element_size()
    if view.stride(1) != 1 or es not in (2, 4):
        return mn, None  # torch's copy
    return mn, (es, engine.rows_16b(view))


def _copies(first: tuple[int, int] | None, second: tuple[int, int] | None) -> list[Kernel]:
    """``engine._OperandCopies``' launch for the kernel's A and B jobs (``_operand``; one dtype): one
    ``pad_copy_operands`` for both, a lone job's second vector flag repeating its own."""
    jobs = [j for j in (first, second) if j is not None]
    if not jobs:
        return []
    expr = f"pad_copy_operands<{jobs[0][0]}, {jobs[0][1]}, {jobs[-1][1]}>"
    return [Kernel(engine.PAD_COPY_SOURCE, expr, f"engine.{expr}")]


def gemms_of(call: GemmCall, backward: bool = False) -> list[tuple]:
    """The ``gemmlab::matmul`` op calls ``call`` makes (op arguments as meta tensors): its forward, and with
    ``backward`` the GEMMs of ``gemmlab.autograd``'s formula for it (every input requiring a gradient),
    found by running that formula on meta tensors, so warm-up and autograd cannot disagree."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[tuple] = []
    op = torch.ops.gemmlab.matmul.default

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is op:
                seen.append(tuple(args))
            return func(*args, **(kwargs or {}))

    args = call.meta_args(requires_grad=backward)
    a, b, bias, activation, alpha, beta, c, out_dtype = args
    with Record():
        y = functional.matmul(a, b, bias=bias, activation=activation, alpha=alpha, beta=beta, c=c, out_dtype=out_dtype)
        if backward:
            leaves = [t for t in (a, b, bias, c) if t is not None]
            torch.autograd.grad(y, leaves, torch.empty_like(y))
    return seen


def calls_of_model(model: torch.nn.Module, tokens: int | Iterable[int],
                   dtype: torch.dtype | None = None) -> list[GemmCall]:
    """The GEMMs of ``model``'s Linear modules (``gemmlab.nn.Linear``, and ``torch.nn.Linear`` that
    ``gemmlab.patch`` would turn into one) for inputs of ``tokens`` rows (batch x sequence; each value one
    set of shapes). ``dtype``: what they compute in (default: each weight's dtype; give the autocast dtype
    for a model run under autocast). Assumes dense inputs (..., K), as Linear layers usually receive."""
    from .nn import Linear

    tokens = [tokens] if isinstance(tokens, int) else list(tokens)
    calls: dict[GemmCall, None] = {}
    for m in model.modules():
        if type(m) is not torch.nn.Linear and type(m) is not Linear:
            continue
        dt = dtype or m.weight.dtype
        if dt not in ops.INPUT_DTYPES:
            continue
        bias = None if m.bias is None else (dt if dtype else m.bias.dtype)
        for M in tokens:
            calls[GemmCall(M, m.out_features, m.in_features, dt, "TN", bias, getattr(m, "activation", None))] = None
    return list(calls)


@dataclass
class Compiled:
    kernel: Kernel
    seconds: float
    status: str  # "miss" (NVRTC ran), "hit" (disk cache), "memory" (this process had it), "rebuilt"


@dataclass
class WarmupReport:
    """What ``warmup`` did: the calls, the op calls (forward and backward) they make, each kernel with its
    compile time and where it came from, the wall time, and on a GPU the calls prepared and any kernel
    that preparing compiled although the plan had not listed it (``unplanned``: should be empty)."""

    target: str
    calls: list[GemmCall]
    gemms: int
    kernels: list[Compiled]
    threads: int
    plan_seconds: float
    compile_seconds: float
    prepared: int = 0
    prepare_seconds: float = 0.0
    unplanned: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return self.plan_seconds + self.compile_seconds + self.prepare_seconds

    def summary(self) -> str:
        by = {}
        for k in self.kernels:
            by[k.status] = by.get(k.status, 0) + 1
        lines = [f"gemmlab.warmup for {self.target}: {len(self.calls)} calls, {self.gemms} GEMMs, "
                 f"{len(self.kernels)} kernels ({', '.join(f'{n} {s}' for s, n in sorted(by.items()))}) "
                 f"in {self.seconds:.2f} s (plan {self.plan_seconds:.2f}, compile {self.compile_seconds:.2f} "
                 f"on {self.threads} threads, prepare {self.prepare_seconds:.2f})"]
        lines += [f"  {k.seconds:6.2f} s  {k.status:<6}  {k.kernel.name}" for k in self.kernels]
        if self.unplanned:
            lines.append(f"  not planned (compiled while preparing): {', '.join(self.unplanned)}")
        return "\n".join(lines)


def warmup(calls, *, tokens: int | Iterable[int] | None = None, dtype: torch.dtype | None = None,
           backward: bool = False, threads: int | None = None, target: Target | str | None = None,
           prepare: bool | None = None) -> WarmupReport:
    """Compile every kernel that ``calls`` need, in parallel, and say what and how long.

    calls: call descriptions (``GemmCall``, ``(M, N, K)`` tuples meaning bf16 ``x @ w.t()``, or dicts of
        GemmCall's fields), or an ``nn.Module``, whose Linear modules are warmed up for ``tokens`` rows
        each (``calls_of_model``; ``dtype`` for autocast).
    backward: also the GEMMs of their backward (``gemmlab.autograd``: dX and dW, the recomputed
        pre-activation of fused gelu/silu).
    threads: compile threads (default: one per CPU, at most one per kernel).
    target: "h200" to plan ahead for an H200 without looking at the GPU; default: the visible Hopper GPU,
        else an H200.
    prepare: after compiling, prepare each call on the GPU (modules loaded, launches built; later eager
        calls of the same metadata start from there). Default: when the target is the visible GPU.

    Returns a ``WarmupReport`` (``.summary()`` prints it). Raises what ``gemmlab.matmul`` would raise for
    an invalid call.
    """
    t0 = time.perf_counter()
    if isinstance(calls, torch.nn.Module):
        if tokens is None:
            raise ValueError("gemmlab.warmup(model): say how many rows reach its Linear modules (tokens=)")
        calls = calls_of_model(calls, tokens, dtype)
    else:
        calls = [GemmCall.of(d) for d in calls]
    if target is None or target == "visible":
        target = Target.visible()
    elif target == "h200":
        target = Target.h200()
    gemms = [g for call in calls for g in gemms_of(call, backward)]
    kernels = list(dict.fromkeys(k for g in gemms for k in kernels_for(g, target)))
    if kernels:
        _load_toolchain()
    t1 = time.perf_counter()
    threads = max(1, min(threads or os.cpu_count() or 1, len(kernels) or 1))
    compiled = _compile_all(kernels, threads)
    t2 = time.perf_counter()
    report = WarmupReport(target.name, calls, len(gemms), compiled, threads, t1 - t0, t2 - t1)
    if prepare if prepare is not None else target.device is not None:
        _prepare_all(gemms, target.device, report)
        report.prepare_seconds = time.perf_counter() - t2
    return report


def _load_toolchain() -> None:
    """What every compile shares, loaded once before the threads start (counted as planning: ~1-2.5 s on the
    development machine on first use): cuda.core's lazy import of Program is not thread-safe (two threads
    importing it at once failed with ImportError), NVRTC's library and the CUDA headers' folder."""
    from cuda.core import Program, ProgramOptions  # noqa: F401

    from .jit.toolchain import cuda_include_dir, nvrtc_version

    cuda_include_dir(), nvrtc_version()


def _compile_all(kernels: list[Kernel], threads: int) -> list[Compiled]:
    with compiler._LOCK:
        known = {id(v) for v in compiler._MEMORY.values()}

    def one(k: Kernel) -> Compiled:
        t = time.perf_counter()
        ck = k.compile()
        return Compiled(k, time.perf_counter() - t, "memory" if id(ck) in known else ck.cache_status)

    if threads == 1:
        return [one(k) for k in kernels]
    with ThreadPoolExecutor(threads, thread_name_prefix="gemmlab-warmup") as pool:
        return list(pool.map(one, kernels))


def _prepare_all(gemms: list[tuple], device: torch.device | None, report: WarmupReport) -> None:
    """Each GEMM's prepared call on real (uninitialized) tensors with the meta tensors' shapes and strides;
    kernels compiled meanwhile were missing from the plan."""
    with compiler._LOCK:
        before = set(compiler._MEMORY)
    device = device or torch.device("cuda", torch.cuda.current_device())
    seen = set()
    for args in gemms:
        a, b, bias, activation, alpha, beta, c, out_dtype = args
        real = [None if t is None else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)
                for t in (a, b, bias, c)]
        # The op's arguments name the output dtype; eager calls usually leave it None (the inputs' dtype),
        # and prepared calls are keyed on the argument as given: prepare both.
        for dtype in {out_dtype, None if out_dtype in (None, a.dtype) else out_dtype}:
            key = ops._call_key(real[0], real[1], real[2], activation, beta, real[3], dtype, None)
            if key not in seen:
                seen.add(key)
                ops._prepared(real[0], real[1], real[2], activation, alpha, beta, real[3], dtype, None)
                report.prepared += 1
    with compiler._LOCK:
        report.unplanned = sorted(compiler._MEMORY[k].name for k in set(compiler._MEMORY) - before)


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m gemmlab.warm", description=__doc__.split("\n\n")[0])
    ap.add_argument("shapes", nargs="+", help="MxNxK, e.g. 16x4096x4096 (x @ w.t(), nn.Linear's layout)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--backward", action="store_true", help="also the backward GEMMs")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--target", default=None, choices=["h200", "visible"])
    args = ap.parse_args(argv)
    dt = getattr(torch, args.dtype)
    calls = [GemmCall(*map(int, s.lower().split("x")), dtype=dt) for s in args.shapes]
    print(warmup(calls, backward=args.backward, threads=args.threads, target=args.target).summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
