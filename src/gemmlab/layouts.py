"""Layouts in Python: the TMA / wgmma swizzle, shared-memory banks, and the warp tiling of the fp32 ladder.

The Hopper kernels ask the TMA unit for tiles in the 128-byte swizzle mode (``CU_TENSOR_MAP_SWIZZLE_128B``)
and tell ``wgmma`` the same mode in its shared-memory descriptors. This module is the one Python statement
of that layout; the figures and the tests read it from here.

The 128B swizzle works on *atoms* of 8 rows x 128 bytes (1024 bytes, which is why the tiles are 1024-byte
aligned). Inside an atom, the 16-byte chunk ``c`` (0..7) of row ``r`` is stored at chunk ``c ^ r``. As
address bits: bits 4-6 (the chunk) are XORed with bits 7-9 (the row in the atom). The 64B and 32B modes
XOR 2 and 1 bits. With bf16, one 128-byte row is 64 elements: the ``BK = 64`` k-slab of every Hopper step.

Shared memory has 32 banks of 4 bytes; a warp's request is split into phases (for 16-byte accesses, 8
threads per phase) and a phase is conflict-free when no two threads touch different words of one bank.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

BANKS = 32
BANK_BYTES = 4
CHUNK_BYTES = 16  # the swizzle's unit, and the width of one 128-bit access
ROW_BYTES = 128  # one row of a swizzle atom (= all 32 banks once)
ATOM_ROWS = 8
ATOM_BYTES = ROW_BYTES * ATOM_ROWS  # 1024

# mode in bytes -> number of chunk bits XORed (CUTLASS Swizzle<bits, 4, 3>)
_SWIZZLE_BITS = {0: 0, 32: 1, 64: 2, 128: 3}


def swizzle(byte_offset: int, mode: int = 128) -> int:
    """Physical byte offset of logical ``byte_offset`` in a tile stored with TMA swizzle ``mode`` bytes.

    ``byte_offset`` is measured from a 1024-byte aligned tile base. The function is its own inverse.
    """
    bits = _SWIZZLE_BITS[mode]
    mask = (1 << bits) - 1
    return byte_offset ^ (((byte_offset >> 7) & mask) << 4)


def swizzle_128b(byte_offset: int) -> int:
    """The 128B mode: 16-byte chunk index (bits 4-6) XOR row within the 8-row atom (bits 7-9)."""
    return swizzle(byte_offset, 128)


def swizzle_chunk(row: int, chunk: int, mode: int = 128) -> int:
    """Physical 16-byte chunk (0..7) that holds logical chunk ``chunk`` of 128-byte row ``row``."""
    return (swizzle(row * ROW_BYTES + chunk * CHUNK_BYTES, mode) % ROW_BYTES) // CHUNK_BYTES


def bank(byte_address: int) -> int:
    """The shared-memory bank (0..31) of a byte address."""
    return (byte_address // BANK_BYTES) % BANKS


def conflict_ways(byte_addresses, access_bytes: int = 4) -> int:
    """Shared-memory wavefronts one phase of accesses needs: the most distinct 4-byte words in one bank.

    1 means conflict-free. Threads reading the same word are a broadcast, not a conflict. Each access
    covers ``access_bytes`` starting at its address.
    """
    words = defaultdict(set)
    for a in byte_addresses:
        for w in range(a // BANK_BYTES, (a + access_bytes - 1) // BANK_BYTES + 1):
            words[w % BANKS].add(w)
    return max((len(s) for s in words.values()), default=0)


def column_read_addresses(rows, chunk: int, mode: int = 128, row_bytes: int = ROW_BYTES) -> list[int]:
    """Physical addresses of logical 16-byte chunk ``chunk`` in each of ``rows`` (one 128-bit load per row).

    This is the access ``ldmatrix`` and the epilogue make: 8 threads, 8 consecutive rows, one column.
    """
    return [swizzle(r * row_bytes + chunk * CHUNK_BYTES, mode) for r in rows]


def bank_conflicts_by_mode(chunk: int = 0) -> dict[int, int]:
    """Wavefronts for 8 rows reading logical chunk ``chunk``, for each swizzle mode (0 = none)."""
    return {m: conflict_ways(column_read_addresses(range(ATOM_ROWS), chunk, m), CHUNK_BYTES)
            for m in _SWIZZLE_BITS}


def chunk_map(rows: int = ATOM_ROWS, mode: int = 128) -> np.ndarray:
    """``out[r, p]`` = the logical 16-byte chunk stored at physical chunk position ``p`` of row ``r``.

    Each physical chunk ``p`` covers banks ``4p .. 4p + 3``; this is the bank map the figures draw.
    """
    out = np.empty((rows, ROW_BYTES // CHUNK_BYTES), dtype=np.int64)
    for r in range(rows):
        for c in range(ROW_BYTES // CHUNK_BYTES):
            out[r, swizzle_chunk(r, c, mode)] = c
    return out


# Warp tiling: which thread of a block computes which elements of C (the fp32 warptiling step) ---------

@dataclass(frozen=True)
class WarpTiling:
    """A block tile ``BM x BN`` split into warp tiles ``WM x WN``; each warp walks ``WMITER x WNITER``
    sub-tiles of ``WSUBM x WSUBN``; in each, a thread owns a ``TM x TN`` register tile. Warps are laid
    out row by row over the block tile (``BN / WN`` per row); lanes row by row over a sub-tile
    (``WSUBN / TN`` per row). This is the mapping of the public SGEMM ladder's warptiling kernel."""

    BM: int = 128
    BN: int = 128
    BK: int = 16
    WM: int = 64
    WN: int = 64
    WNITER: int = 4
    TM: int = 8
    TN: int = 4
    threads: int = 128

    @property
    def warps(self) -> int:
        return self.threads // 32

    @property
    def WMITER(self) -> int:
        return (self.WM * self.WN) // (32 * self.TM * self.TN * self.WNITER)

    @property
    def WSUBM(self) -> int:
        return self.WM // self.WMITER

    @property
    def WSUBN(self) -> int:
        return self.WN // self.WNITER

    def check(self) -> str | None:
        """None if the parameters tile the block exactly, else why not."""
        if self.threads % 32 or self.BM % self.WM or self.BN % self.WN:
            return "warp tiles must divide the block tile and threads be whole warps"
        if (self.BM // self.WM) * (self.BN // self.WN) != self.warps:
            return f"{(self.BM // self.WM) * (self.BN // self.WN)} warp tiles for {self.warps} warps"
        if self.WMITER < 1 or (self.WM * self.WN) % (32 * self.TM * self.TN * self.WNITER):
            return "a warp tile must be a whole number of 32-thread sub-tiles"
        if self.WSUBN % self.TN or self.WSUBM % self.TM or (self.WSUBN // self.TN) * (self.WSUBM // self.TM) != 32:
            return "a warp sub-tile must hold exactly 32 thread tiles"
        return None

    def elements(self, warp: int, lane: int) -> list[tuple[int, int]]:
        """The (row, col) elements of the block tile that thread ``lane`` of ``warp`` computes."""
        wr, wc = divmod(warp, self.BN // self.WN)
        per_row = self.WSUBN // self.TN
        tr, tc = divmod(lane, per_row)
        out = []
        for i in range(self.WMITER):
            for j in range(self.WNITER):
                r0 = wr * self.WM + i * self.WSUBM + tr * self.TM
                c0 = wc * self.WN + j * self.WSUBN + tc * self.TN
                out += [(r0 + r, c0 + c) for r in range(self.TM) for c in range(self.TN)]
        return out

    def owner_map(self) -> tuple[np.ndarray, np.ndarray]:
        """(warp, lane) of the thread owning each element of the block tile, as two BM x BN arrays."""
        warp = np.full((self.BM, self.BN), -1, dtype=np.int64)
        lane = np.full((self.BM, self.BN), -1, dtype=np.int64)
        for w in range(self.warps):
            for t in range(32):
                for r, c in self.elements(w, t):
                    warp[r, c], lane[r, c] = w, t
        return warp, lane

    @classmethod
    def from_config(cls, cfg: dict) -> "WarpTiling":
        """From a step's config: keys BM, BN, BK, WM, WN, WNITER, TM, TN and THREADS / NUM_THREADS where
        present, defaults otherwise."""
        kw = {k: int(cfg[k]) for k in ("BM", "BN", "BK", "WM", "WN", "WNITER", "TM", "TN") if k in cfg}
        for k in ("THREADS", "NUM_THREADS", "NTHREADS"):
            if k in cfg:
                kw["threads"] = int(cfg[k])
        return cls(**kw)
