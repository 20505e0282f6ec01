"""Autograd of gemmlab.matmul / gemmlab.linear (``gemmlab.autograd``): every gradient against torch's.

CPU (the ``on_cpu`` fixture: the real implementation, its prepared calls and the custom op, with a fake
engine that computes the contract in float64): gradients of a, b, bias and c against float64 torch
autograd for every activation, with and without bias / c / alpha / beta, bf16 and fp32 (the fp32 route),
operand layouts; the layout of each gradient; which GEMMs the backward runs; the eager Function against
the op; torch.compile (aot_eager) against eager; meta tensors; opcheck with gradients; ``out=`` refused.
GPU (``gpu``, ``hopper``): the same comparisons on the real kernels, and torch.compile with inductor.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import gemmlab
from gemmlab import ops
from gemmlab.bench import rel_error

from fakes import act_reference, rnd

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
ACTS = [None, *ops.ACTIVATIONS]
TOL = {BF16: 1.5e-2, FP16: 5e-3, FP32: 1e-5}  # relative error of a gradient, by input dtype


def leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_()


def torch_grads(a, b, g, *, bias=None, activation=None, alpha=1.0, beta=0.0, c=None):
    """The gradients of (a, b, bias, c) by torch autograd on float64 copies (None where not given)."""
    ins = [None if t is None else t.detach().double().requires_grad_() for t in (a, b, bias, c)]
    a64, b64, bias64, c64 = ins
    z = alpha * (a64 @ b64)
    if c64 is not None:
        z = z + beta * c64
    if bias64 is not None:
        z = z + bias64
    y = act_reference(z, activation)
    given = [t for t in ins if t is not None]
    grads = iter(torch.autograd.grad(y, given, g.double()))
    return [None if t is None else next(grads) for t in ins]


EPILOGUES = {  # name: (bias dtype or None, alpha, beta, c?, out_dtype)
    "plain": (None, 1.0, 0.0, False, None),
    "bias": ("input", 1.0, 0.0, False, None),
    "bias_fp32": (FP32, 1.0, 0.0, False, None),
    "alpha_beta_c": (FP32, 0.75, -1.5, True, None),
    "fp32_out_c": ("input", 2.0, 0.5, True, FP32),
}


def make_case(M, N, K, dtype, epilogue, a_layout="row", b_layout="w.t()", device="cpu", gen=None):
    """Leaf tensors for one case (a, b, bias, c and the views passed to matmul) and the matmul kwargs."""
    bias_dtype, alpha, beta, has_c, out_dtype = EPILOGUES[epilogue]
    a_leaf = leaf(rnd(M, K, dtype=dtype, device=device, gen=gen) if a_layout == "row"
                  else rnd(K, M, dtype=dtype, device=device, gen=gen))
    b_leaf = leaf(rnd(N, K, dtype=dtype, device=device, gen=gen) if b_layout == "w.t()"
                  else rnd(K, N, dtype=dtype, device=device, gen=gen))
    a = a_leaf if a_layout == "row" else a_leaf.t()
    b = b_leaf.t() if b_layout == "w.t()" else b_leaf
    bias = None if bias_dtype is None else leaf(rnd(N, dtype=dtype if bias_dtype == "input" else bias_dtype,
                                                    device=device, gen=gen))
    c = leaf(rnd(M, N, dtype=out_dtype or dtype, device=device, gen=gen)) if has_c else None
    kw = dict(bias=bias, alpha=alpha, beta=beta if has_c else 0.0, c=c, out_dtype=out_dtype)
    return (a_leaf, b_leaf, a, b, bias, c), kw


def check_case(M, N, K, dtype, epilogue, activation, a_layout="row", b_layout="w.t()", device="cpu", gen=None):
    (a_leaf, b_leaf, a, b, bias, c), kw = make_case(M, N, K, dtype, epilogue, a_layout, b_layout, device, gen)
    y = gemmlab.matmul(a, b, activation=activation, **kw)
    g = rnd(M, N, dtype=y.dtype, device=device, gen=gen)
    y.backward(g)
    want = torch_grads(a, b, g, activation=activation, bias=bias, c=c, alpha=kw["alpha"], beta=kw["beta"])
    got = [a_leaf.grad if a_layout == "row" else a_leaf.grad.t(),
           b_leaf.grad.t() if b_layout == "w.t()" else b_leaf.grad,
           None if bias is None else bias.grad, None if c is None else c.grad]
    for name, leaf_t, gg, w in zip("a b bias c".split(), (a_leaf, b_leaf, bias, c), got, want):
        if w is None:
            continue
        assert gg.dtype == leaf_t.dtype, f"d{name} is {gg.dtype}, its input {leaf_t.dtype}"
        err = rel_error(gg, w)
        assert err <= TOL[dtype], f"d{name}: relative error {err:.2e} > {TOL[dtype]}"
    # Accumulated into the leaves in their own layout: no transposed gradients.
    assert a_leaf.grad.is_contiguous() and b_leaf.grad.is_contiguous()


# CPU, with the fake engine ------------------------------------------------------------------------------

@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("epilogue", list(EPILOGUES))
@pytest.mark.parametrize("dtype", [BF16, FP32])
def test_gradients_match_torch(on_cpu, dtype, epilogue, activation):
    check_case(13, 24, 40, dtype, epilogue, activation)
    assert (on_cpu.engine.calls if dtype == BF16 else on_cpu.sgemm.calls)  # gemmlab's path ran


@pytest.mark.parametrize("a_layout, b_layout", [("row", "row"), ("col", "w.t()"), ("col", "row")])
@pytest.mark.parametrize("activation", [None, "silu"])
def test_gradients_in_every_layout(on_cpu, a_layout, b_layout, activation):
    check_case(9, 20, 33, BF16, "bias", activation, a_layout, b_layout)


def test_eager_path_uses_the_function_and_matches_the_op(on_cpu, monkeypatch):
    """CUDA-like eager calls that need a gradient run the prepared call inside gemmlab.autograd's Function;
    the op's autograd (what non-eager calls take) gives the same gradients: one formula."""
    (a_leaf, b_leaf, a, b, bias, c), kw = make_case(11, 16, 24, BF16, "alpha_beta_c")
    g = rnd(11, 16)
    y_op = gemmlab.matmul(a, b, activation="gelu", **kw)
    assert "gemmlab_matmul" in type(y_op.grad_fn).__name__
    grads_op = torch.autograd.grad(y_op, (a_leaf, b_leaf, bias, c), g)
    monkeypatch.setattr(ops, "_fast_device", lambda t: True)
    y_eager = gemmlab.matmul(a, b, activation="gelu", **kw)
    assert type(y_eager.grad_fn).__name__ == "_EagerMatmulBackward"
    grads_eager = torch.autograd.grad(y_eager, (a_leaf, b_leaf, bias, c), g)
    assert torch.equal(y_op, y_eager)
    for x, y in zip(grads_op, grads_eager):
        assert torch.equal(x, y)
    with torch.no_grad():  # no gradient needed: the plain prepared call, no graph
        assert gemmlab.matmul(a, b, activation="gelu", **kw).grad_fn is None


def test_eager_backward_keeps_its_gemms_by_the_gradients_layout(on_cpu, monkeypatch):
    """The eager Function's backward GEMMs are prepared once per layout of dy and kept with the forward's
    prepared call: repeated steps prepare nothing new, another dy layout prepares its own, and every
    gradient matches torch's. With create_graph (grad mode on in backward) they take the op."""
    monkeypatch.setattr(ops, "_fast_device", lambda t: True)
    a, w = leaf(rnd(8, 32)), leaf(rnd(16, 32))
    for g in (rnd(8, 16), rnd(8, 16), rnd(16, 8).t(), rnd(16, 8).t(), rnd(8, 16)):
        a.grad = w.grad = None
        y = gemmlab.matmul(a, w.t())
        y.backward(g)
        want_a, want_b, *_ = torch_grads(a, w.t(), g)
        assert rel_error(a.grad, want_a) <= TOL[BF16] and rel_error(w.grad.t(), want_b) <= TOL[BF16]
    call = ops._prepared(a, w.t(), None, None, 1.0, 0.0, None, None, None)
    assert len(call.grads) == 4  # dA and dB, for a row-major and a column-major dy
    assert len(on_cpu.engine.prepared) == 1 + 4
    y = gemmlab.matmul(a, w.t())
    (da,) = torch.autograd.grad(y, a, rnd(8, 16), create_graph=True)
    assert "gemmlab_matmul" in type(da.grad_fn).__name__  # the op, which differentiates again


def test_eager_function_under_functorch_grad(on_cpu, monkeypatch):
    """torch.func.grad accepts only Functions with a setup_context: under it the eager path takes that form
    of the Function (``_EagerMatmulTransforms``), with the same formula. (Fused gelu/silu do not work under
    it: their backward recomputes z through the op, whose generated Function functorch refuses.)"""
    monkeypatch.setattr(ops, "_fast_device", lambda t: True)
    a, w, bias = rnd(8, 32), rnd(16, 32), rnd(16)
    g = rnd(8, 16)
    got = torch.func.grad(lambda a: (gemmlab.matmul(a, w.t(), bias=bias, activation="relu").double()
                                     * g.double()).sum())(a)
    want, *_ = torch_grads(a, w.t(), g, bias=bias, activation="relu")
    assert got.dtype == BF16 and rel_error(got, want) <= TOL[BF16]


@pytest.mark.parametrize("activation, backward_gemms", [(None, 2), ("relu", 2), ("gelu", 3), ("silu", 3)])
def test_backward_runs_gemmlab_gemms(on_cpu, activation, backward_gemms):
    """dA and dB are gemmlab GEMMs; gelu/silu recompute the pre-activation (one more), relu reads y > 0."""
    (a_leaf, b_leaf, a, b, bias, c), kw = make_case(8, 16, 32, BF16, "bias")
    y = gemmlab.matmul(a, b, activation=activation, **kw)
    before = len(on_cpu.engine.calls)
    y.backward(rnd(8, 16))
    calls = on_cpu.engine.calls[before:]
    assert len(calls) == backward_gemms
    # dW of b = w.t() is computed as a row-major (N, K) matrix: dz^T (N, M) @ a (M, K).
    dw = calls[-1]
    assert dw["a"].shape == (16, 8) and dw["b"].shape == (8, 32) and dw["out"].shape == (16, 32)


def test_only_the_gradients_asked_for_are_computed(on_cpu):
    x = leaf(rnd(8, 32))
    w = rnd(16, 32)  # frozen weight: no dW GEMM
    y = gemmlab.linear(x, w)
    before = len(on_cpu.engine.calls)
    g = rnd(8, 16)
    y.backward(g)
    assert len(on_cpu.engine.calls) == before + 1 and w.grad is None
    assert rel_error(x.grad, g.double() @ w.double()) <= TOL[BF16]


def test_linear_3d_gradients_match_f_linear(on_cpu):
    x, w, bias = leaf(rnd(2, 5, 32)), leaf(rnd(24, 32)), leaf(rnd(24))
    y = gemmlab.linear(x, w, bias, activation="gelu_tanh")
    g = rnd(2, 5, 24)
    y.backward(g)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, bias))
    want = torch.autograd.grad(F.gelu(F.linear(x64, w64, b64), approximate="tanh"), (x64, w64, b64), g.double())
    for got, ref in zip((x.grad, w.grad, bias.grad), want):
        assert rel_error(got, ref) <= TOL[BF16]


# gemmlab.linear's fast path with gradients: x and the weight straight into autograd._EagerLinear ---------------

X_LAYOUTS = {  # how x (rows 6 = 2 x 3, K 32) is laid out; each flattens to (6, 32) by a view
    "3-D": lambda: rnd(2, 3, 32),
    "2-D": lambda: rnd(6, 32),
    "2-D column-major": lambda: rnd(32, 6).t(),
    "3-D column-major rows": lambda: rnd(32, 6).t().view(2, 3, 32),  # x2 = x.view(6, 32) has strides (1, 6)
    "3-D strided rows": lambda: rnd(2, 3, 48)[:, :, :32],
}


def _linear_grads(x, w, bias, activation, g):
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    b64 = None if bias is None else bias.detach().double().requires_grad_()
    ins = [t for t in (x64, w64, b64) if t is not None]
    return torch.autograd.grad(act_reference(F.linear(x64, w64, b64), activation), ins, g.double())


@pytest.mark.parametrize("activation", [None, "relu", "silu"])
@pytest.mark.parametrize("w_layout", ["row", "column-major"])
@pytest.mark.parametrize("x_layout", list(X_LAYOUTS))
def test_linear_fast_path_gradients_in_every_layout(on_cpu, monkeypatch, x_layout, w_layout, activation):
    """Once a linear key is stored, a call that needs gradients runs ``_EagerLinear`` on x and the weight
    themselves: its node's inputs are the leaves (no view nodes between), and x's, the weight's and the
    bias's gradients match torch's, each in its leaf's layout, step after step with fresh x."""
    monkeypatch.setattr(ops, "_fast_device", lambda t: True)
    w = leaf(rnd(16, 32) if w_layout == "row" else rnd(32, 16).t())
    bias = leaf(rnd(16))
    for step in range(3):
        x = leaf(X_LAYOUTS[x_layout]())
        y = gemmlab.linear(x, w, bias, activation=activation)
        g = rnd(*y.shape)
        if step:  # the first call took the general path and stored the key
            assert type(y.grad_fn).__name__ == "_EagerLinearBackward"
            assert [type(f).__name__ for f, _ in y.grad_fn.next_functions[:3]] == ["AccumulateGrad"] * 3
        w.grad = bias.grad = None
        y.backward(g)
        want = _linear_grads(x, w, bias, activation, g)
        for name, t, ref in (("x", x, want[0]), ("w", w, want[1]), ("bias", bias, want[2])):
            assert t.grad.dtype == t.dtype and t.grad.shape == t.shape, name
            assert rel_error(t.grad, ref) <= TOL[BF16], name
        # Each gradient is written in its input's layout (no copy to accumulate it): dX (rows, K), or
        # (K, rows) transposed for column-major rows of x; dW (N, K) for a row-major w, else (K, N).
        dx, dw = on_cpu.engine.calls[-2:]
        assert dx["out"].shape == ((32, 6) if "column-major" in x_layout else (6, 32))
        assert dw["out"].shape == ((16, 32) if w_layout == "row" else (32, 16))


@pytest.mark.parametrize("needs", ["x", "weight", "bias"])
def test_linear_fast_path_computes_only_the_gradients_asked_for(on_cpu, monkeypatch, needs):
    monkeypatch.setattr(ops, "_fast_device", lambda t: True)
    x, w, bias = rnd(2, 3, 32), rnd(16, 32), rnd(16)
    gemmlab.linear(x, w, bias)  # stores the key
    x, w, bias = (leaf(t) if name == needs else t for name, t in (("x", x), ("weight", w), ("bias", bias)))
    y = gemmlab.linear(x, w, bias)
    assert type(y.grad_fn).__name__ == "_EagerLinearBackward"
    before = len(on_cpu.engine.calls)
    y.backward(rnd(2, 3, 16))
    assert len(on_cpu.engine.calls) - before == {"x": 1, "weight": 1, "bias": 0}[needs]
    assert [t.grad is not None for t in (x, w, bias)] == [needs == n for n in ("x", "weight", "bias")]


def test_linear_fast_path_output_is_not_a_view(on_cpu, monkeypatch):
    """The Function's result is made in its (..., N) shape, not viewed from (rows, N) inside forward (such
    a view would refuse in-place changes): ``y += r`` works and the gradients are unchanged by it; with relu,
    whose backward reads y, changing y in place is caught by autograd as for any saved output."""
    monkeypatch.setattr(ops, "_fast_device", lambda t: True)
    w = leaf(rnd(16, 32))
    gemmlab.linear(rnd(2, 3, 32), w)
    x = leaf(rnd(2, 3, 32))
    y = gemmlab.linear(x, w)
    assert y._base is None
    y += rnd(2, 3, 16)
    g = rnd(2, 3, 16)
    y.backward(g)
    want = _linear_grads(x, w, None, None, g)
    assert rel_error(x.grad, want[0]) <= TOL[BF16] and rel_error(w.grad, want[1]) <= TOL[BF16]
    gemmlab.linear(rnd(2, 3, 32), w, activation="relu")
    y = gemmlab.linear(leaf(rnd(2, 3, 32)), w, activation="relu")
    assert type(y.grad_fn).__name__ == "_EagerLinearBackward"
    y.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward(g)


def test_linear_fast_path_shares_the_matmul_paths_backward_gemms(on_cpu, monkeypatch):
    """``_EagerLinear`` and ``_EagerMatmul`` on the same metadata run the same backward GEMMs: the kept
    prepared calls of one serve the other (nothing new prepared), with the same gradients."""
    monkeypatch.setattr(ops, "_fast_device", lambda t: True)
    x, w = leaf(rnd(2, 3, 32)), leaf(rnd(16, 32))
    g = rnd(2, 3, 16)
    gemmlab.matmul(x.view(6, 32), w.t()).view(2, 3, 16).backward(g)  # the matmul path: forward, dX, dW
    via_matmul = x.grad.clone(), w.grad.clone()
    prepared = len(on_cpu.engine.prepared)
    gemmlab.linear(rnd(2, 3, 32), w)  # stores the linear key (its prepared call is the matmul's)
    x.grad = w.grad = None
    y = gemmlab.linear(x, w)
    assert type(y.grad_fn).__name__ == "_EagerLinearBackward"
    y.backward(g)
    assert len(on_cpu.engine.prepared) == prepared == 3
    assert torch.equal(x.grad, via_matmul[0]) and torch.equal(w.grad, via_matmul[1])


def test_linear_fast_path_under_functorch_grad(on_cpu, monkeypatch):
    """Under torch.func.grad the linear fast path takes ``_EagerMatmulTransforms`` on the views."""
    monkeypatch.setattr(ops, "_fast_device", lambda t: True)
    x, w = rnd(2, 3, 32), rnd(16, 32)
    gemmlab.linear(x, w)
    g = rnd(2, 3, 16)
    got = torch.func.grad(lambda x: (gemmlab.linear(x, w).double() * g.double()).sum())(x)
    assert got.shape == x.shape and rel_error(got, g.double() @ w.double()) <= TOL[BF16]


@pytest.mark.parametrize("rows, N, K", [(16, 2048, 2048), (4096, 5632, 2048), (16, 2048, 5632), (16, 5632, 2048)])
def test_linear_backward_gemms_read_their_operands_in_place(rows, N, K):
    """The backward GEMMs of a bf16 nn.Linear (dense x, row-major weight, dense dy), as the formula forms
    them (``_grad_x``, ``_grad_w``), reach the engine as views TMA reads where they lie: no operand copy
    (``engine._operand_plan``), whichever kernel the router picks for them on an H200. dW = dz^T @ x with
    K = rows (16 at decode) reads both dz and x MN-major."""
    from gemmlab import autograd, engine

    x2, w, dz = (torch.empty(*s, dtype=BF16, device="meta") for s in ((rows, K), (N, K), (rows, N)))
    seen = []

    def gemm(which, dz_, a, b, alpha, out_dtype):
        seen.append((which, a, b))
        return torch.empty(a.shape[0], b.shape[1], dtype=out_dtype, device="meta")

    assert autograd._grad_x(dz, x2, w, 1.0, gemm).shape == (rows, K)
    assert autograd._grad_w(dz, x2, w, 1.0, gemm).shape == (N, K)
    assert [which for which, _, _ in seen] == ["a", "b"]
    for which, a, b in seen:
        assert engine._operand_plan(a, 1)[2] is None and engine._operand_plan(b, 0)[2] is None, which
        out = torch.empty(a.shape[0], b.shape[1], dtype=BF16, device="meta")
        assert engine.route(a, b, out, bias=None, activation=None, has_c=False, sm_count=132).kernel in (
            "decode", "engine", "h11")
    _, dzt, x_b = seen[1]
    assert dzt.shape == (N, rows) and engine._operand_mn(dzt, 1) and engine._operand_mn(x_b, 0)


def test_compiled_gradients_match_eager(on_cpu):
    """torch.compile traces the backward formula (AOTAutograd); its gradients are eager's, and its
    backward GEMMs are gemmlab's."""
    def f(x, w, bias):
        return gemmlab.linear(x, w, bias, activation="silu").sum(dim=-1)

    x, w, bias = rnd(2, 7, 32), rnd(24, 32), rnd(24)
    g = rnd(2, 7)
    eager = [leaf(t) for t in (x, w, bias)]
    f(*eager).backward(g)
    compiled = [leaf(t) for t in (x, w, bias)]
    before = len(on_cpu.engine.calls)
    torch.compile(f, fullgraph=True, backend="aot_eager")(*compiled).backward(g)
    assert len(on_cpu.engine.calls) - before == 4  # forward, recomputed z, dX, dW
    for e, cpl in zip(eager, compiled):
        assert torch.allclose(e.grad.float(), cpl.grad.float(), rtol=1e-2, atol=1e-3)
        assert torch.isfinite(cpl.grad.float()).all()


@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_backward_on_meta(dynamic):
    def f(x, w, bias):
        return gemmlab.linear(x, w, bias, activation="gelu")

    x = torch.empty(3, 5, 32, device="meta", dtype=BF16, requires_grad=True)
    w = torch.empty(24, 32, device="meta", dtype=BF16, requires_grad=True)
    bias = torch.empty(24, device="meta", dtype=FP32, requires_grad=True)
    y = torch.compile(f, fullgraph=True, backend="aot_eager", dynamic=dynamic)(x, w, bias)
    y.backward(torch.empty_like(y))
    assert x.grad.shape == x.shape and w.grad.shape == w.shape and bias.grad.shape == bias.shape
    assert (x.grad.dtype, w.grad.dtype, bias.grad.dtype) == (BF16, BF16, FP32)


def test_meta_backward_shapes_dtypes_and_layouts():
    a = torch.empty(32, 8, device="meta", dtype=BF16, requires_grad=True)  # used as a.t(): column-major
    w = torch.empty(16, 32, device="meta", dtype=BF16, requires_grad=True)
    c = torch.empty(8, 16, device="meta", dtype=FP32, requires_grad=True)
    y = gemmlab.matmul(a.t(), w.t(), c=c, beta=2.0, out_dtype=FP32, activation="relu")
    y.backward(torch.empty_like(y))
    assert a.grad.shape == (32, 8) and a.grad.dtype == BF16 and a.grad.is_contiguous()
    assert w.grad.shape == (16, 32) and w.grad.dtype == BF16 and w.grad.is_contiguous()
    assert c.grad.shape == (8, 16) and c.grad.dtype == FP32


@pytest.mark.parametrize("activation", [None, "gelu"])
def test_opcheck_with_gradients(on_cpu, activation):
    """opcheck's autograd registration and AOT-dispatch tests (forward and backward traced vs eager)."""
    args = (leaf(rnd(8, 16)), rnd(24, 16).t().requires_grad_(), leaf(rnd(24, dtype=FP32)), activation, 0.5, 2.0,
            leaf(rnd(8, 24, dtype=FP32)), FP32)
    torch.library.opcheck(torch.ops.gemmlab.matmul.default, args)


def test_out_with_gradients_is_refused(on_cpu):
    a, b = leaf(rnd(8, 32)), rnd(32, 16)
    with pytest.raises(RuntimeError, match=r"out=\.\.\.\) does not support automatic differentiation"):
        gemmlab.matmul(a, b, out=torch.empty(8, 16, dtype=BF16))
    with torch.no_grad():
        out = torch.empty(8, 16, dtype=BF16)
        assert gemmlab.matmul(a, b, out=out) is out


def test_act_grad_matches_autograd():
    from gemmlab.autograd import _act_grad

    z = torch.linspace(-8, 8, 2001, dtype=torch.float64, requires_grad=True)
    for activation in ("gelu", "gelu_tanh", "silu"):
        want, = torch.autograd.grad(act_reference(z, activation).sum(), z)
        assert torch.allclose(_act_grad(z.detach(), activation), want, atol=1e-12, rtol=1e-10), activation


# GPU -------------------------------------------------------------------------------------------------------

@pytest.fixture
def gen():
    return torch.Generator(device="cuda").manual_seed(20251217)


GPU_LAYOUTS = {("row", "w.t()"): "TN", ("row", "row"): "NN", ("col", "w.t()"): "TT", ("col", "row"): "NT"}


@pytest.fixture(scope="module")
def gpu_warm():
    """Every kernel the GPU tests below run (forward and backward), compiled at once in parallel threads
    by gemmlab.warmup, and prepared; nothing it missed."""
    from gemmlab.warm import GemmCall

    calls = []
    for dtype in (BF16, FP16, FP32):
        for bias_dtype, _, _, has_c, out_dtype in EPILOGUES.values():
            bias = None if bias_dtype is None else (dtype if bias_dtype == "input" else bias_dtype)
            calls += [GemmCall(300, 264, 200, dtype, "TN", bias, act, has_c, out_dtype) for act in ACTS]
    for (M, N, K) in ((16, 1024, 512), (1000, 520, 264)):
        calls += [GemmCall(M, N, K, BF16, GPU_LAYOUTS[lay], BF16, "silu") for lay in GPU_LAYOUTS]
    report = gemmlab.warmup(calls, backward=True)
    assert report.unplanned == [], report.summary()
    return report


@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("epilogue", list(EPILOGUES))
@pytest.mark.parametrize("dtype", [BF16, FP16, FP32])
@pytest.mark.gpu
@pytest.mark.hopper
def test_gpu_gradients_match_torch(dtype, epilogue, activation, gen, gpu_warm):
    check_case(300, 264, 200, dtype, epilogue, activation, device="cuda", gen=gen)


@pytest.mark.parametrize("a_layout, b_layout", [("row", "row"), ("col", "w.t()"), ("col", "row")])
@pytest.mark.parametrize("M, N, K", [(16, 1024, 512), (1000, 520, 264)], ids=str)
@pytest.mark.gpu
@pytest.mark.hopper
def test_gpu_gradients_in_every_layout(a_layout, b_layout, M, N, K, gen, gpu_warm):
    check_case(M, N, K, BF16, "bias", "silu", a_layout, b_layout, device="cuda", gen=gen)


@pytest.mark.parametrize("dtype", [BF16, FP32])
@pytest.mark.gpu
@pytest.mark.hopper
def test_gpu_compiled_gradients_match_eager(dtype, gen):
    def f(x, w, bias):
        return gemmlab.linear(x, w, bias, activation="gelu") * 2

    x, w, bias = (rnd(*shape, dtype=dtype, device="cuda", gen=gen) for shape in ((4, 100, 256), (192, 256), (192,)))
    g = rnd(4, 100, 192, dtype=dtype, device="cuda", gen=gen)
    eager = [leaf(t) for t in (x, w, bias)]
    y = f(*eager)
    assert type(y.grad_fn).__name__ == "MulBackward0" and y.grad_fn.next_functions[0][0] is not None
    y.backward(g)
    compiled = [leaf(t) for t in (x, w, bias)]
    torch.compile(f, fullgraph=True)(*compiled).backward(g)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, bias))
    want = torch.autograd.grad(F.gelu(F.linear(x64, w64, b64)) * 2, (x64, w64, b64), g.double())
    for e, cpl, ref in zip(eager, compiled, want):
        assert rel_error(e.grad, ref) <= TOL[dtype]
        assert rel_error(cpl.grad, ref) <= TOL[dtype]


@pytest.mark.parametrize("w_layout", ["row", "column-major"])
@pytest.mark.parametrize("x_shape", [(16, 1, 512), (4, 100, 256)], ids=str)
@pytest.mark.gpu
@pytest.mark.hopper
def test_gpu_linear_fast_path_gradients(x_shape, w_layout, gen):
    """``_EagerLinear`` on the real kernels: the second call of a shape runs it, and x's, the weight's and
    the bias's gradients match float64 torch's (at 16 rows dW's inner dimension is 16)."""
    K = x_shape[-1]
    w = leaf(rnd(192, K, dtype=BF16, device="cuda", gen=gen) if w_layout == "row"
             else rnd(K, 192, dtype=BF16, device="cuda", gen=gen).t())
    bias = leaf(rnd(192, dtype=BF16, device="cuda", gen=gen))
    for step in range(2):
        x = leaf(rnd(*x_shape, dtype=BF16, device="cuda", gen=gen))
        y = gemmlab.linear(x, w, bias, activation="silu")
        if step:
            assert type(y.grad_fn).__name__ == "_EagerLinearBackward"
        g = rnd(*y.shape, dtype=BF16, device="cuda", gen=gen)
        w.grad = bias.grad = None
        y.backward(g)
        want = _linear_grads(x, w, bias, "silu", g)
        for name, t, ref in (("x", x, want[0]), ("w", w, want[1]), ("bias", bias, want[2])):
            assert rel_error(t.grad, ref) <= TOL[BF16], name
