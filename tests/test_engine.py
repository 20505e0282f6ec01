"""The Hopper engine's host-side choices and the copy kernel's SASS; no GPU needed (the GPU side is
tests/test_engine_gpu.py)."""

import math

import pytest

from gemmlab import engine, sass
from gemmlab.jit.compiler import compile_kernel


@pytest.mark.parametrize("tiles, K, splits", [
    (64, 1024, 2),  # 1024^3 at BN = 128: two SM-fillers of 8 k-steps
    (32, 4096, 4),  # 512x1024x4096: limited by SMs / tiles
    (8, 8192, 8),  # at most a cluster of 8
    (16, 1024, 4),  # 16 k-steps: at least 4 per split
    (4, 448, 1),  # 7 k-steps: one split of 4 and one of 3 would break the minimum
    (10, 832, 3),  # 13 k-steps: 3 splits of 5, 5, 3 (a 4th would get 1)
    (70, 8192, 1),  # the tiles fill half the SMs already
])
def test_choose_splits_most_that_fit_one_wave(tiles, K, splits):
    got = engine.choose_splits(tiles, K, 132)
    assert got == splits
    k_iters = math.ceil(K / engine.BK)
    per = math.ceil(k_iters / got)
    assert got <= engine.MAX_CLUSTER and tiles * got <= 132
    assert got == 1 or (k_iters // got >= engine.MIN_SPLIT_K_STEPS and (got - 1) * per < k_iters)  # no empty split


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
