"""``gemmlab.scaled_mm``'s eager path on CPU: the prepared FP8 launch (``engine2.Fp8Launch``) against
``engine2.launch_fp8`` with the driver stubbed (tests/fakes.py's ``FakeLauncher`` / ``FakeMapSlot``: the
same parameters, descriptors of the same geometry, every address following the tensors of each call), and
the prepared calls behind ``scaled_mm`` with the launch replaced by the float64 reference (keyed on
metadata, never stale, the op still seen by tracing, modes and autograd, the same errors)."""

import pytest
import torch

import gemmlab
from gemmlab import engine, engine2, fp8, ops, planner
from gemmlab.errors import UnsupportedProblem

import fakes
from fakes import FakeTmap, ptx_param_types, unsigned
from test_fp8 import BAD, _ops

BF16, FP32 = torch.bfloat16, torch.float32


def _weight_t(N, K, pad=0):
    """b = w.t() of a fresh (N, K) e4m3 weight whose rows are K + pad bytes apart."""
    w = torch.randn(N, K + pad).clamp(-4, 4).to(fp8.E4M3)
    return w[:, :K].t()


# The prepared launch against launch_fp8 (driver stubbed) ----------------------------------------------------

@pytest.fixture
def driver(monkeypatch):
    """engine2's FP8 launches on CPU tensors: fake Launcher / MapSlot (Fp8Launch), descriptors and the
    cuda-core launch captured (launch_fp8), one tile order for both, and every block-scale view
    ``block_scales_mn_major`` returns recorded (``relaid``)."""
    launchers = fakes.fake_driver(monkeypatch, engine, engine2)
    order = torch.zeros(64, dtype=torch.int32)
    captured = {}
    monkeypatch.setattr(engine2, "compile_fp8_plan", lambda p: "compiled")
    monkeypatch.setattr(engine2, "_index", lambda device: 0)
    monkeypatch.setattr(engine2, "device_order_table", lambda name, tm, tn, group, dev, pair_m=1: order)
    monkeypatch.setattr(engine2, "tensor_map_2d", lambda t, box, swizzle_bytes=128: FakeTmap(
        t.data_ptr(), *t.shape, t.stride(0), t.dtype, box, swizzle_bytes))
    monkeypatch.setattr(engine2, "_launch", lambda compiled, **kw: captured.update(kw))
    relaid = fakes.record_returns(monkeypatch, engine2, "block_scales_mn_major")
    return type("Driver", (), dict(launchers=launchers, captured=captured, relaid=relaid))


def _case(scale, M, N, K, out_dtype, bias_dtype, layout="mn"):
    a, b, sa, sb = _ops(M, N, K, block=scale == "block")
    if layout == "row":  # activation scales row-major, (M, K / 128) contiguous: re-laid on every call
        sa = sa.contiguous()
    bias = None if bias_dtype is None else torch.randn(N).to(bias_dtype)
    p = planner.plan_fp8(M, N, K, scale=scale, out_dtype=out_dtype, bias_dtype=bias_dtype)
    return p, a, b, sa, sb, bias


CASES = [("tensor", 300, 1000, 1024, BF16, BF16, "mn"),  # ragged M: A's short box
         ("tensor", 64, 300, 256, BF16, None, "mn"),  # 600-byte rows: DIRECT
         ("block", 200, 512, 512, FP32, FP32, "mn"),  # scales read in place
         ("block", 130, 384, 384, FP32, None, "row"),  # A's scales re-laid
         ("block", 256, 640, 256, torch.float16, BF16, "row")]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}x{c[3]}-{c[6]}" for c in CASES])
def test_prepared_launch_passes_what_launch_fp8_passes(driver, case):
    """Every parameter of Fp8Launch's launch equals launch_fp8's: the same scalars and pointers, and
    descriptors of the same geometry (rows, columns, row stride, dtype, box, swizzle) at the same
    address; a re-laid scale's descriptor points at the copy made for that call."""
    p, a, b, sa, sb, bias = _case(*case)
    out = torch.empty(p.M, p.N, dtype=fakes._OUT_DTYPES[p.out_dtype])
    engine2.launch_fp8(p, a, b.t(), sa, sb, out, bias=bias)
    want = fakes.as_params(driver.captured["args"])
    launch = engine2.Fp8Launch(p, a, b.t(), sa, sb, out, bias=bias)
    launch.run(11, a, b, sa, sb, out, bias)
    L = driver.launchers[-1]
    stream, got = L.launches[-1]
    assert stream == 11 and len(got) == len(want) == len(engine2.FP8_PARAMS)
    assert L.config == dict(grid=p.grid, block=p.threads, smem=p.smem_bytes, cluster=None, pdl=True)
    for i, (g, w) in enumerate(zip(got, want)):
        if i == 5 and case[6] == "row":  # A's scales re-laid: launch_fp8's copy and this call's differ
            assert g[1] == w[1] and g[2] == driver.relaid[-1].data_ptr() != sa.data_ptr()
            assert torch.equal(driver.relaid[-1], sa.t())
        else:
            assert g == w, (i, g, w)


def test_fp8_params_match_the_kernel_signature():
    """FP8_PARAMS (what Fp8Launch's parameter block holds) has the kernel's parameters in order and size."""
    p = planner.plan_fp8(300, 1000, 1024, scale="block", bias_dtype="bf16")
    ptx = {"tmap": "b8[128]", "ptr": "u64", "i32": "u32", "i64": "u64", "f32": "f32"}
    assert [ptx[k] for k in engine2.FP8_PARAMS] == unsigned(ptx_param_types(planner.FP8_SOURCE, p.name_expression))


@pytest.mark.parametrize("layout", ["mn", "row"])
def test_prepared_launch_follows_every_address(driver, layout):
    """A launch built for one set of tensors and run with another passes the other's addresses
    everywhere (A and its short box, B, the output maps, the scale maps, the scale and bias pointers,
    the output pointer), replaces nothing when run again with the same tensors, and takes the stream
    it is given."""
    p, a, b, sa, sb, bias = _case("block", 300, 640, 512, BF16, BF16, layout)
    out = torch.empty(p.M, p.N, dtype=BF16)
    launch = engine2.Fp8Launch(p, a, b.t(), sa, sb, out, bias=bias)
    L = driver.launchers[-1]
    sets = []
    for _ in range(2):
        _, b2, sa2, sb2, bias2 = _case("block", 300, 640, 512, BF16, BF16, layout)[1:]
        sets.append((torch.empty_like(a).copy_(a), b2, sa2, sb2, torch.empty(p.M, p.N, dtype=BF16), bias2))
    for stream, (a2, b2, sa2, sb2, out2, bias2) in zip((3, 5, 3), sets + sets[:1]):
        launch.run(stream, a2, b2, sa2, sb2, out2, bias2)
        s, got = L.launches[-1]
        ptr = [g[2] if g[0] == "tmap" else g[1] for g in got]
        sa_view = sa2.t() if layout == "mn" else driver.relaid[-1]  # read in place, or this call's copy
        assert s == stream
        assert ptr[:7] == [a2.data_ptr(), a2.data_ptr(), b2.data_ptr(), out2.data_ptr(), out2.data_ptr(),
                           sa_view.data_ptr(), sb2.data_ptr()]
        assert ptr[11:15] == [sa2.data_ptr(), sb2.data_ptr(), bias2.data_ptr(), out2.data_ptr()]
        assert torch.equal(sa_view, sa2.t())
    slots = [launch.map_a, launch.map_a_short, launch.map_b, launch.maps_c.c, launch.maps_c.tail, launch.map_sb]
    slots += [launch.map_sa] if layout == "mn" else []  # a re-laid copy is wherever the allocator puts it
    assert launch.map_a_short is not launch.map_a and launch.maps_c.tail is not None  # 300 = 2 x 128 + 44 rows
    replaced = [s.replaced for s in slots]
    launch.run(3, *sets[0])
    assert [s.replaced for s in slots] == replaced  # the same tensors again: no address replaced


# scaled_mm's eager path (the launches replaced by the float64 reference) --------------------------------------

@pytest.fixture
def eager(monkeypatch):
    """CPU tensors take scaled_mm's eager path (as CUDA tensors do); the launches are the reference
    (``fakes.fake_fp8_launches``); ``op_calls`` counts the calls that went through the custom op."""
    rec = fakes.fake_fp8_launches(monkeypatch)
    monkeypatch.setattr(ops, "_fast_device", lambda a: True)
    rec.op_calls = []
    real_op = fp8._scaled_mm_op

    def op(*args):
        rec.op_calls.append(args)
        return real_op(*args)

    monkeypatch.setattr(fp8, "_scaled_mm_op", op)
    yield rec
    fp8.clear_prepared_calls()


def _ref(a, b, sa, sb, bias=None, activation=None):
    return fp8.reference_scaled_mm(a, b, sa, sb, bias=bias, activation=activation)


@pytest.mark.parametrize("block", [False, True])
def test_eager_calls_prepare_once_and_follow_each_calls_tensors(eager, block):
    for i in range(4):
        torch.manual_seed(i)
        a, b, sa, sb = _ops(M=40, N=256, K=256, block=block)
        bias = torch.randn(256)
        y = gemmlab.scaled_mm(a, b, sa, sb, bias=bias, activation="relu", out_dtype=FP32)
        assert torch.allclose(y.double(), _ref(a, b, sa, sb, bias, "relu"))
        run = eager.runs[-1]
        assert all(run[k] is v for k, v in dict(a=a, b=b, sa=sa, sb=sb, bias=bias, out=y).items())
    assert len(eager.prepared) == 1 and len(eager.runs) == 4 and not eager.op_calls


CHANGES = ["shape", "weight row stride", "scale_a row-major", "scale_b row-major", "per-tensor to block",
           "bias", "bias dtype", "out_dtype", "activation", "a offset 16 bytes"]


@pytest.mark.parametrize("change", CHANGES)
def test_eager_calls_prepare_again_when_metadata_changes(eager, change):
    """Anything validation, the plan or the launch depends on is in the key: a changed call never runs a
    stale preparation; only an address that keeps the 16-byte alignment shares the key."""
    a, b, sa, sb = _ops(M=64, N=256, K=256, block=change != "per-tensor to block")
    kw = {}
    gemmlab.scaled_mm(a, b, sa, sb, **({"bias": torch.randn(256)} if change == "bias dtype" else {}))
    if change == "shape":
        a, sa = a[:33], sa[:33]
    elif change == "weight row stride":
        b = _weight_t(256, 256, pad=16)
    elif change == "scale_a row-major":
        sa = sa.contiguous()
    elif change == "scale_b row-major":
        sb = sb.contiguous()
    elif change == "per-tensor to block":
        a, b, sa, sb = _ops(M=64, N=256, K=256, block=True)
    elif change == "bias":
        kw = dict(bias=torch.randn(256))
    elif change == "bias dtype":
        kw = dict(bias=torch.randn(256).to(BF16))
    elif change == "out_dtype":
        kw = dict(out_dtype=torch.float16)
    elif change == "activation":
        kw = dict(activation="gelu")
    elif change == "a offset 16 bytes":  # same metadata and alignment: the same key
        buf = torch.empty(64 * 256 + 16, dtype=fp8.E4M3)
        a = buf[16:].view(64, 256).copy_(a)
    before = len(eager.prepared)
    y = gemmlab.scaled_mm(a, b, sa, sb, **kw)
    assert len(eager.prepared) == before + (change != "a offset 16 bytes")
    assert eager.runs[-1]["a"] is a and eager.runs[-1]["sa"] is sa
    want = _ref(a, b, sa, sb, kw.get("bias"), kw.get("activation"))
    assert y.dtype == kw.get("out_dtype", BF16) and torch.allclose(y.double(), want.to(y.dtype).double())


def test_eager_calls_read_the_current_stream_every_call(eager, monkeypatch):
    a, b, sa, sb = _ops(block=True)
    for stream in (3, 5, 3):
        monkeypatch.setattr(ops, "_stream", lambda dev, s=stream: s)
        gemmlab.scaled_mm(a, b, sa, sb)
    assert [r["stream"] for r in eager.runs] == [3, 5, 3] and len(eager.prepared) == 1


@pytest.mark.parametrize("block", [False, True])
def test_eager_result_equals_the_ops_and_gemms(eager, block):
    a, b, sa, sb = _ops(M=77, N=384, K=256, block=block)
    bias = torch.randn(384).to(BF16)
    y = gemmlab.scaled_mm(a, b, sa, sb, bias=bias, activation="silu")
    by_op = torch.ops.gemmlab.scaled_mm(a, b, sa, sb, bias, None, "silu")
    by_gemm = fp8.gemm(a, b, sa, sb, bias=bias, activation="silu")  # launch_fp8, the plan made anew
    assert torch.equal(y, by_op) and torch.equal(y, by_gemm)
    assert torch.allclose(y.double(), _ref(a, b, sa, sb, bias, "silu").to(BF16).double())
    assert not eager.op_calls and eager.ran[-1] == eager.prepared[-1]  # the same plan on both paths


def test_modes_the_profiler_and_gradients_take_the_op(eager):
    a, b, sa, sb = _ops()
    with fakes.OpRecorder() as rec:
        gemmlab.scaled_mm(a, b, sa, sb)
    assert any("gemmlab.scaled_mm" in name for name in rec.ops) and len(eager.op_calls) == 1
    with torch.autograd.profiler.profile():
        gemmlab.scaled_mm(a, b, sa, sb)
    assert len(eager.op_calls) == 2
    bias = torch.randn(256, requires_grad=True)
    gemmlab.scaled_mm(a, b, sa, sb, bias=bias)  # the op (it has no backward formula: autograd says so)
    assert len(eager.op_calls) == 3
    with torch.no_grad():
        gemmlab.scaled_mm(a, b, sa, sb, bias=bias)
    assert len(eager.op_calls) == 3  # no gradient wanted: eager


def test_tracing_and_compile_see_the_op(eager):
    from torch.fx.experimental.proxy_tensor import make_fx

    a, b, sa, sb = _ops(block=True)
    g = make_fx(lambda *t: gemmlab.scaled_mm(*t), tracing_mode="fake")(a, b, sa, sb)
    assert [str(n.target) for n in g.graph.nodes if n.op == "call_function"] == ["gemmlab.scaled_mm.default"]
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    y = torch.compile(lambda *t: gemmlab.scaled_mm(*t, out_dtype=FP32) * 2, backend=backend, fullgraph=True)(a, b, sa, sb)
    assert any("scaled_mm" in str(n.target) for n in graphs[-1].graph.nodes)
    assert torch.allclose(y.double(), 2 * _ref(a, b, sa, sb))


@pytest.mark.parametrize("make,exc,match", BAD, ids=[m for _, _, m in BAD])
def test_eager_bad_input_raises_as_before_and_prepares_nothing(eager, make, exc, match):
    a, b, sa, sb, kw = make(*_ops())
    with pytest.raises(exc, match=match):
        gemmlab.scaled_mm(a, b, sa, sb, **kw)
    assert not fp8._PREPARED and not eager.prepared


def test_eager_misaligned_operand_is_refused_after_an_aligned_call(eager):
    a, b, sa, sb = _ops()
    gemmlab.scaled_mm(a, b, sa, sb)
    buf = torch.empty(64 * 256 + 1, dtype=fp8.E4M3)
    with pytest.raises(UnsupportedProblem, match="16-byte aligned"):
        gemmlab.scaled_mm(buf[1:].view(64, 256), b, sa, sb)
    assert len(eager.prepared) == 1


def test_eager_empty_and_k0_launch_nothing(eager):
    a, b, sa, sb = _ops(M=64, N=128, K=128)
    assert gemmlab.scaled_mm(a[:0], b, sa, sb).shape == (0, 128)
    y = gemmlab.scaled_mm(a[:, :0], b[:0], sa, sb, bias=torch.ones(128), activation="relu")
    assert torch.equal(y, torch.ones(64, 128, dtype=BF16))
    assert not eager.prepared and not eager.ran and not eager.op_calls


def test_prepared_calls_start_over_past_the_bound(eager, monkeypatch):
    monkeypatch.setattr(fp8, "MAX_PREPARED", 2)
    a, b, sa, sb = _ops(M=64)
    for M in (8, 16, 24):
        gemmlab.scaled_mm(a[:M], b, sa, sb)
    assert len(fp8._PREPARED) == 1
    gemmlab.scaled_mm(a[:8], b, sa, sb)  # forgotten: prepared again
    assert len(eager.prepared) == 4
