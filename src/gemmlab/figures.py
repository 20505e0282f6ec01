"""The subject's pictures as code. Each figure is drawn from the functions the kernels and models use
(``gemmlab.layouts``, ``gemmlab.schedule``, ``gemmlab.model``, the registry), so it cannot drift from them.

    gemmlab figures OUT            # every figure as OUT/<name>.png, and OUT/figures.json
    make_figures(out, ["swizzle"]) # from Python

Figures: ``swizzle`` (the 128B swizzle as a bank map), ``outer_products`` (a matmul as a sum of outer
products), ``wave_quantization`` (across sizes), ``roofline`` (with the ladder steps' tile intensities),
``warptiling`` (block / warp / thread tiling of the fp32 warptiling step), ``tile_order`` (row-major vs
grouped vs Hilbert with the panels each wave touches), ``pipeline`` (the warp-specialized pipeline as a
timeline).

``fingerprint(fig)`` hashes what a figure draws (texts and data, not pixels); ``make_figures`` keeps each
figure's in ``OUT/figures.json``, so a test can tell whether the committed images are what the code draws.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from . import layouts, model, schedule  # noqa: E402

plt.rcParams.update({"font.size": 9, "axes.titlesize": 10, "figure.dpi": 110, "svg.fonttype": "none"})


def save(fig, out_dir: str | Path, name: str, formats=("png", "svg")) -> list[Path]:
    """Write ``fig`` as ``out_dir/name.<fmt>`` for each format and close it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        p = out / f"{name}.{fmt}"
        fig.savefig(p, bbox_inches="tight", metadata={"Date": None} if fmt == "svg" else None)
        paths.append(p)
    plt.close(fig)
    return paths


# What a figure draws, as a hash ---------------------------------------------------------------------------

MANIFEST = "figures.json"


def _nums(values) -> str:
    return ",".join(f"{v:.5g}" for v in np.asarray(values, dtype=float).ravel())


def _describe(artist) -> str | None:
    from matplotlib.collections import Collection
    from matplotlib.colors import to_hex
    from matplotlib.image import AxesImage
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle
    from matplotlib.text import Text

    if isinstance(artist, Text):
        return f"text {artist.get_text()!r} at {_nums(artist.get_position())}" if artist.get_text() else None
    if isinstance(artist, Line2D):
        return (f"line {_nums(artist.get_xdata())} | {_nums(artist.get_ydata())} {artist.get_marker()} "
                f"{artist.get_linestyle()}")
    if isinstance(artist, Rectangle):
        return f"rect {_nums([*artist.get_xy(), artist.get_width(), artist.get_height()])} {to_hex(artist.get_facecolor())}"
    if isinstance(artist, Collection):
        return f"points {_nums(artist.get_offsets())}"
    if isinstance(artist, AxesImage):
        return f"image {_nums(artist.get_array())}"
    return None


def fingerprint(fig) -> str:
    """A short hash of what ``fig`` draws: every text, the data of its lines, rectangles, point collections
    and images (numbers to 5 significant digits), and tick labels set by the code. Pixels, fonts and the
    ticks matplotlib chooses itself are left out, so the hash says whether the code draws the same thing,
    whatever renders it."""
    from matplotlib.axis import Axis
    from matplotlib.spines import Spine

    skip = {id(fig.patch)}
    parts = []
    for ax in fig.axes:
        skip.add(id(ax.patch))
        for axis in (ax.xaxis, ax.yaxis):
            skip.update(id(o) for o in axis.findobj())
            if type(axis.get_major_formatter()).__name__ in ("FixedFormatter", "FuncFormatter"):
                parts.append("ticks " + " ".join(t.get_text() for t in axis.get_ticklabels()))
        parts += [f"scale {ax.get_xscale()} {ax.get_yscale()}", f"label {ax.get_xlabel()!r} {ax.get_ylabel()!r}"]
    for artist in fig.findobj():
        if id(artist) in skip or isinstance(artist, (Axis, Spine)):
            continue
        d = _describe(artist)
        if d is not None:
            parts.append(d)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def read_manifest(out_dir: str | Path) -> dict[str, str]:
    path = Path(out_dir) / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else {}


def write_manifest(out_dir: str | Path, prints: dict[str, str]) -> Path:
    """Merge ``{figure name: fingerprint}`` into ``out_dir/figures.json``."""
    path = Path(out_dir) / MANIFEST
    merged = {**read_manifest(out_dir), **prints}
    path.write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")
    return path


# The 128B swizzle ---------------------------------------------------------------------------------------

def fig_swizzle(rows: int = 8):
    """Physical layout of an 8 x 128-byte atom (bf16: 8 rows x 64 elements), without and with the 128B
    swizzle. Each cell is a 16-byte chunk = 4 banks; its colour and label are the logical chunk stored
    there. The outlined cells are logical chunk 0 of every row: what 8 threads read with one 128-bit load
    each (one phase)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    cmap = plt.get_cmap("tab10")
    for ax, mode in zip(axes, (0, 128)):
        cmap_vals = layouts.chunk_map(rows, mode)
        for r in range(rows):
            for p in range(8):
                c = int(cmap_vals[r, p])
                ax.add_patch(Rectangle((p * 4, r), 4, 1, facecolor=cmap(c), alpha=0.55, edgecolor="white"))
                ax.text(p * 4 + 2, r + 0.5, f"c{c}", ha="center", va="center", fontsize=8)
                if c == 0:
                    ax.add_patch(Rectangle((p * 4, r), 4, 1, fill=False, edgecolor="black", linewidth=2.2))
        ways = layouts.conflict_ways(layouts.column_read_addresses(range(rows), 0, mode), layouts.CHUNK_BYTES)
        name = "no swizzle" if mode == 0 else "128B swizzle (chunk ^ row % 8)"
        verdict = "conflict-free" if ways == 1 else f"{ways}-way bank conflict"
        ax.set_title(f"{name}: column c0 of 8 rows -> {verdict}")
        ax.set_xlim(0, 32)
        ax.set_ylim(rows, 0)
        ax.set_xticks(range(0, 33, 4))
        ax.set_xlabel("bank (4 bytes each; a 16-byte chunk spans 4 banks)")
        ax.set_yticks([r + 0.5 for r in range(rows)], [str(r) for r in range(rows)])
        ax.set_ylabel("row (128 bytes = 64 bf16)")
    fig.suptitle("The 128-byte swizzle of TMA and wgmma: logical 16-byte chunk c of row r is stored at chunk "
                 "c ^ (r % 8)")
    fig.tight_layout()
    return fig


# Outer products -----------------------------------------------------------------------------------------

def fig_outer_products(M: int = 4, N: int = 5, K: int = 3, seed: int = 0):
    """C = A @ B computed as the sum over k of the outer products A[:, k] x B[k, :]: each element of C is
    a dot product, and a thread that owns a TM x TN tile of C does TM x TN FMAs per k from TM + TN loads."""
    rng = np.random.default_rng(seed)
    vals = np.array([-3, -2, -1, 1, 2, 3])
    A = rng.choice(vals, size=(M, K))
    B = rng.choice(vals, size=(K, N))
    hi, hj = 1, 2  # the element whose dot product is outlined
    parts = [np.outer(A[:, k], B[k, :]) for k in range(K)]
    C = A @ B
    assert (sum(parts) == C).all()
    fig, axes = plt.subplots(1, K + 1, figsize=(2.4 * (K + 1), 2.6))
    lim = max(abs(C).max(), max(abs(p).max() for p in parts))
    for ax, mat, title in zip(axes, parts + [C], [f"A[:, {k}] x B[{k}, :]" for k in range(K)] + ["C = A @ B"]):
        ax.imshow(mat, cmap="RdBu_r", vmin=-lim, vmax=lim)
        for (i, j), v in np.ndenumerate(mat):
            ax.text(j, i, str(v), ha="center", va="center", fontsize=8)
        ax.add_patch(Rectangle((hj - 0.5, hi - 0.5), 1, 1, fill=False, linewidth=2))
        ax.set_title(title)
        ax.set_xticks([])
        ax.set_yticks([])
    terms = " + ".join(f"({A[hi, k]})({B[k, hj]})" for k in range(K))
    axes[-1].set_xlabel(f"C[{hi},{hj}] = {terms} = {C[hi, hj]}: a dot product over k", fontsize=8)
    for k, ax in enumerate(axes[:-1]):
        ax.text(1.08, 0.5, "=" if k == K - 1 else "+", transform=ax.transAxes, ha="center", va="center",
                fontsize=16)
    fig.suptitle(f"A ({M}x{K}) @ B ({K}x{N}) as a sum of {K} outer products (rank-1 updates)")
    fig.tight_layout()
    return fig


# Wave quantization --------------------------------------------------------------------------------------

def fig_wave_quantization(profile: model.DeviceProfile = model.H200, tiles=((128, 256), (128, 128)),
                          sizes=None):
    """Efficiency of the last wave (waves / ceil(waves)) for square problems, one tile per SM."""
    sizes = list(sizes or range(256, 8192 + 1, 64))
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(9, 5.2), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    for bm, bn in tiles:
        w = [model.wave_quantization(s, s, bm, bn, profile.sm_count) for s in sizes]
        ax.plot(sizes, [x.efficiency for x in w], label=f"{bm}x{bn} tiles")
        ax2.plot(sizes, [x.waves for x in w], label=f"{bm}x{bn}")
    w4 = model.wave_quantization(4096, 4096, 128, 256, profile.sm_count)
    ax.annotate(f"4096^2, 128x256: {w4.tiles} tiles = {w4.waves:.2f} waves,\nlast wave "
                f"{w4.last_wave_utilization:.0%} full -> {w4.efficiency:.0%}", xy=(4096, w4.efficiency),
                xytext=(4400, 0.55), arrowprops={"arrowstyle": "->"})
    ax.set_ylabel("waves / ceil(waves)")
    ax.set_ylim(0, 1.05)
    ax.legend(loc="lower right")
    ax.set_title(f"Wave quantization on {profile.sm_count} SMs (M = N = size, one block per SM)")
    ax2.set_ylabel("waves")
    ax2.set_xlabel("M = N")
    ax2.grid(alpha=0.3)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


# Roofline -----------------------------------------------------------------------------------------------

def _step_points():
    """(label, dtype, tile intensity) for every registered step at its default config."""
    from . import registry

    pts = []
    for spec in registry.all_kernels():
        cfg = spec.default_config()
        bm, bn, bk = spec.tile(cfg)
        dtype = registry.ladders()[spec.ladder].dtype
        pts.append((spec.short.split("_")[0], dtype, model.tile_intensity(bm, bn, bk, dtype)))
    return pts


def _step_ranges(labels: list[str]) -> str:
    """``["h02", "h03", "h11"]`` -> ``"h02-h03, h11"``: runs of consecutive steps joined by a dash."""
    runs: list[list[str]] = []
    for lab in sorted(labels):
        prev = runs[-1][-1] if runs else None
        if prev and prev[0] == lab[0] and int(lab[1:]) == int(prev[1:]) + 1:
            runs[-1].append(lab)
        else:
            runs.append([lab])
    return ", ".join(r[0] if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def fig_roofline(profile: model.DeviceProfile = model.H200, clocks=(1980.0, 1320.0), points=None):
    """The roofline for bf16 tensor cores and fp32 FFMA at two SM clocks, with each ladder step's tile
    intensity (FLOP per byte its block tile loads: the bound if no load hit in L2) and a few problems'
    minimum-traffic intensity."""
    fig, ax = plt.subplots(figsize=(8.5, 5.2))
    ai = np.logspace(-1, 4, 400)
    bw = profile.hbm_bytes_per_s
    styles = {"bf16": "tab:blue", "fp32": "tab:orange"}
    for dtype in ("bf16", "fp32"):
        for clock, ls in zip(clocks, ("-", "--")):
            peak = profile.peak_flops(dtype, clock)
            ax.loglog(ai, [model.roofline(x, peak, bw) / 1e12 for x in ai], ls, color=styles[dtype],
                      label=f"{dtype} at {clock:.0f} MHz: {peak / 1e12:.0f} TFLOP/s, ridge "
                            f"{model.ridge_point(peak, bw):.0f} FLOP/B")
    pts = points if points is not None else _step_points()
    groups: dict[tuple[str, float], list[str]] = {}
    for label, dtype, x in pts:
        groups.setdefault((dtype, round(x, 6)), []).append(label)
    for (dtype, x), labels in groups.items():
        y = model.roofline(x, profile.peak_flops(dtype, clocks[-1]), bw) / 1e12
        ax.plot(x, y, "o", color=styles.get(dtype, "gray"), markersize=4)
        # bf16 dots sit on the rising line: label them above-left, clear of the problems' grey labels on
        # the right; fp32 dots sit on the flat roof: below-right.
        up = dtype == "bf16"
        ax.annotate(_step_ranges(labels), (x, y), textcoords="offset points", xytext=(-5, 5) if up else (4, -11),
                    ha="right" if up else "left", fontsize=7)
    for M, N, K, what in ((1, 8192, 8192, "decode M=1"), (16, 8192, 8192, "M=16"), (128, 8192, 8192, "M=128"),
                          (4096, 4096, 4096, "4096^3")):
        x = model.arithmetic_intensity(M, N, K, "bf16")
        ax.axvline(x, color="gray", alpha=0.25)
        ax.text(x, 1.5e3, f" {what}", rotation=90, fontsize=7, color="gray", va="top")
    ax.set_ylim(0.3, 2e3)
    ax.set_xlabel("arithmetic intensity (FLOP / byte of HBM traffic)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.set_title(f"Roofline, {profile.name}: {profile.sm_count} SMs, HBM {bw / 1e12:.1f} TB/s. Dots: each ladder "
                 "step's tile intensity\n(its bound if no tile load hit in L2); grey lines: bf16 problems at minimum "
                 "traffic (N = K = 8192)")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig


# Warp tiling --------------------------------------------------------------------------------------------

def warptiling_config():
    """The warp tiling of the registered fp32 step that has warp tiles (params WM and WN) at its default
    config, or the public ladder's defaults; and where it came from.

    A step may state its lane layout in ``extra["warp_layout"]`` (``{"TM": .., "TN": .., "WNITER": ..}``);
    otherwise the layout of ``k09_warptiling`` is assumed: warp sub-tiles of ``WARP_SUB_M x WARP_SUB_N``
    (read from the sgemm ladder module) with the 32 lanes as 4 rows x 8 columns."""
    from . import registry

    for spec in registry.all_kernels("sgemm"):
        if not {"WM", "WN"} <= set(spec.param_names()):
            continue
        cfg = dict(spec.default_config())
        cfg.setdefault("THREADS", spec.threads(cfg))
        layout = spec.extra.get("warp_layout")
        if layout is None and not {"TM", "TN", "WNITER"} <= set(cfg):
            from .fp32 import WARP_SUB_M as sub_m, WARP_SUB_N as sub_n

            layout = {"TM": sub_m // 4, "TN": sub_n // 8, "WNITER": cfg["WN"] // sub_n}
        cfg.update(layout or {})
        wt = layouts.WarpTiling.from_config(cfg)
        if wt.check() is None:
            return wt, spec.name
    return layouts.WarpTiling(), "default warptiling parameters"


def fig_warptiling(wt: layouts.WarpTiling | None = None, source: str = ""):
    """The block tile coloured by warp; one warp's sub-tiles outlined; one thread's elements marked."""
    if wt is None:
        wt, source = warptiling_config()
    why = wt.check()
    if why:
        raise ValueError(f"warptiling {wt}: {why}")
    warp, lane = wt.owner_map()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 5.6))
    ax.imshow(warp, cmap="Pastel1", interpolation="nearest")
    for w in range(wt.warps):
        wr, wc = divmod(w, wt.BN // wt.WN)
        ax.add_patch(Rectangle((wc * wt.WN - 0.5, wr * wt.WM - 0.5), wt.WN, wt.WM, fill=False, linewidth=2))
        # Warp 0's label sits on its outlined sub-tiles: a white box keeps it readable.
        ax.text(wc * wt.WN + wt.WN / 2, wr * wt.WM + wt.WM / 2, f"warp {w}", ha="center", va="center", fontsize=9,
                bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "alpha": 0.9, "linewidth": 0})
    for i in range(wt.WMITER):
        for j in range(wt.WNITER):
            ax.add_patch(Rectangle((j * wt.WSUBN - 0.5, i * wt.WSUBM - 0.5), wt.WSUBN, wt.WSUBM, fill=False,
                                   linestyle="--", linewidth=1))
    mine = wt.elements(0, 0)
    ys, xs = zip(*mine)
    ax.scatter(xs, ys, s=2, marker="s", color="black", label="thread 0 of warp 0")
    ax.legend(loc="lower right", fontsize=7)
    ax.set_title(f"block tile {wt.BM}x{wt.BN}: {wt.warps} warps of {wt.WM}x{wt.WN}, each "
                 f"{wt.WMITER}x{wt.WNITER} sub-tiles of {wt.WSUBM}x{wt.WSUBN}")
    # Zoom: the first sub-tile of warp 0, cells labelled by lane.
    sub = lane[:wt.WSUBM, :wt.WSUBN]
    ax2.imshow(sub % 8, cmap="Set3", interpolation="nearest")
    for t in range(32):
        r, c = np.argwhere(sub == t)[0]
        ax2.add_patch(Rectangle((c - 0.5, r - 0.5), wt.TN, wt.TM, fill=False, linewidth=0.8))
        ax2.text(c + wt.TN / 2 - 0.5, r + wt.TM / 2 - 0.5, str(t), ha="center", va="center", fontsize=7)
    ax2.set_title(f"warp 0, sub-tile (0,0): lane t owns a {wt.TM}x{wt.TN} register tile")
    for a in (ax, ax2):
        a.set_xlabel("column of the block tile")
        a.set_ylabel("row")
    fig.suptitle(f"Warp tiling (BK={wt.BK}, {wt.threads} threads) from {source}", y=1.0)
    fig.tight_layout()
    return fig


# Tile order ---------------------------------------------------------------------------------------------

def fig_tile_order(M: int = 8192, N: int = 8192, BM: int = 128, BN: int = 256, group_m: int = 8,
                   profile: model.DeviceProfile = model.H200, K: int = 8192, elem_bytes: int = 2):
    """Row-major vs grouped vs Hilbert order on the tile grid; the first wave (one tile per SM) is
    highlighted and each title gives the A+B panels per wave (fewer = more L2 reuse)."""
    tm, tn = -(-M // BM), -(-N // BN)
    orders = {"row-major": schedule.row_major(tm, tn), f"grouped (group_m={group_m})":
              schedule.grouped(tm, tn, group_m), "Hilbert": schedule.hilbert(tm, tn)}
    window = profile.sm_count
    fig, axes = plt.subplots(1, 3, figsize=(13, 5.2))
    for ax, (name, order) in zip(axes, orders.items()):
        rank = np.zeros((tm, tn))
        for i, (m, n) in enumerate(order):
            rank[m, n] = i
        ax.imshow(rank, cmap="viridis", interpolation="nearest", aspect="auto")
        ms, ns = zip(*order)
        ax.plot(ns, ms, color="white", linewidth=0.5, alpha=0.7)
        first = order[:window]
        fm, fn = zip(*first)
        ax.scatter(fn, fm, s=6, color="red", label=f"first wave ({window} tiles)")
        panels = np.mean(schedule.panels_per_window(order, window))
        mb = np.mean(schedule.window_traffic_bytes(order, window, BM, BN, K, elem_bytes)) / 2**20
        ax.set_title(f"{name}\n{panels:.1f} panels per wave ({mb:.0f} MB of A+B at K={K})")
        ax.set_xlabel(f"tile column n (BN={BN})")
        ax.set_ylabel(f"tile row m (BM={BM})")
        ax.legend(loc="lower right", fontsize=7)
    fig.suptitle(f"Tile order for {M}x{N} with {BM}x{BN} tiles ({tm}x{tn} tiles), colour = position in the order")
    fig.tight_layout()
    return fig


# The warp-specialized pipeline --------------------------------------------------------------------------

def fig_pipeline(k_tiles: int = 10, BM: int = 128, BN: int = 256, BK: int = 64, l2_bytes_per_clk: float = 64.0,
                 flop_per_clk: int = 4096):
    """A producer warp and two consumer warpgroups over a ring of stages, from ``model.pipeline_timeline``.

    Per k-tile, the consumers need ``2 BM BN BK / 4096`` clocks of tensor-core time and the producer's
    loads ``(BM + BN) BK 2`` bytes at an assumed ``l2_bytes_per_clk`` per SM."""
    t_compute = 2 * BM * BN * BK / flop_per_clk
    t_load = (BM + BN) * BK * 2 / l2_bytes_per_clk
    cases = [(1, "1 stage: load, then compute (no overlap)"), (4, "4-stage ring, warp-specialized")]
    fig, axes = plt.subplots(len(cases), 1, figsize=(10, 4.6), sharex=True)
    cmap = plt.get_cmap("tab10")
    for ax, (stages, title) in zip(axes, cases):
        segs = model.pipeline_timeline(k_tiles, stages, t_load, t_compute, consumers=2)
        lanes = ["producer", "consumer 0", "consumer 1"]
        for s in segs:
            y = lanes.index(s.lane)
            ax.barh(y, s.end - s.start, left=s.start, color=cmap(s.slot), edgecolor="black", linewidth=0.4)
            ax.text((s.start + s.end) / 2, y, f"k{s.k}", ha="center", va="center", fontsize=6)
        util = model.pipeline_utilization(segs)
        span = max(s.end for s in segs)
        ax.set_title(f"{title}: {span:.0f} clocks for {k_tiles} k-tiles, tensor cores busy {util:.0%}")
        ax.set_yticks(range(len(lanes)), ["producer (TMA)", "consumer WG 0", "consumer WG 1"])
        ax.invert_yaxis()
    axes[-1].set_xlabel(f"SM clocks (k-tile {BM}x{BN}x{BK}: compute {t_compute:.0f} clk, load {t_load:.0f} clk "
                        f"at {l2_bytes_per_clk:.0f} B/clk; colour = ring slot)")
    fig.tight_layout()
    return fig


FIGURES: dict[str, Callable] = {
    "swizzle": fig_swizzle,
    "outer_products": fig_outer_products,
    "wave_quantization": fig_wave_quantization,
    "roofline": fig_roofline,
    "warptiling": fig_warptiling,
    "tile_order": fig_tile_order,
    "pipeline": fig_pipeline,
}


def make_figures(out_dir: str | Path, names=None, formats=("png",)) -> list[Path]:
    """Draw the named figures (default: all) into ``out_dir``, and their fingerprints into
    ``out_dir/figures.json``; returns the files written."""
    names = list(names or FIGURES)
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        raise ValueError(f"unknown figure(s) {unknown}; known: {', '.join(FIGURES)}")
    paths, prints = [], {}
    for n in names:
        fig = FIGURES[n]()
        prints[n] = fingerprint(fig)
        paths += save(fig, out_dir, n, formats)
    return paths + [write_manifest(out_dir, prints)]
