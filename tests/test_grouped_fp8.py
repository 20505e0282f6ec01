"""FP8 grouped GEMM (``gemmlab.grouped_mm`` with e4m3 operands and per-tensor scales) without a GPU: the
FP8 grouped instantiations (a representative set; ``-m slow``: all 48) compile for sm_90a without spills or local memory and shows QGMMA (no HGMMA),
TMA loads and the group table's scan; the launch's argument list against the kernel's PTX parameters
(byte-view operand maps, the two scale pointers and the per-group step); the plan space and its pricing
(half-depth bf16); argument errors; the custom op's fake implementation; the dequantized float64
reference; and the call path with the launch replaced by the reference."""

import dataclasses

import pytest
import torch

import gemmlab
from gemmlab import fp8, grouped, sass
from gemmlab.devices import H200
from gemmlab.errors import UnsupportedProblem

from fakes import launch_arg_types, ptx_param_types, unsigned

E4M3 = torch.float8_e4m3fn


def _check(p: grouped.GroupedPlan) -> None:
    ck = grouped.compile_plan(p)
    assert ck.cubin[:4] == b"\x7fELF"
    assert sass.check(grouped.sass_expect(p), sass.kernel_summary(ck), ck.resources) == [], p
    assert not ck.resources.spills and ck.resources.stack_frame == 0, (p, ck.resources)
    assert p.smem_bytes + ck.resources.static_shared <= 227 * 1024, p
    for needle in ("serialized", "C7510", "C7519"):  # ptxas's warnings that wgmma was serialized
        assert needle not in ck.log, f"{p}:\n{ck.log}"


def _forced(layout, bm, bn, out_dtype="bf16", groups=8, N=4096, rows=4096):
    return next(c for c in grouped.candidates(layout, groups, rows, N, 4096, dtype="e4m3", out_dtype=out_dtype)
                if (c.bm, c.bn) == (bm, bn))


def _representative():
    ps = [_forced(layout, bm, bn) for layout in grouped.LAYOUTS for bm, bn in grouped.FP8_TILES]
    # fp32 out, the 512-group table, DIRECT stores (N = 4100: out's rows not 16-byte aligned).
    ps += [_forced("contiguous", 128, 192, "fp32"), _forced("contiguous", 128, 128, groups=256, rows=65536),
           _forced("masked", 64, 192, "fp16", N=4100)]
    assert [p.table for p in ps[-3:]] == [128, 512, 128] and ps[-1].direct
    return ps


@pytest.mark.parametrize("p", _representative(), ids=lambda p: p.compiled_name)
def test_fp8_grouped_plans_compile_clean(p):
    _check(p)


def _every():
    return [_forced(layout, bm, bn, odt, groups) for layout in grouped.LAYOUTS for bm, bn in grouped.FP8_TILES
            for odt in ("bf16", "fp16", "fp32") for groups in (8, 256)]


@pytest.mark.slow
@pytest.mark.parametrize("p", _every(), ids=lambda p: p.compiled_name)
def test_every_fp8_grouped_instantiation_compiles_clean(p):
    _check(p)


def test_fp8_plans_use_the_fp8_tiles_and_kernel():
    ps = grouped.candidates("contiguous", 8, 4096, 4096, 7168, dtype="e4m3")
    assert {(p.bm, p.bn) for p in ps} == set(grouped.FP8_TILES)
    # The bf16 grouped kernel instantiated with the FP8 traits (one kernel, the FP8 main loop inside).
    assert all(p.kernel == grouped.KERNEL and p.out_dtype == "bf16" for p in ps)
    assert all(p.name_expression.startswith("engine_gemm_grouped<Fp8GemmTraits<__nv_bfloat16, float, ")
               and p.compiled_name.startswith("engine.gemm_grouped_fp8[") for p in ps)
    # Priced as bf16 at half the depth (same bytes, twice the tensor rate).
    for p in ps:
        twin = grouped.predict_s(8, 512.0, 4096, 3584, p.bm, p.bn, p.stages, H200, 2, uneven=True)
        assert abs(twin - p.predicted_s) < 1e-12, p
    # The same stages as the bf16 plan of the tile (a stage holds the same bytes).
    bf = {(p.bm, p.bn): p.stages for p in grouped.candidates("contiguous", 8, 4096, 4096, 7168)}
    assert all(p.stages == bf[(p.bm, p.bn)] for p in ps if (p.bm, p.bn) in bf)


def _ops(T=100, G=4, N=48, K=128, per_group=False, seed=0):
    torch.manual_seed(seed)
    a, sa = fp8.quantize_per_tensor(torch.randn(T, K))
    w = torch.randn(G, N, K)
    if per_group:
        qs = [fp8.quantize_per_tensor(w[g]) for g in range(G)]
        b, sb = torch.stack([q for q, _ in qs]), torch.stack([s.reshape(()) for _, s in qs])
    else:
        b, sb = fp8.quantize_per_tensor(w)
    offsets = torch.tensor([0, 10, 10, 70, T], dtype=torch.int32)
    return a, b, offsets, sa, sb


BAD = [
    (lambda a, b, o, sa, sb: ((a, b, o), {"scale_a": sa}), UnsupportedProblem, "need scale_a"),
    (lambda a, b, o, sa, sb: ((a, b, o), {}), UnsupportedProblem, "need scale_a"),
    (lambda a, b, o, sa, sb: ((a.float().to(torch.bfloat16), b.float().to(torch.bfloat16), o),
                              {"scale_a": sa, "scale_b": sb}), UnsupportedProblem, "go with e4m3"),
    (lambda a, b, o, sa, sb: ((a, b, o), {"scale_a": sa.double(), "scale_b": sb}), TypeError, "float32"),
    (lambda a, b, o, sa, sb: ((a, b, o), {"scale_a": torch.ones(2), "scale_b": sb}), UnsupportedProblem,
     "scale_a must hold one"),
    (lambda a, b, o, sa, sb: ((a, b, o), {"scale_a": sa, "scale_b": torch.ones(3)}), UnsupportedProblem,
     "one per group"),
    (lambda a, b, o, sa, sb: ((a, b, o), {"scale_a": sa, "scale_b": torch.ones(8)[::2]}), UnsupportedProblem,
     "contiguous"),
    (lambda a, b, o, sa, sb: ((a[:, :120], b[:, :, :120], o), {"scale_a": sa, "scale_b": sb}), UnsupportedProblem,
     "multiple of 16"),
    (lambda a, b, o, sa, sb: ((a, b.float().to(torch.bfloat16), o), {"scale_a": sa, "scale_b": sb}), TypeError,
     "same dtype"),
    (lambda a, b, o, sa, sb: ((a, b, o), {"scale_a": sa, "scale_b": sb, "out": torch.empty(100, 48)}),
     UnsupportedProblem, "no out="),
]


@pytest.mark.parametrize("make,exc,match", BAD, ids=[m for _, _, m in BAD])
def test_fp8_grouped_rejects_bad_arguments(make, exc, match):
    args, kw = make(*_ops())
    with pytest.raises(exc, match=match):
        gemmlab.grouped_mm(*args, **kw)


def test_fp8_grouped_fake_impl():
    a, b, o, sa, sb = _ops(per_group=True)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fa, fb, fo, fsa, fsb = (mode.from_tensor(x) for x in (a, b, o, sa, sb))
        out = grouped._grouped_scaled_mm_op(fa, fb, fo, None, fsa, fsb, torch.float32)
    assert out.shape == (100, 48) and out.dtype == torch.float32
    assert torch.ops.gemmlab.grouped_scaled_mm.default is not None


@pytest.mark.parametrize("layout", grouped.LAYOUTS)
@pytest.mark.parametrize("per_group", [False, True])
def test_fp8_launch_arguments_match_the_kernel_parameters(monkeypatch, layout, per_group):
    """Byte views of a and b with 128-byte (128-element) boxes, out's map, the block scales' two maps (A's
    again: per-tensor scales), ranges, lead, G, limit, N, K, panel, then scale_a, scale_b and sb_step (1:
    one scale per group), out, ldo."""
    a, b, o, sa, sb = _ops(T=128, per_group=per_group)
    if layout == "masked":
        a, o = a.reshape(4, 32, 128), torch.tensor([3, 0, 32, 40], dtype=torch.int32)
    kw = {"offsets": o} if layout == "contiguous" else {"counts": o}
    prob = grouped.validate(a, b, **kw, scale_a=sa, scale_b=sb)
    assert prob.sb_step == (1 if per_group else 0) and prob.out_dtype == torch.bfloat16
    p = dataclasses.replace(grouped.plan_for(a, b, **kw, scale_a=sa, scale_b=sb), direct=False, panel=3)
    captured = {}
    monkeypatch.setattr(grouped, "compile_plan", lambda p: "compiled")
    monkeypatch.setattr(grouped, "_tensor_map", lambda t, box: ("tmap", t.dtype, tuple(t.shape), tuple(box)))
    monkeypatch.setattr(grouped, "_launch_fn", lambda: lambda compiled, **kw: captured.update(kw))
    out = torch.empty((128, 48) if layout == "contiguous" else (4, 32, 48), dtype=torch.bfloat16)
    grouped.launch(p, a, b, o, 1 if layout == "contiguous" else 0, out, sa, sb, prob.sb_step)
    args = captured["args"]
    assert launch_arg_types(args) == unsigned(ptx_param_types(grouped.SOURCE, p.name_expression))
    assert args[0] == ("tmap", torch.uint8, (128, 128), (p.bm, 128))
    assert args[1] == ("tmap", torch.uint8, (4 * 48, 128), (p.bn, 128))
    assert args[3] == args[4] == args[0]
    assert args[12] is sa and args[13] is sb and int(args[14]) == prob.sb_step
    with pytest.raises(UnsupportedProblem, match="scale_a and scale_b"):
        grouped.launch(p, a, b, o, 1, out)


@pytest.mark.parametrize("per_group", [False, True])
def test_fp8_reference_dequantizes(per_group):
    a, b, o, sa, sb = _ops(per_group=per_group)
    ref = grouped.reference_grouped_mm(a, b, o, scale_a=sa, scale_b=sb)
    A = a.double() * sa.double()
    for g, (s, e) in enumerate(((0, 10), (10, 10), (10, 70), (70, 100))):
        scale = sb.double().reshape(-1)[g if per_group else 0]
        assert torch.allclose(ref[s:e], A[s:e] @ (b[g].double() * scale).t(), rtol=1e-12, atol=1e-12)
    # Against the unquantized product: FP8's own error only (the reference itself is exact).
    x = a.double() * sa.double()
    assert torch.isfinite(ref).all() and ref.abs().max() > 0 and x.abs().max() > 0


def test_fp8_call_path_on_cpu(monkeypatch):
    ran = []

    def launch(p, a, b, ranges, lead, out, scale_a=None, scale_b=None, sb_step=0):
        assert p.dtype == "e4m3" and scale_a is not None and scale_b is not None
        ref = grouped.reference_grouped_mm(a, b, **({"offsets": ranges} if a.dim() == 2 else {"counts": ranges}),
                                           scale_a=scale_a, scale_b=scale_b)
        out.copy_(torch.where(torch.isnan(ref), out.to(ref.dtype), ref).to(out.dtype))
        ran.append((p, sb_step))

    monkeypatch.setattr(grouped, "_runs_here", lambda a: True)
    monkeypatch.setattr(grouped, "launch", launch)
    for per_group in (False, True):
        a, b, o, sa, sb = _ops(per_group=per_group)
        out = gemmlab.grouped_mm(a, b, o, scale_a=sa, scale_b=sb, out_dtype=torch.float32)
        ref = grouped.reference_grouped_mm(a, b, o, scale_a=sa, scale_b=sb)
        assert out.dtype == torch.float32 and torch.allclose(out.double(), ref, rtol=1e-6, atol=1e-5)
        assert ran[-1][1] == (1 if per_group else 0)
    counts = torch.tensor([3, 0, 25, 7], dtype=torch.int32)
    out3 = gemmlab.grouped_mm(a.reshape(4, 25, 128), b, counts=counts, scale_a=sa, scale_b=sb)
    assert out3.shape == (4, 25, 48) and out3.dtype == torch.bfloat16 and ran[-1][0].layout == "masked"
