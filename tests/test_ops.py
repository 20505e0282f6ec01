"""gemmlab.matmul / gemmlab.linear and the gemmlab::matmul custom op.

CPU tests (run everywhere): every validation error (exact type and a message fragment), the fake impl
(shapes and dtypes under meta and FakeTensorMode), torch.compile(fullgraph=True) tracing with the fake impl,
opcheck, zero-size results, and the dispatch logic against a fake engine (``ops._load_engine`` and
``ops._check_device`` replaced, so the real impl runs on CPU tensors). GPU tests (``gpu``; ``hopper`` where
the bf16/fp16 engine is needed) check results against a float64 reference on fresh random inputs with
poisoned outputs, torch.compile with inductor, and CUDA-graph capture.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import gemmlab
from gemmlab import matmul_suites, ops
from gemmlab.bench import poison_, rel_error
from gemmlab.errors import GemmlabError, NoGPUError, UnsupportedProblem

from fakes import OpRecorder, act_reference, reference, rnd  # noqa: F401 - on_cpu (conftest) is the fixture built on them

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
TOL = {BF16: 1e-2, FP16: 5e-3, FP32: 1e-3}  # by output dtype (half inputs); fp32 inputs+output: 1e-5


def meta(*shape, dtype=BF16):
    return torch.empty(shape, device="meta", dtype=dtype)


# Validation: every error, on CPU/meta tensors --------------------------------------------------------

def _ok(M=8, N=16, K=32, dtype=BF16):
    return meta(M, K, dtype=dtype), meta(K, N, dtype=dtype)


@pytest.mark.parametrize("kwargs, exc, fragment", [
    (dict(a=[[1.0]]), TypeError, "a must be a torch.Tensor"),
    (dict(b=3.0), TypeError, "b must be a torch.Tensor"),
    (dict(c=[[0.0]], beta=1.0), TypeError, "c must be a torch.Tensor or None"),
    (dict(a=meta(8, 32, dtype=torch.int8)), TypeError, "a has dtype torch.int8"),
    (dict(a=meta(8, 32, dtype=torch.float64), b=meta(32, 16, dtype=torch.float64)), TypeError,
     "a has dtype torch.float64"),
    (dict(b=meta(32, 16, dtype=FP16)), TypeError, "must share one dtype"),
    (dict(b=meta(32, 16, dtype=FP32)), TypeError, "must share one dtype"),
    (dict(out_dtype=torch.float64), TypeError, "out_dtype torch.float64 is not supported"),
    (dict(out_dtype="bf16"), TypeError, "out_dtype must be a torch.dtype"),
    (dict(out_dtype=FP32, out=meta(8, 16, dtype=BF16)), TypeError, "out has dtype torch.bfloat16"),
    (dict(a=meta(2, 8, 32)), UnsupportedProblem, "a has shape (2, 8, 32)"),
    (dict(b=meta(32)), UnsupportedProblem, "b has shape (32,)"),
    (dict(a=meta(8, 31)), UnsupportedProblem, "inner dimensions differ"),
    (dict(alpha=torch.tensor(2.0)), TypeError, "alpha must be a Python number"),
    (dict(beta="1", c=meta(8, 16)), TypeError, "beta must be a Python number"),
    (dict(activation="tanh"), UnsupportedProblem, "unknown activation 'tanh'"),
    (dict(activation=F.relu), TypeError, "activation must be a string"),
    (dict(bias=meta(17)), UnsupportedProblem, "bias must have shape (N,) = (16,)"),
    (dict(bias=meta(1, 16)), UnsupportedProblem, "bias must have shape (N,)"),
    (dict(bias=meta(16, dtype=FP16)), TypeError, "bias must be torch.bfloat16"),
    (dict(c=meta(8, 15), beta=1.0), UnsupportedProblem, "c must have shape (M, N) = (8, 16)"),
    (dict(c=meta(16), beta=1.0), UnsupportedProblem, "c must have shape (M, N)"),
    (dict(c=meta(8, 16, dtype=FP32), beta=1.0), TypeError, "c must have the output's dtype torch.bfloat16"),
    (dict(c=meta(8, 16)), UnsupportedProblem, "c is given but beta=0"),
    (dict(beta=0.5), UnsupportedProblem, "beta=0.5 needs c"),
    (dict(out=meta(16, 8)), UnsupportedProblem, "out must have shape (M, N) = (8, 16)"),
    (dict(a=meta(2**31, 1), b=meta(1, 1)), UnsupportedProblem, "M=2147483648 is too large"),
    (dict(a=meta(1, 2**31), b=meta(2**31, 1)), UnsupportedProblem, "K=2147483648 is too large"),
    (dict(a=meta(2**20, 1), b=meta(1, 2**20)), UnsupportedProblem, "M*N = 1099511627776"),
    (dict(a=torch.empty_strided((2, 32), (2**40, 1), device="meta", dtype=BF16)), UnsupportedProblem,
     "a (shape (2, 32), strides (1099511627776, 1)) spans"),
    (dict(b=torch.zeros(32, 16, dtype=BF16).to_sparse()), UnsupportedProblem, "only dense (strided) tensors"),
    (dict(a=torch.empty(8, 32, dtype=BF16)), UnsupportedProblem, "all tensors must be on one device"),
    (dict(bias=torch.empty(16, dtype=BF16)), UnsupportedProblem, "bias on cpu"),
])
def test_validation_errors(kwargs, exc, fragment):
    a, b = _ok()
    args = dict(a=a, b=b)
    args.update(kwargs)
    with pytest.raises(exc) as info:
        gemmlab.matmul(args.pop("a"), args.pop("b"), **args)
    assert fragment in str(info.value)


def test_unsupported_problem_is_a_value_error_and_dtype_errors_are_type_errors():
    assert issubclass(UnsupportedProblem, ValueError)
    with pytest.raises(ValueError):
        gemmlab.matmul(meta(4, 3), meta(4, 3))
    with pytest.raises(TypeError):
        gemmlab.matmul(meta(4, 3), meta(3, 4, dtype=FP16))


def test_cpu_tensors_without_a_gpu_say_what_is_missing(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(NoGPUError, match="torch sees none.*inputs are on cpu"):
        gemmlab.matmul(torch.rand(4, 8, dtype=BF16), torch.rand(8, 4, dtype=BF16))


def test_cpu_tensors_with_a_gpu_are_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(UnsupportedProblem, match="takes CUDA tensors; the inputs are on cpu"):
        gemmlab.matmul(torch.rand(4, 8), torch.rand(8, 4))


def test_shape_errors_come_before_device_errors():
    """Validation is all metadata: a CPU tensor with a bad shape gets the shape error."""
    with pytest.raises(UnsupportedProblem, match="inner dimensions differ"):
        gemmlab.matmul(torch.rand(4, 8), torch.rand(7, 4))


def test_the_op_validates_when_called_directly():
    with pytest.raises(UnsupportedProblem, match="inner dimensions differ"):
        torch.ops.gemmlab.matmul(meta(4, 8), meta(7, 4), None, None, 1.0, 0.0, None, None)


@pytest.mark.parametrize("call, exc, fragment", [
    (lambda: gemmlab.linear("x", meta(4, 8)), TypeError, "must be torch.Tensors"),
    (lambda: gemmlab.linear(meta(), meta(4, 8)), UnsupportedProblem, "got a scalar"),
    (lambda: gemmlab.linear(meta(3, 8), meta(4, 8, 1)), UnsupportedProblem, "weight must be 2-D (N, K)"),
    (lambda: gemmlab.linear(meta(3, 8), meta(8, 4)), UnsupportedProblem, "x has 8 features"),
    (lambda: gemmlab.linear(meta(3, 8), meta(4, 8), meta(8)), UnsupportedProblem, "bias must have shape (N,)"),
    (lambda: gemmlab.linear(meta(3, 8), meta(4, 8), activation="gelu_erf"), UnsupportedProblem,
     "unknown activation"),
])
def test_linear_errors(call, exc, fragment):
    with pytest.raises(exc) as info:
        call()
    assert fragment in str(info.value)


def test_out_overlapping_an_input_is_refused(on_cpu):
    x = torch.zeros(8, 64, dtype=BF16)
    a, b = x[:, :32], rnd(32, 16)
    with pytest.raises(UnsupportedProblem, match="out overlaps a"):
        gemmlab.matmul(a, b, out=x[:, 32:48])
    w = torch.zeros(64, 16, dtype=BF16)
    with pytest.raises(UnsupportedProblem, match="out overlaps b"):
        gemmlab.matmul(rnd(8, 32), w[:32], out=w[24:32])
    bias_and_out = torch.zeros(9, 16, dtype=BF16)
    with pytest.raises(UnsupportedProblem, match="out overlaps bias"):
        gemmlab.matmul(rnd(8, 32), b, bias=bias_and_out[7], out=bias_and_out[:8])
    c = torch.zeros(9, 16, dtype=BF16)
    with pytest.raises(UnsupportedProblem, match="out overlaps c"):
        gemmlab.matmul(rnd(8, 32), b, c=c[1:], beta=1.0, out=c[:8])
    assert not on_cpu.engine.calls


def test_engine_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(ops, "_check_device", lambda device: None)
    monkeypatch.setitem(__import__("sys").modules, "gemmlab.engine", None)  # import now fails
    monkeypatch.delattr(gemmlab, "engine", raising=False)  # (set once another test imported the engine)
    with pytest.raises(GemmlabError, match="need the Hopper engine"):
        gemmlab.matmul(rnd(4, 8), rnd(8, 4))


def test_non_hopper_gpu_names_what_is_missing(on_cpu):
    on_cpu.engine.reason = "NVIDIA A100 is sm_80, not sm_90"
    with pytest.raises(NoGPUError, match="needs the Hopper .* sm_80, not sm_90.*float32 inputs run on any"):
        gemmlab.matmul(rnd(4, 8), rnd(8, 4))
    # fp32 inputs do not need the engine
    y = gemmlab.matmul(rnd(4, 8, dtype=FP32), rnd(8, 4, dtype=FP32))
    assert y.dtype == FP32 and len(on_cpu.sgemm.calls) == 1


# The fake impl: shapes and dtypes ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, out_dtype, want", [(BF16, None, BF16), (FP16, None, FP16), (BF16, FP32, FP32),
                                                     (FP16, BF16, BF16), (FP32, None, FP32), (FP32, BF16, BF16)])
def test_fake_impl_shape_and_dtype_on_meta(dtype, out_dtype, want):
    y = gemmlab.matmul(meta(33, 65, dtype=dtype), meta(65, 17, dtype=dtype), out_dtype=out_dtype,
                       bias=meta(17, dtype=FP32), activation="silu")
    assert y.shape == (33, 17) and y.dtype == want and y.device.type == "meta" and y.is_contiguous()


def test_fake_impl_under_fake_tensor_mode_on_cuda_tensors():
    """FakeTensorMode makes fake CUDA tensors even without a GPU: the public path runs the fake impl."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(3, 5, 64, device="cuda", dtype=FP16)
        w = torch.empty(48, 64, device="cuda", dtype=FP16)
        bias = torch.empty(48, device="cuda", dtype=FP32)
        y = gemmlab.linear(x, w, bias, activation="gelu_tanh")
        assert y.shape == (3, 5, 48) and y.dtype == FP16 and y.device.type == "cuda"
        x2 = torch.empty(5, 64, device="cuda", dtype=FP16)
        z = gemmlab.matmul(w, x2.t(), out_dtype=FP32, c=torch.empty(48, 5, device="cuda", dtype=FP32), beta=2.0)
        assert z.shape == (48, 5) and z.dtype == FP32
        with pytest.raises(UnsupportedProblem, match="inner dimensions"):
            gemmlab.matmul(w, x2)


def test_linear_shapes_on_meta():
    w = meta(24, 16)
    assert gemmlab.linear(meta(16), w).shape == (24,)
    assert gemmlab.linear(meta(2, 3, 4, 16), w).shape == (2, 3, 4, 24)
    assert gemmlab.linear(meta(0, 5, 16), w).shape == (0, 5, 24)
    assert gemmlab.linear(meta(7, 0), meta(24, 0)).shape == (7, 24)


def test_zero_size_on_meta():
    assert gemmlab.matmul(meta(0, 8), meta(8, 5)).shape == (0, 5)
    assert gemmlab.matmul(meta(4, 8), meta(8, 0)).shape == (4, 0)
    assert gemmlab.matmul(meta(4, 0), meta(0, 5), out_dtype=FP32).shape == (4, 5)


def test_op_schema():
    schema = str(torch.ops.gemmlab.matmul.default._schema)
    assert schema.startswith("gemmlab::matmul(Tensor a, Tensor b, Tensor? bias, str? activation, float alpha, "
                             "float beta, Tensor? c, ScalarType? out_dtype) -> Tensor")


@pytest.mark.parametrize("case", ["plain", "epilogue"])
def test_opcheck_on_cpu_with_a_fake_engine(on_cpu, case):
    """torch.library.opcheck: schema, fake impl vs real impl, autograd registration, AOT dispatch."""
    a, b = rnd(8, 16), rnd(32, 16).t()
    if case == "plain":
        args = (a, b, None, None, 1.0, 0.0, None, None)
    else:
        args = (a, b, rnd(32, dtype=FP32), "gelu", 0.5, 2.0, rnd(8, 32, dtype=FP32), FP32)
    torch.library.opcheck(torch.ops.gemmlab.matmul.default, args)


# torch.compile(fullgraph=True) traces through the op -------------------------------------------------------

def _block(x, w1, w2, bias):
    h = gemmlab.linear(x, w1, bias, activation="silu")
    return gemmlab.matmul(h.reshape(-1, h.shape[-1]), w2.t(), alpha=0.5) + 1


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph_on_meta(dynamic):
    f = torch.compile(_block, fullgraph=True, backend="aot_eager", dynamic=dynamic)
    w1, w2, bias = meta(64, 32), meta(16, 64), meta(64, dtype=FP32)
    assert f(meta(4, 8, 32), w1, w2, bias).shape == (32, 16)
    assert f(meta(3, 5, 32), w1, w2, bias).shape == (15, 16)


def test_compile_fullgraph_out_variant_on_meta():
    def f(a, b, out):
        return gemmlab.matmul(a, b, out=out)

    out = meta(8, 16)
    y = torch.compile(f, fullgraph=True, backend="aot_eager")(meta(8, 32), meta(32, 16), out)
    assert y.shape == (8, 16)


def test_compile_fullgraph_matches_eager_on_cpu(on_cpu):
    """The compiled graph calls the real impl (here with the fake engine) and matches eager exactly."""
    x, w1, w2, bias = rnd(2, 8, 32), rnd(64, 32), rnd(16, 64), rnd(64, dtype=FP32)
    eager = _block(x, w1, w2, bias)
    compiled = torch.compile(_block, fullgraph=True, backend="aot_eager")(x, w1, w2, bias)
    assert torch.equal(eager, compiled)
    assert len(on_cpu.engine.calls) == 4  # the compiled graph launched the op twice, like eager


# Dispatch and epilogue on CPU with the fake engine ----------------------------------------------------------

def test_engine_receives_operands_as_given(on_cpu):
    """No copies on the way: b = w.t() (MN-major) and a transposed view reach the engine as views."""
    w = rnd(48, 64)
    a = rnd(64, 20).t()
    y = gemmlab.matmul(a, w.t(), activation="relu", alpha=2.0)
    call = on_cpu.engine.calls[-1]
    assert call["a"].data_ptr() == a.data_ptr() and call["a"].stride() == a.stride()
    assert call["b"].data_ptr() == w.data_ptr() and call["b"].stride() == (1, 64)
    assert call["activation"] == "relu" and call["alpha"] == 2.0 and call["beta"] == 0.0 and call["c"] is None
    assert rel_error(y, reference(a, w.t(), activation="relu", alpha=2.0)) < 1e-2


def test_noncontiguous_bias_is_made_contiguous(on_cpu):
    bias = rnd(32, 2)[:, 0]
    y = gemmlab.matmul(rnd(4, 8), rnd(8, 32), bias=bias)
    assert on_cpu.engine.calls[-1]["bias"].is_contiguous()
    assert y.shape == (4, 32)


def test_out_is_written_directly_when_dense(on_cpu):
    out = poison_(torch.empty(8, 16, dtype=FP32))
    a, b = rnd(8, 32), rnd(32, 16)
    y = gemmlab.matmul(a, b, out=out)
    assert y is out and on_cpu.engine.calls[-1]["out"] is out
    assert rel_error(out, reference(a, b)) < 1e-6


def test_out_that_is_not_dense_goes_through_a_temporary(on_cpu):
    big = poison_(torch.empty(16, 8, dtype=BF16))
    out = big.t()  # (8, 16), column-major
    a, b = rnd(8, 32), rnd(32, 16)
    assert gemmlab.matmul(a, b, out=out) is out
    assert on_cpu.engine.calls[-1]["out"] is not out
    assert rel_error(out, reference(a, b)) < 1e-2


def test_out_equal_to_c_accumulates_in_place(on_cpu):
    a, b, c = rnd(8, 32), rnd(32, 16), rnd(8, 16)
    want = reference(a, b, c=c, beta=-1.0)
    assert gemmlab.matmul(a, b, c=c, beta=-1.0, out=c) is c
    assert rel_error(c, want) < 1e-2


@pytest.mark.parametrize("out_dtype", [BF16, FP16, FP32])
def test_fp32_route_applies_epilogue_in_torch(on_cpu, out_dtype):
    a, b = rnd(20, 12, dtype=FP32).t(), rnd(33, 20, dtype=FP32).t()  # both transposed: made contiguous
    c = rnd(12, 33, dtype=out_dtype)
    bias = rnd(33, dtype=FP32)
    y = gemmlab.matmul(a, b, bias=bias, activation="gelu", alpha=0.5, beta=2.0, c=c, out_dtype=out_dtype)
    assert y.dtype == out_dtype and not on_cpu.engine.calls
    assert on_cpu.sgemm.calls == [dict(alpha=0.5, beta=2.0)]
    want = reference(a, b, bias=bias, activation="gelu", alpha=0.5, beta=2.0, c=c)
    assert rel_error(y, want) < (1e-6 if out_dtype == FP32 else TOL[out_dtype])


def test_scalars_of_any_real_type_are_accepted(on_cpu):
    import numpy as np

    a, b, c = rnd(4, 8, dtype=FP32), rnd(8, 4, dtype=FP32), rnd(4, 4, dtype=FP32)
    y = gemmlab.matmul(a, b, alpha=np.float32(0.5), beta=2, c=c)
    assert on_cpu.sgemm.calls == [dict(alpha=0.5, beta=2.0)]
    assert rel_error(y, reference(a, b, alpha=0.5, beta=2.0, c=c)) < 1e-6
    with pytest.raises(TypeError, match="alpha must be a Python number"):
        gemmlab.matmul(a, b, alpha=True)


def test_fp32_route_without_c_passes_beta_zero(on_cpu):
    gemmlab.matmul(rnd(4, 8, dtype=FP32), rnd(8, 4, dtype=FP32))
    assert on_cpu.sgemm.calls == [dict(alpha=1.0, beta=0.0)]


# The eager path: prepared calls, keyed on metadata (CPU, fake engine) -------------------------------------

@pytest.fixture
def eager_cpu(on_cpu, monkeypatch):
    """on_cpu, and CPU tensors take the eager path (as CUDA tensors do)."""
    monkeypatch.setattr(ops, "_fast_device", lambda a: True)
    return on_cpu


def test_eager_calls_prepare_once_and_follow_each_calls_tensors(eager_cpu):
    eng = eager_cpu.engine
    for i in range(4):
        a, w, bias = rnd(8, 32), rnd(16, 32), rnd(16)
        y = gemmlab.matmul(a, w.t(), bias=bias, activation="silu", alpha=0.5 + i)
        assert rel_error(y, reference(a, w.t(), bias=bias, activation="silu", alpha=0.5 + i)) < TOL[BF16]
        assert eng.calls[-1]["a"] is a and eng.calls[-1]["alpha"] == 0.5 + i
    assert len(eng.prepared) == 1 and len(eng.calls) == 4


@pytest.mark.parametrize("change", ["shape", "b transposed", "dtype", "misaligned a", "bias", "bias dtype",
                                    "activation", "c", "out_dtype", "out", "out strided"])
def test_eager_calls_prepare_again_when_metadata_changes(eager_cpu, change):
    """Anything the launch depends on is in the key: a changed call never runs a stale preparation."""
    eng = eager_cpu.engine
    a, b = rnd(8, 32), rnd(32, 16)
    gemmlab.matmul(a, b)
    kw, dtype = {}, BF16
    if change == "shape":
        a = rnd(9, 32)
    elif change == "b transposed":
        b = rnd(16, 32).t()
    elif change == "dtype":
        a, b, dtype = a.to(FP16), b.to(FP16), FP16
    elif change == "misaligned a":  # same shape and strides, data pointer off 16 bytes
        a = rnd(8 * 32 + 1)[1:].view(8, 32)
    elif change == "bias":
        kw = dict(bias=rnd(16))
    elif change == "bias dtype":
        gemmlab.matmul(a, b, bias=rnd(16))
        kw = dict(bias=rnd(16, dtype=FP32))
    elif change == "activation":
        kw = dict(activation="relu")
    elif change == "c":
        kw = dict(c=rnd(8, 16), beta=2.0)
    elif change == "out_dtype":
        kw = dict(out_dtype=FP32)
    elif change == "out":
        kw = dict(out=poison_(torch.empty(8, 16, dtype=BF16)))
    elif change == "out strided":
        gemmlab.matmul(a, b, out=poison_(torch.empty(8, 16, dtype=BF16)))
        kw = dict(out=poison_(torch.empty(16, 8, dtype=BF16)).t())
    before = len(eng.prepared)
    y = gemmlab.matmul(a, b, **kw)
    assert len(eng.prepared) == before + 1
    want = reference(a, b, **{k: v for k, v in kw.items() if k not in ("out", "out_dtype")})
    assert rel_error(y, want) < TOL[kw.get("out_dtype", dtype)]
    if "out" in kw:
        assert y is kw["out"]


def test_eager_calls_read_the_current_stream_every_call(eager_cpu, monkeypatch):
    a, b = rnd(8, 32), rnd(32, 16)
    for stream in (3, 5, 3):
        monkeypatch.setattr(ops, "_stream", lambda dev, s=stream: s)
        gemmlab.matmul(a, b)
    assert eager_cpu.engine.streams == [3, 5, 3] and len(eager_cpu.engine.prepared) == 1


def test_a_saved_tuned_plan_empties_the_prepared_calls(eager_cpu, monkeypatch):
    from gemmlab import engine, tuned

    a, b = rnd(8, 32), rnd(32, 16)
    gemmlab.matmul(a, b)
    gemmlab.matmul(a, b)
    assert len(eager_cpu.engine.prepared) == 1
    monkeypatch.setattr(tuned, "SAVES", tuned.SAVES + 1)  # a save in this process: seen at once
    gemmlab.matmul(a, b)
    assert len(eager_cpu.engine.prepared) == 2
    stamp = engine.tuned_plans_stamp()
    monkeypatch.setattr(engine, "tuned_plans_stamp", lambda: stamp + (("another process saved", 1),))
    gemmlab.matmul(a, b)  # another process's save: seen at the next watch, not on every call
    assert len(eager_cpu.engine.prepared) == 2
    monkeypatch.setattr(ops._CALLS, "next_watch", 0.0)
    gemmlab.matmul(a, b)
    assert len(eager_cpu.engine.prepared) == 3


def test_eager_out_is_checked_for_overlap_on_every_call(eager_cpu):
    a, b = rnd(8, 32), rnd(32, 16)
    gemmlab.matmul(a, b, out=torch.empty(8, 16, dtype=BF16))
    buf = rnd(8 * 32)
    with pytest.raises(UnsupportedProblem, match="out overlaps a"):
        gemmlab.matmul(buf.view(8, 32), b, out=buf[:128].view(8, 16))


@pytest.mark.parametrize("make_out", [
    lambda: torch.empty(16, dtype=BF16).expand(8, 16),  # every row the same memory
    lambda: torch.empty(8, dtype=BF16)[:, None].expand(8, 16),
    lambda: torch.empty(64, dtype=BF16).as_strided((8, 16), (4, 1)),  # rows step inside each other
])
def test_out_that_overlaps_itself_is_refused_before_any_work(on_cpu, make_out):
    with pytest.raises(UnsupportedProblem, match="overlaps itself"):
        gemmlab.matmul(rnd(8, 32), rnd(32, 16), out=make_out())
    assert not on_cpu.engine.calls


def test_an_empty_out_with_zero_strides_is_no_overlap(on_cpu):
    """(M, 0) with stride (0, 1), as expand and empty views make: no elements, so nothing overlaps (the
    H200 fuzz soak found this refused, sha 704c78e)."""
    out = torch.empty(0, dtype=BF16).as_strided((18, 0), (0, 1))
    y = gemmlab.matmul(rnd(18, 34), rnd(34, 0), out=out)
    assert y is out and y.shape == (18, 0)


def test_out_views_that_do_not_overlap_are_accepted(on_cpu):
    big = poison_(torch.empty(16, 40, dtype=BF16))
    for out in (big[:8, :16], big.t()[:16, :8].t(), big[::2, ::2][:, :16]):
        a, b = rnd(8, 32), rnd(32, 16)
        assert gemmlab.matmul(a, b, out=out) is out
        assert rel_error(out, reference(a, b)) < TOL[BF16]


def test_eager_bad_input_raises_and_prepares_nothing(eager_cpu):
    with pytest.raises(UnsupportedProblem, match="inner dimensions differ"):
        gemmlab.matmul(rnd(8, 31), rnd(32, 16))
    with pytest.raises(TypeError, match="activation must be a string"):
        gemmlab.matmul(rnd(8, 32), rnd(32, 16), activation=["relu"])
    assert not eager_cpu.engine.prepared and not ops._CALLS.calls


def test_autograd_and_dispatch_modes_take_the_op(eager_cpu):
    """What must see the op (a dispatch mode) never takes the eager path; a call that needs a gradient
    takes it inside gemmlab.autograd's Function (the op's backward formula)."""
    a, b = rnd(8, 32), rnd(32, 16)
    with OpRecorder() as rec:
        gemmlab.matmul(a, b)
    assert any("gemmlab.matmul" in name for name in rec.ops)
    y = gemmlab.matmul(a.requires_grad_(), b)
    assert type(y.grad_fn).__name__ == "_EagerMatmulBackward"


@pytest.mark.parametrize("activation", [None, *ops.ACTIVATIONS])
def test_activations_match_torch(activation):
    x = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    assert torch.allclose(ops._activate_(x.clone(), activation), act_reference(x, activation))


def test_linear_matches_f_linear_and_flattens_without_copy(on_cpu):
    x, w, bias = rnd(2, 3, 32), rnd(16, 32), rnd(16)
    y = gemmlab.linear(x, w, bias, activation="silu")
    assert y.shape == (2, 3, 16)
    assert on_cpu.engine.calls[-1]["a"].data_ptr() == x.data_ptr()  # reshape was a view
    want = F.silu(F.linear(x.double(), w.double(), bias.double()))
    assert rel_error(y, want) < 1e-2


# gemmlab.linear's fast path: keyed on x's and the weight's metadata (CPU, fake engine) --------------------------

def _linear_entries() -> int:
    return sum(type(v).__name__ == "_Linear" for v in ops._CALLS.calls.values())


def test_linear_fast_path_follows_fresh_inputs(eager_cpu):
    """Fresh x every call (new data pointers, the model's pattern): one preparation, one fast-path entry,
    every result right, and the engine sees each call's own tensors."""
    eng = eager_cpu.engine
    w = torch.nn.Parameter(rnd(16, 32))
    for i in range(4):
        x = rnd(2, 3, 32)
        with torch.no_grad():
            y = gemmlab.linear(x, w, activation="relu")
        assert y.shape == (2, 3, 16)
        assert rel_error(y, F.relu(F.linear(x.double(), w.detach().double()))) < TOL[BF16]
        assert eng.calls[-1]["a"].data_ptr() == x.data_ptr() and eng.calls[-1]["b"].data_ptr() == w.data_ptr()
    assert len(eng.prepared) == 1 and len(eng.calls) == 4 and _linear_entries() == 1


@pytest.mark.parametrize("change", ["shape", "x strided", "x misaligned", "dtype", "weight layout",
                                    "weight misaligned", "bias", "activation", "x 2-D", "x 1-D"])
def test_linear_fast_path_prepares_again_when_metadata_changes(eager_cpu, change):
    """A fast-path hit needs the same metadata as the call that stored it: any change is a new key, which
    the general path validates and prepares (and whose result is right)."""
    eng = eager_cpu.engine
    x, w, bias, act = rnd(2, 3, 32), rnd(16, 32), None, None
    gemmlab.linear(x, w)
    if change == "shape":
        x = rnd(2, 4, 32)
    elif change == "x strided":  # still flattens to a view: rows 48 elements apart
        x = rnd(2, 3, 48)[:, :, :32]
    elif change == "x misaligned":  # same shape and strides, data pointer off 16 bytes
        x = rnd(2 * 3 * 32 + 1)[1:].view(2, 3, 32)
    elif change == "dtype":
        x, w = x.to(FP16), w.to(FP16)
    elif change == "weight layout":  # same (N, K) shape, column-major
        w = rnd(32, 16).t()
    elif change == "weight misaligned":
        w = rnd(16 * 32 + 1)[1:].view(16, 32)
    elif change == "bias":
        bias = rnd(16)
    elif change == "activation":
        act = "gelu"
    elif change == "x 2-D":
        x = rnd(6, 32)
    elif change == "x 1-D":
        x = rnd(32)
    before, entries = len(eng.prepared), _linear_entries()
    for _ in range(2):  # the second call is a fast-path hit on the new key
        y = gemmlab.linear(x, w, bias, activation=act)
    # (6, 32) is what (2, 3, 32) flattened to: a new key for the same prepared call
    assert len(eng.prepared) == before + (change != "x 2-D") and _linear_entries() == entries + 1
    assert y.shape == (*x.shape[:-1], 16)
    want = act_reference(F.linear(x.double(), w.double(), None if bias is None else bias.double()), act)
    assert rel_error(y, want) < TOL[x.dtype]


def test_linear_fast_path_when_weight_data_is_replaced(eager_cpu):
    """A Parameter whose ``.data`` is replaced (same object, another layout) is a new key, not a stale call."""
    eng = eager_cpu.engine
    w = torch.nn.Parameter(rnd(16, 32))
    x = rnd(4, 32)
    with torch.no_grad():
        gemmlab.linear(x, w)
        w.data = rnd(32, 16).t()
        y = gemmlab.linear(x, w)
    assert len(eng.prepared) == 2 and eng.prepared[-1]["strides"][1] == (16, 1)
    assert rel_error(y, F.linear(x.double(), w.detach().double())) < TOL[BF16]


def test_linear_input_that_reshape_copies_is_never_a_fast_path_key(eager_cpu):
    """x whose leading dimensions cannot be flattened by a view (a transpose): each call flattens with a
    copy on the general path; no fast-path key is stored, and results stay right."""
    eng = eager_cpu.engine
    w = rnd(16, 32)
    for _ in range(3):
        x = rnd(3, 2, 32).transpose(0, 1)
        y = gemmlab.linear(x, w)
        assert rel_error(y, F.linear(x.double(), w.double())) < TOL[BF16]
    assert _linear_entries() == 0 and len(eng.prepared) == 1


def test_linear_bad_input_stores_no_fast_path_key(eager_cpu):
    """A key is stored only after the general path validated and ran the call: bad input raises every time."""
    w = rnd(16, 32)
    for _ in range(2):
        with pytest.raises(UnsupportedProblem, match="features"):
            gemmlab.linear(rnd(2, 3, 31), w)
        with pytest.raises(TypeError, match="must share one dtype"):
            gemmlab.linear(rnd(2, 3, 32, dtype=FP16), w)
        with pytest.raises(UnsupportedProblem, match="unknown activation"):
            gemmlab.linear(rnd(2, 3, 32), w, activation="tanh")
    assert not ops._CALLS.calls and not eager_cpu.engine.prepared


def test_linear_fast_path_steps_aside_for_modes_and_gradients(eager_cpu):
    """After a key is stored: a dispatch mode still sees the op; a call needing a gradient runs inside
    gemmlab.autograd's Function and its gradients match torch's."""
    x, w = rnd(2, 3, 32), torch.nn.Parameter(rnd(16, 32))
    with torch.no_grad():
        gemmlab.linear(x, w)
        gemmlab.linear(x, w)
        with OpRecorder() as rec:
            gemmlab.linear(x, w)
    assert any("gemmlab.matmul" in name for name in rec.ops)
    xg = x.clone().requires_grad_()
    y = gemmlab.linear(xg, w)
    # x and the weight go into the Function as they are: no view nodes around it (autograd._EagerLinear)
    assert type(y.grad_fn).__name__ == "_EagerLinearBackward" and y.shape == (2, 3, 16)
    g = rnd(2, 3, 16)
    y.backward(g)
    x64, w64 = x.double().requires_grad_(), w.detach().double().requires_grad_()
    want = torch.autograd.grad(F.linear(x64, w64), (x64, w64), g.double())
    assert rel_error(xg.grad, want[0]) < 1.5e-2 and rel_error(w.grad, want[1]) < 1.5e-2
    assert w.grad.stride() == (32, 1)  # the weight's gradient in the weight's layout


# Zero-size problems launch nothing -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [BF16, FP32])
def test_zero_m_or_n_returns_empty(on_cpu, dtype):
    assert gemmlab.matmul(rnd(0, 8, dtype=dtype), rnd(8, 5, dtype=dtype)).shape == (0, 5)
    y = gemmlab.matmul(rnd(4, 8, dtype=dtype), rnd(8, 0, dtype=dtype), bias=rnd(0, dtype=dtype), out_dtype=FP16)
    assert y.shape == (4, 0) and y.dtype == FP16
    assert not on_cpu.engine.calls and not on_cpu.sgemm.calls


@pytest.mark.parametrize("dtype", [BF16, FP16, FP32])
@pytest.mark.parametrize("activation", [None, "relu", "silu"])
def test_zero_k_is_the_epilogue_of_beta_c_plus_bias(on_cpu, dtype, activation):
    M, N = 6, 10
    a, b = rnd(M, 0, dtype=dtype), rnd(0, N, dtype=dtype)
    assert torch.equal(gemmlab.matmul(a, b, out_dtype=FP32), torch.zeros(M, N))
    c, bias = rnd(M, N, dtype=FP32), rnd(N, dtype=dtype)
    y = gemmlab.matmul(a, b, c=c, beta=-0.5, bias=bias, activation=activation, out_dtype=FP32)
    want = act_reference(-0.5 * c.double() + bias.double(), activation)
    assert torch.allclose(y.double(), want, atol=1e-6)
    out = poison_(torch.empty(M, N, dtype=dtype))
    assert gemmlab.matmul(a, b, bias=bias, activation=activation, out=out) is out
    assert rel_error(out, act_reference(bias.double().expand(M, N), activation)) < TOL[dtype]
    assert not on_cpu.engine.calls and not on_cpu.sgemm.calls


# Suites ---------------------------------------------------------------------------------------------------------

def test_matmul_suites():
    assert set(matmul_suites.SUITES) >= {"square", "llm", "decode", "unaligned", "epilogue"}
    llm = matmul_suites.suite("llm")
    assert {c.M for c in llm} == {1, 16, 64, 128, 512, 2048, 8192, 16384}
    assert (16384, 28672, 8192) in {c.shape for c in llm}  # 70B gate/up prefill
    assert (1, 4096, 14336) in {c.shape for c in llm}  # 8B down decode
    assert all(c.M <= 128 for c in matmul_suites.suite("decode"))
    assert (4096, 4096, 4095) in {c.shape for c in matmul_suites.suite("unaligned")}
    assert all(c.activation in ops.ACTIVATIONS for c in matmul_suites.suite("epilogue"))
    with pytest.raises(KeyError, match="known: square"):
        matmul_suites.suite("nope")


# GPU: correctness against float64, poisoned outputs ------------------------------------------------------------

gpu = pytest.mark.gpu

LAYOUTS = {  # name: (a row-major?, b row-major?); b col-major is w.t() of an (N, K) weight
    "TN": (True, False),   # a (M,K) row-major, b = w.t(): nn.Linear, what the ladder calls TN
    "NN": (True, True),    # b (K,N) row-major
    "NT": (False, True),   # a = x.t() of a (K,M) tensor
    "TT": (False, False),
}
SHAPES = [(1, 1, 1), (17, 33, 65), (1000, 1001, 999), (4095, 4095, 4095), (4096, 4096, 4096)]


def make(M, N, K, dtype, layout="TN", gen=None, device="cuda"):
    a_row, b_row = LAYOUTS[layout]
    a = rnd(M, K, dtype=dtype, device=device, gen=gen) if a_row else rnd(K, M, dtype=dtype, device=device, gen=gen).t()
    b = rnd(K, N, dtype=dtype, device=device, gen=gen) if b_row else rnd(N, K, dtype=dtype, device=device, gen=gen).t()
    return a, b


@pytest.fixture
def gen():
    return torch.Generator(device="cuda").manual_seed(20251201)


def poison_allocator(nbytes: int) -> None:
    """Leave NaN bytes (0xFF..) in the caching allocator, so an output the op allocates next starts as NaN."""
    poison = torch.empty(nbytes + 4096, dtype=torch.uint8, device="cuda").fill_(0xFF)
    del poison


def check(y, want, dtype):
    err = rel_error(y, want)
    assert err <= TOL[dtype], f"relative error {err:.3e} > {TOL[dtype]}"


@pytest.mark.parametrize("M, N, K", SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", [BF16, FP16])
@pytest.mark.gpu
@pytest.mark.hopper
def test_gpu_layouts_and_ragged_shapes(M, N, K, layout, dtype, gen):
    a, b = make(M, N, K, dtype, layout, gen)
    want = reference(a, b)
    poison_allocator(M * N * 2)
    check(gemmlab.matmul(a, b), want, dtype)
    out = poison_(torch.empty(M, N, device="cuda", dtype=dtype))
    assert gemmlab.matmul(a, b, out=out) is out
    check(out, want, dtype)


@pytest.mark.parametrize("M, N, K", [(1, 4096, 14336), (16, 14336, 4096), (128, 1024, 8192), (64, 4095, 4097),
                                     (8191, 257, 129)], ids=lambda v: str(v))
@pytest.mark.gpu
@pytest.mark.hopper
def test_gpu_decode_and_skinny_shapes(M, N, K, gen):
    a, b = make(M, N, K, BF16, "TN", gen)
    poison_allocator(M * N * 2)
    check(gemmlab.matmul(a, b), reference(a, b), BF16)


@pytest.mark.parametrize("dtype", [BF16, FP16])
@pytest.mark.gpu
@pytest.mark.hopper
def test_gpu_unaligned_views_and_pointers(dtype, gen):
    """Leading dimensions not a multiple of 8 and data pointers off 16-byte alignment."""
    M, N, K = 300, 200, 130
    a = rnd(M, K + 3, dtype=dtype, device="cuda", gen=gen)[:, 1:K + 1]
    w = rnd(N, K + 5, dtype=dtype, device="cuda", gen=gen)[:, 3:K + 3]
    out = poison_(torch.empty(M * N + 1, device="cuda", dtype=dtype))[1:].view(M, N)
    assert a.data_ptr() % 16 and w.data_ptr() % 16 and out.data_ptr() % 16
    gemmlab.matmul(a, w.t(), out=out)
    check(out, reference(a, w.t()), dtype)


@pytest.mark.parametrize("activation", [None, *ops.ACTIVATIONS])
@pytest.mark.parametrize("bias_dtype", ["input", FP32, None])
@pytest.mark.parametrize("dtype", [BF16, FP16])
@pytest.mark.gpu
@pytest.mark.hopper
def test_gpu_epilogue(activation, bias_dtype, dtype, gen):
    M, N, K = 333, 520, 264
    a, b = make(M, N, K, dtype, "TN", gen)
    bias = None if bias_dtype is None else rnd(N, dtype=dtype if bias_dtype == "input" else FP32, device="cuda",
                                               gen=gen)
    poison_allocator(M * N * 2)
    check(gemmlab.matmul(a, b, bias=bias, activation=activation), reference(a, b, bias=bias, activation=activation),
          dtype)


@pytest.mark.parametrize("c_layout", ["row", "col"])
@pytest.mark.parametrize("out_dtype", [BF16, FP16, FP32])
@pytest.mark.parametrize("dtype", [BF16, FP16])
@pytest.mark.gpu
@pytest.mark.hopper
def test_gpu_alpha_beta_c_and_out_dtype(c_layout, out_dtype, dtype, gen):
    M, N, K = 257, 300, 190
    a, b = make(M, N, K, dtype, "NN", gen)
    c = rnd(M, N, dtype=out_dtype, device="cuda", gen=gen)
    if c_layout == "col":
        c = c.t().contiguous().t()
    bias = rnd(N, dtype=FP32, device="cuda", gen=gen)
    want = reference(a, b, alpha=0.75, beta=-1.5, c=c, bias=bias, activation="silu")
    poison_allocator(M * N * 4)
    y = gemmlab.matmul(a, b, alpha=0.75, beta=-1.5, c=c, bias=bias, activation="silu", out_dtype=out_dtype)
    assert y.dtype == out_dtype
    check(y, want, out_dtype)
    assert gemmlab.matmul(a, b, alpha=0.75, beta=-1.5, c=c, bias=bias, activation="silu", out=c) is c
    check(c, want, out_dtype)


@pytest.mark.gpu
@pytest.mark.hopper
def test_gpu_linear_3d(gen):
    x = rnd(4, 33, 96, dtype=BF16, device="cuda", gen=gen)
    w, bias = rnd(80, 96, dtype=BF16, device="cuda", gen=gen), rnd(80, dtype=BF16, device="cuda", gen=gen)
    y = gemmlab.linear(x, w, bias, activation="gelu")
    assert y.shape == (4, 33, 80)
    check(y, F.gelu(F.linear(x.double(), w.double(), bias.double())), BF16)
    check(gemmlab.linear(x[:, ::2], w), F.linear(x[:, ::2].double(), w.double()), BF16)  # non-viewable: one copy


@pytest.mark.parametrize("shape, N", [((16, 1, 2048), 2048), ((2, 300, 512), 1000), ((3, 7, 96), 32000)],
                         ids=lambda v: str(v))
@pytest.mark.gpu
@pytest.mark.hopper
def test_gpu_linear_fast_path_follows_fresh_inputs(shape, N, gen):
    """gemmlab.linear's fast path on the real kernels (decode, h11): fresh inputs every call, a strided x
    that still flattens by a view, a misaligned x, a side stream, and forward + backward with grad."""
    K = shape[-1]
    w = torch.nn.Parameter(rnd(N, K, dtype=BF16, device="cuda", gen=gen))
    wd = w.detach().double()
    xs = [rnd(*shape, dtype=BF16, device="cuda", gen=gen) for _ in range(3)]
    xs.append(rnd(*shape[:-1], K + 8, dtype=BF16, device="cuda", gen=gen)[..., :K])  # rows K + 8 apart
    xs.append(rnd(math.prod(shape) + 1, dtype=BF16, device="cuda", gen=gen)[1:].view(shape))  # off 2 bytes
    with torch.inference_mode():
        for x in xs + xs:  # the second pass: every key is a fast-path hit
            poison_allocator(math.prod(shape[:-1]) * N * 2)
            check(gemmlab.linear(x, w), F.linear(x.double(), wd), BF16)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y = gemmlab.linear(xs[0], w)
        torch.cuda.current_stream().wait_stream(side)
        check(y, F.linear(xs[0].double(), wd), BF16)
    for x in xs[:2] + xs[:2]:
        x = x.clone().requires_grad_()
        w.grad = None
        g = rnd(*shape[:-1], N, dtype=BF16, device="cuda", gen=gen)
        gemmlab.linear(x, w).backward(g)
        x64, w64 = x.detach().double().requires_grad_(), wd.clone().requires_grad_()
        want = torch.autograd.grad(F.linear(x64, w64), (x64, w64), g.double())
        check(x.grad, want[0], BF16)
        check(w.grad, want[1], BF16)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("M, N, K", [(1, 1, 1), (17, 33, 65), (1000, 1001, 999)], ids=lambda v: str(v))
@gpu
def test_gpu_fp32_route(M, N, K, layout, gen):
    a, b = make(M, N, K, FP32, layout, gen)
    want = reference(a, b)
    poison_allocator(M * N * 4)
    assert rel_error(gemmlab.matmul(a, b), want) <= 1e-5
    c, bias = rnd(M, N, dtype=FP32, device="cuda", gen=gen), rnd(N, dtype=FP32, device="cuda", gen=gen)
    want = reference(a, b, alpha=0.5, beta=2.0, c=c, bias=bias, activation="gelu_tanh")
    y = gemmlab.matmul(a, b, alpha=0.5, beta=2.0, c=c, bias=bias, activation="gelu_tanh")
    assert rel_error(y, want) <= 1e-5
    check(gemmlab.matmul(a, b, out_dtype=BF16), reference(a, b), BF16)


@gpu
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0),
                    reason="checks the non-Hopper message")
def test_gpu_non_hopper_refuses_half_inputs_clearly():
    a = torch.rand(8, 8, device="cuda", dtype=BF16)
    with pytest.raises(NoGPUError, match="needs the Hopper"):
        gemmlab.matmul(a, a)
    assert gemmlab.matmul(a.float(), a.float()).dtype == FP32


@pytest.mark.parametrize("dtype", [BF16, FP32])
@gpu
def test_gpu_zero_sizes(dtype, gen):
    if dtype != FP32 and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs Hopper for bf16")
    assert gemmlab.matmul(*make(0, 5, 8, dtype, gen=gen)).shape == (0, 5)
    assert gemmlab.matmul(*make(5, 0, 8, dtype, gen=gen)).shape == (5, 0)
    a, b = make(6, 10, 0, dtype, gen=gen)
    c, bias = rnd(6, 10, dtype=dtype, device="cuda", gen=gen), rnd(10, dtype=dtype, device="cuda", gen=gen)
    y = gemmlab.matmul(a, b, c=c, beta=2.0, bias=bias, activation="relu")
    assert rel_error(y, F.relu(2.0 * c.double() + bias.double())) <= TOL[BF16]


@gpu
def test_gpu_device_errors():
    a = torch.rand(8, 8, device="cuda")
    with pytest.raises(UnsupportedProblem, match="one device"):
        gemmlab.matmul(a, torch.rand(8, 8))
    with pytest.raises(UnsupportedProblem, match="one device"):
        gemmlab.matmul(a, a, out=torch.empty(8, 8))
    x = torch.rand(8, 16, device="cuda")
    with pytest.raises(UnsupportedProblem, match="out overlaps a"):
        gemmlab.matmul(x[:, :8], a, out=x[:, 8:])


@pytest.mark.parametrize("dtype", [BF16, FP32])
@gpu
def test_gpu_torch_compile_inductor_matches_eager(dtype, gen):
    if dtype != FP32 and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs Hopper for bf16")

    def f(x, w, bias):
        h = gemmlab.linear(x, w, bias, activation="silu")
        return h * 2 + 1

    x = rnd(2, 100, 64, dtype=dtype, device="cuda", gen=gen)
    w, bias = rnd(96, 64, dtype=dtype, device="cuda", gen=gen), rnd(96, dtype=dtype, device="cuda", gen=gen)
    eager = f(x, w, bias)
    compiled = torch.compile(f, fullgraph=True)(x, w, bias)
    assert torch.allclose(compiled.float(), eager.float(), rtol=1e-2, atol=1e-2)
    err = rel_error(compiled, F.silu(F.linear(x.double(), w.double(), bias.double())) * 2 + 1)
    assert err <= (1e-5 if dtype == FP32 else TOL[dtype])


@pytest.mark.parametrize("dtype", [BF16, FP32])
@gpu
def test_gpu_cuda_graph_capture_replays_like_eager(dtype, gen):
    if dtype != FP32 and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs Hopper for bf16")
    M, N, K = 300, 264, 200
    a, b = make(M, N, K, dtype, "TN", gen)
    bias = rnd(N, dtype=dtype, device="cuda", gen=gen)
    out = torch.empty(M, N, device="cuda", dtype=dtype)

    def step():
        y = gemmlab.matmul(a, b, bias=bias, activation="gelu")
        gemmlab.matmul(a, b, out=out)
        return y

    side = torch.cuda.Stream()  # warm-up compiles and loads the kernels outside capture
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = step()
    a.copy_(rnd(M, K, dtype=dtype, device="cuda", gen=gen))  # new inputs, same buffers
    poison_(out)
    g.replay()
    torch.cuda.synchronize()
    tol = 1e-5 if dtype == FP32 else TOL[dtype]
    assert rel_error(y, reference(a, b, bias=bias, activation="gelu")) <= tol
    assert rel_error(out, reference(a, b)) <= tol
    eager = gemmlab.matmul(a, b, bias=bias, activation="gelu")
    assert torch.equal(eager, y)


@pytest.mark.parametrize("M, N, K", [(16, 4096, 4096), (24, 14336, 4096), (300, 1000, 512), (64, 1024, 8192),
                                     (2048, 1024, 4096), (100, 4095, 4095)], ids=lambda v: str(v))
@pytest.mark.gpu
@pytest.mark.hopper
def test_gpu_prepared_calls_never_reuse_stale_state(M, N, K, gen):
    """The eager path keeps one prepared launch per metadata key (decode, h11, split-K, copies of unaligned
    operands): new tensors every call, another stream, then another layout and dtype under the same
    shape each give their own correct result."""
    for dtype in (BF16, FP16):
        for _ in range(3):  # one key, new pointers (the descriptors' addresses must follow)
            a, b = make(M, N, K, dtype, "TN", gen)
            bias = rnd(N, dtype=dtype, device="cuda", gen=gen)
            want = reference(a, b, bias=bias, activation="gelu", alpha=0.5)
            poison_allocator(M * N * 2)
            check(gemmlab.matmul(a, b, bias=bias, activation="gelu", alpha=0.5), want, dtype)
        side = torch.cuda.Stream()
        a, b = make(M, N, K, dtype, "TN", gen)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y = gemmlab.matmul(a, b)
        torch.cuda.current_stream().wait_stream(side)
        check(y, reference(a, b), dtype)
        for layout in ("NN", "NT"):
            a, b = make(M, N, K, dtype, layout, gen)
            check(gemmlab.matmul(a, b), reference(a, b), dtype)


@pytest.mark.gpu
@pytest.mark.hopper
def test_gpu_prepared_calls_from_several_threads(gen):
    """Threads sharing prepared launches: each call's own tensors, no mixed-up parameters."""
    import threading

    M, N, K = 16, 4096, 4096
    a_s = [make(M, N, K, BF16, "TN", gen) for _ in range(4)]
    wants = [reference(a, b) for a, b in a_s]
    errors: list = []

    def work(i: int) -> None:
        try:
            for _ in range(20):
                a, b = a_s[i]
                y = gemmlab.matmul(a, b)
                torch.cuda.current_stream().synchronize()
                err = rel_error(y, wants[i])
                if not err <= TOL[BF16]:
                    errors.append((i, err))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@pytest.mark.gpu
@pytest.mark.hopper
def test_gpu_opcheck_with_the_engine(gen):
    a, b = make(64, 48, 32, BF16, "TN", gen)
    bias, c = rnd(48, dtype=FP32, device="cuda", gen=gen), rnd(64, 48, dtype=FP32, device="cuda", gen=gen)
    torch.library.opcheck(torch.ops.gemmlab.matmul.default, (a, b, bias, "gelu_tanh", 0.5, 2.0, c, FP32))


@pytest.mark.gpu
@pytest.mark.hopper
def test_gpu_debug_log_names_the_route_and_plan_once_per_key(caplog, gen):
    """GEMMLAB_LOG=debug (the gemmlab logger at DEBUG) says which kernel and plan a call runs when it is
    prepared, and a repeated call logs nothing (it prepares nothing)."""
    import logging

    a, b = make(777, 1000, 512, BF16, "TN", gen)
    x, w = make(7, 2056, 3080, BF16, "TN", gen)  # shapes no other test prepares
    with caplog.at_level(logging.DEBUG, logger="gemmlab"):
        gemmlab.matmul(a, b)
        gemmlab.matmul(x, w)
        first = caplog.text
        caplog.clear()
        gemmlab.matmul(a, b)
    said = {"engine": ("engine kernel Plan(",), "h11": ("h11 BN=",), "decode": ("decode kernel", "decode plan")}
    for (M, N, K) in ((777, 1000, 512), (7, 2056, 3080)):
        kernel = gemmlab.plan(M, N, K).kernel  # the route matmul took (the same function decides)
        assert f"matmul {M}x{N}x{K}" in first and all(s in first for s in said[kernel]), (kernel, first)
    assert "matmul 777x1000x512" not in caplog.text
