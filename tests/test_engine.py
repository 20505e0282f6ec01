"""The Hopper engine's host-side choices and the copy kernel's SASS; no GPU needed (the GPU side is
tests/test_engine_gpu.py)."""

import math

import pytest

from gemmlab import engine, sass
from gemmlab.jit.compiler import compile_kernel


@pytest.mark.parametrize("shape, plan", [
    ((1024, 1024, 1024), (64, 1)),  # 128 narrow tiles fill the GPU: no split (the reduction costs more)
    ((128, 1024, 4096), (64, 6)),  # 16 tiles: clusters of 6 (an H200 holds 17 of them at once)
    ((512, 1024, 8192), (128, 3)),  # 32 tiles: clusters of 4 would need two waves (30 at once)
    ((2048, 2048, 2048), (256, 1)),  # the tiles fill the GPU
    ((128, 8192, 8192), (128, 2)),
    ((16, 28672, 8192), (256, 1)),  # a weight stream: wide tiles, 112 of them, no split
])
def test_choose_plan_on_the_h200_table(shape, plan):
    M, N, K = shape
    assert engine.choose_plan(M, N, K, 132) == plan
    bn, splits = plan
    tiles = math.ceil(M / engine.BM) * math.ceil(N / bn)
    k_iters = math.ceil(K / engine.BK)
    assert splits == 1 or tiles <= engine.H200_CLUSTER_CAPACITY[splits]  # one wave of clusters
    assert splits == 1 or (k_iters // splits >= engine.MIN_SPLIT_K_STEPS
                           and (splits - 1) * math.ceil(k_iters / splits) < k_iters)  # no empty split


def test_split_k_stages_take_the_slabs_room():
    for bn in engine.SPLIT_WIDTHS:
        q, qs = engine._qsize(bn, 2), engine._qsize(bn, 2, split=True)
        assert qs >= q and engine.smem_bytes(bn, qs, 2, split=True) <= engine.SMEM_LIMIT
        assert engine.smem_bytes(bn, q, 2) <= engine.SMEM_LIMIT
    assert engine._qsize(128, 2, split=True) == 7 and engine._qsize(128, 2) == 6
    assert engine._qsize(64, 2, split=True) == engine.MAX_STAGES and engine._qsize(64, 2) == 8
    assert engine._qsize(256, 2) == engine._qsize(256, 2, split=True) == 4


@pytest.mark.parametrize("M, N, K", [(1, 4096, 4096), (64, 1024, 8192), (300, 700, 9000), (33, 5, 64 * 64)])
def test_choose_plan_is_the_least_modelled_time(M, N, K):
    bn, splits = engine.choose_plan(M, N, K, 132)
    best = engine.split_seconds(M, N, K, bn, splits, 132, engine.H200_CLUSTER_CAPACITY)
    for width in engine.SPLIT_WIDTHS:
        assert best <= engine.split_seconds(M, N, K, width, 1, 132, engine.H200_CLUSTER_CAPACITY)
    assert splits <= engine.MAX_CLUSTER


@pytest.mark.parametrize("elem, src_vec, dst_vec", [(2, 0, 1), (2, 1, 0), (4, 0, 1), (2, 0, 0), (4, 1, 1)])
def test_pad_copy_moves_16_byte_chunks_on_the_aligned_side(elem, src_vec, dst_vec):
    ck = compile_kernel(engine.PAD_COPY_SOURCE, f"pad_copy<{elem}, {src_vec}, {dst_vec}>", arch="sm_90a")
    summary = sass.kernel_summary(ck)
    scalar = r"\.U16" if elem == 2 else r"(\.CONSTANT)?$"
    expect = sass.SassExpect(
        contains=((r"^LDG\.E\.EF\.128$",) if src_vec else (rf"^LDG\.E{scalar}",))
        + ((r"^STG\.E\.128$",) if dst_vec else (rf"^STG\.E{scalar if elem == 2 else '$'}",)),
        no_local_memory=True)
    assert sass.check(expect, summary, ck.resources) == []
