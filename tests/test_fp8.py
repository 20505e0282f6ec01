"""FP8 (e4m3) GEMM without a GPU: the FP8 engine kernel's instantiations compile for sm_90a without spills
and their SASS has the FP8 wgmma of the plan's shape (QGMMA.64xNx32.F32.E4M3.E4M3), TMA loads and stores;
the plans' rules and repr; ``gemmlab.scaled_mm``'s argument errors; the custom op's fake implementation;
the float64 reference and the quantizers the GPU tests use.

The default run compiles a representative set (11 instantiations); ``-m slow`` compiles every tile the
FP8 planner may pick, per scale mode, with the plainest and the heaviest epilogue (~110 compiles).
"""

import dataclasses
import math

import pytest
import torch

import gemmlab
from gemmlab import engine2, fp8, planner, sass
from gemmlab.errors import UnsupportedProblem

import fakes
from fakes import launch_arg_types, ptx_param_types, unsigned


def _check(p: planner.Fp8Plan) -> None:
    ck = engine2.compile_fp8_plan(p)
    assert ck.cubin[:4] == b"\x7fELF"
    summary = sass.kernel_summary(ck)
    assert sass.check(engine2.sass_expect_fp8(p), summary, ck.resources) == [], p
    # Split promotion: the wgmmas cover one column part (128 x 256: n = 128).
    assert engine2.qgmma_shapes(ck) == {f"64x{p.bn // p.part_split}x32.F32.E4M3.E4M3"}, p
    assert not ck.resources.spills and ck.resources.stack_frame == 0, (p, ck.resources)
    if p.consumers > 1:
        # setmaxnreg takes the consumers' registers from the CTA's launch allocation (168 a thread at 384
        # threads): producer + 2 x consumer must not pass 3 x 168, or setmaxnreg.inc waits forever.
        assert ck.resources.registers == 168, (p, ck.resources)
        regs = _setmaxnreg(ck)
        assert regs["dealloc"] + 2 * regs["alloc"] <= 3 * 168 and regs["alloc"] >= 232, (p, regs)
        # The producer's code after its setmaxnreg.dec stays within the registers it kept.
        assert regs["producer_max_reg"] < regs["dealloc"], (p, regs)
    for needle in ("serialized", "C7510", "C7519"):  # ptxas's warnings that wgmma was serialized
        assert needle not in ck.log, f"{p}:\n{ck.log}"


def _setmaxnreg(ck) -> dict:
    """The consumers' and the producer's setmaxnreg counts in the SASS (USETMAXREG.TRY_ALLOC / .DEALLOC),
    and the highest register the producer's code uses between its DEALLOC and its last EXIT."""
    import re

    ins = sass.parse(sass.disassemble(ck.cubin, ck.mangled_name))
    out = {}
    for i, x in enumerate(ins):
        if x.opcode.startswith("USETMAXREG"):
            kind = "alloc" if "ALLOC" in x.opcode and "DEALLOC" not in x.opcode else "dealloc"
            out[kind] = int(x.operands.split(",")[-1].strip().rstrip(";"), 0)
            if kind == "dealloc":
                start = i
    # The producer branch runs from its DEALLOC to the EXIT that ends it (the unpredicated one).
    end = next(j for j in range(start, len(ins)) if ins[j].base == "EXIT" and not ins[j].predicate)
    out["producer_max_reg"] = max((int(r) for x in ins[start:end + 1] for r in re.findall(r"\bR(\d+)\b", x.operands)),
                                  default=0)
    return out


def _representative():
    """~12 instantiations: the model's picks for a square (both scale modes), a big square, a few-row and a one-row problem; DIRECT; the heaviest epilogue; no
    promotion; and forced tiles at the space's edges (256 x 96 block, 64 x 240), 128 x 208 block, whose
    tiles straddle B's scale blocks at any multiple of 16 (8 copies of the k-loop; not offered with block
    scales, still compiled clean), 128 x 224 / 64 x 224 block (4 phases, offered; 128 x 224 with the
    consumers at 240 registers), and 128 x 256 in both modes (split promotion). The every-choice sweep
    compiles every offered tile."""
    seen = {}
    for shape, kw in (((4096, 4096, 4096), {}), ((4096, 4096, 4096), {"scale": "block"}),
                      ((8192, 8192, 8192), {}), ((128, 4096, 4096), {}), ((1, 4096, 4096), {"scale": "block"}),
                      ((4095, 4097, 4096), {}),  # DIRECT stores
                      ((2048, 4096, 4096), {"out_dtype": "fp32", "bias_dtype": "bf16", "activation": "gelu"}),
                      ((2048, 4096, 16384), {"promote": 0})):  # no promotion until the tile's end
        p = planner.plan_fp8(*shape, **kw)
        seen.setdefault(p.name_expression, p)
    for bm, bn, scale in ((256, 96, "block"), (64, 240, "tensor"), (128, 208, "block"), (128, 224, "block"),
                          (64, 224, "block"), (128, 256, "tensor"), (128, 256, "block")):
        # Block scales on straddling tiles are not offered (slow promotion) but the kernel runs them when
        # forced: the per-tensor plan of the tile with block scales.
        p = next(c for c in planner.fp8_candidates(4096, 4096, 4096) if (c.bm, c.bn) == (bm, bn))
        p = dataclasses.replace(p, scale=scale, stages=planner.fp8_stages_for(bm, bn, scale))
        seen.setdefault(p.name_expression, p)
    return list(seen.values())


@pytest.mark.parametrize("p", _representative(), ids=lambda p: p.compiled_name)
def test_representative_fp8_plans_compile_clean(p):
    _check(p)


def test_representative_set_covers_the_space():
    ps = _representative()
    assert {p.bm for p in ps} == {64, 128, 256} and {p.scale for p in ps} == set(planner.FP8_SCALES)
    assert any(p.direct for p in ps) and any(p.out_dtype == "fp32" and p.bias_dtype for p in ps)
    assert {p.promote for p in ps} >= {0, 1}
    assert any(p.scale == "block" and 128 % p.bn and p.bn % 128 for p in ps)  # straddling tiles
    assert {p.scale for p in ps if p.part_split == 2} == set(planner.FP8_SCALES)  # split promotion


def _every_choice():
    out = []
    for heavy in (False, True):
        kw = dict(out_dtype="fp32", bias_dtype="bf16", activation="gelu", direct=True) if heavy else {}
        for scale in planner.FP8_SCALES:
            out += planner.fp8_candidates(4096, 4096, 4096, scale=scale, **kw)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("p", _every_choice(), ids=lambda p: p.compiled_name)
def test_every_fp8_choice_compiles_clean(p):
    _check(p)


def test_every_fp8_tile_is_offered():
    """Every tile of FP8_TILES is a candidate with per-tensor scales; block scales the widths whose tiles
    never straddle B's 128-column scale blocks at a varying column, and those that start at up to 4
    column offsets inside a block (192: 0 or 64; 96, 160, 224: four multiples of 32)."""
    tensor = {(p.bm, p.bn) for p in planner.fp8_candidates(4096, 4096, 4096)}
    block = {(p.bm, p.bn) for p in planner.fp8_candidates(4096, 4096, 4096, scale="block")}
    assert tensor == set(planner.FP8_TILES)
    assert block == {(bm, bn) for bm, bn in tensor
                     if 128 % bn == 0 or bn % 128 == 0 or bn in (96, 160, 192, 224)} and block
    assert {(64, 192), (128, 192), (64, 224), (128, 224)} <= block
    assert not {(128, 208), (128, 176), (64, 240)} & block
    assert [planner.fp8_sb_phases(bn) for bn in (64, 128, 192, 224, 208)] == [1, 1, 2, 4, 8]


# Plans -----------------------------------------------------------------------------------------------

def test_fp8_plan_fields_and_repr():
    p = planner.plan_fp8(4096, 4096, 4096, scale="block")
    assert p.dtype == "e4m3" and p.kernel == "engine_gemm_fp8" and p.schedule == "data_parallel"
    assert p.k_iters == 32 and p.promote == 1 and p.grid == min(132, p.tiles)
    assert p.smem_bytes <= planner.SMEM_LIMIT and p.smem_bytes == planner.fp8_smem_bytes(p.bm, p.bn, p.stages, "block")
    assert planner.fp8_smem_bytes(p.bm, p.bn, p.stages + 1, "block") > planner.SMEM_LIMIT or p.stages == planner.MAX_STAGES
    # Slots of whole 128 bytes (the row scales' TMA destination): 128 + 1 and 128 + 3 floats -> 160.
    assert planner.fp8_scale_slot_bytes(128, 128, "block") == 640 and planner.fp8_scale_slot_bytes(128, 128) == 0
    assert planner.fp8_scale_slot_bytes(128, 192, "block") == 160 * 4 and planner.fp8_scale_slot_bytes(64, 128, "block") == 96 * 4
    assert p.name_expression.startswith("engine_gemm_fp8<Fp8GemmTraits<__nv_bfloat16, float, ")
    assert p.template_args()[5:7] == ("1", "1")  # SCALE_BLOCK, promote every k-step
    r = repr(p)
    assert r.startswith("Fp8Plan(4096x4096x4096 e4m3->bf16: engine_gemm_fp8 ")
    assert "block scales" in r and "promoted every 128 of K" in r and "predicted" in r
    q = planner.plan_fp8(1000, 1001, 4096, out_dtype="fp32", bias_dtype="fp32", activation="silu", promote=0)
    assert q.direct  # 1001 fp32 columns: rows not 16-byte aligned
    assert "per-tensor scales" in repr(q) and "promoted once per tile" in repr(q) and "silu" in repr(q)
    assert q.template_args()[0] == "float" and q.template_args()[6] == "0"
    assert q.a_rows == min(q.bm, math.ceil((1000 - (q.tiles_m - 1) * q.bm) / 8) * 8)


def test_split_promotion_plans():
    """128 x 256 is the one split tile (planner.FP8_PART_SPLIT): its plans say so in their template
    arguments (PART_SPLIT, the last), repr and price (one more wgmma drain per k-step); every other tile
    keeps one part."""
    assert planner.FP8_PART_SPLIT == {(128, 256): 2}
    for scale in planner.FP8_SCALES:
        cands = planner.fp8_candidates(4096, 4096, 4096, scale=scale)
        assert {(c.bm, c.bn) for c in cands if c.part_split == 2} == {(128, 256)}
        p = next(c for c in cands if c.bn == 256)
        assert p.template_args()[-1] == "2" and p.name_expression.endswith(", 2>>") and "in 2 column parts" in repr(p)
        assert all(c.template_args()[-1] == "1" for c in cands if c.bn != 256)
        prof = planner.H200
        assert p.predicted_s > planner.fp8_predict_s(4096, 4096, 4096, 128, 256, p.stages, 1, prof, 1)
    # Shared memory: per-tensor keeps 4 stages of 48 KB; block scales' slots leave room for 3.
    assert planner.fp8_stages_for(128, 256) == 4 and planner.fp8_stages_for(128, 256, "block") == 3


def test_block_scales_price_the_k_loop_copies():
    """Block scales on a tile of more than two column phases (96, 160, 224 wide: four copies of the k-loop)
    cost fp8_block_phases_factor more a k-step than the same tile's per-tensor plan; tiles of one or two
    phases cost the same in both modes. Measured (H200, fp8_tiles_probe.jsonl): 128 x 224 block ran 3-15%
    behind 128 x 192 / 128 x 256 where the model without the factor priced it ahead, so those shapes' block
    plans run 192 or 256 wide (8192x6144x4096: 128 x 224 385.7 us, 128 x 192 347.6)."""
    prof = planner.H200
    assert prof.fp8_block_phases_factor > 1.0
    args = (8192, 6144, 4096)
    for bn, phases in ((224, 4), (160, 4), (96, 4), (192, 2), (128, 1), (256, 1)):
        assert planner.fp8_sb_phases(bn) == phases
        st = planner.fp8_stages_for(128, bn, "block")
        tensor = planner.fp8_predict_s(*args, 128, bn, st, 1, prof, planner.fp8_part_split(128, bn))
        block = planner.fp8_predict_s(*args, 128, bn, st, 1, prof, planner.fp8_part_split(128, bn), "block")
        assert (block > tensor * 1.02) if phases > 2 else block == tensor, (bn, block, tensor)
    for shape in ((8192, 6144, 4096), (8192, 14336, 4096), (2048, 14336, 4096), (8192, 8192, 8192)):
        p = planner.plan_fp8(*shape, scale="block")
        assert planner.fp8_sb_phases(p.bn) <= 2, p
    # Per-tensor plans are priced as before: 128 x 224 stays a per-tensor pick.
    assert planner.plan_fp8(8192, 6144, 4096).bn == 224


def test_fp8_plan_rejects_what_the_kernel_cannot_run():
    with pytest.raises(ValueError, match="scale mode"):
        planner.plan_fp8(128, 128, 128, scale="rowwise")
    with pytest.raises(ValueError, match="promote"):
        planner.plan_fp8(128, 128, 128, scale="block", promote=2)
    with pytest.raises(ValueError, match="promote"):
        planner.plan_fp8(128, 128, 128, promote=-1)
    with pytest.raises(ValueError, match="M, N, K"):
        planner.plan_fp8(0, 128, 128)
    assert planner.fp8_tile_problem(256, 128) and planner.fp8_tile_problem(64, 256)  # spill: not offered
    # 128 x 256 runs split promotion: every k-step, so not with another interval.
    assert planner.fp8_tile_problem(128, 256) is None and planner.fp8_tile_problem(128, 256, "block") is None
    assert "promote = 1" in planner.fp8_tile_problem(128, 256, promote=4)
    assert "promote = 1" in planner.fp8_tile_problem(128, 256, promote=0)
    assert all(c.bn < 256 for c in planner.fp8_candidates(4096, 4096, 4096, promote=4))
    assert planner.fp8_tile_problem(128, 224, "block") is None and planner.fp8_tile_problem(128, 224) is None
    assert "8 column phases" in planner.fp8_tile_problem(128, 208, "block")
    assert planner.fp8_tile_problem(128, 128, "block") is None
    assert planner.fp8_tile_problem(128, 128) is None


def test_fp8_model_prefers_full_waves_and_big_tiles_on_big_problems():
    p = planner.plan_fp8(8192, 8192, 8192)
    assert p.bm >= 128 and p.bn >= 128
    # TFLOP/s the unfitted model predicts stay below the FP8 peak at the planned clock.
    prof = planner.H200
    peak = prof.flop_per_clk_sm["fp8"] * prof.sm_count * prof.plan_clock_mhz * 1e6
    assert 2 * 8192 ** 3 / p.predicted_s < peak


# scaled_mm's arguments ---------------------------------------------------------------------------------

def _ops(M=64, N=256, K=256, block=False):
    torch.manual_seed(0)
    x, w = torch.randn(M, K), torch.randn(N, K)
    if block:
        a, sa = fp8.quantize_blocks(x, 1)
        q, sb = fp8.quantize_blocks(w, 128)
    else:
        (a, sa), (q, sb) = fp8.quantize_per_tensor(x), fp8.quantize_per_tensor(w)
    return a, q.t(), sa, sb


BAD = [
    (lambda a, b, sa, sb: (a.float(), b, sa, sb, {}), TypeError, "float8_e4m3fn"),
    (lambda a, b, sa, sb: (a, b.to(torch.float8_e5m2), sa, sb, {}), TypeError, "float8_e4m3fn"),
    (lambda a, b, sa, sb: (a[None], b, sa, sb, {}), UnsupportedProblem, "2-D"),
    (lambda a, b, sa, sb: (a, b[:128], sa, sb, {}), UnsupportedProblem, "inner dimensions"),
    (lambda a, b, sa, sb: (a.t().contiguous().t(), b, sa, sb, {}), UnsupportedProblem, "row-major"),
    (lambda a, b, sa, sb: (a, b.contiguous(), sa, sb, {}), UnsupportedProblem, r"transpose of a row-major \(N, K\)"),
    (lambda a, b, sa, sb: (a[:, :200], b[:200], sa, sb, {}), UnsupportedProblem, "K % 16"),
    (lambda a, b, sa, sb: (a, b, sa.double(), sb, {}), TypeError, "float32"),
    (lambda a, b, sa, sb: (a, b, sa, sb.reshape(1, 1), {}), UnsupportedProblem, "row-wise"),
    (lambda a, b, sa, sb: (a, b, torch.ones(64, 1), torch.ones(1, 256), {}), UnsupportedProblem, "row-wise"),
    (lambda a, b, sa, sb: (a, b, sa, sb, {"out_dtype": torch.float8_e4m3fn}), TypeError, "out_dtype"),
    (lambda a, b, sa, sb: (a, b, sa, sb, {"bias": torch.ones(255)}), UnsupportedProblem,
     r"bias must have shape \(N,\)"),
    (lambda a, b, sa, sb: (a, b, sa, sb, {"bias": torch.ones(256, dtype=torch.int32)}), TypeError, "bias must be"),
    (lambda a, b, sa, sb: (a, b, sa, sb, {"activation": "tanh"}), UnsupportedProblem, "unknown activation"),
]


@pytest.mark.parametrize("make,exc,match", BAD, ids=[m for _, _, m in BAD])
def test_scaled_mm_rejects_bad_arguments(make, exc, match):
    """TypeError for dtypes (as gemmlab.matmul), UnsupportedProblem (a ValueError) for the rest."""
    a, b, sa, sb, kw = make(*_ops())
    with pytest.raises(exc, match=match):
        gemmlab.scaled_mm(a, b, sa, sb, **kw)
    assert issubclass(UnsupportedProblem, ValueError)


def test_block_scales_need_their_shapes():
    a, b, sa, sb = _ops(M=64, N=200, K=384, block=True)
    assert sa.shape == (64, 3) and sb.shape == (2, 3)
    fp8.validate(a, b, sa, sb, None, None, None)  # the right shapes pass
    with pytest.raises(UnsupportedProblem, match=r"scale_a must be \(M, K / 128\) = \(64, 3\)"):
        gemmlab.scaled_mm(a, b, sa[:, :2], sb)
    with pytest.raises(UnsupportedProblem, match=r"scale_b must be \(ceil\(N / 128\), K / 128\) = \(2, 3\)"):
        gemmlab.scaled_mm(a, b, sa, sb[:1])
    with pytest.raises(UnsupportedProblem, match="block scales need K % 128"):
        gemmlab.scaled_mm(a[:, :368], b[:368], torch.ones(64, 2), torch.ones(2, 2))
    with pytest.raises(UnsupportedProblem, match="0-dim tensors"):
        gemmlab.scaled_mm(a, b, sa, torch.tensor(1.0))  # one block, one per-tensor


def test_scaled_mm_needs_a_cuda_device():
    a, b, sa, sb = _ops()
    with pytest.raises(UnsupportedProblem, match="CUDA"):
        gemmlab.scaled_mm(a, b, sa, sb)


def test_scaled_mm_is_lazy_and_registered():
    assert "scaled_mm" in dir(gemmlab) and gemmlab.scaled_mm is fp8.scaled_mm
    assert hasattr(torch.ops.gemmlab, "scaled_mm")


# The custom op's fake implementation -------------------------------------------------------------------

@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("block", [False, True])
def test_fake_impl_shapes_and_dtypes(out_dtype, block):
    from torch._subclasses.fake_tensor import FakeTensorMode

    a, b, sa, sb = _ops(M=77, N=300, K=256, block=block)
    with FakeTensorMode() as mode:
        fa, fb, fsa, fsb = (mode.from_tensor(t) for t in (a, b, sa, sb))
        out = torch.ops.gemmlab.scaled_mm(fa, fb, fsa, fsb, None, out_dtype, None)
        assert out.shape == (77, 300) and out.dtype == out_dtype
        with pytest.raises(UnsupportedProblem):
            torch.ops.gemmlab.scaled_mm(fa, fb[:128], fsa, fsb, None, out_dtype, None)


def test_scaled_mm_traces_as_one_op():
    from torch.fx.experimental.proxy_tensor import make_fx

    a, b, sa, sb = _ops(block=True)
    bias = torch.zeros(256)
    g = make_fx(lambda a, b, sa, sb, bias: gemmlab.scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.float32,
                                                             activation="relu"),
                tracing_mode="fake")(a, b, sa, sb, bias)
    calls = [n for n in g.graph.nodes if n.op == "call_function"]
    assert [str(n.target) for n in calls] == ["gemmlab.scaled_mm.default"]
    assert calls[0].meta["val"].shape == (64, 256) and calls[0].meta["val"].dtype == torch.float32


# The reference and the quantizers ------------------------------------------------------------------------

def test_dequantize_blocks_by_hand():
    torch.manual_seed(1)
    R, K = 130, 256
    x = torch.randn(R, K)
    qa, sa = fp8.quantize_blocks(x, 1)
    qw, sw = fp8.quantize_blocks(x, 128)
    assert sa.shape == (R, 2) and sw.shape == (2, 2)
    da, dw = fp8.dequantize(qa, sa), fp8.dequantize(qw, sw)
    for r in (0, 77, 129):
        for k in (0, 127, 128, 255):
            assert da[r, k] == qa[r, k].double() * sa[r, k // 128].double()
            assert dw[r, k] == qw[r, k].double() * sw[r // 128, k // 128].double()
    # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 for values above the block's subnormals.
    big = x.abs() > x.abs().amax() / 16
    assert ((da - x.double()).abs() <= x.abs().double() * 2 ** -4 + 1e-12)[big].all()
    assert qa.float().abs().amax() <= fp8.E4M3_MAX and torch.isfinite(qa.float()).all()


def test_reference_matches_a_loop_over_k_blocks():
    """The block formula written out: out[m, n] = sum_kb sa[m, kb] sb[n // 128, kb] sum_{k in kb} a b."""
    a, b, sa, sb = _ops(M=5, N=200, K=256, block=True)
    ref = fp8.reference_scaled_mm(a, b, sa, sb)
    A, B = a.double(), b.double()
    for m, n in ((0, 0), (4, 199), (2, 128), (3, 127)):
        want = sum(sa[m, kb].double() * sb[n // 128, kb].double() * (A[m, kb * 128:(kb + 1) * 128]
                   @ B[kb * 128:(kb + 1) * 128, n]) for kb in range(2))
        assert torch.allclose(ref[m, n], want, rtol=1e-12, atol=1e-12)


def test_reference_per_tensor_and_epilogue():
    a, b, sa, sb = _ops(M=8, N=32, K=64)
    bias = torch.randn(32)
    ref = fp8.reference_scaled_mm(a, b, sa, sb, bias=bias, activation="relu")
    want = torch.relu(sa.double() * sb.double() * (a.double() @ b.double()) + bias.double())
    assert ref.dtype == torch.float64 and torch.allclose(ref, want, rtol=1e-12, atol=1e-12)


def test_quantized_product_is_close_to_the_real_one():
    """What the GPU tests lean on: the dequantized reference is within e4m3's error of the fp32 product."""
    torch.manual_seed(2)
    x, w = torch.randn(64, 512), torch.randn(96, 512)
    exact = x.double() @ w.double().t()
    for block in (False, True):
        if block:
            (a, sa), (q, sb) = fp8.quantize_blocks(x, 1), fp8.quantize_blocks(w, 128)
        else:
            (a, sa), (q, sb) = fp8.quantize_per_tensor(x), fp8.quantize_per_tensor(w)
        ref = fp8.reference_scaled_mm(a, q.t(), sa, sb)
        rel = (ref - exact).norm() / exact.norm()
        assert 1e-4 < rel < 0.08, (block, rel)  # quantized (not exact), but close


# The launch's arguments against the kernel's parameter list ---------------------------------------------

@pytest.mark.parametrize("scale", planner.FP8_SCALES)
def test_launch_fp8_arguments_match_the_kernel_parameters(monkeypatch, scale):
    """engine2.launch_fp8's argument list, captured on CPU tensors, has the kernel's parameters in order
    and size: five tensor maps by value, then pointers (8 bytes), int32, int64 and float32 scalars."""
    M, N, K = 300, 1000, 1024
    a, b, sa, sb = _ops(M, N, K, block=scale == "block")
    p = planner.plan_fp8(M, N, K, scale=scale, bias_dtype="bf16")
    captured = {}
    monkeypatch.setattr(engine2, "compile_fp8_plan", lambda p: "compiled")
    monkeypatch.setattr(engine2, "tensor_map_2d", lambda t, box, swizzle_bytes=128: ("tmap", t.dtype, tuple(box)))
    monkeypatch.setattr(engine2, "device_order_table", lambda name, tm, tn, group, dev, pair_m=1:
                        torch.zeros(tm * tn, dtype=torch.int32))
    monkeypatch.setattr(engine2, "_launch", lambda compiled, **kw: captured.update(kw))
    out = torch.empty(M, N, dtype=torch.bfloat16)
    engine2.launch_fp8(p, a, b.t(), sa, sb, out, bias=torch.zeros(N, dtype=torch.bfloat16))
    args = captured["args"]
    assert captured["grid"] == p.grid and captured["block"] == p.threads and captured["smem"] == p.smem_bytes

    assert launch_arg_types(args) == unsigned(ptx_param_types(planner.FP8_SOURCE, p.name_expression))
    # The operand maps are byte views with 128-byte (one swizzle row) boxes; A's short box for ragged M.
    assert args[0] == ("tmap", torch.uint8, (p.bm, 128)) and args[2] == ("tmap", torch.uint8, (p.bn, 128))
    assert args[1] == ("tmap", torch.uint8, (p.a_rows, 128)) and p.a_rows == 48  # 300 = 2 x 128 + 44 -> 48
    if scale == "block":  # the scales: a (1, bm) and a (1, 8) fp32 box of their MN-major views
        assert args[5] == ("tmap", torch.float32, (1, p.bm)) and args[6] == ("tmap", torch.float32, (1, 8))


def test_block_scale_registers_cover_every_tile():
    """fp8_traits.cuh's SB_BLOCKS (B scales a thread holds per k-block, (128 - gcd(BN, 128) + BN + 127)
    / 128; planner.fp8_sb_blocks) is enough for every tile of every FP8 width: a tile at column n0 touches
    B blocks n0 // 128 .. (n0 + BN - 1) // 128, within the slot's box of 8 from (n0 // 128) & ~3. And
    mainloop_fp8.cuh's consume_block_phase / promote_at: the tile's offset n0 % 128 is one of SB_PHASES multiples
    of gcd(BN, 128) (0 where SB_ALIGNED), and column group j's block (n0 + 8j) // 128 - n0 // 128 is
    (OFF + 8j) // 128 with OFF that compile-time offset."""
    for bn in sorted({bn for _, bn in planner.FP8_TILES} | {256}):
        step = math.gcd(bn, 128)
        sb_blocks = planner.fp8_sb_blocks(bn)
        assert sb_blocks == (128 - step + bn + 127) // 128 and sb_blocks <= 4
        aligned = 128 % bn == 0 or bn % 128 == 0
        offsets = set()
        for t in range(256):
            n0 = t * bn
            nb = n0 // 128
            assert (n0 + bn - 1) // 128 - nb + 1 <= sb_blocks, (bn, n0)
            assert nb % 4 + sb_blocks <= 8  # inside the box of 8 loaded from nb & ~3
            off = 0 if aligned else n0 % 128
            assert off % step == 0
            offsets.add(off)
            for j in range(bn // 8):
                assert (off + 8 * j) // 128 == (n0 + 8 * j) // 128 - nb, (bn, n0, j)
        assert len(offsets) == planner.fp8_sb_phases(bn), bn


# The call path on CPU: scaled_mm -> the custom op -> plan -> launch_fp8 (replaced by the reference) ------

@pytest.fixture
def fake_launch(monkeypatch):
    """fp8.gemm and the prepared calls run on CPU tensors, their launches replaced by fakes that check what
    they are given against the plan and write the float64 reference into ``out`` (tests/fakes.py);
    yields the plans they ran."""
    yield fakes.fake_fp8_launches(monkeypatch).ran
    fp8.clear_prepared_calls()


@pytest.mark.parametrize("block", [False, True])
def test_call_path_on_cpu(fake_launch, block):
    a, b, sa, sb = _ops(M=100, N=300, K=256, block=block)
    bias = torch.randn(300)
    out = gemmlab.scaled_mm(a, b, sa, sb, out_dtype=torch.float32, bias=bias, activation="silu")
    p = fake_launch[-1]
    assert (p.M, p.N, p.K, p.scale, p.out_dtype, p.bias_dtype, p.activation) == (
        100, 300, 256, "block" if block else "tensor", "fp32", "fp32", "silu")
    assert not p.direct  # 300 fp32 columns: 1200-byte rows
    assert out.shape == (100, 300) and out.dtype == torch.float32
    assert torch.allclose(out.double(), fp8.reference_scaled_mm(a, b, sa, sb, bias=bias, activation="silu"))
    out = gemmlab.scaled_mm(a, b, sa, sb)  # bf16, N = 300: 600-byte rows are not 16-byte aligned
    assert out.dtype == torch.bfloat16 and fake_launch[-1].direct


def test_call_path_under_torch_compile_on_cpu(fake_launch):
    a, b, sa, sb = _ops(M=64, N=128, K=256, block=True)

    def f(a, b, sa, sb):
        return gemmlab.scaled_mm(a, b, sa, sb, out_dtype=torch.float32) * 2

    out = torch.compile(f, backend="eager", fullgraph=True)(a, b, sa, sb)
    assert torch.allclose(out.double(), 2 * fp8.reference_scaled_mm(a, b, sa, sb))


def test_empty_and_k0_on_cpu(fake_launch):
    a, b, sa, sb = _ops(M=64, N=128, K=128)
    assert gemmlab.scaled_mm(a[:0], b, sa, sb).shape == (0, 128)
    out = gemmlab.scaled_mm(a[:, :0], b[:0], sa, sb, bias=torch.ones(128), activation="relu")
    assert torch.equal(out, torch.ones(64, 128, dtype=torch.bfloat16))
    assert not fake_launch  # nothing launched for an empty problem


@pytest.mark.parametrize("M,KB,layout", [(300, 4, "mn"), (300, 4, "row"), (301, 6, "row"), (8, 1, "row"),
                                         (301, 3, "mn-unpadded")])
def test_block_scales_mn_major(M, KB, layout):
    """The (K / 128, M) view the kernel's TMA reads: used in place when already MN-major with 16-byte
    aligned rows (quantize_blocks' layout), else a padded copy; the same values either way."""
    torch.manual_seed(1)
    ref = torch.rand(M, KB) + 0.5
    if layout == "mn":
        s = fp8.quantize_blocks(torch.randn(M, KB * 128), 1)[1]
        ref = s.clone()
    elif layout == "row":
        s = ref.clone()
    else:  # MN-major, rows of M = 301 floats: not 16-byte aligned
        s = ref.t().contiguous().t()
    v = engine2.block_scales_mn_major(s)
    assert v.shape == (KB, M) and v.stride(1) == 1 and (v.stride(0) * 4) % 16 == 0 and v.data_ptr() % 16 == 0
    assert torch.equal(v, ref.t())
    # One k-block: an (M, 1) column is MN-major already.
    assert (v.data_ptr() == s.data_ptr()) == (layout == "mn" or (KB == 1 and M % 4 == 0))
