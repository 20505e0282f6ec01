"""B multicast (``Plan.mcast`` = 2, kernels/engine/gemm.cu's ``MCAST``) without a GPU: where the planner offers
it, how it prices it, the paired tile order, the launch it builds, and the 32-byte rows of operand copies.
The kernel itself: tests/test_engine2_gpu.py (float64 references, a padding tile, determinism) and
tests/test_engine2.py (every multicast tile compiles without spills, with multicast loads in its SASS)."""

import dataclasses

import pytest
import torch

from gemmlab import engine, engine2, plan_cost, planner, schedule
from gemmlab.devices import H200

from fakes import launch_arg_types, ptx_param_types, unsigned


# Where rows are misaligned --------------------------------------------------------------------------------

@pytest.mark.parametrize("M, N, K, a_mn, b_mn, a_pitch, b_pitch, want", [
    (512, 512, 3000, False, False, None, None, (True, True)),  # 6000-byte rows: 16- but not 32-byte aligned
    (512, 512, 1000, False, False, None, None, (True, True)),
    (512, 512, 3008, False, False, None, None, (False, False)),  # 32-byte aligned
    (512, 512, 4096, False, False, None, None, (False, False)),
    (3072, 3072, 3000, True, True, None, None, (False, False)),  # MN-major: rows of M and N
    (3000, 3000, 3072, True, True, None, None, (True, True)),
    (512, 3000, 3000, True, False, None, None, (False, True)),  # B still K-major
    (512, 512, 4096, False, False, 4104, None, (True, False)),  # a view: A's rows 4104 apart
    (512, 512, 3000, False, False, 3008, 3008, (False, False)),  # padded rows: aligned whatever K is
    (512, 512, 4095, False, False, None, None, (False, False)),  # not 16-byte aligned: a 32-byte aligned copy
])
def test_misaligned_operands_are_the_16_not_32_byte_class(M, N, K, a_mn, b_mn, a_pitch, b_pitch, want):
    assert plan_cost.misaligned_operands(M, N, K, a_mn, b_mn, "bf16", a_pitch, b_pitch) == want


def test_each_operand_pays_for_its_own_rows():
    kw = dict(bm=128, bn=128, rows=128, stages=6, active_sms=132, hbm_share=0.0, prof=H200, clock_mhz=1755.0)
    t = {m: plan_cost.kstep_s(misaligned=m, **kw) for m in (False, (True, False), (False, True), True)}
    assert t[False] < t[(True, False)] == t[(False, True)] < t[True]  # square tile: A's bytes weigh as B's
    assert plan_cost.kstep_s(misaligned=(True, True), **kw) == t[True]


def test_the_engine_judges_the_rows_tma_reads():
    a = torch.empty(64, 4104, dtype=torch.bfloat16)[:, :4096]  # a view of wider rows
    assert engine._operand_layout(a, 1) == (False, 4104)
    w = torch.empty(1000, 3000, dtype=torch.bfloat16)
    assert engine._operand_layout(w.t(), 0) == (False, 3000)  # B = w.t(): K-major rows of K
    assert engine._operand_layout(torch.empty(3000, 1000, dtype=torch.bfloat16), 0) == (True, 1000)  # N-major
    odd = torch.empty(64, 4100, dtype=torch.bfloat16)[:, 1:4096]  # base not 16-byte aligned: copied
    assert engine._operand_layout(odd, 1) == (False, None)


def test_operand_copies_get_32_byte_rows():
    for cols, dtype in ((2050, torch.bfloat16), (4095, torch.float16), (1001, torch.float32), (7, torch.bfloat16)):
        t = engine._aligned_empty(3, cols, dtype, "cpu")
        assert t.shape == (3, cols) and (t.stride(0) * t.element_size()) % 32 == 0
        assert t.stride(0) - cols < 32 // t.element_size()  # no more padding than that


# What the planner offers -----------------------------------------------------------------------------------

def _mc(plans):
    return [p for p in plans if p.mcast > 1]


def test_offered_on_misaligned_rows_only():
    assert _mc(planner.candidates(3000, 3000, 3000)) and planner.plan(3000, 3000, 3000).mcast == 2
    assert not _mc(planner.candidates(3072, 3072, 3072))
    assert not _mc(planner.candidates(3000, 3000, 3000, a_mn=True, b_mn=True))  # (MN-major B: no multicast)
    assert _mc(planner.candidates(3072, 3072, 3072, b_pitch=3080))  # B's rows misaligned: the bytes it halves
    assert not _mc(planner.candidates(3072, 3072, 3072, a_pitch=3080))  # only A's
    assert not _mc(planner.candidates(3000, 3000, 3000, a_pitch=3008, b_pitch=3008))  # padded rows
    assert _mc(planner.candidates(4096, 4096, 4096, mcast=True))  # asked for: everywhere it can run
    assert not _mc(planner.candidates(3000, 3000, 3000, mcast=False))


def test_offered_as_the_multicast_switch_says(monkeypatch):
    monkeypatch.setattr(planner, "MCAST_OFFERED", True)
    planner._CACHE.clear()
    assert _mc(planner.candidates(3072, 3072, 3072))
    monkeypatch.setattr(planner, "MCAST_OFFERED", False)
    planner._CACHE.clear()
    assert not _mc(planner.candidates(3000, 3000, 3000))
    planner._CACHE.clear()


def test_multicast_plans_are_data_parallel_pairs():
    for p in _mc(planner.candidates(2050, 3000, 1000, schedules=planner.SCHEDULES)):
        assert p.schedule == "data_parallel" and p.cluster == 2 and not p.swap_ab and not p.b_mn
        rows = -(-2050 // p.bm)
        assert p.tiles_m == rows + rows % 2  # padded to whole pairs (17 rows of 128-row tiles: 18)
        assert p.grid % 2 == 0 and p.grid == min(2 * H200.clusters(2), p.tiles)
        assert p.b_box_rows == p.bn // 2 and p.b_box_rows % 8 == 0
        assert p.template_args()[-1] == "2" and "B multicast" in repr(p)
    plain = planner.plan(3072, 3072, 3072)
    assert plain.mcast == 1 and len(plain.template_args()) == 14 and plain.b_box_rows == plain.bn


def test_padding_tile_does_not_change_the_short_a_box():
    p = next(c for c in planner.candidates(2050, 3000, 1000) if c.mcast == 2 and c.bm == 128)
    assert p.tiles_m == 18 and p.a_rows == 8  # 2050 - 16 x 128 = 2 rows, to 8; the 18th row of tiles is padding
    q = dataclasses.replace(p, mcast=1)
    assert q.tiles_m == 17 and q.a_rows == p.a_rows


@pytest.mark.parametrize("tiles_m, bm, bn, b_mn, swapped, heavy, ok", [
    (2, 128, 144, False, False, False, True),
    (1, 128, 144, False, False, False, False),  # no vertical neighbour
    (4, 128, 128, True, False, False, False),   # MN-major B
    (4, 64, 16, False, True, False, False),     # swapped
    (4, 256, 112, False, False, True, False),   # spills with a heavy epilogue
    (4, 256, 96, False, False, True, True),
])
def test_mcast_problem(tiles_m, bm, bn, b_mn, swapped, heavy, ok):
    assert (planner.mcast_problem(tiles_m, bm, bn, b_mn, swapped, heavy, H200) is None) is ok


def test_multicast_is_priced_with_half_of_b_and_the_misaligned_rate():
    kw = dict(bm=128, bn=192, schedule="data_parallel", stages=4, prof=H200)
    plain = plan_cost.predict_s(3000, 3000, 3000, **kw)
    slow = plan_cost.predict_s(3000, 3000, 3000, misaligned=True, **kw)
    shared = plan_cost.predict_s(3000, 3000, 3000, misaligned=True, mcast=2, **kw)
    assert slow > plain and shared < slow
    # The pick on the probe's shapes is the tile that measured best with multicast (mcast_probe.jsonl),
    # among the plain plans: at 2050x3000x1000 a swapped 256 x 192 plan goes first since SWAP_WIDE (0.986x
    # torch.mm against the multicast plan's 0.914, engine_broad.jsonl be963b8).
    for shape, tile in (((3000, 3000, 3000), (128, 192)), ((2050, 3000, 1000), (128, 224)),
                        ((3000, 5000, 1000), (128, 240))):
        p = next(c for c in planner.candidates(*shape) if not c.swap_ab)
        assert (p.bm, p.bn, p.mcast) == (*tile, 2), p
    assert planner.plan(2050, 3000, 1000).swap_ab
    p = planner.plan(1000, 1000, 1000)  # 64 x 144 measured 0.927x, 64 x 128 0.909x: one consumer, multicast
    assert p.bm == 64 and p.bn in (128, 144) and p.mcast == 2, p


# The tile order ----------------------------------------------------------------------------------------------

def test_paired_order_keeps_each_pair_adjacent():
    tm, tn = 6, 5
    order = schedule.paired_order(schedule.tile_order("hilbert", tm // 2, tn), 2)
    assert sorted(order) == [(m, n) for m in range(tm) for n in range(tn)]  # every tile once
    for i in range(0, len(order), 2):
        (m0, n0), (m1, n1) = order[i], order[i + 1]
        assert n0 == n1 and m0 % 2 == 0 and m1 == m0 + 1  # CTA ranks 0 and 1 of one cluster


def test_device_order_table_pairs_and_its_capture_fallback(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    table = schedule.device_order_table("hilbert", 4, 3, 8, "cpu", pair_m=2)
    tiles = [(int(v) >> 16, int(v) & 0xFFFF) for v in table]
    assert tiles == schedule.paired_order(schedule.tile_order("hilbert", 2, 3), 2)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    captured = schedule.device_order_table("hilbert", 4, 5, 8, "cpu", pair_m=2)  # not cached: row-major pairs
    tiles = [(int(v) >> 16, int(v) & 0xFFFF) for v in captured]
    assert sorted(tiles) == [(m, n) for m in range(4) for n in range(5)]
    assert all(tiles[i][1] == tiles[i + 1][1] and tiles[i + 1][0] == tiles[i][0] + 1 for i in range(0, 20, 2))


# The launch ----------------------------------------------------------------------------------------------------

def test_launch_builds_half_b_boxes_a_cluster_and_the_paired_order(monkeypatch):
    M, N, K = 2050, 3000, 1000
    p = next(c for c in planner.candidates(M, N, K) if c.mcast == 2 and (c.bm, c.bn) == (128, 224))
    captured, orders = {}, []
    monkeypatch.setattr(engine2, "compile_plan", lambda p: "compiled")
    monkeypatch.setattr(engine2, "tensor_map_2d",
                        lambda t, box, swizzle_bytes=128: ("tmap", t.data_ptr(), tuple(t.shape), tuple(box)))
    monkeypatch.setattr(engine2, "device_order_table", lambda name, tm, tn, group, dev, pair_m=1:
                        orders.append((tm, tn, pair_m)) or torch.zeros(tm * tn, dtype=torch.int32))
    monkeypatch.setattr(engine2, "_launch", lambda compiled, **kw: captured.update(kw))
    a, w = torch.randn(M, K).bfloat16(), torch.randn(N, K).bfloat16()
    out = torch.empty(M, N, dtype=torch.bfloat16)
    engine2.launch(p, a, w.t(), out)
    args = captured["args"]
    assert launch_arg_types(args) == unsigned(ptx_param_types(planner.SOURCE, p.name_expression))
    assert args[2] == ("tmap", w.data_ptr(), (N, K), (112, 64))  # each CTA loads half of B's 224 rows
    assert captured["cluster"] == 2 and captured["grid"] == p.grid and p.grid % 2 == 0
    assert orders == [(18, p.tiles_n, 2)]
