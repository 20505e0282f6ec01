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

import fakes
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

    monkeypatch.setattr(grouped, "launch", launch)
    fakes.route_grouped_launches(monkeypatch)
    for per_group in (False, True):
        a, b, o, sa, sb = _ops(per_group=per_group)
        out = gemmlab.grouped_mm(a, b, o, scale_a=sa, scale_b=sb, out_dtype=torch.float32)
        ref = grouped.reference_grouped_mm(a, b, o, scale_a=sa, scale_b=sb)
        assert out.dtype == torch.float32 and torch.allclose(out.double(), ref, rtol=1e-6, atol=1e-5)
        assert ran[-1][1] == (1 if per_group else 0)
    counts = torch.tensor([3, 0, 25, 7], dtype=torch.int32)
    out3 = gemmlab.grouped_mm(a.reshape(4, 25, 128), b, counts=counts, scale_a=sa, scale_b=sb)
    assert out3.shape == (4, 25, 48) and out3.dtype == torch.bfloat16 and ran[-1][0].layout == "masked"


# Block scales (DeepSeek-V3's 1 x 128 for a, 128 x 128 for each expert's weight) ---------------------------

def _block_ops(layout="contiguous", T=100, G=4, N=200, K=256, seed=0):
    """e4m3 a ((T, K), or (G, T, K) slabs) and b (G, N, K) with block scales in the quantizers' MN-major
    layout, and the ranges: offsets with an empty group, or counts."""
    torch.manual_seed(seed)
    if layout == "contiguous":
        a, sa = fp8.quantize_blocks(torch.randn(T, K) * torch.linspace(0.1, 10, T)[:, None], 1)
        ranges = torch.tensor([0, 10, 10, 70, T], dtype=torch.int32)
    else:
        a, sa = fp8.quantize_expert_blocks(torch.randn(G, T, K), 1)
        ranges = torch.tensor([3, 0, T, 40][:G], dtype=torch.int32)
    w = torch.randn(G, N, K) * torch.linspace(0.5, 4, K)[None, None, :]
    b, sb = fp8.quantize_expert_blocks(w, 128)
    return a, b, ranges, sa, sb


def _forced_block(layout, bm, bn, out_dtype="bf16", groups=8, N=4096, rows=4096):
    return next(c for c in grouped.candidates(layout, groups, rows, N, 4096, dtype="e4m3", out_dtype=out_dtype,
                                              scale="block") if (c.bm, c.bn) == (bm, bn))


def _block_representative():
    ps = [_forced_block(layout, bm, bn) for layout in grouped.LAYOUTS for bm, bn in grouped.FP8_TILES]
    ps += [_forced_block("contiguous", 128, 192, "fp32"), _forced_block("contiguous", 128, 128, groups=256, rows=65536),
           _forced_block("masked", 64, 192, "fp16", N=4100)]
    assert [p.table for p in ps[-3:]] == [128, 512, 128] and ps[-1].direct
    assert all(p.scale == "block" for p in ps)
    return ps


@pytest.mark.parametrize("p", _block_representative(), ids=lambda p: p.compiled_name)
def test_block_scaled_plans_compile_clean(p):
    """QGMMA, TMA loads (and no cp.async: the scales come by TMA), no local memory, no spills, ptxas did not
    serialize the wgmmas; block-scaled promotion's FFMAs present (per-tensor promotion has plain FADDs)."""
    _check(p)
    from gemmlab.sass import disassemble

    ck = grouped.compile_plan(p)
    text = disassemble(ck.cubin, ck.mangled_name)
    assert "FFMA" in text and "LDGSTS" not in text
    assert "block scales" in repr(p) and ", 1, 1, " in p.compiled_name  # SCALE_BLOCK, promote every k-step


def _every_block():
    return [_forced_block(layout, bm, bn, odt, groups) for layout in grouped.LAYOUTS for bm, bn in grouped.FP8_TILES
            for odt in ("bf16", "fp16", "fp32") for groups in (8, 256)]


@pytest.mark.slow
@pytest.mark.parametrize("p", _every_block(), ids=lambda p: p.compiled_name)
def test_every_block_scaled_instantiation_compiles_clean(p):
    _check(p)


def test_block_plans_carry_a_scale_slot_per_stage():
    for table in grouped.TABLES:
        for bm, bn in grouped.FP8_TILES:
            q = grouped.stages_for(bm, bn, table, "block")
            assert q <= grouped.stages_for(bm, bn, table)  # the slots cost stages, never add any
            assert grouped.smem_bytes(bm, bn, q, "block") <= grouped.smem_limit(table) \
                < grouped.smem_bytes(bm, bn, q + 1, "block")
            # GroupedScales::SCALE_SLOT: bm + 4 row scales (a box from a multiple of 4 rows) padded to 128
            # bytes, then the box of 8 column-block scales, padded likewise.
            assert grouped.scale_slot_bytes(bm, "block") == (bm + 64) * 4 and grouped.scale_slot_bytes(bm) == 0
    assert grouped.stages_for(128, 128, 128, "block") == 5 < grouped.stages_for(128, 128, 128) == 6
    ps = grouped.candidates("masked", 8, 64, 4096, 7168, dtype="e4m3", scale="block")
    assert {(p.bm, p.bn) for p in ps} == set(grouped.FP8_TILES) and all(p.scale == "block" for p in ps)
    assert all(p.smem_bytes == grouped.smem_bytes(p.bm, p.bn, p.stages, "block") for p in ps)
    with pytest.raises(ValueError, match="scale must be"):
        grouped.candidates("contiguous", 8, 64, 4096, 7168, scale="block")  # bf16
    with pytest.raises(ValueError, match="K % 128"):
        grouped.candidates("contiguous", 8, 64, 4096, 7184, dtype="e4m3", scale="block")
    with pytest.raises(ValueError, match="block: e4m3 only"):
        dataclasses.replace(grouped.plan("contiguous", 8, 64, 4096, 7168), scale="block")


BAD_BLOCK = [
    (lambda a, b, o, sa, sb: ((a, b, o), {"scale_a": torch.ones(()), "scale_b": sb}), UnsupportedProblem,
     "mixing per-tensor and block"),
    (lambda a, b, o, sa, sb: ((a, b, o), {"scale_a": sa, "scale_b": torch.ones(4)}), UnsupportedProblem,
     "mixing per-tensor and block"),
    (lambda a, b, o, sa, sb: ((a[:, :144].contiguous(), b[:, :, :144].contiguous(), o),
                              {"scale_a": sa[:, :1], "scale_b": sb[:, :, :1]}), UnsupportedProblem, "K % 128"),
    (lambda a, b, o, sa, sb: ((a, b, o), {"scale_a": sa[:, :1], "scale_b": sb}), UnsupportedProblem,
     r"scale_a must be \(T, K / 128\) = \(100, 2\)"),
    (lambda a, b, o, sa, sb: ((a, b, o), {"scale_a": sa[:99], "scale_b": sb}), UnsupportedProblem,
     r"scale_a must be \(T, K / 128\)"),
    (lambda a, b, o, sa, sb: ((a, b, o), {"scale_a": sa, "scale_b": sb[0]}), UnsupportedProblem,
     r"scale_b must be \(G, ceil\(N / 128\), K / 128\) = \(4, 2, 2\)"),
    (lambda a, b, o, sa, sb: ((a, b, o), {"scale_a": sa, "scale_b": sb[:, :1]}), UnsupportedProblem,
     r"scale_b must be \(G, ceil\(N / 128\), K / 128\)"),
    (lambda a, b, o, sa, sb: ((a, b, o), {"scale_a": sa.double(), "scale_b": sb}), TypeError, "float32"),
    (lambda a, b, o, sa, sb: ((a, b, o), {"scale_a": sa, "scale_b": sb.half()}), TypeError, "float32"),
    (lambda a, b, o, sa, sb: ((a, b, o), {"scale_a": sa, "scale_b": sb.to("meta")}), UnsupportedProblem,
     "scale_b is on meta"),
    (lambda a, b, o, sa, sb: ((a.t().contiguous().t(), b, o), {"scale_a": sa, "scale_b": sb}), UnsupportedProblem,
     "unit stride along K"),
    (lambda a, b, o, sa, sb: ((a, b, o), {"scale_a": sa, "scale_b": sb, "out": torch.empty(100, 200)}),
     UnsupportedProblem, "no out="),
]


@pytest.mark.parametrize("make,exc,match", BAD_BLOCK, ids=[m for _, _, m in BAD_BLOCK])
def test_block_scaled_grouped_rejects_bad_arguments(make, exc, match):
    args, kw = make(*_block_ops())
    with pytest.raises(exc, match=match):
        gemmlab.grouped_mm(*args, **kw)


def test_masked_block_scales_need_slab_shapes():
    a, b, c, sa, sb = _block_ops("masked", T=32)
    p = grouped.validate(a, b, counts=c, scale_a=sa, scale_b=sb)
    assert p.scale == "block" and p.layout == "masked"
    with pytest.raises(UnsupportedProblem, match=r"scale_a must be \(G, C, K / 128\) = \(4, 32, 2\)"):
        grouped.validate(a, b, counts=c, scale_a=sa.reshape(-1, 2), scale_b=sb)
    with pytest.raises(UnsupportedProblem, match=r"scale_a must be \(G, C, K / 128\)"):
        grouped.validate(a, b, counts=c, scale_a=sa[:, :31], scale_b=sb)


@pytest.mark.parametrize("layout", grouped.LAYOUTS)
def test_block_launch_arguments_match_the_kernel_parameters(monkeypatch, layout):
    """The block scales' maps: A's (K / 128, rows) view with a (1, bm + 4) box, B's (K / 128, G ceil(N / 128))
    view with a (1, 8) box, both without swizzle, on the quantizers' scales in place; scale pointers and
    sb_step after them as for per-tensor scales."""
    a, b, o, sa, sb = _block_ops(layout, T=128 if layout == "contiguous" else 32)
    kw = {"offsets": o} if layout == "contiguous" else {"counts": o}
    prob = grouped.validate(a, b, **kw, scale_a=sa, scale_b=sb)
    p = dataclasses.replace(grouped.plan_for(a, b, **kw, scale_a=sa, scale_b=sb), direct=False)
    assert p.scale == "block" and p.name_expression.startswith("engine_gemm_grouped<Fp8GemmTraits<")
    captured, maps = {}, []

    def flat(t, box):
        maps.append(t)
        return ("tmap", t.dtype, tuple(t.shape), tuple(box), "flat")

    monkeypatch.setattr(grouped, "compile_plan", lambda p: "compiled")
    monkeypatch.setattr(grouped, "_tensor_map", lambda t, box: ("tmap", t.dtype, tuple(t.shape), tuple(box)))
    monkeypatch.setattr(grouped, "_tensor_map_flat", flat)
    monkeypatch.setattr(grouped, "_launch_fn", lambda: lambda compiled, **kw: captured.update(kw))
    out = torch.empty(prob.out_shape, dtype=torch.bfloat16)
    grouped.launch(p, a, b, o, prob.lead, out, sa, sb, prob.sb_step)
    args = captured["args"]
    assert launch_arg_types(args) == unsigned(ptx_param_types(grouped.SOURCE, p.name_expression))
    assert captured["smem"] == p.smem_bytes == grouped.smem_bytes(p.bm, p.bn, p.stages, "block")
    assert args[3] == ("tmap", torch.float32, (2, 128), (1, p.bm + 4), "flat")  # (K / 128, T or G x C)
    assert args[4] == ("tmap", torch.float32, (2, 4 * 2), (1, 8), "flat")  # (K / 128, G x ceil(200 / 128))
    assert maps[0].data_ptr() == sa.data_ptr() and maps[1].data_ptr() == sb.data_ptr()  # in place, no copy
    assert torch.equal(maps[0].t(), sa.reshape(-1, 2)) and torch.equal(maps[1].t(), sb.reshape(-1, 2))
    assert args[12] is sa and args[13] is sb and int(args[14]) == 0
    with pytest.raises(UnsupportedProblem, match="plan is for block scales"):
        grouped.launch(p, a, b, o, prob.lead, out, torch.ones(()), torch.ones(()))


@pytest.mark.parametrize("layout", ["row-major", "slab-mn", "quantized", "expanded"])
def test_scale_rows_mn_major(layout):
    """(G, R, K / 128) block scales as the (K / 128, G R) view: in place for the quantizers' layout, one
    padded copy (16-byte aligned pitch) for others, including per-slab MN-major slabs whose rows cannot be
    merged into one view; the same values every time."""
    torch.manual_seed(2)
    G, R, KB = 3, 37, 5
    ref = torch.rand(G, R, KB) + 0.5
    if layout == "row-major":
        s = ref.clone()
    elif layout == "slab-mn":  # each slab (KB, R) MN-major on its own: strides (KB R, 1, R)
        s = ref.transpose(1, 2).contiguous().transpose(1, 2)
    elif layout == "quantized":
        s = fp8.quantize_expert_blocks(torch.randn(G, R, KB * 128), 1)[1]
        ref = s.clone()
    else:  # one row's scales broadcast over every row (stride 0)
        s = ref[:, :1].expand(G, R, KB)
        ref = s.clone()
    v = grouped.scale_rows_mn_major(s)
    assert v.shape == (KB, G * R) and v.stride(1) == 1 and (v.stride(0) * 4) % 16 == 0 and v.data_ptr() % 16 == 0
    assert torch.equal(v.t(), ref.reshape(G * R, KB))
    assert (v.data_ptr() == s.data_ptr()) == (layout == "quantized")
    # 2-D (contiguous a's (T, K / 128)) goes through the dense path's helper unchanged.
    two = fp8.quantize_blocks(torch.randn(50, 384), 1)[1]
    assert grouped.scale_rows_mn_major(two).data_ptr() == two.data_ptr()


def test_quantize_expert_blocks_keeps_experts_apart():
    """Each expert's (N, K) weight quantized alone (a block never mixes two experts, N not a multiple of
    128), scales MN-major over all experts' blocks; dequantized it is within e4m3's rounding of the input."""
    torch.manual_seed(3)
    w = torch.randn(3, 200, 256)
    w[1] *= 1000  # an expert of another magnitude: a shared block would show it in its neighbours' scales
    q, s = fp8.quantize_expert_blocks(w, 128)
    assert q.shape == w.shape and q.dtype == E4M3 and s.shape == (3, 2, 2) and s.stride()[1] == 1
    for g in range(3):
        for j in range(2):
            for kb in range(2):
                blk = w[g, 128 * j:128 * (j + 1), 128 * kb:128 * (kb + 1)]
                assert torch.isclose(s[g, j, kb], blk.abs().max() / fp8.E4M3_MAX)
        deq = fp8.dequantize(q[g], s[g])
        assert (deq - w[g].double()).abs().max() <= 2 ** -3 * w[g].abs().max()


@pytest.mark.parametrize("layout", grouped.LAYOUTS)
def test_block_reference_against_the_formula(layout):
    """out[r, n] = sum_kb scale_a[r, kb] scale_b[g, n // 128, kb] sum_{k in kb} a[r, k] b[g, n, k], written
    out over k-blocks, for the rows of each group; NaN (not written) elsewhere."""
    a, b, r, sa, sb = _block_ops(layout, T=100 if layout == "contiguous" else 40)
    kw = {"offsets": r} if layout == "contiguous" else {"counts": r}
    ref = grouped.reference_grouped_mm(a, b, **kw, scale_a=sa, scale_b=sb)
    A, SA = a.double().reshape(-1, 256), sa.double().reshape(-1, 2)
    out = torch.full((A.shape[0], 200), float("nan"), dtype=torch.float64)
    spans = ([(0, 10), (10, 0), (10, 60), (70, 30)] if layout == "contiguous"
             else [(g * 40, n) for g, n in enumerate([3, 0, 40, 40])])
    for g, (s, n) in enumerate(spans):
        if n:
            acc = torch.zeros(n, 200, dtype=torch.float64)
            for kb in range(2):
                ks = slice(128 * kb, 128 * (kb + 1))
                part = A[s:s + n, ks] @ b[g, :, ks].double().t()
                colscale = sb[g, :, kb].double().repeat_interleave(128)[:200]
                acc += part * SA[s:s + n, kb:kb + 1] * colscale[None, :]
            out[s:s + n] = acc
    assert torch.allclose(ref.reshape(-1, 200), out, rtol=1e-12, atol=1e-12, equal_nan=True)
    assert bool(torch.isnan(out).any()) == (layout == "masked")  # slabs' rows past their counts
    assert not torch.isnan(out[spans[-1][0]]).any()


def test_block_scaled_call_path_and_fake_impl_on_cpu(monkeypatch):
    ran = []

    def launch(p, a, b, ranges, lead, out, scale_a=None, scale_b=None, sb_step=0):
        assert p.scale == "block" and scale_a.dim() >= 2
        ref = grouped.reference_grouped_mm(a, b, **({"offsets": ranges} if a.dim() == 2 else {"counts": ranges}),
                                           scale_a=scale_a, scale_b=scale_b)
        out.copy_(torch.where(torch.isnan(ref), out.to(ref.dtype), ref).to(out.dtype))
        ran.append(p)

    monkeypatch.setattr(grouped, "launch", launch)
    fakes.route_grouped_launches(monkeypatch)
    for layout in grouped.LAYOUTS:
        a, b, r, sa, sb = _block_ops(layout, T=100 if layout == "contiguous" else 40)
        kw = {"offsets": r} if layout == "contiguous" else {"counts": r}
        out = gemmlab.grouped_mm(a, b, **kw, scale_a=sa, scale_b=sb, out_dtype=torch.float32)
        ref = grouped.reference_grouped_mm(a, b, **kw, scale_a=sa, scale_b=sb)
        written = ~torch.isnan(ref[..., 0])
        assert out.shape == ref.shape and torch.allclose(out[written].double(), ref[written], rtol=1e-6, atol=1e-5)
        assert ran[-1].layout == layout and ran[-1].scale == "block"
        with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
            fa, fb, fr, fsa, fsb = (mode.from_tensor(x) for x in (a, b, r, sa, sb))
            offs, counts = (fr, None) if layout == "contiguous" else (None, fr)
            fake = grouped._grouped_scaled_mm_op(fa, fb, offs, counts, fsa, fsb, None)
        assert fake.shape == ref.shape and fake.dtype == torch.bfloat16
