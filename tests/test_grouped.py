"""Grouped GEMM (``gemmlab.grouped_mm``) without a GPU: the grouped kernel's instantiations compile for sm_90a
without spills or local memory and their SASS has the plan's HGMMA, TMA loads, the group table's warp scan
and no TMA store; the launch's argument list against the kernel's PTX parameters; argument errors; the
custom ops' fake implementations; the float64 reference for both layouts (with the kernel's clamping of
bad offsets / counts); the call path with the launch replaced by the reference; and a Python mirror of
the kernel's tile walk (group_scheduler.cuh) covering every stored element exactly once.

The default run compiles 10 instantiations; ``-m slow`` compiles every tile x layout x dtype x out dtype (48).
"""

import math

import pytest
import torch

import gemmlab
from gemmlab import engine2, grouped, sass
from gemmlab.errors import UnsupportedProblem

from fakes import launch_arg_types, ptx_param_types, unsigned


def _check(p: grouped.GroupedPlan) -> None:
    ck = grouped.compile_plan(p)
    assert ck.cubin[:4] == b"\x7fELF"
    summary = sass.kernel_summary(ck)
    assert sass.check(grouped.sass_expect(p), summary, ck.resources) == [], p
    suffix = ".BF16" if p.dtype == "bf16" else ""
    assert engine2.hgmma_shapes(ck) == {f"64x{p.bn}x16.F32{suffix}"}, p
    assert not ck.resources.spills and ck.resources.stack_frame == 0, (p, ck.resources)
    assert ck.resources.static_shared >= grouped.TABLE_BYTES  # the group table is static shared memory
    assert p.smem_bytes + ck.resources.static_shared <= 227 * 1024, p
    for needle in ("serialized", "C7510", "C7519"):  # ptxas's warnings that wgmma was serialized
        assert needle not in ck.log, f"{p}:\n{ck.log}"


def _forced(layout, bm, bn, dtype="bf16", out_dtype="bf16"):
    return next(c for c in grouped.candidates(layout, 8, 4096, 4096, 4096, dtype=dtype, out_dtype=out_dtype)
                if (c.bm, c.bn) == (bm, bn))


def _representative():
    ps = [_forced(layout, bm, bn) for layout in grouped.LAYOUTS for bm, bn in grouped.TILES]
    ps += [_forced("contiguous", 128, 256, "fp16", "fp32"), _forced("masked", 64, 128, "fp16", "fp16")]
    return ps


def _every():
    return [_forced(layout, bm, bn, dt, odt) for layout in grouped.LAYOUTS for bm, bn in grouped.TILES
            for dt in ("bf16", "fp16") for odt in ("bf16", "fp16", "fp32")]


@pytest.mark.parametrize("p", _representative(), ids=lambda p: p.compiled_name)
def test_representative_grouped_plans_compile_clean(p):
    _check(p)


@pytest.mark.slow
@pytest.mark.parametrize("p", _every(), ids=lambda p: p.compiled_name)
def test_every_grouped_instantiation_compiles_clean(p):
    _check(p)


def test_plans_fit_and_are_priced():
    for layout in grouped.LAYOUTS:
        ps = grouped.candidates(layout, 64, 8192, 1408, 2048)
        assert {(p.bm, p.bn) for p in ps} == set(grouped.TILES)
        assert all(p.smem_bytes <= grouped.SMEM_LIMIT and p.stages >= 3 for p in ps)
        assert ps == sorted(ps, key=lambda p: (round(p.predicted_s, 9), -p.bm * p.bn))
        assert all(0 < p.grid <= 132 for p in ps)
    # Few rows a group (decode): one short tile each; more rows priced as more time.
    few = grouped.plan("contiguous", 256, 256, 2048, 7168)
    many = grouped.plan("contiguous", 256, 65536, 2048, 7168)
    assert few.predicted_s < many.predicted_s
    assert few.expected_rows == 1.0 and many.expected_rows == 256.0
    assert grouped.plan("masked", 8, 64, 4096, 4096).expected_rows == 64  # masked: priced at capacity
    with pytest.raises(ValueError, match="groups"):
        grouped.plan("contiguous", grouped.MAX_GROUPS + 1, 64, 64, 64)


# The kernel's tile walk, mirrored in Python -----------------------------------------------------------

def _walk(layout, ranges, G, limit, N, bm, bn, grid):
    """group_scheduler.cuh's GroupTable.build + locate and the data-parallel scheduler, in Python: every
    CTA's (group, row0, rows, m, n) units, plus the A rows each tile's box covers."""
    tiles_n = math.ceil(N / bn)
    spans = grouped.group_rows(layout, torch.tensor(ranges, dtype=torch.int32), G, limit)
    first, acc = [], 0
    for s, r in spans:
        first.append(acc)
        acc += math.ceil(r / bm) * tiles_n
    first.append(acc)
    units = []
    for cta in range(grid):
        for t in range(cta, acc, grid):
            lo, hi = 0, G - 1
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if first[mid] <= t:
                    lo = mid
                else:
                    hi = mid - 1
            s, r = spans[lo]
            tm = math.ceil(r / bm)
            local = t - first[lo]
            units.append((lo, s, r, local % tm, local // tm))
    return spans, units


@pytest.mark.parametrize("layout,ranges,limit", [
    ("contiguous", [0, 5, 5, 200, 200, 201, 330], 330),        # G + 1 boundaries, empty groups
    ("contiguous", [5, 5, 200, 200, 201, 330], 330),           # G ends (torch._grouped_mm's offs)
    ("contiguous", [0, 400, -3, 100, 90, 330, 331], 330),      # bad offsets: clamped, never outside
    ("masked", [0, 64, 3, 200, -1, 128], 128),                 # counts past capacity / negative: clamped
])
def test_tile_walk_covers_each_stored_element_once(layout, ranges, limit):
    G = 6
    N, bm, bn = 300, 128, 128
    spans, units = _walk(layout, ranges, G, limit, N, bm, bn, grid=7)
    written = {}
    for g, s, r, m, n in units:
        assert 0 <= m * bm < r and 0 <= n * bn < N  # no tile lies wholly outside its group
        for row in range(m * bm, min(r, (m + 1) * bm)):
            for col in (n * bn, min(N, (n + 1) * bn) - 1):
                written[(s + row, col)] = written.get((s + row, col), 0) + 1
    want = {(s + row, col) for s, r in spans for row in range(r) for col in range(0, N, bn)}
    assert {k for k in written if k[1] % bn == 0} == want
    rows_total = limit if layout == "contiguous" else G * limit
    assert all(0 <= k[0] < rows_total for k in written)
    if layout == "contiguous" and ranges[:2] != [0, 400]:
        assert all(v == 1 for v in written.values())


# Arguments ------------------------------------------------------------------------------------------

def _ops(G=4, T=100, N=48, K=64, dtype=torch.bfloat16):
    torch.manual_seed(0)
    a = torch.randn(T, K).to(dtype)
    b = torch.randn(G, N, K).to(dtype)
    offs = torch.tensor([0, 10, 10, 70, T], dtype=torch.int32)[: G + 1]
    return a, b, offs


BAD = [
    (lambda a, b, o: ((a.float(), b, o), {}), TypeError, "a must be torch.bfloat16"),
    (lambda a, b, o: ((a, b.half(), o), {}), TypeError, "same dtype"),
    (lambda a, b, o: ((a, b, o.long()), {}), TypeError, "offsets must be torch.int32"),
    (lambda a, b, o: ((a, b, o.tolist()), {}), TypeError, "int32 torch.Tensor"),
    (lambda a, b, o: ((a, b, torch.zeros(10, dtype=torch.int32)[::2]), {}), UnsupportedProblem,
     "offsets must be contiguous"),
    (lambda a, b, o: ((a, b), {}), UnsupportedProblem, "exactly one of offsets"),
    (lambda a, b, o: ((a, b, o), {"counts": o[:4]}), UnsupportedProblem, "exactly one of offsets"),
    (lambda a, b, o: ((a, b[0], o), {}), UnsupportedProblem, "b must be 3-D"),
    (lambda a, b, o: ((a, b, o[:3]), {}), UnsupportedProblem, "G \\+ 1 = 5 boundaries or G = 4 ends"),
    (lambda a, b, o: ((a, b, o.reshape(5, 1)), {}), UnsupportedProblem, "offsets must be 1-D"),
    (lambda a, b, o: ((a.reshape(4, 25, 64), b, o), {}), UnsupportedProblem, "with offsets, a must be 2-D"),
    (lambda a, b, o: ((a, b), {"counts": o}), UnsupportedProblem, "with counts, a must be 3-D"),
    (lambda a, b, o: ((a.reshape(4, 25, 64), b), {"counts": o}), UnsupportedProblem, "counts must be 1-D of G = 4"),
    (lambda a, b, o: ((a[:, :56], b, o), {}), UnsupportedProblem, "inner dimensions differ"),
    (lambda a, b, o: ((a[:, :60], b[:, :, :60], o), {}), UnsupportedProblem, "multiple of 8"),
    (lambda a, b, o: ((a.t().contiguous().t(), b, o), {}), UnsupportedProblem, "a must have unit stride"),
    (lambda a, b, o: ((a, b.transpose(1, 2).contiguous().transpose(1, 2), o), {}), UnsupportedProblem,
     "b must have unit stride"),
    (lambda a, b, o: ((a, torch.zeros(600, 8, 64, dtype=torch.bfloat16), torch.zeros(601, dtype=torch.int32)), {}),
     UnsupportedProblem, "1 .. 512 groups"),
    (lambda a, b, o: ((a, b, o), {"out_dtype": torch.int8}), TypeError, "out_dtype must be"),
    (lambda a, b, o: ((a, b, o), {"out": torch.empty(100, 47, dtype=torch.bfloat16)}), UnsupportedProblem,
     r"out must have shape \(100, 48\)"),
    (lambda a, b, o: ((a, b, o), {"out": torch.empty(100, 48), "out_dtype": torch.bfloat16}), TypeError,
     "out is torch.float32 but out_dtype"),
    (lambda a, b, o: ((a, b, o), {"out": torch.empty(48, 100, dtype=torch.bfloat16).t()}), UnsupportedProblem,
     "out must have unit stride"),
]


@pytest.mark.parametrize("make,exc,match", BAD, ids=[m for _, _, m in BAD])
def test_grouped_mm_rejects_bad_arguments(make, exc, match):
    args, kw = make(*_ops())
    with pytest.raises(exc, match=match):
        gemmlab.grouped_mm(*args, **kw)


def test_device_mismatch_is_an_error():
    a, b, o = _ops()
    meta = o.to("meta")
    with pytest.raises(UnsupportedProblem, match="offsets is on meta"):
        grouped.validate(a, b, meta)


def test_grouped_mm_needs_a_cuda_device():
    a, b, o = _ops()
    with pytest.raises(UnsupportedProblem, match="CUDA"):
        gemmlab.grouped_mm(a, b, o)


def test_grouped_mm_is_lazy_and_registered():
    assert "grouped_mm" in dir(gemmlab) and gemmlab.grouped_mm is grouped.grouped_mm
    assert hasattr(torch.ops.gemmlab, "grouped_mm") and hasattr(torch.ops.gemmlab, "grouped_mm_out")


# Fake implementations ------------------------------------------------------------------------------------

@pytest.mark.parametrize("out_dtype", [None, torch.float16, torch.float32])
def test_fake_impl_shapes_and_dtypes(out_dtype):
    from torch._subclasses.fake_tensor import FakeTensorMode

    a, b, o = _ops()
    counts = torch.tensor([3, 0, 25, 7], dtype=torch.int32)
    with FakeTensorMode() as mode:
        fa, fb, fo, fc = (mode.from_tensor(t) for t in (a, b, o, counts))
        out = torch.ops.gemmlab.grouped_mm(fa, fb, fo, None, out_dtype)
        assert out.shape == (100, 48) and out.dtype == (out_dtype or torch.bfloat16)
        out = torch.ops.gemmlab.grouped_mm(fa.reshape(4, 25, 64), fb, None, fc, out_dtype)
        assert out.shape == (4, 25, 48) and out.dtype == (out_dtype or torch.bfloat16)
        with pytest.raises(UnsupportedProblem):
            torch.ops.gemmlab.grouped_mm(fa, fb, fo[:2], None, out_dtype)
        fout = mode.from_tensor(torch.empty(100, 48, dtype=torch.float32))
        assert torch.ops.gemmlab.grouped_mm_out(fa, fb, fo, None, fout) is None


def test_grouped_mm_traces_as_one_op():
    from torch.fx.experimental.proxy_tensor import make_fx

    a, b, o = _ops()
    g = make_fx(lambda a, b, o: gemmlab.grouped_mm(a, b, o, out_dtype=torch.float32), tracing_mode="fake")(a, b, o)
    calls = [n for n in g.graph.nodes if n.op == "call_function"]
    assert [str(n.target) for n in calls] == ["gemmlab.grouped_mm.default"]
    assert calls[0].meta["val"].shape == (100, 48) and calls[0].meta["val"].dtype == torch.float32


# The launch's arguments against the kernel's parameter list ----------------------------------------------

@pytest.mark.parametrize("layout", grouped.LAYOUTS)
def test_launch_arguments_match_the_kernel_parameters(monkeypatch, layout):
    """grouped.launch's arguments, captured on CPU tensors: two tensor maps by value (A over all rows with a
    bm x 64 box, B as (G * N, K) with a bn x 64 box), then the ranges pointer, lead, G, limit, N, K, out, ldo."""
    a, b, o = _ops(T=128)
    if layout == "masked":
        a, o = a.reshape(4, 32, 64), torch.tensor([3, 0, 32, 40], dtype=torch.int32)
    p = grouped.plan_for(a, b, *((o, None) if layout == "contiguous" else (None, o)))
    captured = {}
    monkeypatch.setattr(grouped, "compile_plan", lambda p: "compiled")
    monkeypatch.setattr(grouped, "_tensor_map", lambda t, box: ("tmap", tuple(t.shape), tuple(box)))
    monkeypatch.setattr(grouped, "_launch_fn", lambda: lambda compiled, **kw: captured.update(kw))
    out = torch.empty((128, 48) if layout == "contiguous" else (4, 32, 48), dtype=torch.bfloat16)
    grouped.launch(p, a, b, o, 1 if layout == "contiguous" else 0, out)
    args = captured["args"]
    assert captured["grid"] == p.grid and captured["block"] == p.threads and captured["smem"] == p.smem_bytes

    assert launch_arg_types(args) == unsigned(ptx_param_types(grouped.SOURCE, p.name_expression))
    assert args[0] == ("tmap", (128, 64), (p.bm, 64)) and args[1] == ("tmap", (4 * 48, 64), (p.bn, 64))
    limit = 128 if layout == "contiguous" else 32
    assert [int(x) for x in args[3:8]] == [1 if layout == "contiguous" else 0, 4, limit, 48, 64]
    assert args[8].shape == (128, 48) and int(args[9]) == 48


# The reference and the call path on CPU ------------------------------------------------------------------

def test_reference_contiguous_by_hand():
    a, b, o = _ops()
    ref = grouped.reference_grouped_mm(a, b, o)
    A, B = a.double(), b.double()
    for g, (s, e) in enumerate(((0, 10), (10, 10), (10, 70), (70, 100))):
        assert torch.equal(ref[s:e], A[s:e] @ B[g].t())
    # G ends (torch._grouped_mm's offs) give the same groups.
    assert torch.equal(grouped.reference_grouped_mm(a, b, o[1:]), ref)
    # Rows no group covers keep the fill.
    short = torch.tensor([0, 10, 10, 70, 90], dtype=torch.int32)
    r2 = grouped.reference_grouped_mm(a, b, short)
    assert torch.isnan(r2[90:]).all() and torch.equal(r2[:90], ref[:90])


def test_reference_masked_and_clamping():
    a, b, _ = _ops(T=100)
    a3 = a.reshape(4, 25, 64)
    counts = torch.tensor([3, 0, 25, 99], dtype=torch.int32)  # 99 > capacity: clamped to 25
    ref = grouped.reference_grouped_mm(a3, b, counts=counts)
    assert ref.shape == (4, 25, 48)
    for g, n in enumerate((3, 0, 25, 25)):
        assert torch.equal(ref[g, :n], a3[g, :n].double() @ b[g].double().t())
        assert torch.isnan(ref[g, n:]).all()
    # Bad offsets: negative start, an end before its start, an end past T.
    bad = torch.tensor([-5, 20, 10, 60, 500], dtype=torch.int32)
    assert grouped.group_rows("contiguous", bad, 4, 100) == [(0, 20), (20, 0), (10, 50), (60, 40)]


@pytest.fixture
def fake_launch(monkeypatch):
    """grouped.run on CPU tensors with grouped.launch replaced by the float64 reference writing only the
    groups' rows (as the kernel does); yields the plans run."""
    ran = []

    def launch(p, a, b, ranges, lead, out):
        layout = "contiguous" if a.dim() == 2 else "masked"
        assert p.layout == layout and out.dtype == grouped._DTYPES[p.out_dtype]
        kw = {"offsets": ranges} if layout == "contiguous" else {"counts": ranges}
        assert lead == (1 if layout == "contiguous" and ranges.shape[0] == b.shape[0] + 1 else 0)
        ref = grouped.reference_grouped_mm(a, b, **kw)
        keep = torch.isnan(ref)
        out.copy_(torch.where(keep, out.to(ref.dtype), ref).to(out.dtype))
        ran.append(p)

    monkeypatch.setattr(grouped, "_runs_here", lambda a: True)
    monkeypatch.setattr(grouped, "launch", launch)
    yield ran


def test_call_path_on_cpu(fake_launch):
    a, b, o = _ops()
    out = gemmlab.grouped_mm(a, b, o, out_dtype=torch.float32)
    assert out.shape == (100, 48) and out.dtype == torch.float32 and fake_launch[-1].layout == "contiguous"
    assert torch.allclose(out.double(), grouped.reference_grouped_mm(a, b, o), rtol=1e-5, atol=1e-4)
    # out= keeps the rows outside the groups.
    poison = torch.full((100, 48), 7.0, dtype=torch.bfloat16)
    gemmlab.grouped_mm(a, b, torch.tensor([0, 10, 10, 70, 90], dtype=torch.int32), out=poison)
    assert (poison[90:] == 7).all() and not (poison[:90] == 7).all()
    counts = torch.tensor([3, 0, 25, 7], dtype=torch.int32)
    out3 = torch.full((4, 25, 48), 7.0, dtype=torch.bfloat16)
    gemmlab.grouped_mm(a.reshape(4, 25, 64), b, counts=counts, out=out3)
    assert fake_launch[-1].layout == "masked" and (out3[0, 3:] == 7).all() and (out3[1] == 7).all()
