"""Plots of benchmark records (the JSON lines ``gemmlab bench`` writes), drawn on any machine.

- ``ladder_plot``: TFLOP/s of every step of each ladder at one shape, cuBLAS as a line, the model's
  prediction as a marker where the record has one.
- ``size_plot``: TFLOP/s against problem size for each kernel and cuBLAS.
- ``roofline_plot``: the roofline at the recorded SM clock with every measured point.

``plot_records(path_or_records, out_dir)`` draws whichever apply. Records missing a field are skipped
(a step that failed its correctness check has no ``tflops``).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from pathlib import Path

from .figures import plt, save
from . import model


def _shape(r: dict) -> tuple[int, int, int]:
    return int(r["M"]), int(r["N"]), int(r["K"])


def _label(r: dict) -> str:
    return str(r["kernel"]).split(".", 1)[-1]


def _clock(records: list[dict]) -> float | None:
    clocks = [r["sm_clock_mhz"] for r in records if r.get("sm_clock_mhz")]
    return statistics.median(clocks) if clocks else None


def _profile(records: list[dict]) -> model.DeviceProfile:
    sms = [r["sm_count"] for r in records if r.get("sm_count")]
    if sms:
        import dataclasses

        return dataclasses.replace(model.H200, name=str(records[0].get("gpu", "GPU")), sm_count=int(sms[0]))
    return model.H200


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
    """One panel per ladder: bars per step (in step order as recorded), cuBLAS as a horizontal line."""
    recs = timed(records)
    by_ladder = defaultdict(list)
    for r in recs:
        by_ladder[r["ladder"]].append(r)
    if not by_ladder:
        return None
    fig, axes = plt.subplots(len(by_ladder), 1, figsize=(9, 3.6 * len(by_ladder)), squeeze=False)
    for ax, (lad, rs) in zip(axes[:, 0], sorted(by_ladder.items())):
        shape = ladder_shape(rs)
        rs = [r for r in rs if _shape(r) == shape]
        latest: dict[str, dict] = {}
        for r in rs:  # the last record of each step wins
            latest[r["kernel"]] = r
        rs = sorted(latest.values(), key=lambda r: r["kernel"])
        xs = range(len(rs))
        ax.bar(xs, [r["tflops"] for r in rs], color="tab:blue", label="gemmlab step")
        base = statistics.median(r["baseline_tflops"] for r in rs)
        ax.axhline(base, color="black", linestyle="--", label=f"cuBLAS {base:.1f} TFLOP/s")
        preds = [(i, r["model_tflops"]) for i, r in enumerate(rs) if r.get("model_tflops")]
        if preds:
            ax.plot(*zip(*preds), "D", color="tab:orange", markersize=5, label="model prediction")
        for i, r in enumerate(rs):
            ax.text(i, r["tflops"], f"{r['ratio']:.2f}x" if r.get("ratio") else "", ha="center", va="bottom",
                    fontsize=7)
        ax.set_xticks(list(xs), [_label(r) for r in rs], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("TFLOP/s")
        clock = _clock(rs)
        ax.set_title(f"{lad} ladder at {'x'.join(map(str, shape))} on {rs[0].get('gpu', '?')}"
                     + (f", SM clock {clock:.0f} MHz" if clock else "") + " (labels: ratio to cuBLAS)")
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def _size(r: dict) -> float:
    M, N, K = _shape(r)
    return (M * N * K) ** (1 / 3)


def size_plot(records: list[dict]):
    """TFLOP/s against the cube root of M N K, one line per kernel and per ladder's cuBLAS."""
    recs = timed(records)
    if len({_shape(r) for r in recs}) < 2:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.8))
    lines = defaultdict(dict)
    base = defaultdict(dict)
    for r in recs:
        lines[_label(r)][_size(r)] = r["tflops"]
        base[f"cuBLAS ({r['ladder']})"][_size(r)] = r["baseline_tflops"]
    for name, pts in sorted(lines.items()):
        xs = sorted(pts)
        ax.plot(xs, [pts[x] for x in xs], "o-", markersize=3, label=name)
    for name, pts in sorted(base.items()):
        xs = sorted(pts)
        ax.plot(xs, [pts[x] for x in xs], "k--", linewidth=1.2, label=name)
    ax.set_xlabel("(M N K)^(1/3)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title("TFLOP/s against size, with cuBLAS measured in the same runs")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def roofline_plot(records: list[dict]):
    """Roofline at the median recorded SM clock; each measured kernel and cuBLAS at its problem's
    minimum-traffic arithmetic intensity."""
    recs = timed(records)
    if not recs:
        return None
    import numpy as np

    prof = _profile(recs)
    clock = _clock(recs) or prof.sm_clock_mhz
    fig, ax = plt.subplots(figsize=(8, 5))
    ai = np.logspace(-1, 4, 300)
    colors = {"bf16": "tab:blue", "fp32": "tab:orange"}
    for dtype in sorted({r.get("dtype", "bf16") for r in recs}):
        peak = prof.peak_flops(dtype, clock)
        ax.loglog(ai, [model.roofline(x, peak, prof.hbm_bytes_per_s) / 1e12 for x in ai], color=colors.get(dtype),
                  label=f"{dtype} roofline at {clock:.0f} MHz ({peak / 1e12:.0f} TFLOP/s)")
        rs = [r for r in recs if r.get("dtype", "bf16") == dtype]
        x = [model.arithmetic_intensity(*_shape(r), dtype) for r in rs]
        ax.plot(x, [r["tflops"] for r in rs], "o", color=colors.get(dtype), markersize=4, alpha=0.8,
                label=f"{dtype} gemmlab steps")
        ax.plot(x, [r["baseline_tflops"] for r in rs], "x", color="black", markersize=5,
                label=f"{dtype} cuBLAS" if dtype == sorted({r.get('dtype', 'bf16') for r in recs})[0] else None)
    ax.set_xlabel("arithmetic intensity at minimum traffic (FLOP/byte)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"Measured points on the roofline ({prof.name}, HBM {prof.hbm_bytes_per_s / 1e12:.1f} TB/s)")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig


PLOTS = {"ladder": ladder_plot, "sizes": size_plot, "roofline": roofline_plot}


def plot_records(records, out_dir: str | Path, *, prefix: str = "", formats=("png", "svg")) -> list[Path]:
    """Draw every plot that the records support into ``out_dir`` (``<prefix><plot>.png`` / ``.svg``)."""
    if isinstance(records, (str, Path)):
        from .bench import load_records

        records = load_records(records)
    paths = []
    for name, fn in PLOTS.items():
        fig = fn(records)
        if fig is not None:
            paths += save(fig, out_dir, f"{prefix}{name}", formats)
    return paths
