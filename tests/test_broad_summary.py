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
