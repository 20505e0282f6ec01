"""Figures and record plots are produced (no GPU needed), from the same functions the kernels use."""

import json

import pytest

from gemmlab import figures, plots


def test_every_figure_as_png_and_svg(tmp_path):
    paths = figures.make_figures(tmp_path)
    assert len(paths) == 2 * len(figures.FIGURES)
    for p in paths:
        assert p.stat().st_size > 5000
        head = p.read_bytes()[:200]
        assert head.startswith(b"\x89PNG") if p.suffix == ".png" else b"<svg" in p.read_bytes()[:2000]


def test_unknown_figure(tmp_path):
    with pytest.raises(ValueError, match="unknown figure"):
        figures.make_figures(tmp_path, ["nope"])


def test_warptiling_config_is_valid():
    wt, source = figures.warptiling_config()
    assert wt.check() is None and source
    from gemmlab.ladders import sgemm

    if source.startswith("sgemm.") and hasattr(sgemm, "WARP_SUB_M"):
        # the step's documented lane layout: sub-tiles of WARP_SUB_M x WARP_SUB_N, 32 lanes as 4 x 8
        assert (wt.WSUBM, wt.WSUBN) == (sgemm.WARP_SUB_M, sgemm.WARP_SUB_N)
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
    paths = plots.plot_records(path, tmp_path / "plots", formats=("png",))
    assert sorted(p.name for p in paths) == ["ladder.png", "roofline.png", "sizes.png"]


def test_plot_helpers():
    recs = _records()
    assert len(plots.timed(recs)) == len(recs) - 1
    assert plots.ladder_shape(recs) == (4096, 4096, 4096)
    assert plots.ladder_shape([r for r in recs if r["M"] == 2048]) == (2048, 2048, 2048)
    assert plots.size_plot([r for r in recs if r["M"] == 4096]) is None  # one size: nothing to plot
    assert plots.ladder_plot([]) is None
