"""The 128B swizzle (the TMA/wgmma layout) and shared-memory bank conflicts, against hand-worked cases."""

import pytest

from gemmlab import layouts


def test_swizzle_128b_is_a_bijection_on_each_atom():
    for base in (0, 1024, 4096):
        phys = {layouts.swizzle_128b(base + off) for off in range(0, 1024, 16)}
        assert phys == set(range(base, base + 1024, 16))
    # its own inverse
    assert all(layouts.swizzle_128b(layouts.swizzle_128b(a)) == a for a in range(0, 8192, 4))


def test_swizzle_128b_hand_cases():
    # row 0 is unchanged; row r moves chunk c to c ^ r; the pattern repeats every 8 rows (1024 bytes)
    assert layouts.swizzle_128b(0x000) == 0x000
    assert layouts.swizzle_128b(0x080) == 0x090  # row 1, chunk 0 -> chunk 1
    assert layouts.swizzle_128b(0x3F0) == 0x380  # row 7, chunk 7 -> chunk 0
    assert layouts.swizzle_128b(0x404) == 0x404  # row 8 = row 0 of the next atom; byte within a chunk kept
    assert [layouts.swizzle_chunk(r, 0) for r in range(8)] == list(range(8))
    assert layouts.swizzle_chunk(5, 3) == 6


@pytest.mark.parametrize("chunk", range(8))
def test_swizzled_column_read_is_conflict_free(chunk):
    # 8 consecutive rows (one phase of 128-bit loads) read the same logical 16-byte column
    for first_row in (0, 3, 8):
        rows = range(first_row, first_row + 8)
        addrs = layouts.column_read_addresses(rows, chunk)
        assert len({layouts.bank(a) for a in addrs}) == 8  # 8 different 4-bank groups
        assert layouts.conflict_ways(addrs, access_bytes=16) == 1


def test_unswizzled_column_read_is_an_8_way_conflict():
    addrs = layouts.column_read_addresses(range(8), 0, mode=0)
    assert layouts.conflict_ways(addrs, access_bytes=16) == 8


def test_64b_swizzle_halves_the_conflict():
    addrs = layouts.column_read_addresses(range(8), 0, mode=64)
    assert layouts.conflict_ways(addrs, access_bytes=16) == 2


def test_conflict_ways_broadcast_and_stride():
    assert layouts.conflict_ways([0] * 32) == 1  # same word: broadcast
    assert layouts.conflict_ways([4 * i for i in range(32)]) == 1
    assert layouts.conflict_ways([128 * i for i in range(32)]) == 32  # column of a 32-float row-major tile


def test_chunk_map_rows_are_permutations():
    cm = layouts.chunk_map(16)
    for r in range(16):
        assert sorted(cm[r]) == list(range(8))
        assert cm[r, r % 8] == 0  # logical chunk 0 sits at physical chunk r % 8
    # each logical chunk lands in every physical column once per atom: no column is a hot spot
    for c in range(8):
        assert sorted(int(p) for r in range(8) for p in range(8) if cm[r, p] == c) == list(range(8))


TILINGS = [layouts.WarpTiling(), layouts.WarpTiling(BM=64, BN=128, WM=32, WN=64, WNITER=2, TM=4, TN=4),
           layouts.WarpTiling(BM=128, BN=64, WM=64, WN=32, WNITER=1, TM=8, TN=4, threads=128)]


@pytest.mark.parametrize("wt", TILINGS, ids=["default", "wmiter2", "wniter1"])
def test_warptiling_owns_every_element_once(wt):
    assert wt.check() is None
    warp, lane = wt.owner_map()
    assert (warp >= 0).all() and (lane >= 0).all()
    per_thread = wt.TM * wt.TN * wt.WMITER * wt.WNITER
    assert per_thread * wt.threads == wt.BM * wt.BN
    for w in range(wt.warps):
        for t in (0, 17, 31):
            els = wt.elements(w, t)
            assert len(els) == len(set(els)) == per_thread
            assert all(warp[r, c] == w and lane[r, c] == t for r, c in els)


def test_warptiling_hand_case_and_checks():
    wt = layouts.WarpTiling()  # 128x128, warps 64x64, WNITER 4, TM 8, TN 4, 128 threads
    assert (wt.WMITER, wt.WSUBM, wt.WSUBN) == (1, 64, 16)
    # lane 5: row 1 of lanes (4 per row), column 1 -> rows 8..15, columns 4..7 of each 16-wide sub-tile
    assert wt.elements(0, 5)[:2] == [(8, 4), (8, 5)]
    assert (8, 4 + 16) in wt.elements(0, 5)
    assert wt.elements(3, 0)[0] == (64, 64)  # warp 3: bottom-right warp tile
    assert layouts.WarpTiling(threads=256).check() is not None
    assert layouts.WarpTiling.from_config({"BM": 64, "WM": 32, "NUM_THREADS": 256}) == \
        layouts.WarpTiling(BM=64, WM=32, threads=256)
