"""Programmatic dependent launch on a Hopper GPU (``jit.launch.Launcher(pdl=True)``, kernels/common/ptx.cuh's
``pdl_wait``): the engine's kernels may be scheduled while the kernel before them on the stream still runs,
so each must hold every global access until that kernel has completed. Chains of launches with no
synchronisation between them, where the second reads what the first writes (read after write) or writes
what the first reads (write after read), through the prepared launches of every engine schedule (plain and
swapped), the decode kernel, FP8 and grouped GEMM, eagerly and replayed from a CUDA graph; every result
against a float64 reference on fresh random inputs, outputs poisoned with NaN first."""

import dataclasses

import pytest
import torch

import gemmlab
from gemmlab import decode, engine, engine2, epilogue, planner
from gemmlab.bench import rel_error
from gemmlab.jit import launch

from fakes import reference

pytestmark = pytest.mark.hopper

TOL = 2e-2  # bf16 output over K <= 8192, fp32 accumulation


def _stream() -> int:
    return launch.raw_stream(torch.cuda.current_device())


def _first(M, N, K, schedule, swap_ab=False) -> planner.Plan:
    prof = dataclasses.replace(engine2._profile(torch.device("cuda")), stream_k_offered=True)  # the kernel, not the planner's choice
    for c in planner.candidates(M, N, K, profile=prof, schedules=planner.SCHEDULES, swap_ab=True):
        if c.schedule == schedule and c.swap_ab == swap_ab and c.mcast == 1:
            return c
    pytest.skip(f"no {schedule} plan (swap_ab={swap_ab}) offered at {M}x{N}x{K}")


def _long_first_call(g):
    """A ~50 us data-parallel launch of 128 tiles (4 SMs idle, so a dependent kernel's CTAs start there
    at once): x (2048 x 8192) @ w (8192 x 2048) -> y."""
    x = torch.randn(2048, 8192, device="cuda", generator=g).bfloat16()
    w = torch.randn(2048, 8192, device="cuda", generator=g).bfloat16().t()
    y = torch.full((2048, 2048), float("nan"), device="cuda", dtype=torch.bfloat16)
    prof = engine2._profile(torch.device("cuda"))
    p = next(c for c in planner.candidates(2048, 2048, 8192, profile=prof, schedules=planner.SCHEDULES)
             if (c.bm, c.bn, c.schedule) == (128, 256, "data_parallel"))
    assert p.grid < torch.cuda.get_device_properties(0).multi_processor_count
    call = engine.Engine2Launch(x, w, y, bias=None, c=None, plan=p)
    assert call.launcher.pdl == launch.PDL
    return call, x, w, y


def test_launchers_ask_for_pdl_unless_turned_off(monkeypatch):
    g = torch.Generator(device="cuda").manual_seed(0)
    call, *_ = _long_first_call(g)
    assert call.launcher.pdl is launch.PDL and (call.launcher._config is not None) == launch.PDL
    monkeypatch.setattr(launch, "PDL", False)
    plain, *_ = _long_first_call(g)
    assert plain.launcher.pdl is False and plain.launcher._config is None  # no cluster, no attribute


@pytest.mark.parametrize("schedule,swap_ab", [("data_parallel", False), ("stream_k", False), ("split_k", False),
                                              ("split_k_global", False), ("pingpong", False),
                                              ("data_parallel", True)])
def test_engine_reads_what_the_previous_kernel_wrote(schedule, swap_ab):
    g = torch.Generator(device="cuda").manual_seed(1)
    first, x, w, y = _long_first_call(g)
    M2, N2 = 256, 1024
    p = _first(M2, N2, 2048, schedule, swap_ab)
    w2 = torch.randn(N2, 2048, device="cuda", generator=g).bfloat16().t()
    out = torch.full((M2, N2), float("nan"), device="cuda", dtype=torch.bfloat16)
    second = engine.Engine2Launch(y[:M2], w2, out, bias=None, c=None, plan=p)
    s = _stream()
    for _ in range(3):
        y.fill_(float("nan"))
        out.fill_(float("nan"))
        torch.cuda.synchronize()
        first.run(s, x, w, y, None, None, 1.0, 0.0)
        second.run(s, y[:M2], w2, out, None, None, 1.0, 0.0)  # no synchronisation between the two
        torch.cuda.synchronize()
        assert rel_error(y, reference(x, w)) < TOL
        assert rel_error(out, reference(y[:M2], w2)) < TOL, p


def test_engine_writes_what_the_previous_kernel_reads():
    """The second call's output is the first call's input: written before the first has read it all,
    the first's result would be wrong."""
    g = torch.Generator(device="cuda").manual_seed(2)
    first, x, w, y = _long_first_call(g)
    x0 = x.clone()
    a2 = torch.randn(512, 1024, device="cuda", generator=g).bfloat16()
    b2 = torch.randn(8192, 1024, device="cuda", generator=g).bfloat16().t()  # K-major, as the plan's
    over = x[:512]  # (512, 8192): the rows the first call reads first
    prof = engine2._profile(torch.device("cuda"))
    p = planner.candidates(512, 8192, 1024, profile=prof)[0]
    second = engine.Engine2Launch(a2, b2, over, bias=None, c=None, plan=p)
    s = _stream()
    for _ in range(3):
        x.copy_(x0)
        y.fill_(float("nan"))
        torch.cuda.synchronize()
        first.run(s, x, w, y, None, None, 1.0, 0.0)
        second.run(s, a2, b2, over, None, None, 1.0, 0.0)
        torch.cuda.synchronize()
        assert rel_error(y, reference(x0, w)) < TOL
        assert rel_error(over, reference(a2, b2)) < TOL


@pytest.mark.parametrize("M", [1, 8, 16])
def test_decode_kernel_reads_what_the_previous_kernel_wrote(M):
    g = torch.Generator(device="cuda").manual_seed(3)
    first, x, w, y = _long_first_call(g)
    w2 = torch.randn(4096, 2048, device="cuda", generator=g).bfloat16().t()
    out = torch.full((M, 4096), float("nan"), device="cuda", dtype=torch.bfloat16)
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    second = decode.DecodeLaunch(y[:M], w2, out, epi=0,
                                 ctypes=epilogue.ctypes(torch.bfloat16, torch.bfloat16, None), c=None, bias=None,
                                 sm_count=sm)
    assert second.launcher.pdl == launch.PDL
    s = _stream()
    for _ in range(3):
        y.fill_(float("nan"))
        torch.cuda.synchronize()
        first.run(s, x, w, y, None, None, 1.0, 0.0)
        second.run(s, y[:M], w2, out, None, None, 1.0, 0.0)
        torch.cuda.synchronize()
        assert rel_error(out, reference(y[:M], w2)) < TOL


def test_public_calls_chained_eagerly_and_in_a_graph():
    """gemmlab.matmul (engine and decode routes) feeding each other with no synchronisation, then the same
    chain captured and replayed on new inputs."""
    g = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(16, 4096, device="cuda", generator=g).bfloat16()
    ws = [torch.randn(4096, 4096, device="cuda", generator=g).bfloat16().t() / 64 for _ in range(4)]

    def chain(x):
        h = x
        for w in ws:
            h = gemmlab.matmul(h, w)
        return h

    def ref(x):
        h = x.double()
        for w in ws:
            h = (h @ w.double()).bfloat16().double()  # each step's output is rounded to bf16, as the chain's
        return h

    for _ in range(3):
        out = chain(x)
        torch.cuda.synchronize()
        assert rel_error(out, ref(x)) < 4 * TOL
    static_x = x.clone()
    chain(static_x)  # prepared before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = chain(static_x)
    for seed in (5, 6):
        static_x.copy_(torch.randn(16, 4096, device="cuda", generator=g.manual_seed(seed)).bfloat16())
        static_out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_error(static_out, ref(static_x)) < 4 * TOL


def test_fp8_and_grouped_in_a_chain():
    """scaled_mm's output read at once by the engine; grouped_mm reading the engine's output with group
    offsets a torch kernel has just computed."""
    g = torch.Generator(device="cuda").manual_seed(7)
    f8 = torch.float8_e4m3fn
    a = (torch.randn(1024, 4096, device="cuda", generator=g) / 4).to(f8)
    b = (torch.randn(2048, 4096, device="cuda", generator=g) / 4).to(f8).t()
    one = torch.ones((), device="cuda")
    w = torch.randn(1024, 2048, device="cuda", generator=g).bfloat16().t() / 32  # (K, N) = (2048, 1024)
    experts = torch.randn(4, 512, 1024, device="cuda", generator=g).bfloat16() / 32
    counts = torch.tensor([100, 0, 300, 112], device="cuda", dtype=torch.int32)
    for _ in range(3):
        h = gemmlab.scaled_mm(a, b, one, one)  # (1024, 2048) bf16
        z = gemmlab.matmul(h, w)  # (1024, 1024): reads h at once
        offsets = torch.cumsum(counts, 0, dtype=torch.int32)
        out = gemmlab.grouped_mm(z[:512], experts, offsets)
        torch.cuda.synchronize()
        h_ref = (a.double() @ b.double()).bfloat16()
        assert rel_error(h, h_ref) < TOL
        assert rel_error(z, reference(h, w)) < TOL
        z_ref = z[:512].double()
        bounds = [0] + offsets.tolist()
        for e in range(4):
            lo, hi = bounds[e], bounds[e + 1]
            if hi > lo:
                assert rel_error(out[lo:hi], z_ref[lo:hi] @ experts[e].double().t()) < TOL
