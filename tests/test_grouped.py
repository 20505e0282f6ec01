"""Grouped GEMM (``gemmlab.grouped_mm``) without a GPU: the grouped kernel's instantiations compile for sm_90a
without spills or local memory and their SASS has the plan's HGMMA, TMA loads, the group table's warp scan
and TMA stores (none with DIRECT stores); the launch's argument list against the kernel's PTX parameters;
the plan model (stages as the dense engine's, one group priced as the dense model prices it, the dense
planner's tile for large groups); argument errors; the custom ops' fake implementations; the float64
reference for both layouts (with the kernel's clamping of bad offsets / counts); the call path with the
launch replaced by the reference; and a Python mirror of the kernel's tile walk (group_scheduler.cuh, with
panels) covering every stored element exactly once, TMA-stored blocks inside their group.

The default run compiles 39 representative instantiations; ``-m slow`` compiles every plan ``candidates``
lists for each layout x dtype x out dtype x group table (and MN-major b, claim order): 558.
"""

import dataclasses
import math

import pytest
import torch

import gemmlab
from gemmlab import engine2, grouped, plan_cost, planner, sass
from gemmlab.errors import UnsupportedProblem

import fakes
from fakes import launch_arg_types, ptx_param_types, unsigned


def _check(p: grouped.GroupedPlan) -> None:
    ck = grouped.compile_plan(p)
    assert ck.cubin[:4] == b"\x7fELF"
    summary = sass.kernel_summary(ck)
    assert sass.check(grouped.sass_expect(p), summary, ck.resources) == [], p
    suffix = ".BF16" if p.dtype == "bf16" else ""
    widths = grouped.fit_widths(p.bn) if p.fit else (p.bn,)  # the fitted form: a k-loop a token-tile width
    assert engine2.hgmma_shapes(ck) == {f"64x{w}x16.F32{suffix}" for w in widths}, p
    assert not ck.resources.spills and ck.resources.stack_frame == 0, (p, ck.resources)
    assert ck.resources.static_shared >= grouped.table_bytes(p.table)  # the group table is static shared memory
    assert p.smem_bytes + ck.resources.static_shared <= 227 * 1024, p
    for needle in ("serialized", "C7510", "C7519"):  # ptxas's warnings that wgmma was serialized
        assert needle not in ck.log, f"{p}:\n{ck.log}"


def _forced(layout, bm, bn, dtype="bf16", out_dtype="bf16", groups=8, N=4096, rows=4096, schedule="data_parallel",
            b_mn=False):
    return next(c for c in grouped.candidates(layout, groups, rows, N, 4096, dtype=dtype, out_dtype=out_dtype,
                                              b_mn=b_mn)
                if (c.bm, c.bn, c.schedule) == (bm, bn, schedule))


def _representative():
    ps = [_forced(layout, bm, bn) for layout in grouped.LAYOUTS for bm, bn in grouped.TILES]
    ps += [_forced("contiguous", 128, 256, "fp16", "fp32"), _forced("masked", 64, 128, "fp16", "fp16")]
    # The 512-group table (one stage fewer) and DIRECT stores (out's rows not 16-byte aligned: N = 4100).
    ps += [_forced("contiguous", 128, 256, groups=256, rows=65536), _forced("masked", 256, 128, groups=256),
           _forced("contiguous", 128, 256, N=4100), _forced("masked", 64, 256, "fp16", "fp16", N=4100)]
    assert [p.table for p in ps[-4:]] == [512, 512, 128, 128] and [p.direct for p in ps[-4:]] == [0, 0, 1, 1]
    # Stream-K (bf16 / fp16): the tiles the planner offers it on, TMA and DIRECT stores, both tables.
    ps += [_forced("contiguous", 128, 256, schedule="stream_k"), _forced("masked", 256, 128, schedule="stream_k"),
           _forced("contiguous", 64, 128, "fp16", "fp32", schedule="stream_k"),
           _forced("contiguous", 128, 128, groups=256, rows=65536, schedule="stream_k"),
           _forced("contiguous", 64, 128, N=4100, schedule="stream_k")]
    # Ping-pong (bf16 / fp16): both tiles, TMA and DIRECT stores, fp32 out, both tables, masked.
    ps += [_forced("contiguous", 64, 256, schedule="pingpong"), _forced("masked", 128, 128, schedule="pingpong"),
           _forced("contiguous", 128, 128, "fp16", "fp32", groups=256, rows=65536, schedule="pingpong"),
           _forced("contiguous", 64, 256, N=4100, schedule="pingpong")]
    # Tail pieces (128 x 160 / 176 ping-pong: 32 / 48 columns past the last whole piece; fp32 out 16 / 0),
    # TMA and DIRECT stores.
    ps += [_forced("contiguous", 128, 176, schedule="pingpong"), _forced("masked", 128, 160, schedule="pingpong"),
           _forced("contiguous", 128, 176, "fp16", "fp32", schedule="pingpong"),
           _forced("contiguous", 128, 160, N=4100, schedule="pingpong"),
           _forced("contiguous", 128, 176, "bf16", "fp32", N=4100, schedule="pingpong")]
    # MN-major b (B_MN): every schedule, both tables, fp32 out, DIRECT stores.
    ps += [_forced("contiguous", 128, 256, b_mn=True), _forced("masked", 256, 128, "fp16", "fp32", b_mn=True),
           _forced("contiguous", 128, 128, schedule="stream_k", b_mn=True),
           _forced("contiguous", 64, 256, groups=256, rows=65536, schedule="pingpong", b_mn=True),
           _forced("contiguous", 128, 128, N=4104, schedule="pingpong", b_mn=True)]
    # Tiles in claim order: data-parallel and ping-pong, both tables, MN-major b, fp32 out.
    ps += [dataclasses.replace(p, claim=True) for p in (
        _forced("contiguous", 128, 256), _forced("masked", 64, 128, "fp16", "fp32", groups=256),
        _forced("contiguous", 128, 128, schedule="pingpong", b_mn=True), _forced("contiguous", 64, 256, schedule="pingpong"))]
    return ps


def _every():
    """Every plan ``candidates`` lists for 8 and 256 groups (the two tables; 256 groups of 16 rows store
    every block directly): bf16 / fp16 operands with each output dtype, MN-major b, and in claim order."""
    def listed(layout, dt, odt, groups, b_mn=False):  # the tiled kernel's (the fitted form's: test_grouped_fit.py)
        return [p for p in grouped.candidates(layout, groups, 4096, 4096, 4096, dtype=dt, out_dtype=odt, b_mn=b_mn)
                if not p.fit]

    ps = [p for layout in grouped.LAYOUTS for groups in (8, 256) for dt in ("bf16", "fp16")
          for odt in ("bf16", "fp16", "fp32") for p in listed(layout, dt, odt, groups)]
    ps += [p for layout in grouped.LAYOUTS for groups in (8, 256) for odt in ("bf16", "fp32")
           for p in listed(layout, "bf16", odt, groups, b_mn=True)]
    ps += [dataclasses.replace(p, claim=True) for layout in grouped.LAYOUTS for groups in (8, 256)
           for dt, b_mn in (("bf16", False), ("fp16", False), ("bf16", True)) for odt in ("bf16", "fp32")
           for p in listed(layout, dt, odt, groups, b_mn)
           if p.schedule != "stream_k" and (p.bm, p.bn) not in grouped.CLAIM_REFUSED]
    return list({p.compiled_name: p for p in ps}.values())


@pytest.mark.parametrize("p", _representative(), ids=lambda p: p.compiled_name)
def test_representative_grouped_plans_compile_clean(p):
    _check(p)


@pytest.mark.slow
@pytest.mark.parametrize("p", _every(), ids=lambda p: p.compiled_name)
def test_every_grouped_instantiation_compiles_clean(p):
    _check(p)


def _share(p):
    return grouped.crossing_share(p.expected_rows, p.bm, p.layout == "contiguous")


def test_plans_fit_and_are_priced():
    for layout in grouped.LAYOUTS:
        for groups in (64, 256):
            ps = grouped.candidates(layout, groups, 8192, 1408, 2048)
            # every tile, and the ping-pong tiles where their stores compile clean (pingpong_problem)
            assert set(grouped.TILES) <= {(p.bm, p.bn) for p in ps} <= set(grouped.TILES) | set(grouped.PINGPONG_TILES)
            assert all(p.table == (128 if groups <= 128 else 512) for p in ps)
            assert all(p.smem_bytes <= grouped.smem_limit(p.table) and p.stages >= 3 for p in ps)
            assert [p.predicted_s for p in ps] == sorted(p.predicted_s for p in ps)
            assert all(0 < p.grid <= 132 for p in ps)
            # DIRECT stores only where most blocks cross a group's end (out's rows are aligned here); the
            # fitted form (listed at 128 rows a group with ping-pong consumers) stores every row itself
            assert all(p.direct == (p.fit or _share(p) >= grouped.ALL_DIRECT_SHARE) for p in ps)
    # Few rows a group (decode): one short tile each; more rows priced as more time.
    few = grouped.plan("contiguous", 256, 256, 2048, 7168)
    many = grouped.plan("contiguous", 256, 65536, 2048, 7168)
    assert few.predicted_s < many.predicted_s
    assert few.expected_rows == 1.0 and many.expected_rows == 256.0
    assert grouped.plan("masked", 8, 64, 4096, 4096).expected_rows == 64  # masked: priced at capacity
    with pytest.raises(ValueError, match="groups"):
        grouped.plan("contiguous", grouped.MAX_GROUPS + 1, 64, 64, 64)


def test_stages_match_the_dense_engine_with_the_small_table():
    """The 128-group table leaves the dense engine's depth at every tile; the 512-group one costs a stage
    at 128 x 128, 128 x 256 and 256 x 128."""
    for bm, bn in grouped.TILES:
        dense = planner.stages_for(bm, bn, "data_parallel")
        assert grouped.stages_for(bm, bn, 128) == dense
        assert grouped.stages_for(bm, bn, 512) == dense - (0 if bm == 64 else 1)
        for table in grouped.TABLES:
            q = grouped.stages_for(bm, bn, table)
            assert grouped.smem_bytes(bm, bn, q) <= grouped.smem_limit(table) < grouped.smem_bytes(bm, bn, q + 1)


@pytest.mark.parametrize("M,N,K,bm,bn", [(2048, 28672, 4096, 128, 256), (512, 4096, 14336, 128, 128),
                                         (1024, 2816, 2048, 64, 256), (4096, 4096, 4096, 256, 128)])
def test_one_group_is_priced_as_the_dense_data_parallel_plan(M, N, K, bm, bn):
    """The grouped model calls plan_cost's fitted pieces: for one group of M rows (a multiple of bm, so no
    ragged tile) it is the dense model's data-parallel price at the same stages, without the dense engine's
    faster L2 rate for 64-row tiles (``tile64_l2_factor``: measured on the dense kernel only)."""
    from gemmlab.devices import H200

    q = grouped.stages_for(bm, bn, 128)
    dense = dataclasses.replace(H200, tile64_l2_factor=1.0)
    want = plan_cost.predict_s(M, N, K, bm=bm, bn=bn, schedule="data_parallel", stages=q, prof=dense)
    assert grouped.predict_s(1, M, N, K, bm, bn, q, H200) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("G,T,N,K", [(8, 16384, 28672, 4096), (8, 16384, 4096, 14336)])
def test_large_groups_pick_the_dense_planners_tile(G, T, N, K):
    """Mixtral at T = 16384 (2048 rows an expert): the dense planner runs each expert's GEMM with 128 x 256
    data-parallel tiles at 4 stages; the grouped plan picks the same (it picked 128 x 128 before: the
    DIRECT store's price and one stage fewer made the wide tile look slow)."""
    # The dense planner's pick among the schedules the grouped kernel has (not ping-pong).
    d = planner.candidates(T // G, N, K, schedules=("data_parallel", "split_k", "stream_k"))[0]
    g = grouped.plan("contiguous", G, T, N, K)
    assert (d.schedule, d.bm, d.bn, d.stages) == ("data_parallel", 128, 256, 4)
    assert (g.bm, g.bn, g.stages, g.table, g.direct) == (128, 256, 4, 128, False)


def test_stream_k_is_listed_for_16_bit_operands_and_ranked_first_where_a_partial_wave_is_priced():
    """Beside every data-parallel plan a stream-K one (bf16 / fp16; not e4m3), priced the same where no
    partial wave is left (the tie goes to data-parallel) and below it where the last wave's k-steps spread
    over every SM pay: Mixtral's down projection at T = 4096 (576 tiles of 128 x 256 for groups of 512 rows
    and half a tile each: 4.4 waves). Refused for e4m3. The tiled kernel's plans (the ping-pong fitted form,
    listed beside them, is taken by rule)."""
    both = [c for c in grouped.candidates("contiguous", 8, 4096, 4096, 14336) if not c.fit]
    assert {c.schedule for c in both} == set(grouped.SCHEDULES)
    assert both[0].schedule == "stream_k" and both[0].predicted_s < both[1].predicted_s
    # plan() (what grouped_mm runs) takes it: priced below STREAM_K_MARGIN of the data-parallel pick.
    assert both[0].predicted_s <= grouped.STREAM_K_MARGIN * next(
        c for c in both if c.schedule == "data_parallel").predicted_s
    assert grouped.plan("contiguous", 8, 4096, 4096, 14336).schedule == "stream_k"
    for c in (c for c in both if c.schedule == "stream_k"):
        twin = next(d for d in both if (d.bm, d.bn, d.schedule) == (c.bm, c.bn, "data_parallel"))
        assert c.predicted_s <= twin.predicted_s * 1.1  # stream-K never priced far above its twin
    # One wave or less: nothing to stream, the same price, data-parallel first.
    few = grouped.candidates("contiguous", 8, 256, 512, 4096)
    assert few[0].schedule == "data_parallel"
    for c in (c for c in few if c.schedule == "stream_k"):
        twin = next(d for d in few if (d.bm, d.bn, d.schedule) == (c.bm, c.bn, "data_parallel"))
        assert c.predicted_s == twin.predicted_s
    assert {c.schedule for c in grouped.candidates("contiguous", 8, 4096, 4096, 14336, dtype="e4m3")} == {
        "data_parallel"}
    # The tiles that spill with the partials' code (the slow compile sweep) have none.
    fp32 = grouped.candidates("contiguous", 8, 4096, 4096, 14336, out_dtype="fp32")
    assert {(c.bm, c.bn) for c in both if c.schedule == "stream_k"} == {(64, 128), (128, 128), (128, 256), (256, 128)}
    assert {(c.bm, c.bn) for c in fp32 if c.schedule == "stream_k"} == {(64, 128), (128, 128), (256, 128)}
    with pytest.raises(ValueError, match="stream_k"):
        dataclasses.replace(grouped.candidates("contiguous", 8, 4096, 4096, 4096, dtype="e4m3")[0],
                            schedule="stream_k")


def test_ping_pong_is_listed_on_its_tiles_and_taken_only_once_offered(monkeypatch):
    """Ping-pong plans (bf16 / fp16) on PINGPONG_TILES, two consumers (64-row tiles too) with their slabs,
    priced below their cooperative twin where a tile's epilogue hides under the other consumer's k-loop;
    plan() takes one only with PINGPONG_OFFERED; refused for e4m3 and 256-row tiles. (The fitted form's
    ping-pong plan, listed and taken here: test_grouped_fit.py.)"""
    monkeypatch.setattr(grouped, "FIT_PINGPONG_OFFERED", False)
    cands = [c for c in grouped.candidates("contiguous", 8, 4096, 28672, 4096) if not c.fit]
    pp = [c for c in cands if c.schedule == "pingpong"]
    assert {(c.bm, c.bn) for c in pp} == set(grouped.PINGPONG_TILES)
    assert {(c.bm, c.bn): c.stages for c in pp} == {(64, 256): 4, (128, 128): 6, (128, 160): 5, (128, 176): 5}
    for c in pp:
        assert c.consumers == 2 and c.threads == 384 and c.template_args()[-1] == "3"
        assert c.smem_bytes == 1024 + c.stages * (c.bm + c.bn) * grouped.BK * 2 + 4 * grouped.SLAB_BYTES
        twin = next((d for d in cands if (d.bm, d.bn, d.schedule) == (c.bm, c.bn, "data_parallel")), None)
        # 64 x 256 keeps a stage fewer beside the second consumer's slabs; the tail tiles are ping-pong only
        if twin and c.stages == twin.stages:
            assert c.predicted_s < twin.predicted_s  # 34 waves: every epilogue but the last hidden
        assert "ping-pong" in repr(c)
    best_pp = next(c for c in pp if c.bn % 64 == 0)  # no tail tile offered
    monkeypatch.setattr(grouped, "PINGPONG_OFFERED", False)
    assert grouped.plan("contiguous", 8, 4096, 28672, 4096).schedule != "pingpong"
    monkeypatch.setattr(grouped, "PINGPONG_OFFERED", True)
    monkeypatch.setattr(grouped, "STREAM_K_OFFERED", False)
    picked = grouped.plan("contiguous", 8, 4096, 28672, 4096)
    assert picked == next(c for c in cands if c.schedule != "stream_k" and c.bn % 64 == 0)  # no tail tile offered
    assert picked.predicted_s <= best_pp.predicted_s
    assert "pingpong" not in {c.schedule for c in grouped.candidates("contiguous", 8, 4096, 4096, 4096, dtype="e4m3")}
    base = grouped.candidates("contiguous", 8, 4096, 4096, 4096)[0]
    with pytest.raises(ValueError, match="pingpong"):
        dataclasses.replace(base, bm=256, bn=128, schedule="pingpong")


def test_hbm_bound_ties_pick_the_fewest_rows_then_the_shortest_busy_plan(monkeypatch):
    """At the HBM floor (a few rows an expert) the tie goes to the tile that multiplies the fewest padded
    rows (64 rows, as measured best at 4-16 rows an expert), and among tiles within 5% of those rows to
    the plan whose SMs are busy the shortest: at ~68 rows an expert 64- and 128-row tiles pad alike and
    128 x 128 ping-pong (epilogues hidden) leads, as measured. (The fitted form, which ``plan`` takes where
    it is listed, e.g. at 4 rows an expert over 64, is set aside here: test_grouped_fit.py.)"""
    assert grouped.plan("contiguous", 64, 256, 2816, 2048).fit
    monkeypatch.setattr(grouped, "FIT_OFFERED", False)
    for G, T, N, K in ((64, 256, 2816, 2048), (256, 4096, 7168, 2048), (8, 256, 28672, 4096)):
        ranked = [c for c in grouped.candidates("contiguous", G, T, N, K) if not c.fit]
        assert round(ranked[0].predicted_s, 9) == round(ranked[1].predicted_s, 9)  # a tie at the floor
        assert grouped.plan("contiguous", G, T, N, K).bm == 64
    ranked = grouped.candidates("contiguous", 60, 4096, 2048, 1408)
    assert round(ranked[0].predicted_s, 9) == round(ranked[1].predicted_s, 9)
    p = grouped.plan("contiguous", 60, 4096, 2048, 1408)
    assert (p.bm, p.bn, p.schedule) == (128, 128, "pingpong")


def test_direct_stores_only_where_out_cannot_take_a_tma_map(monkeypatch):
    monkeypatch.setattr(grouped, "FIT_PINGPONG_OFFERED", False)  # the tiled kernel's plans (the fitted form's: direct)
    assert not grouped.plan("contiguous", 8, 4096, 4096, 4096).direct
    assert grouped.plan("contiguous", 8, 4096, 4100, 4096).direct  # 8200-byte rows
    assert not grouped.plan("contiguous", 8, 4096, 4100, 4096, out_dtype="fp32").direct  # 16400-byte rows
    assert grouped.plan("contiguous", 8, 4096, 4098, 4096, out_dtype="fp32").direct


def test_panels_hold_a_groups_rows_in_l2():
    from gemmlab.devices import H200

    # Mixtral gate/up (K = 4096): 1 MB of A per 128-row tile, 25 of them in half the L2; a 2048-row expert
    # (16 m-tiles) runs plain m-fastest, a 6488-row one in three panels of 17.
    assert grouped.panel_tiles(128, 256, 4096, H200) == 25
    # Mixtral down (K = 14336): a column tile of B is 7 MB; panels pay B again per panel, so only groups
    # taller than S b / budget = 37 m-tiles (4736 rows) get them.
    assert grouped.panel_tiles(128, 256, 14336, H200) == 37


# The kernel's tile walk, mirrored in Python -----------------------------------------------------------

def _walk(layout, ranges, G, limit, N, bm, bn, grid, panel=1 << 30):
    """group_scheduler.cuh's GroupTable.build + locate (panels of ``panel`` m-tiles) and the data-parallel
    scheduler, in Python: every CTA's (group, row0, rows, m, n) units."""
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
            panels = -(-tm // panel)
            pm = -(-tm // panels)  # the kernel's panels of even height
            p, i = divmod(local, pm * tiles_n)
            h = min(pm, tm - p * pm)
            units.append((lo, s, r, p * pm + i % h, i // h))
    return spans, units


@pytest.mark.parametrize("panel", [1 << 30, 1, 2, 3])
@pytest.mark.parametrize("layout,ranges,limit", [
    ("contiguous", [0, 5, 5, 200, 200, 201, 330], 330),        # G + 1 boundaries, empty groups
    ("contiguous", [5, 5, 200, 200, 201, 330], 330),           # G ends (torch._grouped_mm's offs)
    ("contiguous", [0, 400, -3, 100, 90, 330, 331], 330),      # bad offsets: clamped, never outside
    ("contiguous", [0, 1100, 1100, 1700, 2000, 2000, 2000], 2000),  # tall groups: 9 and 5 m-tiles
    ("masked", [0, 64, 3, 200, -1, 128], 128),                 # counts past capacity / negative: clamped
])
def test_tile_walk_covers_each_stored_element_once(layout, ranges, limit, panel):
    G = 6
    N, bm, bn = 300, 128, 128
    spans, units = _walk(layout, ranges, G, limit, N, bm, bn, grid=7, panel=panel)
    assert len(set(units)) == len(units)
    written = {}
    for g, s, r, m, n in units:
        assert 0 <= m * bm < r and 0 <= n * bn < N  # no tile lies wholly outside its group
        for b in range(0, bm, 64):  # the kernel TMA-stores a 64-row block only inside the group
            if m * bm + b + 64 <= r:
                assert s + m * bm + b + 64 <= s + r <= (limit if layout == "contiguous" else (g + 1) * limit)
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
    (lambda a, b, o: ((a, torch.cat([b, b], -1)[..., ::2], o), {}), UnsupportedProblem, "b must have unit stride"),
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

@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("layout", grouped.LAYOUTS)
def test_launch_arguments_match_the_kernel_parameters(monkeypatch, layout, direct):
    """grouped.launch's arguments, captured on CPU tensors: five tensor maps by value (A over all rows with a
    bm x 64 box, B as (G * N, K) with a bn x 64 box, out with a 64-row x 128-byte box, or A's map again with
    DIRECT stores; the FP8 block scales' two maps, A's again with bf16), then the ranges pointer, lead, G,
    limit, N, K, panel, the FP8 scales' two pointers and step (unread with bf16: out's pointer, 0), out,
    ldo."""
    import dataclasses

    a, b, o = _ops(T=128)
    if layout == "masked":
        a, o = a.reshape(4, 32, 64), torch.tensor([3, 0, 32, 40], dtype=torch.int32)
    p = grouped.plan_for(a, b, *((o, None) if layout == "contiguous" else (None, o)))
    # (groups this small get direct=True from the planner; claimed tiles: test_claimed_tiles_launch_...)
    p = dataclasses.replace(p, direct=direct, panel=3, claim=False)
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
    assert args[2] == (args[0] if direct else ("tmap", (128, 48), (64, 64)))
    assert args[3] == args[4] == args[0]  # no block scales
    limit = 128 if layout == "contiguous" else 32
    assert [int(x) for x in args[6:12]] == [1 if layout == "contiguous" else 0, 4, limit, 48, 64, 3]
    assert args[12] is args[13] is args[15] and int(args[14]) == 0  # no scales read
    assert args[15].shape == (128, 48) and int(args[16]) == 48
    assert args[17] is args[18] is args[15]  # data-parallel: no stream-K workspace read


def test_stream_k_is_not_listed_where_the_gpus_memory_is_slower():
    """The grouped kernel's stream-K runs the dense engine's scheduler: on a profile whose GPU's memory is
    under devices.STREAM_K_MIN_MEMORY_SHARE of the H200's (an H100 SXM's, as gpu_profile builds it) no
    candidate is stream-K, and Mixtral's down projection at T = 4096 (stream-K on the H200) takes another."""
    from gemmlab import devices

    slow = dataclasses.replace(devices.H200, stream_k_offered=False)
    assert grouped.plan("contiguous", 8, 4096, 4096, 14336).schedule == "stream_k"
    assert not [c for c in grouped.candidates("contiguous", 8, 4096, 4096, 14336, profile=slow)
                if c.schedule == "stream_k"]
    assert grouped.plan("contiguous", 8, 4096, 4096, 14336, profile=slow).schedule != "stream_k"


def test_stream_k_launch_passes_the_streams_workspace(monkeypatch):
    """A stream-K plan's last two arguments: the per-stream workspace (partial slots for every CTA) and its
    flags, as the dense kernel's stream-K plans get them (``engine.stream_k_workspace``)."""
    import dataclasses

    a, b, o = _ops(T=128)
    p = dataclasses.replace(grouped.plan_for(a, b, o), schedule="stream_k", claim=False)
    captured, asked = {}, []
    ws, flags = torch.empty(p.workspace_floats), torch.zeros(2 * p.grid, dtype=torch.int32)
    monkeypatch.setattr(grouped, "compile_plan", lambda p: "compiled")
    monkeypatch.setattr(grouped, "_tensor_map", lambda t, box: ("tmap", tuple(t.shape), tuple(box)))
    monkeypatch.setattr(grouped, "_launch_fn", lambda: lambda compiled, **kw: captured.update(kw))
    monkeypatch.setattr(grouped, "_workspace", lambda plan, device: asked.append(plan) or (ws, flags))
    grouped.launch(p, a, b, o, 1, torch.empty(128, 48, dtype=torch.bfloat16))
    assert asked == [p] and captured["args"][17] is ws and captured["args"][18] is flags
    assert p.sk_ctas == p.grid and p.workspace_floats == p.grid * p.bm * p.bn
    assert "stream-K" in repr(p) and p.template_args()[-1] == "2"


def test_claimed_tiles_launch_passes_the_streams_flags(monkeypatch):
    """A plan with its tiles in claim order keeps its counter in the per-stream flags (zero between
    launches, as the stream-K plans' flags): its last argument is those flags."""
    import dataclasses

    a, b, o = _ops(T=128)
    G, N, K = b.shape
    p = next(dataclasses.replace(c, claim=True) for c in grouped.candidates("contiguous", G, 128, N, K)
             if grouped.claimable(c.bm, c.bn, c.dtype, c.schedule) and c.schedule == "data_parallel")
    captured, asked = {}, []
    ws, flags = torch.empty(1), torch.zeros(512, dtype=torch.int32)
    monkeypatch.setattr(grouped, "compile_plan", lambda p: "compiled")
    monkeypatch.setattr(grouped, "_tensor_map", lambda t, box: ("tmap", tuple(t.shape), tuple(box)))
    monkeypatch.setattr(grouped, "_launch_fn", lambda: lambda compiled, **kw: captured.update(kw))
    monkeypatch.setattr(grouped, "_workspace", lambda plan, device: asked.append(plan) or (ws, flags))
    grouped.launch(p, a, b, o, 1, torch.empty(128, 48, dtype=torch.bfloat16))
    assert asked == [p] and captured["args"][18] is flags and p.workspace_floats == 0


def test_a_plan_that_tma_stores_refuses_an_unaligned_out(monkeypatch):
    import dataclasses

    a, b, o = _ops(T=128)
    p = dataclasses.replace(grouped.plan_for(a, b, o), direct=False)  # a plan that TMA-stores
    monkeypatch.setattr(grouped, "compile_plan", lambda p: "compiled")
    odd = torch.empty(128 * 48 + 1, dtype=torch.bfloat16)[1:].view(128, 48)  # starts 2 bytes off
    with pytest.raises(UnsupportedProblem, match="direct=True"):
        grouped.launch(p, a, b, o, 1, odd)


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

    def launch(p, a, b, ranges, lead, out, scale_a=None, scale_b=None, sb_step=0):
        layout = "contiguous" if a.dim() == 2 else "masked"
        assert p.layout == layout and out.dtype == grouped._DTYPES[p.out_dtype]
        kw = {"offsets": ranges} if layout == "contiguous" else {"counts": ranges}
        assert lead == (1 if layout == "contiguous" and ranges.shape[0] == b.shape[0] + 1 else 0)
        ref = grouped.reference_grouped_mm(a, b, **kw, scale_a=scale_a, scale_b=scale_b)
        assert sb_step == (1 if scale_b is not None and scale_b.numel() > 1 else 0)
        keep = torch.isnan(ref)
        out.copy_(torch.where(keep, out.to(ref.dtype), ref).to(out.dtype))
        ran.append(p)

    monkeypatch.setattr(grouped, "launch", launch)
    fakes.route_grouped_launches(monkeypatch)
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
    assert all(p.direct == (_share(p) >= grouped.ALL_DIRECT_SHARE) for p in fake_launch)
    # An out= view that starts off 16 bytes gets no TMA map: run switches the plan to DIRECT stores.
    odd = torch.empty(100 * 48 + 1, dtype=torch.bfloat16)[1:].view(100, 48)
    gemmlab.grouped_mm(a, b, o, out=odd)
    assert fake_launch[-1].direct and torch.allclose(odd.double(), grouped.reference_grouped_mm(a, b, o),
                                                     rtol=2e-2, atol=2e-2)


def test_small_groups_store_every_block_directly():
    """Where most 64-row blocks cross a group's end (groups of ~64 rows or fewer), the plan stores every
    block with the threads; tall groups keep the TMA stores (grouped.ALL_DIRECT_SHARE)."""
    assert grouped.crossing_share(2048, 128, True) < 0.05
    assert grouped.crossing_share(64, 64, True) == pytest.approx(64 / 96)
    assert grouped.crossing_share(128, 128, False) == 0.0  # every group ends on a block
    small = grouped.plan("contiguous", 256, 16384, 7168, 2048)  # DeepSeek-V3 down, 64 rows an expert
    tall = grouped.plan("contiguous", 8, 16384, 28672, 4096)  # Mixtral gate/up, 2048 rows an expert
    assert small.direct and not tall.direct
    share = grouped.crossing_share(small.expected_rows, small.bm, True)
    assert share >= grouped.ALL_DIRECT_SHARE


def test_plan_takes_stream_k_only_past_the_margin(monkeypatch):
    """A stream-K plan priced below the best data-parallel one but within STREAM_K_MARGIN of it is not
    taken (the stream-K kernel measured a few per cent slower where its streamed wave gains little)."""
    monkeypatch.setattr(grouped, "FIT_PINGPONG_OFFERED", False)  # (which it would take over a data-parallel pick)
    both = [c for c in grouped.candidates("contiguous", 8, 4096, 4096, 14336) if not c.fit]
    sk, dp = both[0], next(c for c in both if c.schedule == "data_parallel")
    assert sk.schedule == "stream_k"
    monkeypatch.setattr(grouped, "STREAM_K_MARGIN", sk.predicted_s / dp.predicted_s * 0.999)
    assert grouped.plan("contiguous", 8, 4096, 4096, 14336) == dp
    monkeypatch.setattr(grouped, "STREAM_K_MARGIN", sk.predicted_s / dp.predicted_s * 1.001)
    assert grouped.plan("contiguous", 8, 4096, 4096, 14336) == sk
    monkeypatch.setattr(grouped, "STREAM_K_OFFERED", False)
    assert grouped.plan("contiguous", 8, 4096, 4096, 14336) == dp


def test_claimed_tiles_are_their_own_instantiation_and_refused_where_they_do_not_fit():
    """GroupedPlan.claim: whole bf16 / fp16 tiles in claim order (data-parallel, ping-pong); its own
    template argument and compiled name; refused for stream-K, for 256 x 128 (local memory) and for e4m3."""
    p = dataclasses.replace(_forced("contiguous", 128, 256), claim=False)
    q = dataclasses.replace(p, claim=True)
    assert q.name_expression == p.name_expression[:-1] + ", true>" and q.compiled_name != p.compiled_name
    assert "claimed" in repr(q) and "claimed" not in repr(p)
    for bad in (_forced("contiguous", 128, 128, schedule="stream_k"), _forced("contiguous", 256, 128),
                next(c for c in grouped.candidates("contiguous", 8, 4096, 4096, 4096, dtype="e4m3"))):
        with pytest.raises(ValueError, match="claim"):
            dataclasses.replace(bad, claim=True)
