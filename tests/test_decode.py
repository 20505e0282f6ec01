"""The decode kernel without a GPU: its k permutation and fragment mapping emulated in numpy, the work split
(``gemmlab.decode.plan``) walked like the kernel walks it, the fast-path rule (``engine.use_decode``), and
the SASS of every instantiation the engine can ask for."""

import itertools
import math
from pathlib import Path

import numpy as np
import dataclasses

import pytest
import torch

from gemmlab import decode, engine, sass
from gemmlab.devices import H200
from gemmlab.jit.compiler import compile_kernel

# mma.m16n8k16 fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"): lane
# (g, q) holds A[g][2q..2q+1] (a0), A[g+8][2q..2q+1] (a1), A[g][2q+8..2q+9] (a2), A[g+8][2q+8..2q+9] (a3),
# B[2q..2q+1][g] (b0), B[2q+8..2q+9][g] (b1), and D[g][2q..2q+1], D[g+8][2q..2q+1].


def _mma(d_lanes, a_lanes, b_lanes):
    """One warp-wide m16n8k16: each lane's registers (pairs of values) placed where the PTX ISA says."""
    A, B = np.zeros((16, 16)), np.zeros((16, 8))
    for lane in range(32):
        g, q = divmod(lane, 4)
        a0, a1, a2, a3 = a_lanes[lane]
        A[g, 2 * q:2 * q + 2], A[g + 8, 2 * q:2 * q + 2] = a0, a1
        A[g, 2 * q + 8:2 * q + 10], A[g + 8, 2 * q + 8:2 * q + 10] = a2, a3
        b0, b1 = b_lanes[lane]
        B[2 * q:2 * q + 2, g], B[2 * q + 8:2 * q + 10, g] = b0, b1
    D = A @ B
    for lane in range(32):
        g, q = divmod(lane, 4)
        d_lanes[lane][0:2] += D[g, 2 * q:2 * q + 2]
        d_lanes[lane][2:4] += D[g + 8, 2 * q:2 * q + 2]


def _warp_chunk(acc, w, x, k):
    """decode::mma_chunk for one token tile: lane (g, q) loads 8 consecutive k at k + 8q of weight rows g,
    g + 8 and token g; values 0-3 feed the first mma, 4-7 the second, as registers (x, y) and (z, w)."""
    regs = []
    for lane in range(32):
        g, q = divmod(lane, 4)
        top, bot, tok = (v[k + 8 * q:k + 8 * q + 8] for v in (w[g], w[g + 8], x[g]))
        regs.append([(top[2 * i:2 * i + 2], bot[2 * i:2 * i + 2], tok[2 * i:2 * i + 2]) for i in range(4)])
    for first in (0, 2):  # registers .x/.y, then .z/.w
        a = [(r[first][0], r[first][1], r[first + 1][0], r[first + 1][1]) for r in regs]
        b = [(r[first][2], r[first + 1][2]) for r in regs]
        _mma(acc, a, b)


def test_k_permutation_reproduces_the_product_exactly():
    """Integer-valued data, so float64 is exact: the permuted k order must give W @ X^T bit for bit."""
    rng = np.random.default_rng(0)
    K = 96
    w = rng.integers(-8, 8, size=(16, K)).astype(np.float64)
    x = rng.integers(-8, 8, size=(8, K)).astype(np.float64)
    acc = [np.zeros(4) for _ in range(32)]
    for k in range(0, K, 32):
        _warp_chunk(acc, w, x, k)
    want = w @ x.T  # (rows, tokens)
    got = np.zeros((16, 8))
    for lane in range(32):
        g, q = divmod(lane, 4)
        got[g, 2 * q:2 * q + 2], got[g + 8, 2 * q:2 * q + 2] = acc[lane][0:2], acc[lane][2:4]
    np.testing.assert_array_equal(got, want)


def _byte_perm(x: int, y: int, sel: int) -> int:
    """CUDA's __byte_perm: bytes 0-3 of x and 4-7 of y, picked by the selector's four low nibbles."""
    pool = (x | (y << 32)).to_bytes(8, "little")
    return int.from_bytes(bytes(pool[(sel >> (4 * i)) & 7] for i in range(4)), "little")


def _bytes_at(lo: list[int], hi: list[int], s: int) -> list[int]:
    """decode::bytes_at on four-word lists: the selects by 8 and 4 bytes, then one byte permute a word."""
    v = lo + hi
    a = [v[i + 2] if s & 8 else v[i] for i in range(6)]
    b = [a[i + 1] if s & 4 else a[i] for i in range(5)]
    sel = 0x5432 if s & 2 else 0x3210
    return [_byte_perm(b[i], b[i + 1], sel) for i in range(4)]


def _words(mem: bytes, at: int) -> list[int]:
    return [int.from_bytes(mem[at + 4 * i:at + 4 * i + 4], "little") for i in range(4)]


@pytest.mark.parametrize("u_chunks", [1, 2, 4])
@pytest.mark.parametrize("row_start", range(0, 32, 2))
def test_row_windows_give_each_lane_its_16_bytes_of_every_chunk(row_start, u_chunks):
    """decode::ld_windows + cut_row (ALIGNED = false) for the four lanes of a row starting at any 2-byte address:
    lane q loads the aligned window its 16 bytes of chunk u start in (v[u]), lane 0 also the window after
    lane 3's last one (v[U], only if the row is off 16 bytes; zero elsewhere). Lane 0 offers v[u + 1], the
    others v[u], and lane q takes lane (q + 1) % 4's offer as its second window. Every lane must get exactly
    the 16 bytes at its address in every chunk, and every window loaded must hold bytes of the row's 64 U
    (nothing read beyond what is needed)."""
    U = u_chunks
    rng = np.random.default_rng(100 * U + row_start)
    mem = rng.integers(0, 256, size=512, dtype=np.uint8).tobytes()
    row = 64 + row_start  # byte address of the row's chunk 0
    shift = row % 16
    p = [row + 16 * q for q in range(4)]  # lane q's 8 elements (16 bytes) of chunk 0
    v = [[_words(mem, a - a % 16 + 64 * u) for u in range(U)] for a in p]  # lane q's v[0 .. U-1]
    loaded = [a - a % 16 + 64 * u for a in p for u in range(U)]
    for q in range(4):
        ext = p[q] - p[q] % 16 + 64 * U
        v[q].append(_words(mem, ext) if q == 0 and shift else [0, 0, 0, 0])
        if q == 0 and shift:
            loaded.append(ext)
    assert all(w + 16 > row and w < row + 64 * U for w in loaded)
    assert len(loaded) == 4 * U + (shift != 0)
    for u in range(U):
        offers = [v[q][u + 1] if q == 0 else v[q][u] for q in range(4)]
        for q in range(4):
            got = b"".join(w.to_bytes(4, "little") for w in _bytes_at(v[q][u], offers[(q + 1) % 4], shift))
            at = p[q] + 64 * u
            assert got == mem[at:at + 16], (q, u)


def _read8(mem: np.ndarray, at: int, lo: int, n: int) -> np.ndarray:
    """A lane's 8 elements at ``at`` with those outside [lo, n) zero and never read (decode::ld_range)."""
    out = np.zeros(8)
    for e in range(lo, n):
        assert 0 <= at + e < len(mem)
        out[e] = mem[at + e]
    return out


def _strided_row(v: int) -> int:
    """decode.cu's strided_row: each 128-row block transposed as 16 x 8."""
    return (v & ~127) | ((v & 15) << 3) | ((v >> 4) & 7)


def test_strided_rows_are_a_permutation_of_each_block_with_one_class_a_tile():
    for v0 in range(0, 512, 16):  # a warp's tile: virtual rows v0 .. v0 + 15
        rows = [_strided_row(v0 + i) for i in range(16)]
        assert len({r % 8 for r in rows}) == 1 and all(r // 128 == v0 // 128 for r in rows)
    assert sorted(_strided_row(v) for v in range(256)) == list(range(256))


@pytest.mark.parametrize("N", [1, 7, 9, 100, 127, 128, 129, 1000, 4097])
def test_strided_plans_cover_every_row_once(N):
    """The plan of a strided variant: its grid's virtual rows, mapped through strided_row, hit every physical
    row below N exactly once in a warp that works (its class's first row is below N), for every CTA shape; and the
    share of the in-flight loads it prices counts those warps only."""
    checked, fills = 0, set()
    for nt in (1, 2, 4):
        v = decode.Variant(u=4, aligned=False, strided=True)
        for rw in (1, 2, 4, 8):
            for splits in (1, 2):
                got = decode._terms(8 * nt, N, 4096, 132, rw, splits, v)
                if got is None:
                    continue
                row_blocks = got[4]
                hits = [0] * N
                for v0 in range(0, row_blocks * rw * 16, 16):
                    if _strided_row(v0) >= N:
                        continue
                    for i in range(16):
                        p = _strided_row(v0 + i)
                        if p < N:
                            hits[p] += 1
                assert hits == [1] * N, (nt, rw, splits)
                # the fill the plan prices counts the working tiles only (a class whose first row is below N)
                working = sum(_strided_row(v0) < N for v0 in range(0, row_blocks * rw * 16, 16))
                warps_needed = math.ceil(H200.decode_in_flight_per_sm / v.in_flight_bytes)
                fill = min(1.0, working * math.ceil(4096 / got[3]) / (132 * warps_needed))
                assert got[0] == pytest.approx(2.0 * N * 4096 / fill)
                fills.add(fill < 1.0)
                checked += 1
    assert checked >= 12 and (N > 1000 or True in fills)


@pytest.mark.parametrize("M, N, K, U, depth, nt, rw, piece, splits, w_off, x_off, pad", [
    (1, 100, 41, 4, 1, 1, 8, 128, 1, 5, 3, 2),  # K under one piece, ragged N
    (1, 200, 7, 2, 2, 1, 8, 128, 1, 2, 1, 1),  # K under one 16-byte window
    (5, 37, 300, 4, 2, 1, 4, 256, 1, 1, 0, 1),
    (13, 70, 999, 4, 1, 2, 2, 256, 1, 7, 2, 0),
    (30, 41, 129, 4, 1, 4, 8, 256, 1, 3, 5, 4),
    (8, 129, 1279, 1, 1, 1, 1, 256, 1, 6, 6, 3),  # one row group a CTA: 16 CTAs, the 129th row alone
    (3, 150, 2047, 4, 1, 1, 4, 512, 2, 7, 1, 5),  # split K: 2 CTAs x 2 pieces of 512 a row block
    (24, 60, 1000, 2, 2, 4, 8, 512, 3, 4, 7, 2),  # split K with an empty last split (1000 < 2 x 512)
])
def test_strided_schedule_byte_by_byte(M, N, K, U, depth, nt, rw, piece, splits, w_off, x_off, pad):
    """The STRIDED variants' whole schedule at the byte level (``tests/strided_emulation.py``: the kernel's
    window loads, X's byte cut and lane shuffle, masked head and tail, k pieces, splits, reduction and the
    store through ``strided_row``), on operands at odd element offsets with NaN around every row: the
    output is exactly X @ W.T, each element written once, and no window is read that holds no byte of its
    tensor. (A desk review before the variants' first GPU run, session 44, ran this emulation over 2,200
    random cases and the GPU test's plans, and checked that it fails with the head mask off, X's cut
    reversed, the tail's bound short by half_s, the store unpermuted or rows past N unclamped.)"""
    import strided_emulation as emu

    variant = decode.Variant(u=U, depth=depth, aligned=False, strided=True, pf=2 if nt == 4 else 1)
    plan = decode.DecodePlan(nt=nt, rw=rw, splits=splits, piece=piece,
                             row_blocks=math.ceil(math.ceil(N / 128) * 128 / (16 * rw)), variant=variant)
    ldw = K + pad
    mem, W, X, w, x = emu.make_case(M, N, K, ldw, K, w_off, x_off, seed=M + N + K)
    out, writes = emu.run(mem, W, ldw, X, K, M, N, K, plan)
    assert not mem.bad, mem.bad[:4]
    assert (writes == 1).all()
    assert np.array_equal(out, x @ w.T)


@pytest.mark.parametrize("U", [1, 2, 4])
@pytest.mark.parametrize("ldw,base_w,N,pieces", [(1029, 3, 21, [(0, 1029)]), (4095, 5, 130, [(0, 2048), (2048, 4095)]),
                                                 (77, 0, 9, [(0, 77)]), (300, 7, 40, [(0, 128), (128, 256), (256, 300)])])
def test_strided_tile_reads_each_k_once_from_aligned_windows(U, ldw, base_w, N, pieces):
    """The STRIDED schedule of decode.cu, element by element (8 elements = one 16-byte window): for each warp
    tile (virtual rows 16 c .. of block 0, physical rows 8 i + c), every lane's 8 weight elements of a chunk
    start on a window boundary (valid rows), the piece's first chunk (half_s elements early) and the tail are
    masked in W and X, every k of the piece is used exactly once, and the mma fragments sum to W @ X^T.
    Memory around the operands is NaN: a foreign element that is not masked shows up. K = ldw - pad."""
    rng = np.random.default_rng(ldw + base_w + U)
    K = pieces[-1][1]
    rows_total = max(N, 1)
    mem = np.full(base_w + rows_total * ldw + 64, np.nan)
    W = rng.integers(-4, 5, size=(rows_total, K)).astype(np.float64)
    for p in range(rows_total):
        mem[base_w + p * ldw:base_w + p * ldw + K] = W[p]
    xoff, M = 3, 5  # X rows: 5 tokens at an odd offset, ldx = K
    xmem = np.full(xoff + M * K + 64, np.nan)
    X = rng.integers(-4, 5, size=(M, K)).astype(np.float64)
    for t in range(M):
        xmem[xoff + t * K:xoff + t * K + K] = X[t]
    chunk = 32 * U
    for c in range(8):
        v0 = 16 * c
        if _strided_row(v0) >= N:
            continue
        phys = [min(_strided_row(v0 + i), N - 1) for i in range(16)]
        shift = (base_w + _strided_row(v0) * ldw) % 8  # elements; the kernel's w_shift / 2 = half_s
        acc = [np.zeros(4) for _ in range(32)]
        used = np.zeros((16, K), dtype=int)

        def chunk32(k, masked):
            regs = []
            for lane in range(32):
                g, q = divmod(lane, 4)
                k0 = k - shift + 8 * q  # the lane's first element's k
                lo, n = (max(0, pieces_k[0] - k0), min(8, pieces_k[1] - k0)) if masked else (0, 8)
                vals = []
                for row in (g, g + 8):
                    at = base_w + phys[row] * ldw + k0
                    if phys[row] == _strided_row(v0 + row):  # a valid row: its windows are aligned
                        assert at % 8 == 0
                        for e in range(lo, n):
                            used[row, k0 + e] += 1
                    vals.append(_read8(mem, at, lo, n))
                tok = min(g, M - 1)
                vals.append(_read8(xmem, xoff + tok * K + k0, lo, n))
                regs.append([(vals[0][2 * i:2 * i + 2], vals[1][2 * i:2 * i + 2], vals[2][2 * i:2 * i + 2])
                             for i in range(4)])
            for first in (0, 2):
                _mma(acc, [(r[first][0], r[first][1], r[first + 1][0], r[first + 1][1]) for r in regs],
                     [(r[first][2], r[first + 1][2]) for r in regs])

        for pieces_k in pieces:
            k_begin, k_end = pieces_k
            k = k_begin
            if shift > 0:
                chunk32(k, masked=True)
                k += 32
            while k + chunk <= k_end + shift:  # main loop: every element inside the piece, unmasked
                assert k - shift >= k_begin and k - shift + chunk <= k_end
                for u in range(U):
                    chunk32(k + 32 * u, masked=False)
                k += chunk
            for _ in range(U):
                if k < k_end + shift:
                    chunk32(k, masked=True)
                    k += 32
            assert k >= k_end + shift  # the tail reached the piece's end
        valid = [i for i in range(16) if phys[i] == _strided_row(v0 + i)]
        assert (used[valid] == 1).all()  # every k of every valid row exactly once
        got = np.zeros((16, 8))
        for lane in range(32):
            g, q = divmod(lane, 4)
            got[g, 2 * q:2 * q + 2], got[g + 8, 2 * q:2 * q + 2] = acc[lane][0:2], acc[lane][2:4]
        want = W[[phys[i] for i in valid]] @ X[[min(t, M - 1) for t in range(8)]].T
        np.testing.assert_array_equal(got[valid], want)


def test_rows_eight_apart_share_the_lanes_shift():
    """decode.cu cuts all of a lane's weight rows (g, g + 8, and g + 16, g + 24 at RPW = 2) at the shift of
    row g, and all its token rows (8 j + g) at token g's: rows 8 apart start 16 ld bytes apart, for any
    leading dimension and base."""
    for ld in (1, 3, 4095, 4097, 8191, 50257):
        for base in range(0, 16, 2):
            for g in range(8):
                shifts = {(base + 2 * (g + 8 * i) * ld) % 16 for i in range(4)}
                assert len(shifts) == 1


@pytest.mark.parametrize("start", range(0, 16, 2))
@pytest.mark.parametrize("lo,n", [(lo, n) for n in range(0, 9) for lo in range(0, 8)])
def test_range_load_keeps_elements_lo_to_n(start, lo, n):
    """decode::ld_range: the lane's elements lo .. n - 1 at any 2-byte address, zeros elsewhere, loading only
    the windows that hold one of them (none when the range is empty): the K tail (lo = 0) and a STRIDED
    piece's first chunk (lo > 0: the elements before k_begin, maybe before the tensor, are not read)."""
    rng = np.random.default_rng(100 * start + 10 * lo + n)
    mem = rng.integers(1, 256, size=64, dtype=np.uint8).tobytes()
    a = 16 + start
    base = a - a % 16
    first = n > lo and start + 2 * lo < 16
    second = n > lo and start + 2 * n > 16
    w0 = _words(mem, base) if first else [0] * 4
    w1 = _words(mem, base + 16) if second else [0] * 4
    v = _bytes_at(w0, w1, start)
    keep = [w & ((0xFFFF if lo <= 2 * i < n else 0) | (0xFFFF0000 if lo <= 2 * i + 1 < n else 0))
            for i, w in enumerate(v)]
    got = b"".join(w.to_bytes(4, "little") for w in keep)
    want = bytes(2 * lo) + mem[a + 2 * lo:a + 2 * n] if n > lo else b""
    assert got == (want + bytes(16 - len(want)))
    # each window loaded holds one of the kept elements: bytes [a + 2 lo, a + 2 n)
    assert not first or (base < a + 2 * n and base + 16 > a + 2 * lo)
    assert not second or (base + 16 < a + 2 * n and base + 32 > a + 2 * lo)


def test_two_row_groups_per_warp_share_each_x_fragment():
    """RPW = 2: the warp's second 16 rows (w_lane[1][*]) use the same X registers; each group's
    accumulators hold its own rows of W @ X^T."""
    rng = np.random.default_rng(1)
    K = 64
    w = rng.integers(-8, 8, size=(32, K)).astype(np.float64)
    x = rng.integers(-8, 8, size=(8, K)).astype(np.float64)
    accs = [[np.zeros(4) for _ in range(32)] for _ in range(2)]
    for k in range(0, K, 32):
        for r in range(2):
            _warp_chunk(accs[r], w[16 * r:16 * r + 16], x, k)
    want = w @ x.T
    for r in range(2):
        got = np.zeros((16, 8))
        for lane in range(32):
            g, q = divmod(lane, 4)
            got[g, 2 * q:2 * q + 2], got[g + 8, 2 * q:2 * q + 2] = accs[r][lane][0:2], accs[r][lane][2:4]
        np.testing.assert_array_equal(got, want[16 * r:16 * r + 16])


@pytest.mark.parametrize("rows_cta", [16, 32, 64, 128, 256])
def test_fragment_store_to_shared_is_conflict_free(rows_cta):
    """engine_decode's store of acc[r][j][i] to red: stride_m = rows_cta + 4; one store instruction's 32
    lanes hit 32 different banks, for every (r, j, i) and every CTA width the variants make."""
    stride_m = rows_cta + 4
    for r, j, i in itertools.product(range(2), range(8), range(4)):
        banks = set()
        for lane in range(32):
            g, q = divmod(lane, 4)
            m = 8 * j + 2 * q + (i & 1)
            row = 16 * r + g + 8 * (i >> 1)
            banks.add((m * stride_m + row) % 32)
        assert len(banks) == 32


def _walk_plan(M, N, K, p):
    """Every (row, k) the kernel's warps cover under plan ``p``, counted, following engine_decode's
    indexing (row0, piece, k_begin/k_end, main loop of CHUNK = 32 U, 32-k tail with lanes masked past
    k_end; both loop depths walk the same chunks)."""
    cover = np.zeros((N, K), dtype=np.int32)
    rows, chunk = p.variant.rows, 32 * p.variant.u
    for bx, by, warp in itertools.product(range(p.row_blocks), range(p.splits), range(decode.WARPS)):
        rg, ks = warp % p.rw, warp // p.rw
        row0 = (bx * p.rw + rg) * rows
        if row0 >= N:
            continue
        piece = by * p.kw + ks
        kb = min(K, piece * p.piece)
        ke = min(K, kb + p.piece)
        k = kb
        rows_here = slice(row0, min(row0 + rows, N))  # rows past N re-read row N - 1 and are never stored
        while k + chunk <= ke:
            cover[rows_here, k:k + chunk] += 1
            k += chunk
        while k < ke:
            for q in range(4):
                if k + 8 * q < ke:
                    cover[rows_here, k + 8 * q:k + 8 * q + 8] += 1
            k += 32
    return cover


SHAPES = [(1, 1, 8), (3, 100, 40), (8, 1024, 4096), (17, 4104, 4096), (33, 1024, 14336), (64, 4096, 14336),
          (1, 28672, 8192), (16, 8192, 28672), (64, 14336, 4096), (5, 48, 264)]


def _shape_variants():
    for shape in SHAPES:
        for v in (None,) + decode.VARIANTS[decode.token_tiles(shape[0])]:
            yield shape, v


@pytest.mark.parametrize("shape,variant", list(_shape_variants()),
                         ids=lambda c: "x".join(map(str, c)) if isinstance(c, tuple) else str(c))
@pytest.mark.parametrize("sm_count", [132, 78, 1])
def test_plan_covers_every_weight_element_once(shape, variant, sm_count):
    M, N, K = shape
    p = decode.plan(M, N, K, sm_count, variant)
    assert p.variant == (variant or decode.default_variant(p.nt))
    assert p.rw * p.kw == decode.WARPS and p.piece % decode.CHUNK_K == 0
    assert p.row_blocks * p.rows_cta >= N
    assert p.smem_bytes <= 100 * 1024, "two CTAs per SM must fit"
    assert (p.splits - 1) * p.kw * p.piece < K, "a CTA without k"
    assert p.nt * 8 >= M and (p.nt == 1 or p.nt * 4 < M)
    assert np.all(_walk_plan(M, N, K, p) == 1)


@pytest.mark.parametrize("N,K", list(itertools.product((1024, 4096, 8192, 14336, 28672), (4096, 8192, 14336, 28672))))
@pytest.mark.parametrize("M", [1, 16, 64])
def test_plan_on_decode_shapes(M, N, K):
    """Llama-3 shapes on 132 SMs: >= 4 KB of weight per warp, at most MAX_SPLITS partials per row block, and
    a modelled time within 1.35x of streaming the weight at HBM bandwidth plus one split's fix-up: paid by a
    split plan, or spared by an unsplit one whose warps keep fewer loads in flight (at N = 1024 and 8 MB of
    weight the fix-up, ~3.5 us measured, is longer than the stream)."""
    p = decode.plan(M, N, K, 132)
    assert p.piece >= decode.MIN_WARP_K and 1 <= p.splits <= decode.MAX_SPLITS
    t, again = decode.plan_time(M, N, K, 132, p.rw, p.splits, p.variant)
    assert again == p
    if M <= decode.MAX_M:  # (M = 64 goes to h11; its plan only has to be valid)
        one_fixup = H200.decode_split_latency_s + max(p.splits, 2) * H200.decode_split_overhead_s
        assert t <= 1.35 * 2 * N * K / H200.decode_split_hbm_bytes_per_s + one_fixup


@pytest.mark.parametrize("M,N,K", [(1, 5120, 5120), (8, 5120, 5120), (1, 6144, 6144), (1, 4864, 896),
                                   (1, 8960, 1536), (2, 2304, 2048), (32, 1024, 1024), (16, 1152, 1024),
                                   (1, 1024, 4096), (1, 429, 480), (64, 4096, 4096)])
@pytest.mark.parametrize("sm_count", [132, 78])
def test_plan_ties_go_to_one_to_one_and_a_half_ctas_an_sm(M, N, K, sm_count):
    """Among the CTA shapes that tie with the pick (same modelled time and splits), the pick has the most CTAs
    up to the profile's decode_fill_ctas_per_sm an SM, or, where every tie has more, the fewest (H200: 160
    CTAs for 1 x 5120 x 5120, not the 80 the old tie rule took)."""
    p = decode.plan(M, N, K, sm_count)
    t = decode.plan_time(M, N, K, sm_count, p.rw, p.splits, p.variant)[0]
    ties = [got[1].row_blocks * p.splits for rw in (8, 4, 2, 1)
            if (got := decode.plan_time(M, N, K, sm_count, rw, p.splits, p.variant)) is not None and got[0] == t
            and not (rw > 1 and p.variant.rows * rw // 2 >= N)]
    cap = decode._PROF.decode_fill_ctas_per_sm * sm_count
    ctas = p.row_blocks * p.splits
    under = [c for c in ties if c <= cap]
    assert ctas == (max(under) if under else min(ties)), (ctas, ties)
    if (M, N, K, sm_count) == (1, 5120, 5120, 132):
        assert (p.rw, p.splits, p.row_blocks) == (2, 1, 160)


@pytest.mark.parametrize("M,N,K,split", [(1, 576, 5120, False), (2, 576, 7168, False), (16, 1024, 2560, False),
                                         (32, 1024, 5120, False), (2, 512, 2304, False), (1, 256, 13824, True),
                                         (32, 768, 28672, True), (32, 896, 28672, True)])
def test_a_split_pays_its_measured_fixup(M, N, K, split):
    """A split plan pays ``decode_split_latency_s`` once and ``decode_split_overhead_s`` a split, as measured
    (H100 at 15ab9dc, h100_decode_splits.jsonl; graph replay, us, best unsplit against best split): 1x576x5120
    5.16 / 5.91, 2x576x7168 6.30 / 6.57, 16x1024x2560 5.58 / 7.01, 32x1024x5120 9.40 / 10.34, 2x512x2304
    3.73 / 5.02 stay unsplit; at N <= 896 and deep K the split still pays: 1x256x13824 9.80 / 6.43,
    32x768x28672 42.6 / 28.3, 32x896x28672 40.7 / 30.6. With 0.05 us a split all eight split."""
    p = decode.plan(M, N, K, 132)
    assert (p.splits > 1) == split, p
    t, _ = decode.plan_time(M, N, K, 132, p.rw, p.splits, p.variant)
    weight_bytes, x_l2, fixup, _, _ = decode._terms(M, N, K, 132, p.rw, p.splits, p.variant)
    assert fixup == (pytest.approx(H200.decode_split_latency_s + p.splits * H200.decode_split_overhead_s, rel=0.2)
                     if split else 0.0)


def test_plan_never_hardcodes_the_sm_count():
    assert decode.plan(1, 4096, 4096, 132) != decode.plan(1, 4096, 4096, 16)


def _t(shape, dtype=torch.bfloat16, stride=None, offset=0):
    numel = (max(s for s in stride) * max(shape) + offset + 64) if stride else math.prod(shape) + offset + 64
    base = torch.empty(numel, dtype=dtype)
    return base.as_strided(shape, stride or torch.empty(shape).stride(), offset)


def test_cost_s_prices_the_plan_with_the_profiles_decode_constants():
    """``cost_s`` = fixed + per-NT + weight bytes over the plan's fill at the fitted bandwidth (slower by the
    fitted share for each 8-token column past the first) + the fitted multiple of the split-K fix-up, for ``plan``'s split; ``plan_time`` (which picks that split) unchanged."""
    from gemmlab.devices import H200

    for M, N, K in [(1, 4096, 4096), (16, 2048, 5632), (32, 896, 896), (1, 576, 5120), (7, 14, 256)]:
        p = decode.plan(M, N, K, 132)
        weight_bytes, x_l2, fixup, piece, blocks = decode._terms(M, N, K, 132, p.rw, p.splits, p.variant)
        assert (piece, blocks) == (p.piece, p.row_blocks)
        assert (fixup > 0) == (p.splits > 1)
        stream = weight_bytes / H200.decode_hbm_bytes_per_s * (1 + H200.decode_token_stream_share * (p.nt - 1))
        want = H200.decode_fixed_s + H200.decode_token_tile_s * p.nt + stream + H200.decode_fixup_factor * fixup
        assert decode.cost_s(M, N, K, 132, H200) == pytest.approx(want)
        t, same = decode.plan_time(M, N, K, 132, p.rw, p.splits, p.variant)
        assert same == p and t == pytest.approx(max(weight_bytes / H200.decode_split_hbm_bytes_per_s, x_l2) + fixup)
    # More tokens per call cost more at one weight; a larger weight costs more at one M.
    assert decode.cost_s(32, 4096, 4096, 132, H200) > decode.cost_s(1, 4096, 4096, 132, H200)
    assert decode.cost_s(1, 8192, 4096, 132, H200) > decode.cost_s(1, 4096, 4096, 132, H200)


def test_use_decode_takes_linear_layer_shapes():
    w = torch.empty(4096, 4096, dtype=torch.bfloat16)
    for M in (1, 7, 16, decode.MAX_M):
        x = torch.empty(M, 4096, dtype=torch.bfloat16)
        assert engine.use_decode(x, w.t(), torch.empty(M, 4096, dtype=torch.bfloat16))
    assert not engine.use_decode(torch.empty(decode.MAX_M + 1, 4096, dtype=torch.bfloat16), w.t())


@pytest.mark.parametrize("M, N, K, decode_kernel", [
    (1, 28672, 8192, False),  # a weight dimension past DECODE_MAX_WEIGHT_DIM: h11 at any M
    (8, 8192, 28672, False),
    (9, 28672, 8192, False),
    (1, 8192, 8192, True),
    (8, 4096, 4096, True),
    (16, 4096, 14336, False),
    (16, 8192, 8192, True),
    (32, 12288, 12288, True),
])
def test_use_decode_sends_large_weights_to_h11(M, N, K, decode_kernel):
    x = torch.empty(M, K, dtype=torch.bfloat16, device="meta")
    w = torch.empty(N, K, dtype=torch.bfloat16, device="meta")
    assert engine.use_decode(x, w.t()) is decode_kernel


@pytest.mark.parametrize("case,reason", [
    ("b row-major (K, N)", "weight"),
    ("a column-major", "a is not K-contiguous"),
    ("M = 65", "M=65"),
])
def test_why_not_names_the_reason(case, reason):
    K, N, M = 4096, 1024, 16
    a, b = torch.empty(M, K, dtype=torch.bfloat16), torch.empty(N, K, dtype=torch.bfloat16).t()
    if case == "b row-major (K, N)":
        b = torch.empty(K, N, dtype=torch.bfloat16)
    elif case == "a column-major":
        a = torch.empty(K, M, dtype=torch.bfloat16).t()
    elif case == "M = 65":
        a = torch.empty(65, K, dtype=torch.bfloat16)
    why = decode.why_not(a, b)
    assert why is not None and reason in why
    assert not engine.use_decode(a, b)


def _operands(case):
    """(a, b) for a 16 x 4096 x 1024 call, aligned or broken as ``case`` says."""
    K, N, M = 4096, 1024, 16
    a, b = torch.empty(M, K, dtype=torch.bfloat16), torch.empty(N, K, dtype=torch.bfloat16).t()
    if case == "K % 8":
        a, b = torch.empty(M, 4093, dtype=torch.bfloat16), torch.empty(N, 4093, dtype=torch.bfloat16).t()
    elif case == "a offset by one element":
        a = torch.empty(M * K + 1, dtype=torch.bfloat16)[1:].view(M, K)
    elif case == "weight offset by three elements":
        b = torch.empty(N * K + 3, dtype=torch.bfloat16)[3:].view(N, K).t()
    elif case == "weight row stride 4100":
        b = torch.empty(N, 4100, dtype=torch.bfloat16)[:, :K].t()
    elif case == "a row stride 4097":
        a = torch.empty(M, 4097, dtype=torch.bfloat16)[:, :K]
    return a, b


@pytest.mark.parametrize("case", ["K % 8", "a offset by one element", "weight offset by three elements",
                                  "weight row stride 4100", "a row stride 4097"])
def test_rows_at_any_address_take_the_unaligned_variants(case):
    """Rows TMA cannot read (the engine kernel and h11 would copy them) are read in place by the unaligned
    variants: ``why_not`` allows them, ``aligned`` says no, and the launch's variant reads any address."""
    a, b = _operands(case)
    assert decode.why_not(a, b) is None and engine.use_decode(a, b)
    assert not decode.aligned(a, b)
    v = decode.variant_for(a, b)
    assert not v.aligned and v == decode.UNALIGNED_VARIANTS[decode.token_tiles(a.shape[0])]
    assert decode.kernel_expr("__nv_bfloat16", "__nv_bfloat16", "float", 2, 0, False, v).count("false") >= 1
    a_ok, b_ok = _operands("aligned")
    assert decode.aligned(a_ok, b_ok) and decode.variant_for(a_ok, b_ok) == decode.default_variant(2)


@pytest.mark.parametrize("M, N, K, expect", [
    (1, 4613, 771, decode.UNALIGNED_VARIANTS[1]),  # 7 MB: the per-row windows
    (32, 2049, 2049, decode.UNALIGNED_VARIANTS[4]),
    (1, 4095, 4095, decode.STRIDED_VARIANTS[1]),  # 33.5 MB: strided, one iteration deep
    (1, 11008, 4095, decode.Variant(u=4, depth=2, aligned=False, strided=True)),  # 90 MB: two deep
    (16, 4095, 4095, decode.STRIDED_VARIANTS[2]),
    (32, 14340, 3077, decode.STRIDED_VARIANTS[4]),
])
def test_unaligned_weights_take_the_strided_variants_by_size(M, N, K, expect):
    """Rows at any address: the strided variants from STRIDED_MIN_BYTES of weight, the launch and the router's
    price alike (``variant_for``, ``cost_s``)."""
    meta = dict(dtype=torch.bfloat16, device="meta")
    a, b = torch.empty(M, K, **meta), torch.empty(N, K, **meta).t()
    assert not decode.aligned(a, b)
    v = decode.variant_for(a, b)
    assert v == expect and v.strided == (2 * N * K >= decode.STRIDED_MIN_BYTES)
    assert decode.plan(M, N, K, 132, v).variant == v
    t = decode.cost_s(M, N, K, 132, H200, aligned=False)
    other = dataclasses.replace(H200, decode_strided_share=1.0)
    assert (t < decode.cost_s(M, N, K, 132, other, aligned=False)) == v.strided
    # fp16 weights weigh the same bytes
    a16, b16 = a.half(), b.half()
    assert decode.variant_for(a16, b16) == v


def test_unaligned_weights_past_the_h11_limit_stay_on_the_decode_kernel():
    """h11 streams a big aligned weight faster, but an unaligned one it would copy whole first."""
    x = torch.empty(1, 8191, dtype=torch.bfloat16, device="meta")
    w = torch.empty(28672, 8191, dtype=torch.bfloat16, device="meta")
    assert engine.use_decode(x, w.t())
    x = torch.empty(1, 8192, dtype=torch.bfloat16, device="meta")
    w = torch.empty(28672, 8192, dtype=torch.bfloat16, device="meta")
    assert not engine.use_decode(x, w.t())


def test_route_keeps_the_engine_kernel_where_its_copies_cost_less_than_the_slower_unaligned_stream():
    """Small weights at 17-32 tokens: the engine kernel's copies stay in L2 and are priced below what the
    unaligned decode stream loses (``decode.unaligned_factor`` at NT = 4), so the router keeps the engine
    kernel at 32 x 1025 x 2049 (H100, b3fbf21: 8.5 us against the decode kernel's 12.1; at 15ab9dc with the
    decode kernel unsplit, 8.4 against 9.2). The copies' price before (``benchmarks/fit_copies.py``: 1.5 us and
    4.3 TB/s at any size) sent it to the decode kernel.
    At 32 x 2049 x 2049 the engine kernel with its copies ran 10.8 us on the H200 (edda661) and 11.4 on the
    H100 (b3fbf21), against the decode kernel's 12.8 / 13.3 as a two-way split. Since the split's fix-up is
    priced as measured (session 49) the decode kernel runs it unsplit, 9.7 us on the H100, and takes it."""
    meta = dict(dtype=torch.bfloat16, device="meta")
    for n, k, kernel in ((1025, 2049, "engine"), (2049, 2049, "decode")):
        a, b, out = torch.empty(32, k, **meta), torch.empty(n, k, **meta).t(), torch.empty(32, n, **meta)
        r = engine.route(a, b, out, bias=None, activation=None, has_c=False, sm_count=132)
        engine_bar = r.engine_s * H200.decode_weighed_engine_share + r.copies_s
        assert r.kernel == kernel and (r.decode_s > engine_bar) == (kernel == "engine"), (n, k, r)
        assert r.copies_s == engine.copies_s(a, b, H200) > 0


def test_a_route_says_what_it_weighed():
    """``Route.copies_s`` and the repr: where the decode kernel would read unaligned rows in place, the route
    keeps what the engine kernel's copies were priced at and says it beside the engine kernel's plan, with
    the price the router weighed that plan at; an engine route says the decode kernel's price it passed
    over; aligned rows carry no copies. ``gemmlab.plan`` and the model report show the same."""
    from gemmlab.reports import modelling

    meta = dict(dtype=torch.bfloat16, device="meta")

    def route(M, N, K):
        a, b, out = torch.empty(M, K, **meta), torch.empty(N, K, **meta).t(), torch.empty(M, N, **meta)
        return engine.route(a, b, out, bias=None, activation=None, has_c=False, sm_count=132), (a, b)

    r, (a, b) = route(1, 4095, 4095)  # the decode kernel: the copies of 33 MB cost more than its slower stream
    assert r.kernel == "decode" and r.copies_s == engine.copies_s(a, b, H200) > 0
    assert f"+ its operand copies {r.copies_s * 1e6:.1f} us" in repr(r) and f"weighed at {r.engine_s * 1e6:.1f}" in repr(r)
    r, (a, b) = route(32, 1025, 2049)  # the engine kernel with its copies
    assert r.kernel == "engine" and r.copies_s == engine.copies_s(a, b, H200)
    assert "its operand copies" in repr(r) and f"gemmlab.decode priced {r.decode_s * 1e6:.1f} us" in repr(r)
    assert "decode kernel" not in repr(r)
    r, _ = route(2, 3072, 3072)  # aligned
    assert r.kernel == "decode" and r.copies_s is None and "copies" not in repr(r)
    got = modelling.matmul_plan(32, 2049, 2049, "bf16", 132)
    assert got.copies_priced_us == pytest.approx(route(32, 2049, 2049)[0].copies_s * 1e6)
    assert modelling.matmul_plan(2, 3072, 3072, "bf16", 132).copies_priced_us is None


def test_copies_are_priced_at_the_l2_rate_up_to_a_share_of_the_l2_and_at_the_hbm_copy_rate_past_it():
    """``engine.copies_s``: nothing where no operand is copied; else every copied byte read and written, at
    ``copy_resident_bytes_per_s`` up to ``copy_resident_share`` of the L2 and at the slower
    ``copy_bytes_per_s`` past it (a continuous price: the knot only changes the slope)."""
    meta = dict(dtype=torch.bfloat16, device="meta")
    prof = H200
    assert engine.copies_s(torch.empty(1, 1024, **meta), torch.empty(4097, 1024, **meta).t(), prof) == 0.0
    assert prof.copy_bytes_per_s < prof.copy_resident_bytes_per_s

    def price(n_rows: int, k: int = 1025) -> tuple[float, int]:
        a, b = torch.empty(1, k, **meta), torch.empty(n_rows, k, **meta).t()
        return engine.copies_s(a, b, prof), 2 * k * (n_rows + 1)

    knot = prof.copy_resident_share * prof.l2_bytes
    (t1, n1), (t2, n2) = price(1000), price(2000)
    assert n2 < knot and t2 - t1 == pytest.approx(2 * (n2 - n1) / prof.copy_resident_bytes_per_s)
    (t3, n3), (t4, n4) = price(20000), price(40000)
    assert n3 > knot and t4 - t3 == pytest.approx(2 * (n4 - n3) / prof.copy_bytes_per_s)
    assert t3 == pytest.approx(prof.copy_fixed_s + 2 * knot / prof.copy_resident_bytes_per_s
                               + 2 * (n3 - knot) / prof.copy_bytes_per_s)
    # Only what is copied counts: an activation whose rows are padded to 16 bytes (1032 elements apart) beside
    # a weight whose rows are not: the weight alone is copied.
    a = torch.empty_strided((4, 1025), (1032, 1), **meta)
    b = torch.empty(3000, 1025, **meta).t()
    assert engine.copies_s(a, b, prof) == pytest.approx(prof.copy_fixed_s + 2 * 3000 * 1025 * 2 / prof.copy_resident_bytes_per_s)


def test_the_copies_price_is_what_the_records_fit():
    """The profile's copy constants are ``benchmarks/fit_copies.py``'s fit to the engine kernel with copies on
    the unaligned decode shapes (H200, engine_broad.jsonl at 90e1bea and edda661), and on the held-out half
    of those shapes the whole path (the router's ``engine_s`` + ``copies_s``) is priced within 0.04 mean
    |log measured / priced| (0.022; the single-rate price before: 0.144), within 0.2 on the H100's records
    (0.16; before 0.26)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import fit_copies
    finally:
        sys.path.pop(0)
    pts = fit_copies.points(fit_copies.RESULTS / "engine_broad.jsonl", ["90e1bea", "edda661"])
    assert len(pts) >= 40
    shapes = sorted({s for *_, s in pts})
    held = [q for q in pts if shapes.index(q[3]) % 2 == 1]
    assert fit_copies.error(held, fit_copies.current) < 0.04 < fit_copies.error(held, fit_copies.single_rate)
    h100 = fit_copies.points(fit_copies.RESULTS / "h100_engine_broad.jsonl", ["90e1bea", "eec817f", "b3fbf21"])
    assert fit_copies.error(h100, fit_copies.current) < 0.2 < fit_copies.error(h100, fit_copies.single_rate)
    f, rr, r = fit_copies.fit(pts, H200.copy_resident_share, H200.l2_bytes)
    assert abs(f - H200.copy_fixed_s) < 0.1e-6
    assert rr == pytest.approx(H200.copy_resident_bytes_per_s, rel=0.02)
    assert r == pytest.approx(H200.copy_bytes_per_s, rel=0.02)


def test_no_unaligned_variant_past_max_m():
    with pytest.raises(ValueError, match="any address"):
        decode.default_variant(8, aligned=False)


def test_route_weighs_the_engine_kernels_copies_against_the_unaligned_decode_kernel():
    """1 x 4097 x 1025 (K odd): the engine kernel copies the 8 MB weight every call (read and written), the
    decode kernel reads it once in place: the router prices both and runs the decode kernel. Aligned, the
    same rule as before (no copies in the price)."""
    meta = dict(dtype=torch.bfloat16, device="meta")
    a, b, out = torch.empty(1, 1025, **meta), torch.empty(4097, 1025, **meta).t(), torch.empty(1, 4097, **meta)
    r = engine.route(a, b, out, bias=None, activation=None, has_c=False, sm_count=132)
    assert r.kernel == "decode" and r.decode_s is not None
    copies = engine.copies_s(a, b, H200)
    assert copies >= 2 * 4097 * 1025 * 2 / H200.copy_resident_bytes_per_s
    assert r.decode_s <= r.engine_s * H200.decode_weighed_engine_share + copies
    assert engine.copies_s(torch.empty(1, 1024, **meta), torch.empty(4097, 1024, **meta).t(), H200) == 0.0
    # The unaligned variants' stream is priced slower than the aligned ones' (decode.unaligned_factor), more so
    # with more token tiles to cut.
    assert 1.0 < decode.unaligned_factor(1, H200) < decode.unaligned_factor(2, H200) < decode.unaligned_factor(4, H200)
    # a strided variant streams at its measured share of the others' time
    for nt in (1, 2, 4):
        strided = decode.Variant(u=4, aligned=False, strided=True)
        assert decode.unaligned_factor(nt, H200, strided) == pytest.approx(
            decode.unaligned_factor(nt, H200) * H200.decode_strided_share)
        assert 1.0 < decode.unaligned_factor(nt, H200, strided) < decode.unaligned_factor(nt, H200)
    assert decode.cost_s(1, 4097, 1025, 132, H200, aligned=False) > decode.cost_s(1, 4097, 1025, 132, H200)
    # Priced without its copies the engine kernel would win here: the copies decide.
    assert not engine.decode_runs(1, 4097, 1025, 132, r.decode_s, r.decode_s * 0.5, prof=H200)
    assert engine.decode_runs(1, 4097, 1025, 132, r.decode_s, r.decode_s * 0.5, copies, prof=H200)


def test_why_not_works_on_meta_tensors():
    a = torch.empty(8, 4096, dtype=torch.float16, device="meta")
    b = torch.empty(1024, 4096, dtype=torch.float16, device="meta").t()
    assert decode.why_not(a, b) is None


# SASS: every instantiation the engine can ask for and every variant the benchmark times compiles without
# local memory, with HMMA and 128-bit no-allocate weight loads. (Activations and bias types only change the
# epilogue; one of each is enough.)
_CT = {"bf16": "__nv_bfloat16", "f16": "__half", "f32": "float"}
SASS_CASES = ([(t, t, "f32", nt, 0, s, None) for t in ("bf16", "f16") for nt in (1, 2, 4, 8) for s in (0, 1)]
              + [("bf16", o, b, 8, 1 | 2 | (act << 2), 1, None)
                 for o, b, act in (("f32", "bf16", 1), ("f16", "f32", 2), ("bf16", "f32", 3), ("f32", "f32", 4))]
              + [("f16", "f32", "f16", 4, 1 | (2 << 2), 1, None)]
              + [("bf16", "bf16", "f32", nt, 0, 1, v) for nt, vs in decode.VARIANTS.items() for v in vs
                 if v != decode.default_variant(nt)])


def _main_loop(summary):
    main = max(summary.loops, key=lambda lp: lp.mix.get("hmma", 0))
    return [ins for ins in summary.instructions if ins.address in main.addresses], main


@pytest.mark.parametrize("case", SASS_CASES, ids=lambda c: "-".join(map(str, c)))
def test_sass_of_every_instantiation(case):
    tin, tout, tbias, nt, epi, split, variant = case
    v = variant or decode.default_variant(nt)
    expr = decode.kernel_expr(_CT[tin], _CT[tout], _CT[tbias], nt, epi, bool(split), v)
    ck = compile_kernel(decode.SOURCE, expr, arch="sm_90a")
    summary = sass.kernel_summary(ck)
    mma = r"^HMMA\.16816\.F32\.BF16$" if tin == "bf16" else r"^HMMA\.16816\.F32$"
    expect = sass.SassExpect(
        contains=(mma, r"^LDG\.E\.NA\.128\.CONSTANT$", r"^LDG\.E\.128\.CONSTANT$", *sass.PDL_OPCODES),
        absent=(r"^LDL", r"^STL"), no_local_memory=True, max_registers=v.max_registers(nt))
    assert sass.check(expect, summary, ck.resources) == []
    # The main loop (both halves of it at depth 2): 2 U RPW weight loads and 2 NT U RPW HMMA per
    # iteration, and the L2 prefetch (CCTL.E.PF2) unless pf = 0.
    body, main = _main_loop(summary)
    w_loads = [i for i, ins in enumerate(body) if ins.opcode == "LDG.E.NA.128.CONSTANT"]
    prefetches = [i for i, ins in enumerate(body) if ins.opcode.startswith("CCTL.E.PF2")]
    # (ptxas may unroll the loop once more: whole iterations, NT HMMA per weight load.)
    assert len(w_loads) % (2 * v.u * v.rpw * v.depth) == 0
    assert main.mix.get("hmma", 0) == nt * len(w_loads)
    assert (len(prefetches) >= 2) == (v.pf > 0)
    assert ck.resources.static_shared <= 1024, "the partials live in dynamic shared memory"


UNALIGNED_SASS_CASES = ([(t, t, "f32", nt, 0, s, None) for t in ("bf16", "f16") for nt in decode.UNALIGNED_VARIANTS
                         for s in (0, 1)]
                        + [("bf16", o, b, 4, 1 | 2 | (act << 2), 1, None)
                           for o, b, act in (("f32", "bf16", 1), ("f16", "f32", 2), ("bf16", "f32", 4))]
                        + [("bf16", "bf16", "f32", nt, 0, 1, v) for nt, vs in decode.UNALIGNED_TRIALS.items() for v in vs])


@pytest.mark.parametrize("case", UNALIGNED_SASS_CASES, ids=lambda c: "-".join(map(str, c)))
def test_sass_of_every_unaligned_instantiation(case):
    """The unaligned variants (rows at any address): no local memory under their register cap; in the main
    loop U + 1 no-allocate weight loads a row for U chunks (the windows and lane 0's one after them,
    predicated; strided: the U windows only), 2 NT HMMA per chunk and row pair, and the shuffles and byte
    permutes that cut each lane's 16 bytes out of two windows (strided: X's only)."""
    tin, tout, tbias, nt, epi, split, variant = case
    v = variant or decode.default_variant(nt, aligned=False)
    expr = decode.kernel_expr(_CT[tin], _CT[tout], _CT[tbias], nt, epi, bool(split), v)
    ck = compile_kernel(decode.SOURCE, expr, arch="sm_90a")
    summary = sass.kernel_summary(ck)
    mma = r"^HMMA\.16816\.F32\.BF16$" if tin == "bf16" else r"^HMMA\.16816\.F32$"
    expect = sass.SassExpect(
        contains=(mma, r"^LDG\.E\.NA\.128\.CONSTANT$", r"^LDG\.E\.128\.CONSTANT$", r"^SHFL\.IDX$", r"^PRMT$",
                  *sass.PDL_OPCODES),
        absent=(r"^LDL", r"^STL"), no_local_memory=True, max_registers=v.max_registers(nt))
    assert sass.check(expect, summary, ck.resources) == []
    body, main = _main_loop(summary)
    w_loads = [ins for ins in body if ins.opcode == "LDG.E.NA.128.CONSTANT"]
    # Rows g and g + 8 of each row group: U windows and lane 0's next one (strided: the U windows are the
    # fragments, none more).
    windows = v.u if v.strided else v.u + 1
    assert w_loads and len(w_loads) % (2 * v.rpw * windows * v.depth) == 0
    assert main.mix.get("hmma", 0) * windows == nt * v.u * len(w_loads)


@pytest.mark.parametrize("nt", [1, 2])  # NT = 4, 8 run the first kernel: measured faster, loads interleaved
def test_default_variant_issues_its_weight_loads_before_the_mmas(nt):
    """In the default variants' main loop every lane issues all 2 U RPW weight loads of an iteration
    before the first HMMA that follows them (at depth 2: the next iteration's loads before this one's
    mmas), so a warp waits once per iteration for all its bytes, not once per load."""
    v = decode.default_variant(nt)
    ck = compile_kernel(decode.SOURCE, decode.kernel_expr(_CT["bf16"], _CT["bf16"], _CT["f32"], nt, 0, True),
                        arch="sm_90a")
    body, _ = _main_loop(sass.kernel_summary(ck))
    seq = "".join("W" if ins.opcode == "LDG.E.NA.128.CONSTANT" else "M" if ins.base == "HMMA" else ""
                  for ins in body)
    runs = [r for r in seq.split("M") if r]  # the weight loads between HMMAs
    assert len(runs) % v.depth == 0 and {len(r) for r in runs} == {2 * v.u * v.rpw}, seq


# The prepared launch's split-K buffers, with the GPU stubbed ---------------------------------------------

class _Launcher:
    """jit.launch.Launcher's interface, recording the parameter block's pointers and the launches."""

    def __init__(self, compiled, kinds, *, grid, block, smem=0, cluster=None, device_index=0, pdl=False):
        import threading

        self.kinds, self.ptrs, self.launches, self.lock = kinds, {}, [], threading.Lock()
        self.pdl = pdl

    def set_args(self, args):
        assert len(args) == len(self.kinds)

    def set_ptr(self, i, v):
        assert self.kinds[i] == "ptr"
        self.ptrs[i] = v

    def set_f32(self, i, v):
        assert self.kinds[i] == "f32"

    def launch(self, stream):
        self.launches.append(stream)


@pytest.fixture
def stubbed(monkeypatch):
    """DecodeLaunch on CPU tensors: compiles and launches stubbed, the current stream 7, buffer lookups and
    capture queries counted (``calls``), ``capturing`` settable."""
    import types

    from gemmlab.jit import compiler, launch

    monkeypatch.setattr(compiler, "compile_kernel", lambda *a, **k: types.SimpleNamespace(name="stub"))
    monkeypatch.setattr(launch, "Launcher", _Launcher)
    monkeypatch.setattr(launch, "raw_stream", lambda index: 7)
    state = types.SimpleNamespace(capturing=False, calls={"buffers": [], "capturing": 0})

    def capturing():
        state.calls["capturing"] += 1
        return state.capturing

    def buffers(device, ws_floats, counters, stream):
        state.calls["buffers"].append(stream)
        return state.bufs.setdefault(stream, (torch.zeros(max(ws_floats, 1)), torch.full((max(counters, 8),), 5,
                                                                                          dtype=torch.int32)))

    state.bufs = {}
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", capturing)
    monkeypatch.setattr(decode, "split_buffers", buffers)
    monkeypatch.setattr(decode, "_CAPTURED", set())
    return state


def _launch(M, N, K):
    a, w = torch.zeros(M, K, dtype=torch.bfloat16), torch.zeros(N, K, dtype=torch.bfloat16)
    out = torch.empty(M, N, dtype=torch.bfloat16)
    call = decode.prepare(a, w.t(), out, epi=0, ctypes=("__nv_bfloat16", "__nv_bfloat16", "float"), c=None,
                          bias=None, sm_count=132)
    return call, (a, w.t(), out, None, None, 1.0, 0.0)


SPLIT = (16, 256, 8192)  # decode.plan splits K at this shape on 132 SMs


def test_split_k_call_binds_its_buffers_once_per_stream(stubbed):
    """The buffers are looked up when the call is prepared (on the current stream, so a capture of a
    prepared call allocates nothing) and again only when a call comes on another stream; the capture
    state is never asked for counters allocated outside a capture."""
    assert decode.plan(*SPLIT, 132).splits > 1
    call, args = _launch(*SPLIT)
    assert call.launcher.pdl is True  # the decode kernel waits (pdl_wait) before any global access
    assert stubbed.calls["buffers"] == [7]
    ws, ctr = stubbed.bufs[7]
    for _ in range(3):
        call.run(7, *args)
    assert stubbed.calls == {"buffers": [7], "capturing": 0}
    assert call.launcher.ptrs[decode._WS] == ws.data_ptr() and call.launcher.ptrs[decode._CTR] == ctr.data_ptr()
    call.run(9, *args)  # another stream: its own buffers
    assert stubbed.calls["buffers"] == [7, 9]
    assert call.launcher.ptrs[decode._CTR] == stubbed.bufs[9][1].data_ptr()
    call.run(9, *args)
    call.run(7, *args)
    assert stubbed.calls["buffers"] == [7, 9, 7] and call.launcher.ptrs[decode._CTR] == ctr.data_ptr()
    assert call.launcher.launches == [7, 7, 7, 9, 9, 7]
    assert torch.all(ctr == 5)  # counters allocated outside a capture are never zeroed again


def test_counters_allocated_during_a_capture_are_zeroed_until_zeroed_eagerly(stubbed):
    """Counters a capture allocated (in _CAPTURED): every captured call zeroes them in its graph; the first
    eager call zeroes them for good, and later calls and captures leave them alone."""
    call, args = _launch(*SPLIT)
    ctr = stubbed.bufs[7][1]
    decode._CAPTURED.add(ctr.data_ptr())
    other, _ = _launch(*SPLIT)  # a second launch bound to the same counters before they were zeroed
    call._bind(7)
    stubbed.capturing = True
    call.run(7, *args)
    assert torch.all(ctr == 0) and ctr.data_ptr() in decode._CAPTURED and stubbed.calls["capturing"] == 1
    ctr.fill_(5)
    call.run(7, *args)  # a second capture zeroes them again
    assert torch.all(ctr == 0) and stubbed.calls["capturing"] == 2
    ctr.fill_(5)
    stubbed.capturing = False
    call.run(7, *args)  # eager: zeroed now, and no longer noted
    assert torch.all(ctr == 0) and ctr.data_ptr() not in decode._CAPTURED and stubbed.calls["capturing"] == 3
    ctr.fill_(5)
    stubbed.capturing = True
    call.run(7, *args)
    assert torch.all(ctr == 5) and stubbed.calls["capturing"] == 3
    stubbed.capturing = False
    other.run(7, *args)  # bound while they were noted: it zeroes them once more (harmless), then never
    assert torch.all(ctr == 0) and stubbed.calls["capturing"] == 4
    ctr.fill_(5)
    other.run(7, *args)
    assert torch.all(ctr == 5) and stubbed.calls["capturing"] == 4


def test_unsplit_call_never_touches_buffers_or_the_capture_state(stubbed):
    call, args = _launch(1, 1024, 1024)
    assert decode.plan(1, 1024, 1024, 132).splits == 1
    call.run(7, *args)
    call.run(9, *args)
    assert stubbed.calls == {"buffers": [], "capturing": 0}


def test_split_buffers_note_counters_allocated_during_a_capture(monkeypatch):
    monkeypatch.setattr(decode, "_BUFFERS", {})
    monkeypatch.setattr(decode, "_RETIRED", [])
    monkeypatch.setattr(decode, "_CAPTURED", set())
    monkeypatch.setattr(decode, "_SPARE", {})
    cpu = torch.device("cpu", 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    ws, ctr = decode.split_buffers(cpu, 100, 10, stream=1)
    assert not decode._CAPTURED and torch.all(ctr == 0)
    assert decode.split_buffers(cpu, 50, 10, stream=1)[1] is ctr  # big enough: the same buffers
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    ws2, ctr2 = decode.split_buffers(cpu, 100, 4096, stream=1)  # grown during a capture
    assert ctr2 is not ctr and decode._CAPTURED == {ctr2.data_ptr()} and ctr in decode._RETIRED
    assert ws2 is ws  # the workspace was big enough: kept


def test_a_stream_first_seen_in_a_capture_takes_zeroed_spare_counters(monkeypatch):
    """Eager calls stock SPARE_COUNTERS zeroed counter buffers of at least their size; a stream first seen
    during a capture takes one (not noted in _CAPTURED: its graph needs no memset node) until none is left or
    none is big enough, then allocates and is noted. A capture stocks nothing."""
    monkeypatch.setattr(decode, "_BUFFERS", {})
    monkeypatch.setattr(decode, "_RETIRED", [])
    monkeypatch.setattr(decode, "_CAPTURED", set())
    monkeypatch.setattr(decode, "_SPARE", {})
    cpu = torch.device("cpu", 0)
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    decode.split_buffers(cpu, 100, 10, stream=1)
    spares = list(decode._SPARE[0])
    assert len(spares) == decode.SPARE_COUNTERS and all(t.numel() >= decode.COUNTERS_MIN for t in spares)
    assert all(torch.all(t == 0) for t in spares)
    capturing[0] = True
    got = [decode.split_buffers(cpu, 100, 10, stream=s)[1] for s in (2, 3)]
    assert {t.data_ptr() for t in got} == {t.data_ptr() for t in spares} and not decode._CAPTURED
    assert decode._SPARE[0] == []
    _, fresh = decode.split_buffers(cpu, 100, 10, stream=4)  # none left: allocated during the capture
    assert decode._CAPTURED == {fresh.data_ptr()} and decode._SPARE[0] == []
    capturing[0] = False
    decode.split_buffers(cpu, 100, 3000, stream=5)  # a bigger eager call: spares of its size
    assert [t.numel() for t in decode._SPARE[0]] == [3000] * decode.SPARE_COUNTERS
    capturing[0] = True
    _, big = decode.split_buffers(cpu, 100, 4000, stream=6)  # more than any spare holds
    assert big.data_ptr() in decode._CAPTURED and len(decode._SPARE[0]) == decode.SPARE_COUNTERS
    assert decode.split_buffers(cpu, 100, 2000, stream=7)[1].numel() == 3000  # a spare
    assert len(decode._SPARE[0]) == decode.SPARE_COUNTERS - 1


def test_a_forced_split_must_be_a_plan_of_the_calls_variant():
    """``decode.prepare(..., split=)`` (benchmarks/decode_splits.py) takes another plan of the call's own variant
    and token tiles only: one of another variant or NT is refused before anything compiles."""
    meta = dict(dtype=torch.bfloat16, device="meta")
    a, b, out = torch.empty(1, 1024, **meta), torch.empty(896, 1024, **meta).t(), torch.empty(1, 896, **meta)
    kw = dict(epi=0, ctypes=("__nv_bfloat16", "__nv_bfloat16", "float"), c=None, bias=None, sm_count=132)
    v = decode.variant_for(a, b)
    for wrong in (decode.plan(1, 896, 1024, 132, decode.Variant(u=4)),  # another variant
                  decode.plan(16, 896, 1024, 132, v)):  # another NT
        assert wrong.variant != v or wrong.nt != 1
        with pytest.raises(ValueError, match="is not a plan of"):
            decode.prepare(a, b, out, split=wrong, **kw)


def test_every_unaligned_default_is_among_the_checked_variants():
    """Whatever ``default_variant`` may pick for rows at any address (per-row windows, strided one or two
    iterations deep) is among the variants the SASS test compiles and the GPU test runs (UNALIGNED_VARIANTS
    and UNALIGNED_TRIALS)."""
    checked = {v for vs in decode.UNALIGNED_TRIALS.values() for v in vs} | set(decode.UNALIGNED_VARIANTS.values())
    for nt in decode.UNALIGNED_VARIANTS:
        for weight_bytes in (0, decode.STRIDED_MIN_BYTES - 1, decode.STRIDED_MIN_BYTES, decode.STRIDED_DEEP_BYTES,
                             10**10):
            assert decode.default_variant(nt, False, weight_bytes) in checked, (nt, weight_bytes)
