"""benchmarks/fresh_draw.py (CPU): the shapes it draws are new to the project and honour what it promises."""

import runpy
import sys
from pathlib import Path

from gemmlab.broad_shapes import MAX_FLOP, MODELS, broad_cases, projections

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "fresh_draw.py"
mod = runpy.run_path(str(SCRIPT))


def test_a_draw_is_distinct_new_and_under_the_flop_cap():
    shapes = mod["draw"](5401, 60)
    assert len(shapes) == 60 and len(set(shapes)) == 60
    broad = {c.shape for c in broad_cases()}
    assert not broad & set(shapes)
    assert all(2.0 * M * N * K <= MAX_FLOP and 1 <= M <= 16384 for M, N, K in shapes)
    # every (N, K) is a held-out model's projection or vocabulary head
    pairs = {nk for dims in mod["HELD_OUT"].values() for nk in projections(*dims).values()} | set(mod["HEADS"].values())
    assert {(N, K) for _, N, K in shapes} <= pairs
    # M spans decode to prefill, and most token counts are not multiples of 8
    ms = [M for M, _, _ in shapes]
    assert min(ms) <= 32 and max(ms) >= 4000
    assert sum(M % 8 != 0 for M in ms) > len(ms) // 2


def test_the_held_out_families_are_not_the_broad_sets():
    assert not set(mod["HELD_OUT"]) & {m for fam in MODELS.values() for m in fam}


def test_a_seed_is_one_draw_and_another_seed_another():
    assert mod["draw"](7, 20) == mod["draw"](7, 20)
    assert mod["draw"](7, 20) != mod["draw"](8, 20)


def test_the_command_prints_a_shapes_argument(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--seed", "3", "--count", "5"])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    last = capsys.readouterr().out.strip().splitlines()[-1]
    shapes = [tuple(map(int, s.split(","))) for s in last.split(";")]
    assert shapes == mod["draw"](3, 5)


def test_engine_broad_gives_shapes_outside_the_set_the_sets_classes():
    """engine_broad.py --shapes: a shape outside the broad set gets the class its size gives it (so a fresh
    draw's records summarize per class); a shape of the set keeps its own case."""
    import argparse

    broad = runpy.run_path(str(SCRIPT.parent / "engine_broad.py"))
    first = broad_cases()[0]
    args = argparse.Namespace(shapes=f"515,8192,8192;8,12800,4096;5803,15360,5120;300,4095,4096;"
                                     f"{first.M},{first.N},{first.K}", classes=None, limit=None, skip_measured=None)
    cases = broad["load_cases"](args)
    assert [c["cls"] for c in cases] == ["mid", "decode", "prefill", "unaligned", first.cls]
    assert cases[-1]["source"] == first.source and cases[0]["source"] == "adhoc"
    args.classes = "mid,prefill"
    assert [(c["M"], c["cls"]) for c in broad["load_cases"](args)] == [(515, "mid"), (5803, "prefill")]


def test_engine_broad_times_the_pick_under_planner_constants_as_alt():
    """engine_broad.py --alt SWAP_PAD_SPAN=none: the pick with that planner constant is timed beside the
    model's ("alt"), and the constant is back to its value afterwards."""
    from gemmlab import planner
    from gemmlab.devices import H200

    broad = runpy.run_path(str(SCRIPT.parent / "engine_broad.py"))
    prof, consts = broad["_benchmarks_module"]("changed_picks").constants(["SWAP_PAD_SPAN=none"], H200)
    plans = broad["candidate_plans"](351, 6144, 16384, prof, (), False, None, consts)
    assert not plans["model"].swap_ab and plans["alt"].swap_ab
    assert (plans["model"].bn, plans["alt"].bn) == (144, 176)  # h100_span_heldout.jsonl: 0.922 / 0.767x torch.mm
    assert planner.SWAP_PAD_SPAN == 1.0 and not planner.candidates(351, 6144, 16384)[0].swap_ab
    assert "alt" not in broad["candidate_plans"](351, 6144, 16384, prof)
