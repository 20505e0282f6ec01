"""gemmlab.warmup (gemmlab/warm.py): which kernels a call needs, and compiling them ahead.

CPU: ``kernels_for`` against the real ``engine.prepare`` run on meta tensors with a recording compiler
(the GPU-only pieces faked), over layouts, dtypes, epilogues, decode / split-K / unaligned shapes and the
backward GEMMs: any decision the engine changes without warm-up fails here. The backward GEMMs come from
gemmlab.autograd's formula; a model's Linear modules are found; one real warm-up compiles with NVRTC
(cache: miss, then memory, then disk). GPU (``hopper``): warm-up prepares the calls and nothing is left
to compile; the next calls compile nothing.
"""

from __future__ import annotations

import types

import pytest
import torch

import gemmlab
from gemmlab import engine, fp32, ops, warm
from gemmlab.jit import compiler

import decoder_block as db

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
GemmCall = warm.GemmCall


class _FakeLauncher:
    """engine.Launcher without a GPU: accepts the parameter block, launches nothing."""

    def __init__(self, compiled, kinds, **kw):
        self.lock = types.SimpleNamespace(__enter__=lambda *a: None, __exit__=lambda *a: None)

    def __getattr__(self, name):  # set_ptr, set_i32, set_i64, set_f32, set_map, set_args
        return lambda *a, **k: None


@pytest.fixture
def engine_on_meta(monkeypatch):
    """engine.prepare on meta tensors, planning for an H200: every kernel it would compile is recorded."""
    compiled: list[tuple[str, str]] = []

    def record(source, name_expression, **kw):
        compiled.append((source, name_expression))
        return types.SimpleNamespace(name=kw.get("name", name_expression))

    monkeypatch.setattr(engine, "compile_kernel", record)
    monkeypatch.setattr(compiler, "compile_kernel", record)  # decode imports it at launch preparation
    monkeypatch.setattr(engine, "Launcher", _FakeLauncher)
    monkeypatch.setattr("gemmlab.jit.launch.Launcher", _FakeLauncher)
    monkeypatch.setattr(engine, "MapSlot", lambda *a, **k: types.SimpleNamespace(tmap=None))
    monkeypatch.setattr(engine, "device_order_table", lambda *a, **k: torch.empty(1, device="meta", dtype=torch.int32))
    monkeypatch.setattr(engine, "_sm_count", lambda device: 132)
    monkeypatch.setattr(engine, "_memory_peak", lambda device: engine.H200.hbm_peak_bytes_per_s)
    monkeypatch.setattr(engine, "raw_stream", lambda index: 0)
    monkeypatch.setattr(engine, "stream_k_workspace", lambda p, index, stream: None)
    monkeypatch.setattr(engine, "_index", lambda device: 0)
    monkeypatch.setattr(engine, "cluster_capacity", lambda device: engine.H200_CLUSTER_CAPACITY)
    monkeypatch.setattr(engine.tuned, "device_gpu", lambda index: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return compiled


def engine_kernels(args, compiled) -> set[tuple[str, str]]:
    """What engine.prepare compiles for one op call, prepared as ops._Call prepares it."""
    a, b, bias, activation, alpha, beta, c, out_dtype = args
    p = ops._validate(a, b, bias, activation, alpha, beta, c, out_dtype)
    out = torch.empty((p.M, p.N), dtype=p.out_dtype, device="meta")
    has_c = c is not None and beta != 0
    del compiled[:]
    engine.prepare(a, b, out, bias=bias, activation=activation, has_c=has_c, c=c if has_c else None)
    return set(compiled)


def planned(args) -> set[tuple[str, str]]:
    return {(k.source, k.name_expression) for k in warm.kernels_for(args, warm.Target.h200())}


CALLS = [
    GemmCall(1, 4096, 4096), GemmCall(16, 14336, 4096), GemmCall(32, 4096, 14336, FP16),  # decode
    GemmCall(16, 28672, 8192),  # a weight past DECODE_MAX_WEIGHT_DIM: h11 at M = 16
    GemmCall(128, 1024, 8192), GemmCall(64, 256, 4096, bias=FP32),  # split-K plans
    GemmCall(2048, 4096, 4096, activation="silu", bias=BF16), GemmCall(4096, 4096, 4096, c=True, out_dtype=FP32),
    GemmCall(333, 520, 264, FP16, "NN", FP16, "gelu"), GemmCall(300, 200, 130, layout="NT"),
    GemmCall(4095, 4095, 4095, layout="TT"),  # leading dimensions TMA cannot take: aligned copies
    GemmCall(257, 301, 190, bias=FP32, activation="gelu_tanh", c=True),  # an output row of 602 bytes
    GemmCall(8, 100, 64, activation="relu"),  # decode shape whose weight rows are not 16-byte aligned
]


@pytest.mark.parametrize("call", CALLS, ids=str)
def test_kernels_for_is_what_the_engine_compiles(engine_on_meta, call):
    gemms = warm.gemms_of(call, backward=True)
    assert len(gemms) >= 3
    for args in gemms:
        want = engine_kernels(args, engine_on_meta)
        assert want and planned(args) == want, args[:2]


def test_kernels_for_unaligned_and_strided_operands(engine_on_meta):
    """Views whose data pointers are off 16 bytes or whose rows are strided: aligned copies (pad_copy with
    and without vector loads, or torch's copy), as the engine makes them."""
    base = torch.empty(64 * 200 + 1, device="meta", dtype=BF16)
    cases = [
        (base[1:64 * 200 + 1].view(64, 200)[:, :130], torch.empty(130, 96, device="meta", dtype=BF16)),
        (torch.empty(64, 130, device="meta", dtype=BF16), torch.empty(96, 260, device="meta", dtype=BF16)[:, ::2].t()),
        (torch.empty(130, 64, device="meta", dtype=FP16).t(), torch.empty(130, 96, device="meta", dtype=FP16)[:, 1:91]),
        (torch.empty(64, 129, device="meta", dtype=BF16), torch.empty(257, 129, device="meta", dtype=BF16).t()),
    ]
    copies = []
    for a, b in cases:
        args = (a, b, None, None, 1.0, 0.0, None, None)
        want = engine_kernels(args, engine_on_meta)
        assert planned(args) == want
        copies.append(sorted(e for _, e in want if e.startswith("pad_copy")))
    # a: misaligned base; a: rows of 260 B (b: strided rows, torch's copy); b: misaligned base; both
    # operands' rows of 258 B: one launch copies both.
    assert copies == [["pad_copy_operands<2, 0, 0>"]] * 4


def test_fp32_calls_need_the_fp32_routes_step():
    args = GemmCall(1000, 1001, 999, FP32).meta_args()
    (k,) = warm.kernels_for(args, warm.Target.h200())
    spec, cfg = fp32.K10, fp32.config_for(1000, 1001, 999, 132)
    assert (k.source, k.name_expression) == (spec.source, spec.name_expression(cfg))


def test_empty_calls_need_nothing():
    assert warm.kernels_for(GemmCall(0, 8, 8).meta_args(), warm.Target.h200()) == []
    assert warm.kernels_for(GemmCall(8, 8, 0).meta_args(), warm.Target.h200()) == []


@pytest.mark.parametrize("activation, n", [(None, 3), ("relu", 3), ("silu", 4)])
def test_backward_gemms_follow_the_autograd_formula(activation, n):
    """Forward, dX = dz @ W (weight row-major: NN), dW = dz^T @ x (written as (N, K) row-major), and for
    gelu/silu the recomputed pre-activation in fp32."""
    M, N, K = 48, 80, 64
    gemms = warm.gemms_of(GemmCall(M, N, K, bias=BF16, activation=activation), backward=True)
    assert len(gemms) == n
    shapes = [(tuple(g[0].shape), tuple(g[1].shape)) for g in gemms]
    assert shapes[0] == ((M, K), (K, N)) and ((M, N), (N, K)) in shapes and ((N, M), (M, K)) in shapes
    if n == 4:
        assert [g[7] for g in gemms].count(FP32) == 1
    assert len(warm.gemms_of(GemmCall(M, N, K), backward=False)) == 1


def test_calls_of_a_model():
    model = db.build(db.Config(qkv_bias=True), seed=0, dtype=BF16)
    calls = warm.calls_of_model(model, tokens=[8, 64])
    # Per token count: q/o (64 x 64), k/v (32 x 64, bias), gate/up (160 x 64), down, lm_head; q has a bias, o not.
    assert len(calls) == 2 * 6
    assert GemmCall(8, 64, 64, BF16, "TN", BF16) in calls and GemmCall(8, 64, 64, BF16, "TN", None) in calls
    assert GemmCall(64, 256, 64) in calls  # the tied lm_head
    gemmlab.patch(model)
    assert warm.calls_of_model(model, 8) == [c for c in calls if c.M == 8]
    auto = warm.calls_of_model(db.build(db.Config(), seed=0), 8, dtype=BF16)  # fp32 weights under autocast
    assert all(c.dtype == BF16 for c in auto)


def test_warmup_needs_tokens_for_a_model():
    with pytest.raises(ValueError, match="tokens="):
        gemmlab.warmup(torch.nn.Linear(4, 4))


def test_warmup_compiles_ahead_then_finds_its_kernels(tmp_path, monkeypatch):
    """Real NVRTC compiles without a GPU: misses, then this process's memory, then the disk cache."""
    monkeypatch.setenv("GEMMLAB_CACHE_DIR", str(tmp_path))
    compiler.clear_memory_cache()
    calls = [(1, 2048, 2048), {"M": 256, "N": 512, "K": 320, "activation": "gelu", "bias": BF16}]
    first = gemmlab.warmup(calls, target="h200", threads=2)
    assert first.gemms == 2 and len(first.kernels) == 2 and first.threads == 2
    assert {k.status for k in first.kernels} == {"miss"} and first.prepared == 0
    assert any("engine.decode" in k.kernel.name for k in first.kernels)
    again = gemmlab.warmup(calls, target="h200")
    assert {k.status for k in again.kernels} == {"memory"}
    compiler.clear_memory_cache()
    disk = gemmlab.warmup(calls, target="h200")
    assert {k.status for k in disk.kernels} == {"hit"}
    assert "2 hit" in disk.summary() and "engine.decode" in disk.summary()
    compiler.clear_memory_cache()


def test_warmup_prepares_the_calls_that_eager_calls_then_find(on_cpu, monkeypatch):
    """On a GPU target warm-up also prepares each GEMM (here a faked CPU 'GPU' and the fake engine): the
    eager forward (out_dtype left None) and its backward (explicit out_dtype) then prepare nothing."""
    from fakes import rnd

    monkeypatch.setattr(warm, "_compile_all", lambda kernels, threads: [warm.Compiled(k, 0.0, "miss") for k in kernels])
    monkeypatch.setattr(ops, "_fast_device", lambda t: True)
    target = warm.Target("the CPU, faked", 132, engine.H200_CLUSTER_CAPACITY, device=torch.device("cpu"))
    report = gemmlab.warmup([GemmCall(8, 16, 32, bias=BF16, activation="silu")], backward=True, target=target)
    # Three GEMMs in bf16 (forward, dX, dW) prepared under out_dtype None and bfloat16, the fp32 recompute once.
    assert report.gemms == 4 and report.prepared == 7 and report.unplanned == []
    before = len(on_cpu.engine.prepared)
    x, w, bias = (rnd(*s).requires_grad_() for s in ((8, 32), (16, 32), (16,)))
    gemmlab.linear(x, w, bias, activation="silu").backward(rnd(8, 16))
    assert len(on_cpu.engine.prepared) == before and len(on_cpu.engine.calls) == 4
    assert x.grad is not None and w.grad is not None and bias.grad is not None


def test_command_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GEMMLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(warm, "_compile_all", lambda kernels, threads: [warm.Compiled(k, 0.0, "miss") for k in kernels])
    assert warm.main(["16x4096x4096", "2048x1024x4096", "--backward", "--target", "h200"]) == 0
    out = capsys.readouterr().out
    assert "2 calls, 6 GEMMs" in out and "hopper.h11_general" in out


# GPU -------------------------------------------------------------------------------------------------------

def like(t: torch.Tensor | None) -> torch.Tensor | None:
    """A CUDA leaf requiring grad, random, with meta tensor ``t``'s shape and strides (row- or column-major)."""
    if t is None:
        return None
    if t.dim() == 2 and t.stride(0) == 1 and t.stride(1) != 1:
        return torch.randn(t.shape[::-1], dtype=t.dtype, device="cuda").requires_grad_().t()
    return torch.randn(t.shape, dtype=t.dtype, device="cuda").requires_grad_()


@pytest.mark.gpu
@pytest.mark.hopper
def test_gpu_warmup_leaves_nothing_to_compile():
    calls = [(16, 4096, 4096), (512, 1376, 512), GemmCall(300, 264, 200, bias=FP32, activation="silu"),
             GemmCall(4095, 4095, 4095, layout="TT"), GemmCall(128, 1024, 8192, FP16, c=True)]
    report = gemmlab.warmup(calls, backward=True)
    assert report.prepared >= len(calls) and report.unplanned == [], report.summary()
    with compiler._LOCK:
        known = set(compiler._MEMORY)
    for d in calls:
        a, b, bias, act, alpha, beta, c, out_dtype = GemmCall.of(d).meta_args()
        a, b, bias, c = (like(t) for t in (a, b, bias, c))
        y = gemmlab.matmul(a, b, bias=bias, activation=act, beta=beta, c=c, out_dtype=out_dtype)
        y.backward(torch.randn_like(y))
        assert torch.isfinite(a.grad if a.is_leaf else a._base.grad).all()
    torch.cuda.synchronize()
    with compiler._LOCK:
        assert set(compiler._MEMORY) == known  # the calls and their backward compiled nothing new
