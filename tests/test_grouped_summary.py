"""benchmarks/grouped_summary.py on records written here (CPU): the newest run of each shape, the bars with few
experts, and what the 2x bar needs of the HBM and the tensor cores with many."""

import json
import runpy
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "grouped_summary.py"


def _rec(sha, cand, ms, G=64, N=2048, K=2048, T=8192, base_ms=1.0, empty=0):
    return {"suite": "grouped", "model": "m", "proj": "down", "groups": G, "N": N, "K": K, "T": T,
            "empty_groups": empty, "candidate": cand, "time_ms": ms, "baseline": "torch_grouped_mm",
            "baseline_ms": base_ms, "ratio": None if cand == "torch_grouped_mm" else base_ms / ms, "git_sha": sha}


def _run(tmp_path, capsys, recs):
    path = tmp_path / "grouped.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert runpy.run_path(str(SCRIPT))["main"](["--file", str(path)]) == 0
    return capsys.readouterr().out


def test_the_newest_run_counts_and_the_bar_asks_for_rates(tmp_path, capsys):
    # 64 experts of 2048 x 2048 at T = 8192: 2 (8192 x 2048 x 2 + 64 x 2048^2) bytes = 604 MB at least and
    # 68.7 GFLOP. torch at 0.25 ms: 2x needs 0.125 ms, 4.83 TB/s (more than the 4.3 of a copy): out of reach.
    recs = [_rec("old", "ours", 0.1, base_ms=0.25), _rec("old", "torch_grouped_mm", 0.25, base_ms=0.25),
            _rec("new", "ours", 0.2, base_ms=0.25), _rec("new", "torch_grouped_mm", 0.25, base_ms=0.25)]
    out = _run(tmp_path, capsys, recs)
    line = next(x for x in out.splitlines() if x.startswith("m down T=8192"))
    assert "1.250" in line and "4.83" in line and "out of reach" in line, out  # the newest run's 1.25x
    assert "24 shapes" not in out and "1 shapes: ours / torch._grouped_mm 1.250" in out, out
    assert "0 of 1 where 2x needs" in out, out


def test_few_experts_against_both_bars(tmp_path, capsys):
    recs = [_rec("s", "ours", 1.0, G=8, base_ms=1.2), _rec("s", "torch_grouped_mm", 1.2, G=8, base_ms=1.2),
            _rec("s", "torch_mm_loop", 0.95, G=8, base_ms=1.2)]
    out = _run(tmp_path, capsys, recs)
    assert "8-16 experts, 1 shapes: ours / torch._grouped_mm 1.200" in out, out
    assert "ours / torch.mm loop 0.950 on 1 (min 0.950; bar 1.0: 0 meet it)" in out, out
