"""gemmlab.nn.Linear, gemmlab.patch / unpatch, the fallback to torch, and a decoder trained patched.

CPU: the module against torch.nn.Linear (parameters, init, state_dict, repr); forward and gradients on
gemmlab's path (the ``on_cpu`` fakes) against torch; the fallback (CPU tensors, float64, a GPU the engine
cannot run on) with one FallbackWarning per reason and a decision made once; the functional API's
``fallback=True``; patch keeping Parameters, ties, hooks and optimizers; autocast; torch.compile. The
decoder of tests/decoder_block.py patched against unpatched: logits and the losses of a few AdamW steps
agree within bf16 tolerance (fake engine), and exactly on the fp32 fallback.
GPU (``gpu``, ``hopper``): the decoder on the H200, eager and compiled.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import gemmlab
from gemmlab import nn as gnn
from gemmlab.bench import rel_error
from gemmlab.errors import FallbackWarning, NoGPUError

import decoder_block as db
from fakes import act_reference, reference, rnd

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


@pytest.fixture(autouse=True)
def fresh_routes():
    """Every test decides (and warns) afresh."""
    gnn.clear_routes()
    yield
    gnn.clear_routes()


def fallback_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, FallbackWarning)]


# The module ---------------------------------------------------------------------------------------------------

def test_linear_is_an_nn_linear_with_the_same_parameters_and_state_dict():
    torch.manual_seed(3)
    ref = torch.nn.Linear(24, 40)
    torch.manual_seed(3)
    ours = gnn.Linear(24, 40, activation="silu")
    assert isinstance(ours, torch.nn.Linear)
    assert ref.state_dict().keys() == ours.state_dict().keys()
    for k, v in ref.state_dict().items():
        assert torch.equal(v, ours.state_dict()[k])  # same init from the same RNG state
    other = gnn.Linear(24, 40, bias=False, dtype=BF16)
    assert other.bias is None and other.weight.dtype == BF16 and other.activation is None
    ours.load_state_dict(torch.nn.Linear(24, 40).state_dict())
    assert repr(ours) == "gemmlab.nn.Linear(in_features=24, out_features=40, bias=True, activation='silu')"
    with pytest.raises(ValueError, match="unknown activation 'tanh'"):
        gnn.Linear(4, 4, activation="tanh")


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh", "silu"])
def test_linear_forward_and_gradients_run_on_gemmlab(on_cpu, activation):
    m = gnn.Linear(32, 24, dtype=BF16, activation=activation)
    x = rnd(2, 5, 32).requires_grad_()
    y = m(x)
    g = rnd(2, 5, 24)
    y.backward(g)
    assert len(on_cpu.engine.calls) == (4 if activation in ("gelu", "gelu_tanh", "silu") else 3)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, m.weight, m.bias))
    y64 = act_reference(F.linear(x64, w64, b64), activation)
    assert rel_error(y.detach(), y64.detach()) <= 1e-2
    want = torch.autograd.grad(y64, (x64, w64, b64), g.double())
    for got, ref in zip((x.grad, m.weight.grad, m.bias.grad), want):
        assert got.dtype == BF16 and rel_error(got, ref) <= 1.5e-2


# Fallback ----------------------------------------------------------------------------------------------------

def test_fallback_on_cpu_warns_once_per_reason():
    """No GPU (or CPU tensors): torch computes, one warning per reason however many calls and modules."""
    mods = [gnn.Linear(16, 8) for _ in range(3)]
    x = torch.randn(4, 16, requires_grad=True)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for _ in range(3):
            for m in mods:
                y = m(x)
                assert torch.equal(y, F.linear(x, m.weight, m.bias))
        y.sum().backward()
        assert x.grad is not None and mods[-1].weight.grad is not None
        m16 = gnn.Linear(16, 8, dtype=BF16)  # another key, the same reason: no second warning
        assert torch.equal(m16(x.to(BF16)), F.linear(x.to(BF16), m16.weight, m16.bias))
        m64 = gnn.Linear(16, 8, dtype=torch.float64)
        assert torch.equal(m64(x.double()), F.linear(x.double(), m64.weight, m64.bias))
        m64(x.double())
    got = fallback_warnings(rec)
    assert len(got) == 2
    assert "inputs are on cpu" in got[0] and "not torch.float64" in got[1]


def test_fallback_where_the_engine_cannot_run(on_cpu):
    """bf16 on a GPU the Hopper engine refuses: torch; fp32 on the same device: gemmlab's fp32 route."""
    on_cpu.engine.reason = "this GPU is 8.0"
    m = gnn.Linear(16, 8, dtype=BF16)
    x = rnd(4, 16)
    with pytest.warns(FallbackWarning, match=r"bfloat16 needs gemmlab's Hopper engine.*this GPU is 8\.0"):
        assert torch.equal(m(x), F.linear(x, m.weight, m.bias))
    assert not on_cpu.engine.calls
    m32 = gnn.Linear(16, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        y = m32(x.float())
    with torch.no_grad():
        want = F.linear(x.double(), m32.weight.double(), m32.bias.double())
    assert len(on_cpu.sgemm.calls) == 1 and rel_error(y.detach(), want) <= 1e-6


def test_the_route_is_decided_once(on_cpu, monkeypatch):
    from gemmlab import fallback

    asked = []
    real = fallback.fallback_reason
    monkeypatch.setattr(fallback, "fallback_reason", lambda dtype, device: asked.append(dtype) or real(dtype, device))
    m = gnn.Linear(16, 8, dtype=BF16)
    for _ in range(5):
        m(rnd(3, 16))
    m.float()
    for _ in range(5):
        m(rnd(3, 16, dtype=FP32))
    assert asked == [BF16, FP32]


def test_functional_api_raises_unless_asked(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    x, w, bias = torch.randn(5, 16), torch.randn(8, 16), torch.randn(8)
    with pytest.raises(NoGPUError, match="torch sees none"):
        gemmlab.linear(x, w, bias)
    with pytest.warns(FallbackWarning, match="gemmlab.linear falls back to torch"):
        y = gemmlab.linear(x, w, bias, activation="gelu", fallback=True)
    assert torch.equal(y, F.gelu(F.linear(x, w, bias)))


@pytest.mark.parametrize("dtype", [FP32, torch.float64])
def test_matmul_fallback_keeps_the_contract(dtype):
    a, b = torch.randn(6, 12, dtype=dtype), torch.randn(9, 12, dtype=dtype).t()
    c, bias = torch.randn(6, 9, dtype=dtype), torch.randn(9, dtype=dtype)
    kw = dict(bias=bias, activation="silu", alpha=0.5, beta=-2.0, c=c)
    with pytest.warns(FallbackWarning):
        y = gemmlab.matmul(a, b, fallback=True, **kw)
    assert y.dtype == dtype and rel_error(y, reference(a, b, **kw)) <= 1e-6
    out = torch.full((6, 9), float("nan"), dtype=dtype)
    assert gemmlab.matmul(a, b, out=out, fallback=True, **kw) is out
    assert torch.equal(out, y)
    assert torch.equal(gemmlab.matmul(a, b, fallback=True), a @ b)


def test_functional_fallback_uses_gemmlab_where_it_can(on_cpu):
    x, w = rnd(4, 16), rnd(8, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        y = gemmlab.linear(x, w, fallback=True)
        z = gemmlab.matmul(x, w.t(), fallback=True)
    assert len(on_cpu.engine.calls) == 2 and torch.equal(y, z)


def test_autocast_computes_in_the_autocast_dtype(on_cpu):
    torch.manual_seed(1)
    ref = torch.nn.Linear(32, 16)
    ours = gnn.Linear(32, 16)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(4, 32)
    with torch.autocast("cpu", dtype=BF16):
        y, want = ours(x), ref(x)
    assert y.dtype == want.dtype == BF16
    call = on_cpu.engine.calls[-1]
    assert call["a"].dtype == BF16 and call["b"].dtype == BF16 and call["bias"].dtype == BF16
    assert rel_error(y.detach(), F.linear(x.double(), ref.weight.double(), ref.bias.double()).detach()) <= 1e-2


def test_fast_path_of_a_seen_shape_still_honours_autocast_and_the_fallback(on_cpu, monkeypatch):
    """Linear's forward goes straight to gemmlab.linear's fast path for shapes seen before; autocast still
    casts first (no stored key of the uncast call is used), and tensors off the fast path's device still
    take the fallback's decision."""
    from gemmlab import ops

    monkeypatch.setattr(ops, "_fast_device", lambda a: a.device.type == "cpu")  # CPU acts as the GPU here
    m = gnn.Linear(32, 16)
    x = torch.randn(2, 4, 32)
    with torch.no_grad():
        m(x)
        y = m(x)  # a fast-path hit
        assert len(on_cpu.engine.prepared) == 0 and len(on_cpu.sgemm.calls) == 2  # fp32: the ladder's step
        with torch.autocast("cpu", dtype=BF16):
            y16 = m(x)
    assert y.dtype == FP32 and y16.dtype == BF16 and on_cpu.engine.calls[-1]["b"].dtype == BF16
    want = F.linear(x.double(), m.weight.detach().double(), m.bias.detach().double())
    assert rel_error(y, want) <= 1e-5 and rel_error(y16, want) <= 1e-2
    monkeypatch.setattr(ops, "_fast_device", lambda a: False)  # CPU tensors again, on a machine without a GPU
    monkeypatch.setattr(ops, "_check_device", lambda device: (_ for _ in ()).throw(NoGPUError("no GPU")))
    gnn.clear_routes()  # (decided for CPU-as-GPU above)
    with pytest.warns(FallbackWarning, match="falls back"):
        y = m(x)
    assert torch.equal(y, F.linear(x, m.weight, m.bias)) and len(on_cpu.sgemm.calls) == 2  # torch's, not ours


# patch / unpatch ----------------------------------------------------------------------------------------------

def test_patch_keeps_parameters_ties_hooks_and_optimizers():
    model = db.build(db.Config(), seed=0)
    mha = torch.nn.MultiheadAttention(64, 4)  # its out_proj is an nn.Linear subclass: left alone
    model.add_module("extra", mha)
    params = {n: p for n, p in model.named_parameters()}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    model.blocks[0].mlp.up_proj.register_forward_hook(lambda m, i, o: seen.append(o.shape))

    handle = gemmlab.patch(model)
    assert len(handle.modules) == 2 * 7 + 1 and "lm_head" in handle.modules
    assert handle.skipped == [("extra.out_proj", "NonDynamicallyQuantizableLinear")]
    assert type(model.blocks[1].attn.q_proj) is gnn.Linear and type(mha.out_proj) is not gnn.Linear
    assert {n: p for n, p in model.named_parameters()} == params  # the same objects
    assert model.lm_head.weight is model.embed.weight
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())

    tokens = torch.randint(0, 256, (2, 9))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)  # fp32 on the CPU: torch computes
        db.loss_fn(model, tokens).backward()
    assert seen == [(2, 8, 160)]
    before = model.embed.weight.detach().clone()
    opt.step()  # the optimizer made before patching updates the same Parameters
    assert not torch.equal(before, model.embed.weight)

    assert gemmlab.unpatch(model) == 15
    assert all(type(m) is not gnn.Linear for m in model.modules())
    assert not hasattr(model.lm_head, "activation") and model.lm_head.weight is model.embed.weight
    with gemmlab.patch(model) as h:
        assert type(model.lm_head) is gnn.Linear and len(h.modules) == 15
    assert type(model.lm_head) is torch.nn.Linear


def test_unpatch_leaves_modules_built_as_gemmlab_linear():
    model = torch.nn.Sequential(gnn.Linear(8, 8, activation="relu"), torch.nn.Linear(8, 4))
    gemmlab.patch(model)
    assert gemmlab.unpatch(model) == 1
    assert type(model[0]) is gnn.Linear and model[0].activation == "relu" and type(model[1]) is torch.nn.Linear


# The decoder, patched against torch ---------------------------------------------------------------------------

def train(model, tokens, steps: int, lr: float = 1e-2) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = db.loss_fn(model, tokens)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def test_decoder_patched_matches_torch_bf16(on_cpu):
    cfg = db.Config(qkv_bias=True)
    ref, ours = db.build(cfg, seed=5, dtype=BF16), db.build(cfg, seed=5, dtype=BF16)
    gemmlab.patch(ours)
    tokens = torch.randint(0, cfg.vocab, (2, 17), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = ref(tokens).double()
        assert rel_error(ours(tokens), want) <= 2e-2
    on_cpu.engine.calls.clear()
    steps = 4
    lt, lo = train(ref, tokens, steps), train(ours, tokens, steps)
    gemms = cfg.layers * 7 + 1
    assert len(on_cpu.engine.calls) == steps * 3 * gemms  # forward, dX and dW of every projection on gemmlab
    assert lo[-1] < lo[0] and lt[-1] < lt[0]
    for a, b in zip(lt, lo):
        assert abs(a - b) <= 2e-2 * abs(a), (lt, lo)


def test_decoder_fp32_fallback_is_exactly_torch():
    cfg = db.Config()
    ref, ours = db.build(cfg, seed=2), db.build(cfg, seed=2)
    gemmlab.patch(ours)
    tokens = torch.randint(0, cfg.vocab, (2, 13), generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        lo = train(ours, tokens, 3)
    assert len(fallback_warnings(rec)) == 1
    assert lo == train(ref, tokens, 3)


def test_compiled_patched_decoder_matches_eager(on_cpu):
    cfg = db.Config()
    model = db.build(cfg, seed=4, dtype=BF16)
    gemmlab.patch(model)
    tokens = torch.randint(0, cfg.vocab, (2, 9), generator=torch.Generator().manual_seed(3))
    eager = db.loss_fn(model, tokens)
    eager.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    before = len(on_cpu.engine.calls)
    compiled = torch.compile(db.loss_fn, fullgraph=True, backend="aot_eager")(model, tokens)
    compiled.backward()
    assert len(on_cpu.engine.calls) - before == 3 * (cfg.layers * 7 + 1)
    assert abs(compiled.item() - eager.item()) <= 1e-2 * abs(eager.item())
    for n, p in model.named_parameters():
        assert rel_error(p.grad, grads[n].double()) <= 2e-2, n


def test_compile_fullgraph_through_the_fallback():
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.SiLU(), torch.nn.Linear(32, 8))
    gemmlab.patch(m)
    x = torch.randn(4, 16)
    with pytest.warns(FallbackWarning):
        y = torch.compile(m, fullgraph=True, backend="aot_eager")(x)
    want = F.linear(F.silu(F.linear(x, m[0].weight, m[0].bias)), m[2].weight, m[2].bias)
    assert torch.allclose(y, want, rtol=1e-5, atol=1e-6)


# GPU -----------------------------------------------------------------------------------------------------------

GPU_CFG = db.Config(vocab=1024, dim=512, heads=8, kv_heads=4, ffn=1376, layers=2, qkv_bias=True)


@pytest.mark.gpu
@pytest.mark.hopper
def test_gpu_decoder_patched_matches_torch():
    ref = db.build(GPU_CFG, seed=11, device="cuda", dtype=BF16)
    ours = db.build(GPU_CFG, seed=11, device="cuda", dtype=BF16)
    gemmlab.patch(ours)
    report = gemmlab.warmup(ours, tokens=4 * 128, backward=True)
    assert report.unplanned == [] and report.kernels, report.summary()
    tokens = torch.randint(0, GPU_CFG.vocab, (4, 129), device="cuda", generator=torch.Generator("cuda").manual_seed(2))
    inputs = tokens[:, :-1]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        with torch.no_grad():
            assert rel_error(ours(inputs), ref(inputs).double()) <= 2e-2
        lt, lo = train(ref, tokens, 5, lr=3e-3), train(ours, tokens, 5, lr=3e-3)
    assert lo[-1] < lo[0]
    for a, b in zip(lt, lo):
        assert abs(a - b) <= 2e-2 * abs(a), (lt, lo)


@pytest.mark.gpu
@pytest.mark.hopper
def test_gpu_compiled_patched_decoder_matches_eager():
    model = db.build(GPU_CFG, seed=12, device="cuda", dtype=BF16)
    gemmlab.patch(model)
    tokens = torch.randint(0, GPU_CFG.vocab, (2, 65), device="cuda", generator=torch.Generator("cuda").manual_seed(4))
    eager = db.loss_fn(model, tokens)
    eager.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    # aot_eager: the traced forward and backward graphs (gemmlab's op and its formula) on the real kernels;
    # inductor is checked on a smaller graph in test_autograd.py (its compile of a whole decoder takes minutes).
    compiled = torch.compile(db.loss_fn, fullgraph=True, backend="aot_eager")(model, tokens)
    compiled.backward()
    assert abs(compiled.item() - eager.item()) <= 1e-2 * abs(eager.item())
    for n, p in model.named_parameters():
        assert rel_error(p.grad, grads[n].double()) <= 3e-2, n


@pytest.mark.gpu
def test_gpu_fp32_linear_runs_gemmlab_without_warning():
    m = gnn.Linear(96, 80, device="cuda", activation="relu")
    x = torch.randn(33, 96, device="cuda", requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        y = m(x)
    assert type(y.grad_fn).__name__ == "_EagerMatmulBackward"  # the eager path, with the op's formula
    g = torch.randn_like(y)
    y.backward(g)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, m.weight, m.bias))
    y64 = F.relu(F.linear(x64, w64, b64))
    assert rel_error(y.detach(), y64.detach()) <= 1e-5
    want = torch.autograd.grad(y64, (x64, w64, b64), g.double())
    for got, ref in zip((x.grad, m.weight.grad, m.bias.grad), want):
        assert rel_error(got, ref) <= 1e-5


def test_model_step_benchmark_smoke_run_on_cpu(tmp_path, monkeypatch):
    """benchmarks/model_step.py end to end on the CPU (gemmlab falls back there; times mean nothing; the
    warm-up plans but does not compile): one record per step kind with both times and the ratio."""
    import importlib.util
    import json
    from pathlib import Path

    from gemmlab import warm

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "model_step.py"
    spec = importlib.util.spec_from_file_location("model_step", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(warm, "_compile_all", lambda kernels, threads: [warm.Compiled(k, 0.0, "miss") for k in kernels])
    out = tmp_path / "records.jsonl"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        assert mod.main(["--device", "cpu", "--models", "tiny", "--batch", "2", "--seq", "8", "--decode-batch", "2",
                         "--steps", "1", "--rounds", "1", "--out", str(out)]) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["kind"] for r in recs] == ["train", "prefill", "decode"]
    for r in recs:
        assert r["gemmlab_ms"] > 0 and r["torch_ms"] > 0 and r["ratio"] == r["torch_ms"] / r["gemmlab_ms"]
        assert r["logits_rel_error"] == 0.0 and r["warmup_kernels"] > 0  # the CPU fallback is torch itself
