"""Figures and record plots are produced (no GPU needed), from the same functions the kernels use, and the
committed ones are what the code draws today."""

import importlib.util
import json
from pathlib import Path

import pytest

from gemmlab import figures, plots
from gemmlab.reports.records import read_records

ROOT = Path(__file__).resolve().parent.parent


def test_every_figure_as_png_and_svg(tmp_path):
    paths = figures.make_figures(tmp_path, formats=("png", "svg"))
    assert len(paths) == 2 * len(figures.FIGURES) + 1  # and the manifest
    for p in paths[:-1]:
        assert p.stat().st_size > 5000
        head = p.read_bytes()[:200]
        assert head.startswith(b"\x89PNG") if p.suffix == ".png" else b"<svg" in p.read_bytes()[:2000]
    assert set(json.loads(paths[-1].read_text())) == set(figures.FIGURES)


def test_committed_figures_are_current():
    """docs/figures holds what the code draws today (run `gemmlab figures docs/figures` after a change)."""
    recorded = figures.read_manifest(ROOT / "docs" / "figures")
    for name, draw in figures.FIGURES.items():
        fig = draw()
        assert figures.fingerprint(fig) == recorded.get(name), f"docs/figures/{name}.png is stale"
        figures.plt.close(fig)
        assert (ROOT / "docs" / "figures" / f"{name}.png").is_file()


def test_readme_tables_and_record_plots_are_current():
    """The README's and docs/results.md's tables and benchmarks/plots are what the committed records give
    (run `python benchmarks/readme_tables.py` after new records)."""
    spec = importlib.util.spec_from_file_location("readme_tables", ROOT / "benchmarks" / "readme_tables.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--check"]) == 0


def test_fingerprint_follows_what_is_drawn():
    def draw(label, ys):
        fig, ax = figures.plt.subplots()
        ax.plot([1, 2, 3], ys)
        ax.set_title(label)
        return fig

    a, b, c, d = draw("t", [1, 2, 3]), draw("t", [1, 2, 3]), draw("u", [1, 2, 3]), draw("t", [1, 2, 4])
    prints = [figures.fingerprint(f) for f in (a, b, c, d)]
    assert prints[0] == prints[1] and len(set(prints)) == 3
    for f in (a, b, c, d):
        figures.plt.close(f)


def test_step_ranges():
    assert figures._step_ranges(["h11", "h02", "h03"]) == "h02-h03, h11"
    assert figures._step_ranges(["k01"]) == "k01"


def test_unknown_figure(tmp_path):
    with pytest.raises(ValueError, match="unknown figure"):
        figures.make_figures(tmp_path, ["nope"])


def test_warptiling_config_is_valid():
    wt, source = figures.warptiling_config()
    assert wt.check() is None and source
    from gemmlab import fp32

    if source.startswith("sgemm."):
        # the step's documented lane layout: sub-tiles of WARP_SUB_M x WARP_SUB_N, 32 lanes as 4 x 8
        assert (wt.WSUBM, wt.WSUBN) == (fp32.WARP_SUB_M, fp32.WARP_SUB_N)
        assert wt.WSUBN // wt.TN == 8 and wt.WSUBM // wt.TM == 4


def _records():
    out = []
    common = dict(schema=1, gpu="NVIDIA H200", sm_count=132, sm_clock_mhz=1320.0, suite="ladder", layout="TN",
                  rel_error=1e-4, correct=True)
    for i, (name, tf) in enumerate([("h01_tma_wgmma", 300.0), ("h02_tile_128", 420.0), ("h04_two_consumers", 610.0)]):
        for n in (2048, 4096, 8192):
            out.append(dict(common, kernel=f"hopper.{name}", ladder="hopper", dtype="bf16", M=n, N=n, K=n,
                            tflops=tf * (0.9 if n == 2048 else 1.0), baseline_tflops=670.0,
                            ratio=tf / 670.0, time_ms=2 * n**3 / tf / 1e9, model_tflops=tf * 1.05))
    out.append(dict(common, kernel="sgemm.k01_naive", ladder="sgemm", dtype="fp32", M=4096, N=4096, K=4096,
                    tflops=0.6, baseline_tflops=51.0, ratio=0.012, time_ms=229.0))
    out.append(dict(common, kernel="sgemm.k02_coalesced", ladder="sgemm", dtype="fp32", M=4096, N=4096, K=4096,
                    baseline_tflops=51.0, rel_error=float("inf"), correct=False))  # failed: no time
    return out


def test_plots_from_records_file(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in _records()) + "\n")
    records, notes = read_records([path])
    assert len(records) == len(_records()) and not notes
    paths = plots.plot_records(records, tmp_path / "plots", formats=("png",))
    assert sorted(p.name for p in paths) == ["ladder.png", "roofline.png", "sizes.png"]


def test_ladder_plot_labels_clear_the_model_tick():
    """The ratio label sits above both the bar and the model's tick (it used to hide under the marker)."""
    recs = [r for r in _records() if r["M"] == 4096 and r["ladder"] == "hopper"]
    fig = plots.ladder_plot(recs)
    ax = fig.axes[0]
    labels = {t.get_text(): t.get_position()[1] for t in ax.texts}
    for r in recs:
        assert labels[f"{r['ratio']:.2f}x"] > max(r["tflops"], r["model_tflops"])
    assert ax.get_ylim()[1] > max(labels.values())
    figures.plt.close(fig)


def test_size_plot_shows_ratios():
    fig = plots.size_plot(_records())
    ys = [y for line in fig.axes[0].get_lines() for y in line.get_ydata()]
    assert max(ys) < 2  # ratios to cuBLAS, not TFLOP/s
    assert fig.axes[0].get_xscale() == "log"
    figures.plt.close(fig)


def test_plot_helpers():
    recs = _records()
    assert len(plots.timed(recs)) == len(recs) - 1
    assert plots.ladder_shape(recs) == (4096, 4096, 4096)
    assert plots.ladder_shape([r for r in recs if r["M"] == 2048]) == (2048, 2048, 2048)
    assert plots.size_plot([r for r in recs if r["M"] == 4096]) is None  # one size: nothing to plot
    assert plots.ladder_plot([]) is None



def test_broad_table_shows_the_newest_full_run_by_class():
    spec = importlib.util.spec_from_file_location("readme_tables", ROOT / "benchmarks" / "readme_tables.py")
    rt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rt)

    def rec(sha, i, ratio, cls, candidate="engine"):
        return {"git_sha": sha, "M": i + 1, "N": 64, "K": 64, "cls": cls, "candidate": candidate, "ratio": ratio,
                "correct": True, "gpu": "G", "sm_clock_mhz": 1980.0}

    old = [rec("a" * 12, i, 0.5, "mid") for i in range(4)]
    new = [rec("b" * 12, i, 2.0 if i < 2 else 0.5, "decode" if i < 2 else "mid") for i in range(4)]
    partial = [rec("c" * 12, i, 9.0, "mid") for i in range(2)]  # a cut-short run is not shown
    other = [rec("d" * 12, i, 9.0, "mid", candidate="model") for i in range(4)]  # not what matmul runs
    records = old + new + partial + other
    assert {r["git_sha"] for r in rt.broad_run(records, min_shapes=4)} == {"b" * 12}
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in rt.broad_table(records, min_shapes=4).splitlines() if line.startswith("| ")}
    assert rows["decode"] == ["2", "2.000x", "100%", "2.00x", "2.00x"]
    assert rows["mid"] == ["2", "0.500x", "0%", "0.50x", "0.50x"]
    assert rows["all"] == ["4", "1.000x", "50%", "0.50x", "2.00x"]
    assert "no full run" in rt.broad_table(records)  # none reaches the default 150 shapes
    fig = plots.class_plot(rt.broad_run(records, min_shapes=4))
    assert fig is not None and [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["decode\n(2)", "mid\n(2)"]
    plots.plt.close(fig)
