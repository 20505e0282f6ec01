"""benchmarks/engine_broad_summary.py on records written here (CPU): the pick against the best plan measured,
and the run's own noise read from the same plan timed twice ("engine" where the router ran the engine
kernel, and "model")."""

import json
import runpy
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "engine_broad_summary.py"


def _rec(shape, cand, ms, **kw):
    return {"M": shape[0], "N": shape[1], "K": shape[2], "candidate": cand, "time_ms": ms, "ratio": 1.0 / ms,
            "cls": "mid", "git_sha": "abc123", **kw}


def test_the_same_plan_timed_twice_gives_the_runs_noise(tmp_path, monkeypatch, capsys):
    recs = []
    for i, (engine_ms, model_ms, best_ms) in enumerate([(1.00, 1.01, 0.95), (1.00, 1.20, 1.00), (2.0, 2.0, 2.0)]):
        shape = (64 * (i + 1), 1024, 4096)
        recs += [_rec(shape, "engine", engine_ms, kernel="engine"), _rec(shape, "model", model_ms),
                 _rec(shape, "best split_k", best_ms)]
    shape = (1, 4096, 4096)  # the decode kernel ran: its "engine" is not the model's plan
    recs += [_rec(shape, "engine", 0.5, kernel="decode"), _rec(shape, "model", 1.0)]
    path = tmp_path / "broad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--sha", "abc", "--file", str(path)])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    out = capsys.readouterr().out
    # model 1.20 ms against the best plan's 1.00: the worst pick is 1.2x behind.
    assert "worst 1.200" in out, out
    # Three shapes ran the engine kernel; the largest spread is 1.20 / 1.00 at the second one.
    assert "the same plan timed twice (engine / model, 3 shapes)" in out, out
    assert "max 0.182 at (128, 1024, 4096)" in out, out
    # The routed call against the best engine-kernel plan beside it: 1.00 / 0.95, 1.00 / 1.00, 2.0 / 2.0 and, where
    # the decode kernel ran, 0.5 / 1.0: the decode-routed shape's engine pick (1.0 ms) is not what users run.
    assert "routed call / best measured new-kernel plan (4 shapes): geomean 0.852, worst 1.053" in out, out


def test_runs_reads_each_shape_over_several_runs(tmp_path, monkeypatch, capsys):
    """--runs: each run's bars over the shapes every run timed, and the per-shape median's; a shape one run
    puts under 0.95 but whose median is 1.0 or more is not listed."""
    recs = []
    ratios = {(64, 1024, 4096): (0.90, 0.92, 0.94), (128, 1024, 4096): (0.90, 1.05, 1.10),
              (256, 1024, 4096): (1.20, 1.20, 1.20)}
    for shape, rs in ratios.items():
        for sha, x in zip(("aaa111", "bbb222", "ccc333"), rs):
            recs.append({**_rec(shape, "engine", 1 / x, kernel="engine"), "git_sha": sha})
    recs.append({**_rec((512, 1024, 4096), "engine", 1.0, kernel="engine"), "git_sha": "aaa111"})  # one run only
    path = tmp_path / "broad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--runs", "aaa", "bbb", "ccc", "--file", str(path)])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    out = capsys.readouterr().out
    assert "aaa          0.991  >=1.0: 33.3%  under 0.95: 2" in out, out  # (0.9 * 0.9 * 1.2) ** (1 / 3)
    assert "median       1.050  >=1.0: 66.7%  under 0.95: 1  (3 shapes, 3 runs)" in out, out  # 0.92, 1.05, 1.2
    assert "  mid        1.050  >=1.0: 66.7%  under 0.95: 1  (3 shapes)" in out, out  # every shape is "mid" here
    listed = out.split("under 1.0")[1]
    assert "0.920 [0.900 - 0.940] (64, 1024, 4096)" in listed and "(128, 1024, 4096)" not in listed, out


def test_records_of_shapes_outside_the_set_are_summarized_by_the_class_their_size_gives(tmp_path, monkeypatch,
                                                                                        capsys):
    """Records engine_broad.py --shapes wrote before session 54 say "adhoc": the summary classes them by size."""
    recs = [{**_rec((8, 4096, 4096), "engine", 0.5, kernel="decode"), "cls": "adhoc"},
            {**_rec((515, 8192, 8192), "engine", 2.0, kernel="engine"), "cls": "adhoc"},
            {**_rec((515, 8192, 8192), "model", 2.0), "cls": "adhoc"}]
    path = tmp_path / "fresh.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--sha", "abc", "--file", str(path)])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    out = capsys.readouterr().out
    assert "class adhoc" not in out, out
    decode = out.split("class decode:")[1].split("class mid:")[0]
    assert "2.000" in decode and "(1 shapes)" in decode, out
    assert "0.500" in out.split("class mid:")[1], out


def test_pair_reads_a_held_out_check_over_every_pass(tmp_path, monkeypatch, capsys):
    """--pair model alt: per shape the geomean over passes of each candidate's time over torch.mm's; shapes
    without both are left out, and another sha's records are not read."""
    recs = []
    for passes, shape in (([(1.0, 1.10, 1.0), (1.1, 1.21, 1.1)], (300, 6144, 6144)),  # alt 1.1x slower each pass
                          ([(1.0, 0.95, 1.0)], (400, 6144, 4096)),  # alt 5% faster
                          ([(1.0, 1.0, 1.0)], (500, 6144, 4096))):  # even
        for model_ms, alt_ms, torch_ms in passes:
            recs += [_rec(shape, "model", model_ms, baseline_ms=torch_ms),
                     _rec(shape, "alt", alt_ms, baseline_ms=torch_ms)]
    recs.append(_rec((600, 1024, 1024), "model", 1.0, baseline_ms=1.0))  # no alt: left out
    recs.append({**_rec((700, 1024, 1024), "alt", 9.0, baseline_ms=1.0), "git_sha": "fff000"})
    recs.append({**_rec((700, 1024, 1024), "model", 1.0, baseline_ms=1.0), "git_sha": "fff000"})
    path = tmp_path / "held_out.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--sha", "abc", "--file", str(path), "--pair", "model", "alt"])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    out = capsys.readouterr().out
    gain = (1.1 * 0.95 * 1.0) ** (1 / 3)
    assert f"over 3 shapes (run abc): x{gain:.4f}" in out, out
    assert "faster by more than 2% on 1, slower by more than 2% on 1" in out, out
    assert "300x6144x6144      x1.100" in out and "400x6144x4096      x0.950" in out, out
