"""A byte-level emulation of the decode kernel's STRIDED variants (``engine_decode<..., ALIGNED=false,
STRIDED=true, RPW=1, ...>`` in kernels/engine/decode.cu), for tests/test_decode.py.

It follows the kernel's index arithmetic step by step: each lane's 16-byte window loads (``ld_windows``,
``ld_range``), the byte cut of X (``bytes_at``, the lane (q + 1) mod 4 shuffle and lane 0's extra window),
the m16n8k16 fragment layout, the masked head and tail chunks, the k pieces and splits, the reduction and
the store through ``strided_row``. Memory is a set of byte arrays with NaN around the rows (as the GPU test
allocates them); every window load is checked to be 16-byte aligned and to overlap the tensor's own bytes.
Values are small integers in fp16, so a correct schedule reproduces ``X @ W.T`` exactly.
"""

from __future__ import annotations

import numpy as np


class Memory:
    """Allocations at byte addresses; ``ld16`` is a 16-byte global load, ``bad`` what should not have been read."""

    def __init__(self):
        self.allocs = []  # (start, bytes, first byte of the tensor, one past its last, name)
        self.bad = []

    def add(self, start, data, lo, hi, name):
        self.allocs.append((start, data, lo, hi, name))

    def ld16(self, addr, what):
        assert addr % 16 == 0, (what, addr)
        for start, data, lo, hi, name in self.allocs:
            if start <= addr < start + len(data) or start <= addr + 15 < start + len(data):
                if not (addr < hi and addr + 16 > lo):
                    self.bad.append((what, name, "a window without a byte of the tensor", addr))
                if addr < start or addr + 16 > start + len(data):
                    self.bad.append((what, name, "outside the allocation", addr))
                raw = bytes(data[addr - start + i] if 0 <= addr - start + i < len(data) else 0xEE for i in range(16))
                return [int.from_bytes(raw[4 * i:4 * i + 4], "little") for i in range(4)]
        self.bad.append((what, "unmapped", addr))
        return [0xEEEEEEEE] * 4


def byte_perm(x, y, sel):
    """PTX ``prmt.b32`` (default mode)."""
    pool = (x | (y << 32)).to_bytes(8, "little")
    return int.from_bytes(bytes(pool[(sel >> (4 * i)) & 7] for i in range(4)), "little")


def bytes_at(lo, hi, s):
    """The 16 bytes from byte ``s`` (even) of the two windows ``lo``, ``hi`` (decode.cu's ``bytes_at``)."""
    v = lo + hi
    a = [v[i + 2] if s & 8 else v[i] for i in range(6)]
    b = [a[i + 1] if s & 4 else a[i] for i in range(5)]
    sel = 0x5432 if s & 2 else 0x3210
    return [byte_perm(b[i], b[i + 1], sel) for i in range(4)]


def ld_range(mem, p, lo, n, what):
    """decode.cu's ``ld_range``: elements [lo, n) of the 8 from byte address p, the others zero; a window is
    loaded only if it holds one of them."""
    s, base = p & 15, p & ~15
    zero = [0, 0, 0, 0]
    some = n > lo
    w0 = mem.ld16(base, what) if some and s + 2 * lo < 16 else zero
    w1 = mem.ld16(base + 16, what) if some and s + 2 * n > 16 else zero
    v = bytes_at(w0, w1, s)

    def keep(w, i):
        low = 0xFFFF if lo <= 2 * i < n else 0
        high = 0xFFFF0000 if lo <= 2 * i + 1 < n else 0
        return w & (low | high)

    return [keep(v[i], i) for i in range(4)]


def ld_windows(mem, p, q, U, what):
    """decode.cu's ``ld_windows``: a lane's window of each of U chunks, and lane 0 (q == 0) also the one after
    the last where the row is off 16 bytes."""
    base = p & ~15
    v = [mem.ld16(base + 64 * u, what) for u in range(U)]
    v.append(mem.ld16(base + 64 * U, what) if q == 0 and p & 15 else [0, 0, 0, 0])
    return v


def values(words):
    """A uint4 as its 8 fp16 values."""
    return np.frombuffer(b"".join(w.to_bytes(4, "little") for w in words), dtype=np.float16).astype(np.float64)


def mma_chunk(acc, wt, wb, x, NT):
    """Two m16n8k16 per token tile from each lane's 8 values of its two weight rows and its token rows."""
    for j in range(NT):
        for first in (0, 4):  # the uint4's .x / .y, then .z / .w
            A, B = np.zeros((16, 16)), np.zeros((16, 8))
            for lane in range(32):
                g, q = divmod(lane, 4)
                A[g, 2 * q:2 * q + 2] = wt[lane][first:first + 2]
                A[g + 8, 2 * q:2 * q + 2] = wb[lane][first:first + 2]
                A[g, 2 * q + 8:2 * q + 10] = wt[lane][first + 2:first + 4]
                A[g + 8, 2 * q + 8:2 * q + 10] = wb[lane][first + 2:first + 4]
                B[2 * q:2 * q + 2, g] = x[lane][j][first:first + 2]
                B[2 * q + 8:2 * q + 10, g] = x[lane][j][first + 2:first + 4]
            with np.errstate(all="ignore"):
                D = A @ B
            for lane in range(32):
                g, q = divmod(lane, 4)
                acc[lane][j][0:2] += D[g, 2 * q:2 * q + 2]
                acc[lane][j][2:4] += D[g + 8, 2 * q:2 * q + 2]


def strided_row(v):
    return (v & ~127) | ((v & 15) << 3) | ((v >> 4) & 7)


def run(mem, W, ldw, X, ldx, M, N, K, plan):
    """The kernel's output for weight rows at byte address W (ld ``ldw`` elements) and token rows at X (``ldx``)
    under ``plan`` (a ``decode.DecodePlan`` of a strided variant): (out, writes), NaN where never written."""
    U, DEPTH, NT, RW = plan.variant.u, plan.variant.depth, plan.nt, plan.rw
    WARPS, ROWS, CHUNK = 8, 16, 32 * U
    KW, rows_cta, MP = WARPS // RW, 16 * RW, 8 * NT
    out, writes = np.full((M, N), np.nan), np.zeros((M, N), dtype=int)
    partials = {}
    for bx in range(plan.row_blocks):
        for by in range(plan.splits):
            red = np.zeros((KW, MP, rows_cta))
            for warp in range(WARPS):
                rg, ks = warp % RW, warp // RW
                row0 = (bx * RW + rg) * ROWS
                k_begin = min(K, (by * KW + ks) * plan.piece)
                k_end = min(K, k_begin + plan.piece)
                acc = [np.zeros((NT, 4)) for _ in range(32)]
                if strided_row(row0) < N:
                    _warp(mem, W, ldw, X, ldx, M, N, row0, k_begin, k_end, U, DEPTH, NT, CHUNK, acc)
                for lane in range(32):
                    g, q = divmod(lane, 4)
                    for j in range(NT):
                        m, row = 8 * j + 2 * q, ROWS * rg + g
                        red[ks, m, row], red[ks, m + 1, row] = acc[lane][j][0], acc[lane][j][1]
                        red[ks, m, row + 8], red[ks, m + 1, row + 8] = acc[lane][j][2], acc[lane][j][3]
            partials[bx, by] = red.sum(axis=0)  # the warps' k pieces, summed in shared memory
        total = sum(partials[bx, s] for s in range(plan.splits))  # the split-K fix-up, in slot order
        for m in range(M):
            for i in range(rows_cta):
                n = strided_row(bx * rows_cta + i)
                if n < N:
                    out[m, n] = total[m, i]
                    writes[m, n] += 1
    return out, writes


def _warp(mem, W, ldw, X, ldx, M, N, row0, k_begin, k_end, U, DEPTH, NT, CHUNK, acc):
    """One warp's k piece [k_begin, k_end) of the tile of virtual rows row0 .. row0 + 15."""
    w_shift = (W + 2 * strided_row(row0) * ldw) & 15
    half_s = w_shift // 2
    w_lane, x_row, x_shift = [], [], []
    for lane in range(32):
        g, q = divmod(lane, 4)
        w_lane.append([W + 2 * (min(strided_row(row0 + 8 * h + g), N - 1) * ldw + 8 * q - half_s) for h in range(2)])
        x_row.append([min(8 * j + g, M - 1) * ldx for j in range(NT)])
        x_shift.append((X + 2 * 8 * q + 2 * x_row[-1][0] - w_shift) & 15)

    def x_addr(lane, j, k):
        return X + 2 * (8 * (lane % 4) + x_row[lane][j] + k - half_s)

    def load_w(k):
        return [[[mem.ld16(((w_lane[lane][h] + 2 * k) & ~15) + 64 * u, "W") for u in range(U)] for h in range(2)]
                for lane in range(32)]

    def compute(w, k):
        xw = [[ld_windows(mem, x_addr(lane, j, k), lane % 4, U, "X") for j in range(NT)] for lane in range(32)]
        for u in range(U):
            x = []
            for lane in range(32):
                src = (lane & ~3) | ((lane % 4 + 1) % 4)
                offer = [xw[src][j][u + 1] if src % 4 == 0 else xw[src][j][u] for j in range(NT)]
                x.append([values(bytes_at(xw[lane][j][u], offer[j], x_shift[lane])) for j in range(NT)])
            mma_chunk(acc, [values(w[lane][0][u]) for lane in range(32)], [values(w[lane][1][u]) for lane in range(32)],
                      x, NT)

    def masked_chunk(k, lo_of, n_of):
        x, wt, wb = [], [], []
        for lane in range(32):
            q = lane % 4
            lo, n = lo_of(q), n_of(q)
            x.append([values(ld_range(mem, x_addr(lane, j, k), lo, n, "X masked")) for j in range(NT)])
            wt.append(values(ld_range(mem, w_lane[lane][0] + 2 * k, lo, n, "W masked")))
            wb.append(values(ld_range(mem, w_lane[lane][1] + 2 * k, lo, n, "W masked")))
        mma_chunk(acc, wt, wb, x, NT)

    k = k_begin
    if half_s > 0:  # the head: the piece starts half_s elements into the lanes' first chunk
        masked_chunk(k, lambda q: max(0, half_s - 8 * q), lambda q, k0=k: min(8, k_end - (k0 - half_s + 8 * q)))
        k += 32
    k_stop = k_end + half_s
    if DEPTH == 1:
        while k + CHUNK <= k_stop:
            compute(load_w(k), k)
            k += CHUNK
    elif k + CHUNK <= k_stop:  # two buffers: the next iteration's weight loads before this one's MMAs
        buf = load_w(k)
        while True:
            more = k + 2 * CHUNK <= k_stop
            nxt = load_w(k + CHUNK) if more else None
            compute(buf, k)
            k += CHUNK
            if not more:
                break
            buf = nxt
    for _ in range(U):  # the tail: at most U chunks of 32, masked to k_end
        if k >= k_stop:
            break
        masked_chunk(k, lambda q: 0, lambda q, k0=k: min(8, k_end - (k0 - half_s + 8 * q)))
        k += 32


def make_case(M, N, K, ldw, ldx, w_off, x_off, seed=0, w_base=1 << 20, x_base=1 << 34):
    """Operands as tests/test_decode_gpu.py makes them: NaN-filled buffers (torch's 512-byte aligned blocks),
    views at element offsets w_off / x_off, rows ldw / ldx elements apart. Returns (memory, W's byte
    address, X's, W's values, X's values)."""
    rng = np.random.default_rng(seed)
    Wv = rng.integers(-4, 5, size=(N, K)).astype(np.float16)
    Xv = rng.integers(-4, 5, size=(M, K)).astype(np.float16)
    mem = Memory()

    def alloc(base, rows, ld, off, vals, name):
        nbytes = (2 * (rows * ld + off + 16) + 511) // 512 * 512
        buf = np.full(nbytes // 2, np.nan, dtype=np.float16)
        for r in range(rows):
            buf[off + r * ld: off + r * ld + K] = vals[r]
        start = base + 2 * off
        mem.add(base, buf.view(np.uint8).copy(), start, start + 2 * ((rows - 1) * ld + K), name)
        return start

    W = alloc(w_base, N, ldw, w_off, Wv, "W")
    X = alloc(x_base, M, ldx, x_off, Xv, "X")
    return mem, W, X, Wv.astype(np.float64), Xv.astype(np.float64)
