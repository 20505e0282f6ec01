"""Test helpers shared by the test modules: a float64 reference of gemmlab's contract, and fakes of the
Hopper engine and of the fp32 route's launch, so the real ``gemmlab.matmul`` implementation (validation,
prepared calls, the custom op, autograd) runs on CPU tensors (the ``on_cpu`` fixture in conftest.py)."""

from __future__ import annotations

import sys
import types

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from gemmlab import fp32, ops

BF16, FP32 = torch.bfloat16, torch.float32


def reference(a, b, *, bias=None, activation=None, alpha=1.0, beta=0.0, c=None):
    acc = alpha * (a.double() @ b.double())
    if c is not None:
        acc = acc + beta * c.double()
    if bias is not None:
        acc = acc + bias.double()
    return act_reference(acc, activation)


def act_reference(x, activation):
    return {None: lambda t: t, "relu": F.relu, "gelu": F.gelu, "silu": F.silu,
            "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[activation](x)


def frame_cols(N: int, elem_bytes: int, direct: bool) -> int:
    """The width of a poisoned frame around an (M, N) output view: rows of that many elements are 16-byte
    aligned exactly when the plan does not say ``direct`` (direct stores are for rows TMA cannot store),
    with at least one column of frame beside the output (8 where aligned)."""
    w = N + (1 if direct else 8)
    while ((w * elem_bytes) % 16 == 0) == direct:
        w += 1
    return w


def ptx_param_types(source: str, expr: str) -> list[str]:
    """The .param types of ``expr``'s entry in PTX compiled from ``kernels/<source>``: "u64", "f32",
    "b8[128]" (a by-value CUtensorMap) and so on."""
    import re

    from cuda.bindings import nvrtc

    from gemmlab.jit.compiler import KERNEL_ROOT, collect_sources
    from gemmlab.jit.toolchain import cuda_include_dir

    def ok(result):  # NVRTC calls return (status, value...); cuda-core's PTX path asks the driver, absent here
        assert result[0] == nvrtc.nvrtcResult.NVRTC_SUCCESS, result
        return result[1] if len(result) == 2 else result[1:]

    prog = ok(nvrtc.nvrtcCreateProgram(collect_sources(source)[source].encode(), source.encode(), 0, [], []))
    ok((nvrtc.nvrtcAddNameExpression(prog, expr.encode())[0], None))
    opts = [b"-arch=compute_90a", b"-std=c++17"] + [b"-I" + str(d).encode() for d in
                                                  (KERNEL_ROOT, (KERNEL_ROOT / source).parent, cuda_include_dir())]
    ok((nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0], None))
    size = ok(nvrtc.nvrtcGetPTXSize(prog))
    buf = b" " * size
    ok((nvrtc.nvrtcGetPTX(prog, buf)[0], None))
    mangled = ok(nvrtc.nvrtcGetLoweredName(prog, expr.encode())).decode()
    ptx = buf.decode(errors="replace")
    entry = ptx[ptx.index(f".entry {mangled}("):]
    params = entry[:entry.index(")")]
    return [t + (f"[{n}]" if n else "") for t, n in re.findall(r"\.param\s+(?:\.align\s+\d+\s+)?\.(\w+)\s+[\w$]+(?:\[(\d+)\])?", params)]


def launch_arg_types(args) -> list[str]:
    """The PTX parameter type each argument of a captured launch fills, in ``ptx_param_types``' terms with
    signedness dropped ("u64", "u32", "f32", "b8[128]"): tensor maps by value, tensors as pointers, numpy
    scalars by their width."""
    import numpy as np

    def kind(x):
        if isinstance(x, tuple) and x[0] == "tmap":
            return "b8[128]"
        if isinstance(x, torch.Tensor):
            return "u64"
        return {np.int32: "u32", np.int64: "u64", np.float32: "f32"}[type(x)]

    return [kind(x) for x in args]


def unsigned(types_: list[str]) -> list[str]:
    """PTX parameter types with signedness and bit-type names dropped: s32 / b32 -> u32, s64 / b64 -> u64."""
    return [{"s32": "u32", "b32": "u32", "s64": "u64", "b64": "u64"}.get(t, t) for t in types_]


# A fake engine and a fake sgemm step, so the real impl's dispatch runs on CPU tensors ------------------

class FakeEngine:
    """Stands in for gemmlab.engine: records each call and computes the contract in float64."""

    def __init__(self, reason=None):
        self.reason = reason
        self.calls = []
        self.prepared = []
        self.streams = []

    def hopper_available(self, device):
        return self.reason

    def prepare(self, a, b, out, *, bias, activation, has_c, c):
        """What ops keeps per metadata key: here a recorder whose ``run`` is ``gemm``."""
        self.prepared.append(dict(shape=(a.shape, b.shape), strides=(a.stride(), b.stride()), has_c=has_c))
        engine = self

        class Launch:
            def run(self, stream, a, b, out, bias, c, alpha, beta):
                engine.streams.append(stream)
                engine.gemm(a, b, out, bias=bias, activation=activation, alpha=alpha, beta=beta, c=c)

        return Launch()

    def gemm(self, a, b, out, *, bias=None, activation=None, alpha=1.0, beta=0.0, c=None):
        self.calls.append(dict(a=a, b=b, out=out, bias=bias, activation=activation, alpha=alpha, beta=beta, c=c))
        assert out.is_contiguous() and out.shape == (a.shape[0], b.shape[1])
        assert bias is None or bias.is_contiguous()
        out.copy_(reference(a, b, bias=bias, activation=activation, alpha=alpha, beta=beta, c=c))


class FakeSgemmStep:
    """Stands in for the fp32 route's launch (``gemmlab.fp32.run``): C = alpha * A @ B + beta * C, row-major,
    C unread at beta=0."""

    def __init__(self):
        self.calls = []

    def run(self, a, b, c, *, alpha=1.0, beta=0.0, config=None):
        assert a.is_contiguous() and b.is_contiguous() and c.is_contiguous() and c.dtype == FP32
        self.calls.append(dict(alpha=alpha, beta=beta))
        acc = alpha * (a.double() @ b.double())
        if beta != 0.0:
            acc = acc + beta * c.double()
        c.copy_(acc)


def install(monkeypatch):
    """Let the real impl run on CPU tensors: accept any device, fake engine, fake sgemm step (the
    ``on_cpu`` fixture of conftest.py). Returns the fakes (``.engine``, ``.sgemm``)."""
    eng, step = FakeEngine(), FakeSgemmStep()
    monkeypatch.setattr(ops, "_check_device", lambda device: None)
    monkeypatch.setattr(ops, "_load_engine", lambda: eng)
    monkeypatch.setattr(ops, "_sm_count", lambda device: 132)
    monkeypatch.setattr(fp32, "run", step.run)
    monkeypatch.setattr(ops, "_stream", lambda dev: 7)
    forget()  # calls prepared (and module routes decided) with another test's fakes
    return types.SimpleNamespace(engine=eng, sgemm=step)


def forget() -> None:
    """Forget what was decided with other fakes: prepared calls, gemmlab.nn's routes."""
    ops.clear_prepared_calls()
    nn = sys.modules.get("gemmlab.nn")
    if nn is not None:
        nn.clear_routes()


class OpRecorder(TorchDispatchMode):
    """A dispatch mode that records the names of the ops it sees (``ops``)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def rnd(*shape, dtype=BF16, device="cpu", gen=None):
    """Fresh uniform values in [-1, 1) (never zeros), made in fp32 and cast."""
    return (torch.rand(*shape, generator=gen, device=device, dtype=FP32) * 2 - 1).to(dtype)


# FP8: scaled_mm's launches on CPU tensors ---------------------------------------------------------------

_OUT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def check_fp8_call(p, a, w, sa, sb, out, bias) -> None:
    """What an FP8 launch is given must be what its plan ``p`` is for: a (M, K), the (N, K) K-major weight,
    out (M, N) in the plan's dtype, the bias and scale mode the plan says."""
    assert a.shape == (p.M, p.K) and w.shape == (p.N, p.K) and w.stride(1) == 1
    assert out.shape == (p.M, p.N) and out.dtype == _OUT_DTYPES[p.out_dtype]
    assert (bias is None) == (p.bias_dtype is None) and p.scale == ("tensor" if sa.numel() == 1 else "block")


def fake_fp8_launches(monkeypatch):
    """``gemmlab.scaled_mm`` on CPU tensors: the device test passes, ``engine2.launch_fp8`` (``fp8.gemm``)
    and ``engine2.Fp8Launch`` (the prepared calls) check what they are given against their plan and write
    the float64 reference into ``out``. Returns a namespace: ``ran`` (the plans launched, both paths),
    ``prepared`` (the plans Fp8Launch was built for), ``runs`` (each prepared run's stream and tensors)."""
    from gemmlab import engine2, fp8

    rec = types.SimpleNamespace(ran=[], prepared=[], runs=[])

    def launch(p, a, w, sa, sb, out, *, bias=None):
        check_fp8_call(p, a, w, sa, sb, out, bias)
        out.copy_(fp8.reference_scaled_mm(a, w.t(), sa, sb, bias=bias, activation=p.activation))
        rec.ran.append(p)

    class Fp8Launch:
        def __init__(self, p, a, w, sa, sb, out, *, bias):
            check_fp8_call(p, a, w, sa, sb, out, bias)
            self.plan = p
            rec.prepared.append(p)

        def run(self, stream, a, b, sa, sb, out, bias):  # scaled_mm passes b = w.t()
            rec.runs.append(dict(stream=stream, a=a, b=b, sa=sa, sb=sb, out=out, bias=bias))
            launch(self.plan, a, b.t(), sa, sb, out, bias=bias)

    monkeypatch.setattr(fp8, "_runs_here", lambda a: True)
    monkeypatch.setattr(ops, "_stream", lambda dev: 7)
    monkeypatch.setattr(engine2, "launch_fp8", launch)
    monkeypatch.setattr(engine2, "Fp8Launch", Fp8Launch)
    fp8.clear_prepared_calls()
    return rec


# Grouped: grouped_mm's prepared calls on CPU tensors ----------------------------------------------------

def route_grouped_launches(monkeypatch):
    """``gemmlab.grouped_mm`` on CPU tensors: the device test passes, and ``grouped.GroupedLaunch`` and
    ``grouped.FitLaunch`` (the prepared calls) are replaced by one that runs ``grouped.launch`` (as the calling test replaced it) with
    the plan it was built for and each call's tensors. Returns a namespace: ``prepared`` (the plans
    built), ``runs`` (each run's stream and tensors)."""
    from gemmlab import grouped

    rec = types.SimpleNamespace(prepared=[], runs=[])

    class GroupedLaunch:
        def __init__(self, p, a, b, ranges, lead, out, scale_a=None, scale_b=None, sb_step=0):
            assert out.shape == tuple(grouped.validate(a, b, *((ranges, None) if a.dim() == 2 else (None, ranges)),
                                                       scale_a=scale_a, scale_b=scale_b).out_shape)
            self.plan, self.lead, self.sb_step = p, lead, sb_step
            rec.prepared.append(p)

        def run(self, stream, a, b, ranges, out, scale_a, scale_b):
            rec.runs.append(dict(stream=stream, a=a, b=b, ranges=ranges, out=out, sa=scale_a, sb=scale_b))
            grouped.launch(self.plan, a, b, ranges, self.lead, out, scale_a, scale_b, self.sb_step)

    class FitLaunch(GroupedLaunch):  # the fitted form's prepared launch (no scales)
        def __init__(self, p, a, b, lead, out):
            self.plan, self.lead, self.sb_step = p, lead, 0
            rec.prepared.append(p)

    monkeypatch.setattr(grouped, "_runs_here", lambda a: True)
    monkeypatch.setattr(ops, "_stream", lambda dev: 7)
    monkeypatch.setattr(grouped, "GroupedLaunch", GroupedLaunch)
    monkeypatch.setattr(grouped, "FitLaunch", FitLaunch)
    monkeypatch.setattr(grouped, "_PREPARED", {})  # this test's preparations end with it
    return rec


class FakeTmap:
    """A descriptor as a prepared launch builds it: its geometry, and the address it holds now."""

    def __init__(self, ptr, rows, cols, row_stride_elems, dtype, box, swizzle_bytes):
        self.geometry = dict(rows=rows, cols=cols, row_stride=row_stride_elems, dtype=dtype, box=tuple(box),
                             swizzle=swizzle_bytes)
        self.ptr = ptr


class FakeMapSlot:
    """Stands in for ``jit.launch.MapSlot`` (no driver): a ``FakeTmap`` whose address ``point_at`` replaces
    (counted in ``replaced``) when it changes."""

    def __init__(self, launcher, index, ptr, rows, cols, row_stride_elems, dtype, box, *, swizzle_bytes=128):
        self.tmap = FakeTmap(ptr, rows, cols, row_stride_elems, dtype, box, swizzle_bytes)
        self.replaced = 0
        launcher.set_map(index, self.tmap)

    def point_at(self, ptr):
        if ptr != self.tmap.ptr:
            self.tmap.ptr = ptr
            self.replaced += 1


class FakeLauncher:
    """Stands in for ``jit.launch.Launcher`` (no driver): keeps each parameter as set, and ``launch``
    records (stream, the parameters then: ("tmap", geometry, address) for descriptors, (kind, value) for
    the rest) in ``launches``."""

    def __init__(self, compiled, kinds, *, grid, block, smem=0, cluster=None, device_index, pdl=False):
        import threading

        self.compiled, self.kinds = compiled, tuple(kinds)
        self.config = dict(grid=grid, block=block, smem=smem, cluster=cluster, pdl=pdl)
        self.values = [None] * len(self.kinds)
        self.lock = threading.Lock()
        self.launches = []

    def set_ptr(self, i, v):
        self.values[i] = ("ptr", int(v))

    def set_i32(self, i, v):
        self.values[i] = ("i32", int(v))

    def set_i64(self, i, v):
        self.values[i] = ("i64", int(v))

    def set_f32(self, i, v):
        self.values[i] = ("f32", float(v))

    def set_map(self, i, tmap):
        self.values[i] = tmap

    def launch(self, stream):
        assert all(v is not None for v in self.values), "a parameter was never set"
        self.launches.append((stream, [("tmap", v.geometry, v.ptr) if isinstance(v, FakeTmap) else v
                                       for v in self.values]))


def as_params(args) -> list:
    """An unprepared launch's argument list (cuda-core's: FakeTmaps, tensors, numpy scalars) in
    FakeLauncher's terms, to compare with what a prepared launch passes."""
    import numpy as np

    kinds = {np.int32: "i32", np.int64: "i64", np.float32: "f32"}
    return [("tmap", x.geometry, x.ptr) if isinstance(x, FakeTmap) else ("ptr", x.data_ptr())
            if isinstance(x, torch.Tensor) else (kinds[type(x)], x.item()) for x in args]


def record_returns(monkeypatch, module, name: str) -> list:
    """``module.name`` wrapped so that every value it returns is appended to the list returned."""
    real, seen = getattr(module, name), []

    def wrapped(*args, **kw):
        seen.append(real(*args, **kw))
        return seen[-1]

    monkeypatch.setattr(module, name, wrapped)
    return seen


def fake_driver(monkeypatch, *modules):
    """The prepared launches of ``modules`` (e.g. gemmlab.engine, gemmlab.engine2) on CPU: their
    ``Launcher`` and ``MapSlot`` replaced by the fakes above. Returns the launchers built (a list)."""
    built = []

    class Launcher(FakeLauncher):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            built.append(self)

    for m in modules:
        monkeypatch.setattr(m, "Launcher", Launcher, raising=False)
        monkeypatch.setattr(m, "MapSlot", FakeMapSlot, raising=False)
    return built
