"""Plots of benchmark records (the JSON lines ``gemmlab bench`` writes, read back by
``gemmlab.reports.records.read_records``), drawn on any machine.

- ``ladder_plot``: TFLOP/s of every step of each ladder at one shape, the baseline (cuBLAS) as a line, the
  model's prediction (where the record carries one) as a tick, the ratio to the baseline above each bar.
- ``size_plot``: the ratio to the baseline against problem size, one line per kernel (ratios, not TFLOP/s:
  they are what an interleaved run measures, and an axis of TFLOP/s would start far from zero).
- ``roofline_plot``: the roofline at the recorded SM clock with every measured point, zoomed to the points.

``plot_records(records, out_dir)`` draws whichever apply. Records missing a field are skipped (a step that
failed its correctness check has no ``tflops``).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from pathlib import Path

from . import model
from .figures import plt, save


def _shape(r: dict) -> tuple[int, int, int]:
    return int(r["M"]), int(r["N"]), int(r["K"])


def _label(r: dict) -> str:
    from .reports.records import short_label

    return short_label(r)


def _clock(records: list[dict]) -> float | None:
    clocks = [r["sm_clock_mhz"] for r in records if r.get("sm_clock_mhz")]
    return statistics.median(clocks) if clocks else None


def _profile(records: list[dict]) -> model.DeviceProfile:
    sms = [r["sm_count"] for r in records if r.get("sm_count")]
    if sms:
        import dataclasses

        return dataclasses.replace(model.H200, name=str(records[0].get("gpu", "GPU")), sm_count=int(sms[0]))
    return model.H200


def _group(r: dict) -> str:
    return str(r.get("ladder") or r.get("suite") or "records")


def timed(records: list[dict]) -> list[dict]:
    """Records that carry a measured time (correct and timed)."""
    return [r for r in records if r.get("tflops") is not None]


def ladder_shape(records: list[dict]) -> tuple[int, int, int] | None:
    """The shape a ladder plot shows: 4096^3 if present, else the most common one."""
    shapes = Counter(_shape(r) for r in records)
    if not shapes:
        return None
    return (4096, 4096, 4096) if (4096, 4096, 4096) in shapes else shapes.most_common(1)[0][0]


def ladder_plot(records: list[dict]):
    """One panel per ladder: a bar per step at one shape (the last record of each step), the baseline as a
    dashed line, the model as a tick on the bar, the ratio above it."""
    by_ladder = defaultdict(list)
    for r in timed(records):
        by_ladder[_group(r)].append(r)
    if not by_ladder:
        return None
    fig, axes = plt.subplots(len(by_ladder), 1, figsize=(9, 3.8 * len(by_ladder)), squeeze=False)
    for ax, (lad, rs) in zip(axes[:, 0], sorted(by_ladder.items())):
        shape = ladder_shape(rs)
        latest: dict[str, dict] = {}
        for r in rs:  # the last record of each step wins
            if _shape(r) == shape:
                latest[_label(r)] = r
        rs = [latest[k] for k in sorted(latest)]
        xs = range(len(rs))
        heights = [r["tflops"] for r in rs]
        ax.bar(xs, heights, color="tab:blue", label="gemmlab step")
        bases = [r["baseline_tflops"] for r in rs if r.get("baseline_tflops")]
        if bases:
            base = statistics.median(bases)
            ax.axhline(base, color="black", linestyle="--", linewidth=1, label=f"cuBLAS {base:.0f} TFLOP/s")
        preds = [(i, r["model_tflops"]) for i, r in enumerate(rs) if r.get("model_tflops")]
        if preds:
            ax.plot(*zip(*preds), "_", color="tab:orange", markersize=22, markeredgewidth=2.5,
                    label="model prediction (recorded with the run)")
        top = max(heights + [p for _, p in preds] + bases)
        for i, r in enumerate(rs):  # above the bar and the model's tick, whichever is higher
            above = max([r["tflops"]] + [p for j, p in preds if j == i])
            if r.get("ratio"):
                ax.text(i, above + 0.015 * top, f"{r['ratio']:.2f}x", ha="center", va="bottom", fontsize=7)
        ax.set_ylim(0, top * 1.18)
        ax.set_xticks(list(xs), [_label(r) for r in rs], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("TFLOP/s")
        clock = _clock(rs)
        ax.set_title(f"{lad} at {'x'.join(map(str, shape))} on {rs[0].get('gpu', '?')}"
                     + (f", SM clock {clock:.0f} MHz" if clock else "") + " (labels: ratio to cuBLAS)")
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def _size(r: dict) -> float:
    M, N, K = _shape(r)
    return (M * N * K) ** (1 / 3)


def size_plot(records: list[dict]):
    """The ratio to the baseline against the cube root of M N K, one line per kernel; 1.0 is parity."""
    recs = [r for r in timed(records) if r.get("ratio")]
    if len({_shape(r) for r in recs}) < 2:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.6))
    lines = defaultdict(dict)
    for r in recs:
        lines[_label(r)][_size(r)] = r["ratio"]
    for name, pts in sorted(lines.items()):
        xs = sorted(pts)
        ax.plot(xs, [pts[x] for x in xs], "o-", markersize=4, label=name)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="cuBLAS (same run)")
    ax.set_xscale("log", base=2)
    sizes = sorted({round(x) for pts in lines.values() for x in pts})
    ax.set_xticks(sizes, [str(s) for s in sizes], fontsize=8)
    ax.minorticks_off()
    ax.set_xlabel("(M N K)^(1/3)")
    ax.set_ylabel("x cuBLAS (> 1: faster)")
    clock = _clock(recs)
    ax.set_title("Ratio to cuBLAS against size, interleaved in one run"
                 + (f" (median SM clock {clock:.0f} MHz)" if clock else ""))
    if len(lines) <= 12:  # beyond that a legend hides the plot; the table names the kernels
        ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


CLASS_ORDER = ("decode", "mid", "prefill", "square", "unaligned")


def class_plot(records: list[dict], title: str = ""):
    """One point per shape: its ratio to torch.mm (log scale) against its shape class, spread sideways
    within the class by log(M N K); the class's geomean as a bar and its label. 1.0 is parity."""
    import math

    recs = [r for r in records if r.get("ratio")]
    if not recs:
        return None
    classes = [c for c in CLASS_ORDER if any(r["cls"] == c for r in recs)]
    classes += sorted({r["cls"] for r in recs} - set(classes))
    fig, ax = plt.subplots(figsize=(8, 4.6))
    for i, cls in enumerate(classes):
        rs = [r for r in recs if r["cls"] == cls]
        sizes = [math.log(r["M"] * r["N"] * r["K"]) for r in rs]
        lo, hi = min(sizes), max(sizes)
        xs = [i - 0.3 + 0.6 * ((s - lo) / (hi - lo) if hi > lo else 0.5) for s in sizes]
        ys = [r["ratio"] for r in rs]
        ax.scatter(xs, ys, s=12, alpha=0.7, color=["tab:red" if y < 1.0 else "tab:blue" for y in ys])
        g = math.exp(sum(math.log(y) for y in ys) / len(ys))
        ax.hlines(g, i - 0.35, i + 0.35, color="black", linewidth=2)
        ax.annotate(f"{g:.3f}x", (i + 0.37, g), fontsize=8, va="center")
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
    ax.set_yscale("log")
    ys = [r["ratio"] for r in recs]
    ticks = [t for t in (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 3, 5, 8) if min(ys) / 1.1 <= t <= max(ys) * 1.1]
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.set_xticks(range(len(classes)), [f"{c}\n({sum(r['cls'] == c for r in recs)})" for c in classes])
    ax.set_ylabel("x torch.mm (> 1: faster)")
    clock = _clock(recs)
    ax.set_title((title or "Ratio to torch.mm by shape class")
                 + (f" (median SM clock {clock:.0f} MHz)" if clock else ""), fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig


def roofline_plot(records: list[dict]):
    """Roofline at the median recorded SM clock; each measured kernel and its baseline at its problem's
    minimum-traffic arithmetic intensity; the axes span the points and the ridge, not five decades."""
    recs = timed(records)
    if not recs:
        return None
    import numpy as np

    prof = _profile(recs)
    clock = _clock(recs) or prof.sm_clock_mhz
    fig, ax = plt.subplots(figsize=(8, 5))
    colors = {"bf16": "tab:blue", "fp16": "tab:green", "fp32": "tab:orange"}
    dtypes = sorted({r.get("dtype", "bf16") for r in recs})
    xs = [model.arithmetic_intensity(*_shape(r), r.get("dtype", "bf16")) for r in recs]
    peaks = {d: prof.peak_flops(d, clock) for d in dtypes}
    ridges = [model.ridge_point(p, prof.hbm_bytes_per_s) for p in peaks.values()]
    lo, hi = min(xs + ridges) / 3, max(xs + ridges) * 3
    ai = np.logspace(np.log10(lo), np.log10(hi), 200)
    for dtype in dtypes:
        peak = peaks[dtype]
        ax.loglog(ai, [model.roofline(x, peak, prof.hbm_bytes_per_s) / 1e12 for x in ai], color=colors.get(dtype),
                  label=f"{dtype} roofline at {clock:.0f} MHz ({peak / 1e12:.0f} TFLOP/s)")
        rs = [r for r in recs if r.get("dtype", "bf16") == dtype]
        x = [model.arithmetic_intensity(*_shape(r), dtype) for r in rs]
        ax.plot(x, [r["tflops"] for r in rs], "o", color=colors.get(dtype), markersize=4, alpha=0.8,
                label=f"{dtype} gemmlab")
        base = [(xi, r["baseline_tflops"]) for xi, r in zip(x, rs) if r.get("baseline_tflops")]
        if base:
            ax.plot(*zip(*base), "x", color="black", markersize=5, label=f"{dtype} cuBLAS")
    ys = [r["tflops"] for r in recs]
    ax.set_xlim(lo, hi)
    ax.set_ylim(min(ys) / 3, max(peaks.values()) / 1e12 * 1.6)
    ax.set_xlabel("arithmetic intensity at minimum traffic (FLOP/byte)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"Measured points on the roofline ({prof.name}, HBM {prof.hbm_bytes_per_s / 1e12:.1f} TB/s)")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig


PLOTS = {"ladder": ladder_plot, "sizes": size_plot, "roofline": roofline_plot}


def plot_records(records: list[dict], out_dir: str | Path, *, prefix: str = "", formats=("png", "svg")) -> list[Path]:
    """Draw every plot that the records support into ``out_dir`` (``<prefix><plot>.png`` / ``.svg``)."""
    paths = []
    for name, fn in PLOTS.items():
        fig = fn(records)
        if fig is not None:
            paths += save(fig, out_dir, f"{prefix}{name}", formats)
    return paths
