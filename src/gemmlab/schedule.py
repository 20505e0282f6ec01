"""Tile orders: in which order the output tiles of C are handed to the SMs.

A GEMM of ``tiles_m x tiles_n`` output tiles runs about one tile per SM at a time, so the tiles in flight
together are a window of consecutive entries of the order. Tiles in one row of C share a panel of A
(``BM x K``), tiles in one column share a panel of B (``K x BN``): the fewer distinct panels a window
touches, the more of its loads hit in L2. Three orders:

- ``row_major``: the launch order of a plain grid (``blockIdx.x`` over N fastest). A window of 132 tiles
  covers a few whole rows, so it touches every B panel.
- ``grouped``: ``group_m`` rows of tiles at a time, walked column by column inside the group (Triton's
  "grouped ordering"). A window is a ``group_m``-tall block. ``grouped_tile`` maps one index to its tile
  in O(1), which is what a persistent kernel's tile scheduler computes per tile.
- ``hilbert``: a generalized Hilbert curve over the rectangle (any size, not only powers of two), so
  every window is a compact blob. Persistent kernels read it as a table (``order_table``, on the device
  ``device_order_table``).

How many tiles there are for the SMs is wave quantization (``wave_quantization``): the last wave of a grid
may leave SMs idle.

A tile is ``(m, n)``: row ``m`` of tiles (``M / BM`` of them), column ``n`` (``N / BN``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

Tile = tuple[int, int]


def row_major(tiles_m: int, tiles_n: int) -> list[Tile]:
    """Row by row, ``n`` fastest: the order of ``blockIdx.x`` over N, ``blockIdx.y`` over M."""
    return [(m, n) for m in range(tiles_m) for n in range(tiles_n)]


def column_major(tiles_m: int, tiles_n: int) -> list[Tile]:
    """Column by column, ``m`` fastest."""
    return [(m, n) for n in range(tiles_n) for m in range(tiles_m)]


def grouped_tile(index: int, tiles_m: int, tiles_n: int, group_m: int = 8) -> Tile:
    """The tile at position ``index`` of the grouped order (the per-tile formula a scheduler evaluates).

    Groups are ``group_m`` tile rows (the last group may be shorter); inside a group the order goes down
    a column of ``size_m`` tiles, then to the next column.
    """
    per_group = group_m * tiles_n
    group = index // per_group
    first_m = group * group_m
    size_m = min(tiles_m - first_m, group_m)
    within = index % per_group
    return first_m + within % size_m, within // size_m


def grouped(tiles_m: int, tiles_n: int, group_m: int = 8) -> list[Tile]:
    """Every tile in grouped order (see ``grouped_tile``)."""
    return [grouped_tile(i, tiles_m, tiles_n, group_m) for i in range(tiles_m * tiles_n)]


def _sgn(x: int) -> int:
    return (x > 0) - (x < 0)


def _gilbert(x: int, y: int, ax: int, ay: int, bx: int, by: int) -> Iterator[tuple[int, int]]:
    """Generalized Hilbert curve (J. Cervený's "gilbert" recursion) over the rectangle spanned by the
    major axis (ax, ay) and the minor axis (bx, by) from corner (x, y). Yields (x, y) cells."""
    w, h = abs(ax + ay), abs(bx + by)
    dax, day = _sgn(ax), _sgn(ay)
    dbx, dby = _sgn(bx), _sgn(by)
    if h == 1:
        for _ in range(w):
            yield x, y
            x, y = x + dax, y + day
        return
    if w == 1:
        for _ in range(h):
            yield x, y
            x, y = x + dbx, y + dby
        return
    ax2, ay2 = ax // 2, ay // 2
    bx2, by2 = bx // 2, by // 2
    w2, h2 = abs(ax2 + ay2), abs(bx2 + by2)
    if 2 * w > 3 * h:
        # Long and thin: split the major axis in two halves (prefer an even first half).
        if w2 % 2 and w > 2:
            ax2, ay2 = ax2 + dax, ay2 + day
        yield from _gilbert(x, y, ax2, ay2, bx, by)
        yield from _gilbert(x + ax2, y + ay2, ax - ax2, ay - ay2, bx, by)
    else:
        # Up the minor half, across the whole major axis, back down: the Hilbert "U".
        if h2 % 2 and h > 2:
            bx2, by2 = bx2 + dbx, by2 + dby
        yield from _gilbert(x, y, bx2, by2, ax2, ay2)
        yield from _gilbert(x + bx2, y + by2, ax, ay, bx - bx2, by - by2)
        yield from _gilbert(x + (ax - dax) + (bx2 - dbx), y + (ay - day) + (by2 - dby),
                            -bx2, -by2, -(ax - ax2), -(ay - ay2))


def hilbert(tiles_m: int, tiles_n: int) -> list[Tile]:
    """Every tile along a generalized Hilbert curve; consecutive tiles are (almost always) neighbours."""
    if tiles_m <= 0 or tiles_n <= 0:
        return []
    # x runs over n (columns), y over m (rows); start along the longer side.
    if tiles_n >= tiles_m:
        cells = _gilbert(0, 0, tiles_n, 0, 0, tiles_m)
    else:
        cells = _gilbert(0, 0, 0, tiles_m, tiles_n, 0)
    return [(y, x) for x, y in cells]


ORDERS: dict[str, Callable[..., list[Tile]]] = {
    "row_major": row_major,
    "column_major": column_major,
    "grouped": grouped,
    "hilbert": hilbert,
}


def tile_order(name: str, tiles_m: int, tiles_n: int, **kw) -> list[Tile]:
    """The order called ``name`` (a key of ``ORDERS``); ``group_m`` goes to ``grouped``."""
    try:
        fn = ORDERS[name]
    except KeyError:
        raise ValueError(f"unknown tile order {name!r}; known: {', '.join(ORDERS)}") from None
    return fn(tiles_m, tiles_n, **kw)


def order_table(order: list[Tile]) -> np.ndarray:
    """The order as an int32 array of ``m << 16 | n``: what a persistent kernel's scheduler reads by index."""
    return np.array([(m << 16) | n for m, n in order], dtype=np.int32)


def panels_per_window(order: list[Tile], window: int) -> list[int]:
    """For each run of ``window`` consecutive tiles (those in flight together, e.g. one per SM): how many
    distinct A panels (tile rows) plus B panels (tile columns) it touches. Fewer means more L2 reuse."""
    out = []
    for s in range(0, len(order), window):
        chunk = order[s:s + window]
        out.append(len({m for m, _ in chunk}) + len({n for _, n in chunk}))
    return out


def window_traffic_bytes(order: list[Tile], window: int, BM: int, BN: int, K: int, elem_bytes: int) -> list[int]:
    """Bytes of A and B panels each window needs from L2/HBM if every distinct panel is read once."""
    out = []
    for s in range(0, len(order), window):
        chunk = order[s:s + window]
        out.append((len({m for m, _ in chunk}) * BM + len({n for _, n in chunk}) * BN) * K * elem_bytes)
    return out


# Tile and wave quantization ------------------------------------------------------------------------

@dataclass(frozen=True)
class Waves:
    tiles_m: int
    tiles_n: int
    tiles: int
    slots: int  # tiles that run at once: SMs x blocks per SM
    waves: float  # tiles / slots
    full_waves: int
    last_wave_tiles: int  # tiles in the last wave (== slots when the last wave is full)
    last_wave_utilization: float  # last_wave_tiles / slots
    efficiency: float  # waves / ceil(waves): the fraction of the launched SM time doing work

    @property
    def wave_count(self) -> int:
        return math.ceil(self.waves)


def wave_quantization(M: int, N: int, BM: int, BN: int, sm_count: int = 132, blocks_per_sm: int = 1) -> Waves:
    """How ``ceil(M/BM) x ceil(N/BN)`` tiles fill ``sm_count x blocks_per_sm`` slots.

    Example: 4096 x 4096 with 128 x 256 tiles on 132 SMs: 512 tiles, 3.88 waves, the last wave 116/132 = 88%
    full, efficiency 3.88 / 4 = 97%.
    """
    tm, tn = math.ceil(M / BM), math.ceil(N / BN)
    tiles = tm * tn
    slots = max(1, sm_count * blocks_per_sm)
    waves = tiles / slots
    n_waves = math.ceil(waves)
    last = tiles - (n_waves - 1) * slots if tiles else 0
    return Waves(tiles_m=tm, tiles_n=tn, tiles=tiles, slots=slots, waves=waves, full_waves=tiles // slots,
                 last_wave_tiles=last, last_wave_utilization=last / slots,
                 efficiency=waves / n_waves if n_waves else 1.0)


def tile_quantization(M: int, N: int, BM: int, BN: int) -> float:
    """Useful fraction of the computed tile area: M N / (ceil(M/BM) BM ceil(N/BN) BN)."""
    return (M * N) / (math.ceil(M / BM) * BM * math.ceil(N / BN) * BN)


_DEVICE_TABLES: dict = {}


def paired_order(order: list[Tile], pair_m: int) -> list[Tile]:
    """An order of tile pairs (rows of ``pair_m`` tiles, as ``tile_order`` gives them over tiles_m / pair_m
    rows) as tiles: pair (p, n) becomes tiles (p pair_m, n), (p pair_m + 1, n), ... in turn. The engine
    kernel's B multicast reads its tiles so: CTA rank r of a cluster takes entry pair_m i + r."""
    return [(m * pair_m + r, n) for m, n in order for r in range(pair_m)]


def device_order_table(name: str, tiles_m: int, tiles_n: int, group_m: int, device, pair_m: int = 1):
    """``order_table`` of ``tile_order(name, ...)`` as a device int32 tensor (torch), built once per grid,
    order and device: what the persistent kernels read their tiles from. ``pair_m`` > 1: the order of
    ``paired_order`` (tiles_m a multiple of it)."""
    import torch

    key = (name, tiles_m, tiles_n, group_m if name == "grouped" else 0, device, pair_m)
    t = _DEVICE_TABLES.get(key)
    if t is None and torch.cuda.is_current_stream_capturing():
        # A host-to-device copy cannot be captured in a CUDA graph: build row-major order (of pairs) on
        # the device instead (not cached, so an uncaptured call later still gets the order asked for).
        idx = torch.arange(tiles_m * tiles_n, device=device, dtype=torch.int32)
        pair, r = idx // pair_m, idx % pair_m
        return ((pair // tiles_n) * pair_m + r) * 65536 + pair % tiles_n
    if t is None:
        kw = {"group_m": group_m} if name == "grouped" else {}
        order = paired_order(tile_order(name, tiles_m // pair_m, tiles_n, **kw), pair_m)
        t = torch.from_numpy(order_table(order)).to(device)
        _DEVICE_TABLES[key] = t
    return t
