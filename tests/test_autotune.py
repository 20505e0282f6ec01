"""The autotuner on the CPU, with the GPU faked: candidates, the winner, the per-GPU file, config_for, the CLI."""

import dataclasses
import json
import math
import multiprocessing as mp
import os
import re
import types

import pytest

from gemmlab import autotune, cli, registry
from gemmlab import tuned as store
from gemmlab.autotune import AutotuneCacheWarning, GpuKey
from gemmlab.errors import UnsupportedProblem

FAKE_INFO = types.SimpleNamespace(name="FAKE H200", sm_count=132, driver="570.124.06")
FAKE = GpuKey.from_info(FAKE_INFO)
OTHER = GpuKey("FAKE A100", 108, "535")


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Every test gets its own cache folder; no test sees a GPU unless it asks for the fake one."""
    monkeypatch.setenv("GEMMLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "250")  # rich tables unwrapped
    monkeypatch.setattr(store, "current_gpu", lambda: None)
    monkeypatch.setattr(autotune, "current_gpu", lambda: None)
    monkeypatch.setattr(cli, "_has_gpu", lambda: False)
    return tmp_path / "cache"


class FakeBench:
    """Stands in for ``gemmlab.bench.bench_shape``: a time per config from ``speed``, ``wrong`` configs
    fail the check, ``nan`` configs report a NaN error with ``correct`` True, ``boom`` configs raise."""

    def __init__(self, speed, wrong=(), nan=(), boom=(), wrong_in_final=()):
        self.speed, self.wrong, self.nan, self.boom = speed, list(wrong), list(nan), list(boom)
        self.wrong_in_final = list(wrong_in_final)
        self.calls = []  # (stage, [configs])

    def bench_shape(self, ladder, M, N, K, steps, *, suite="adhoc", rounds=15, extra=None, **_):
        cfgs = [s.resolve(c) for s, c in steps]
        stage = (extra or {}).get("autotune_stage")
        if any(c in self.boom for c in cfgs):
            raise RuntimeError("launch failed: CUDA_ERROR_ILLEGAL_ADDRESS")
        self.calls.append((stage, cfgs))
        out = []
        for spec, cfg in zip((s for s, _ in steps), cfgs):
            wrong = cfg in self.wrong or (stage == "final" and cfg in self.wrong_in_final)
            err = float("nan") if cfg in self.nan else (0.5 if wrong else 1e-6)
            rec = dict(kernel=spec.name, config=cfg, M=M, N=N, K=K, suite=suite, rel_error=err,
                       correct=err <= 1e-3, git_sha="abc123", baseline_ms=1.0,
                       **(extra or {}))
            if cfg in self.nan:
                rec["correct"] = True  # a buggy check that passes NaN: the tuner must still refuse it
            if not wrong:
                t = self.speed(cfg)
                rec.update(time_ms=t, tflops=2 * M * N * K / t / 1e9, ratio=1.0 / t)
            out.append(rec)
        return out


@pytest.fixture
def fake_gpu(monkeypatch):
    import gemmlab.gpu

    monkeypatch.setattr(gemmlab.gpu, "gpu_info", lambda *a: FAKE_INFO)
    monkeypatch.setattr(store, "current_gpu", lambda: FAKE)
    monkeypatch.setattr(autotune, "current_gpu", lambda: FAKE)
    monkeypatch.setattr(cli, "_has_gpu", lambda: True)

    def install(fake):
        import gemmlab.bench

        monkeypatch.setattr(gemmlab.bench, "bench_shape", fake.bench_shape)
        return fake
    return install


def k08_speed(cfg):
    """A made-up landscape: bigger tiles are faster, MIN_BLOCKS=1 a little."""
    return 10.0 / (cfg["BM"] * cfg["BN"] / 4096) + 0.01 * cfg["MIN_BLOCKS"] + 0.001 * cfg["BK"]


# Candidates -----------------------------------------------------------------------------------------

def test_candidates_capped_spread_and_deterministic():
    spec = registry.get("k08")
    sel = autotune.select_candidates(spec, 4096, 4096, 4096, 132, max_configs=8)
    assert len(sel.configs) == 8
    assert sel.configs[0] == sel.heuristic == spec.default_config()  # no heuristic: the defaults, first
    keys = [autotune.variant_key(spec, c) for c in sel.configs]
    assert len(set(keys)) == 8
    space = [c for c in spec.configs() if c != spec.default_config()]
    assert sel.configs[1] == space[0] and sel.configs[-1] == space[-1]  # the spread spans the space
    assert all(c in spec.configs() for c in sel.configs)
    assert autotune.select_candidates(spec, 4096, 4096, 4096, 132, max_configs=8) == sel
    assert len([why for _, why in sel.skipped if "max_configs" in why]) == len(spec.configs()) - 8
    only = autotune.select_candidates(spec, 4096, 4096, 4096, 132, max_configs=1)
    assert only.configs == [spec.default_config()]
    with pytest.raises(ValueError):
        autotune.select_candidates(spec, 4096, 4096, 4096, 132, max_configs=0)


def test_candidates_keep_the_heuristic_and_filter_unsupported():
    spec = registry.get("h10")
    M, N, K = 384, 3072, 4096  # CLUSTER=2 needs M % 256 == 0
    sel = autotune.select_candidates(spec, M, N, K, 132, max_configs=200)
    heuristic = spec.config_for(M, N, K, 132, tuned=False)
    assert heuristic["BN"] == 128 and sel.configs[0] == heuristic == sel.heuristic
    assert sel.configs and all(c["CLUSTER"] == 1 for c in sel.configs)
    assert all(spec.why_unsupported(M, N, K, c) is None for c in sel.configs)
    reasons = [why for c, why in sel.skipped if c["CLUSTER"] == 2]
    assert reasons and all("128*CLUSTER" in why or "%" in why or "multiple" in why for why in reasons)
    # A cap keeps the heuristic even when the spread would not land on it.
    assert autotune.select_candidates(spec, M, N, K, 132, max_configs=3).configs[0] == heuristic


def test_candidates_deduplicated_by_what_runs():
    spec = registry.get("h10")
    base = spec.config_for(4096, 4096, 4096, 132, tuned=False)
    given = [{}, {"ORDER": 2}, {"BN": 128}, {"BN": 128, "GROUP_M": 8}, {"ORDER": 0}, {"ORDER": 0}]
    sel = autotune.select_candidates(spec, 4096, 4096, 4096, 132, configs=given)
    assert sel.configs == [base, {**base, "BN": 128}, {**base, "ORDER": 0}]
    # Launch-time options (ORDER is not a template parameter) tell runs apart that compile the same.
    assert spec.name_expression(sel.configs[0]) == spec.name_expression(sel.configs[2])
    with pytest.raises(UnsupportedProblem):
        autotune.select_candidates(spec, 4096, 4096, 4096, 132, configs=[{"NOPE": 1}])


def test_no_config_runs_the_shape(fake_gpu):
    fake_gpu(FakeBench(k08_speed))
    sel = autotune.select_candidates(registry.get("h10"), 100, 256, 64, 132)
    assert sel.configs == [] and sel.heuristic is None and "own choice" in sel.skipped[0][1]
    with pytest.raises(UnsupportedProblem, match="no config runs"):
        autotune.tune("h10", 100, 256, 64)


def test_steps_that_cannot_be_tuned_say_why(fake_gpu):
    fake_gpu(FakeBench(k08_speed))
    assert autotune.tunable(registry.get("k08")) is None
    assert autotune.tunable(registry.get("h11")) is None  # its launcher runs the config's plan
    frozen = dataclasses.replace(registry.get("k08"), extra={"not_tunable": "its launcher ignores the config"})
    assert "ignores" in autotune.tunable(frozen)
    with pytest.raises(UnsupportedProblem, match="cannot be tuned"):
        autotune.tune(frozen, 4096, 4096, 4096)
    assert "no parameters" in autotune.tunable(dataclasses.replace(frozen, params=()))


# Choosing the winner --------------------------------------------------------------------------------

def test_pick_winner_excludes_wrong_nan_and_untimed():
    recs = [
        dict(config={"X": 1}, correct=False, rel_error=0.5, time_ms=0.1),  # fastest, wrong
        dict(config={"X": 2}, correct=True, rel_error=float("nan"), time_ms=0.2),  # NaN error
        dict(config={"X": 3}, correct=True, rel_error=1e-6, time_ms=float("nan")),
        dict(config={"X": 4}, correct=True, rel_error=1e-6),  # not timed
        dict(config={"X": 5}, correct=True, rel_error=1e-6, time_ms=0.0),
        dict(config={"X": 6}, correct=True, rel_error=1e-6, time_ms=0.9),
        dict(config={"X": 7}, correct=True, rel_error=1e-6, time_ms=0.5),
        dict(config={"X": 8}, correct=True, rel_error=1e-6, time_ms=0.5),  # a tie: the earlier wins
    ]
    assert autotune.pick_winner(recs)["config"] == {"X": 7}
    assert autotune.pick_winner(recs[:5]) is None
    assert autotune.pick_winner([]) is None


def test_tune_groups_final_round_and_save(fake_gpu):
    spec = registry.get("k08")
    cands = autotune.select_candidates(spec, 4096, 4096, 4096, 132, max_configs=20).configs
    ranked = sorted(cands, key=k08_speed)
    fake = fake_gpu(FakeBench(k08_speed, wrong=[ranked[0]], nan=[ranked[1]], wrong_in_final=[ranked[2]]))
    res = autotune.tune(spec, 4096, 4096, 4096, max_configs=20, rounds=3, group_size=8)

    screen = [cfgs for stage, cfgs in fake.calls if stage == "screen"]
    assert [len(g) for g in screen] == [8, 8, 4]  # several candidates per interleaved call
    assert [c for g in screen for c in g] == cands
    (final,) = [cfgs for stage, cfgs in fake.calls if stage == "final"]
    assert final[:3] == ranked[2:5] and final[-1] == spec.default_config()  # best of screen + the default
    assert res.config == ranked[3]  # ranked[0] wrong, ranked[1] NaN, ranked[2] wrong in the final call
    assert res.winner["autotune_stage"] == "final"
    assert len(res.records) == 20 + len(final)
    assert {r["config"] == ranked[0] and r["correct"] for r in res.records} == {False}

    assert res.saved_to == autotune.tuned_path(FAKE) and res.saved_to.is_file()
    doc = json.loads(res.saved_to.read_text())
    assert doc["format"] == autotune.FORMAT and doc["gpu"] == {"name": "FAKE H200", "sm_count": 132,
                                                               "driver_major": "570"}
    entry = doc["entries"]["sgemm.k08_autotuned@4096x4096x4096"]
    assert entry["config"] == ranked[3] and entry["heuristic_config"] == spec.default_config()
    assert entry["time_ms"] == pytest.approx(k08_speed(ranked[3]))
    assert entry["git_sha"] == "abc123" and entry["candidates"] == 20 and entry["rounds"] == 3
    assert {"ratio", "when", "tflops", "heuristic_time_ms"} <= set(entry)
    assert autotune.best_config(spec, 4096, 4096, 4096) == ranked[3]


def test_tune_single_group_has_no_final_round(fake_gpu):
    fake = fake_gpu(FakeBench(lambda c: 1.0 + c["BLOCK"] / 100))
    res = autotune.tune("k01", 64, 64, 64, save=False)
    assert [stage for stage, _ in fake.calls] == ["screen"]
    assert res.heuristic == {"BLOCK": 32} and res.config == {"BLOCK": 16}
    assert res.saved_to is None and not autotune.tuned_path(FAKE).exists()


def test_tune_failing_group_is_retried_one_by_one(fake_gpu):
    spec = registry.get("k08")
    cands = autotune.select_candidates(spec, 512, 512, 512, 132, max_configs=4).configs
    fake = fake_gpu(FakeBench(k08_speed, boom=[cands[1]]))
    messages = []
    res = autotune.tune(spec, 512, 512, 512, max_configs=4, log=messages.append)
    assert [len(cfgs) for _, cfgs in fake.calls] == [1, 1, 1]  # the group failed; the others alone
    (bad,) = [r for r in res.records if r.get("error")]
    assert bad["config"] == cands[1] and bad["correct"] is False and "ILLEGAL_ADDRESS" in bad["error"]
    assert res.winner is not None and res.config != cands[1]
    assert any("one by one" in m for m in messages)


def test_tune_budget_stops_new_groups(fake_gpu):
    fake = fake_gpu(FakeBench(k08_speed))
    res = autotune.tune("k08", 1024, 1024, 1024, max_configs=20, group_size=8, budget_s=0.0)
    assert [stage for stage, _ in fake.calls] == ["screen"]
    assert sum("budget" in why for _, why in res.skipped) == 12
    assert res.winner is not None


def test_tune_with_nothing_correct_saves_nothing(fake_gpu):
    spec = registry.get("k01")
    fake_gpu(FakeBench(k08_speed, wrong=spec.configs()))
    res = autotune.tune(spec, 64, 64, 64)
    assert res.winner is None and res.saved_to is None and not autotune.tuned_path(FAKE).exists()


# The per-GPU file -----------------------------------------------------------------------------------

def _entry(kernel="sgemm.k08_autotuned", M=4096, N=4096, K=4096, config=None, **kw):
    return dict(kernel=kernel, M=M, N=N, K=K, config=config or {"BM": 64}, time_ms=1.0, ratio=1.0,
                git_sha="abc", when="2025-01-01T00:00:00+00:00", **kw)


def test_file_names_are_safe_and_per_gpu():
    names = {GpuKey(n, s, d).file_name() for n, s, d in [("NVIDIA H200", 132, "570"), ("NVIDIA H200", 132, "575"),
                                                          ("NVIDIA H200", 114, "570"), ("../../etc/x", 1, "1")]}
    assert len(names) == 4
    assert all(re.fullmatch(r"[A-Za-z0-9-]+-\d+sm-[0-9a-f]{16}\.json", n) for n in names)
    assert GpuKey.from_info(types.SimpleNamespace(name="X", sm_count=2, driver="unknown")).driver_major == "unknown"


def test_round_trip_and_memory_cache(cache):
    path = autotune.save_entry(FAKE, _entry())
    assert path.parent == cache / "autotune"
    autotune.save_entry(FAKE, _entry(M=2048, config={"BM": 128}))
    autotune.save_entry(FAKE, _entry(config={"BM": 256}))  # replaces the first
    doc = autotune.load(path)
    assert set(doc["entries"]) == {"sgemm.k08_autotuned@4096x4096x4096", "sgemm.k08_autotuned@2048x4096x4096"}
    assert doc["entries"]["sgemm.k08_autotuned@4096x4096x4096"]["config"] == {"BM": 256}
    assert autotune.load(path) is doc  # unchanged file: parsed once
    autotune.save_entry(FAKE, _entry(M=1024))
    assert autotune.load(path) is not doc and len(autotune.load(path)["entries"]) == 3
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []
    rows = autotune.saved_entries(FAKE)
    assert [e["M"] for _, _, e in rows] == [1024, 2048, 4096] and rows[0][0]["name"] == "FAKE H200"
    with pytest.raises(ValueError):
        autotune.save_entry(FAKE, {"kernel": "x"})


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "list", "other-format", "binary"])
def test_damaged_file_is_ignored_with_a_warning_and_rewritten(damage, fake_gpu):
    spec = registry.get("k08")
    path = autotune.save_entry(FAKE, _entry(config={"BM": 64}))
    text = path.read_text()
    path.write_bytes({"truncate": text[: len(text) // 2].encode(), "garbage": b"{not json",
                      "empty": b"", "list": b"[1, 2]", "other-format": json.dumps({"format": "v99", "entries": {}})
                      .encode(), "binary": b"\xff\xfe\x00"}[damage])
    with pytest.warns(AutotuneCacheWarning, match="ignoring the file"):
        assert autotune.best_config(spec, 4096, 4096, 4096) is None  # never a crash
    with pytest.warns(AutotuneCacheWarning):
        autotune.save_entry(FAKE, _entry(M=512, config={"BM": 128}))
    doc = json.loads(path.read_text())
    assert list(doc["entries"]) == ["sgemm.k08_autotuned@512x4096x4096"]
    assert autotune.best_config(spec, 512, 4096, 4096) == {**spec.default_config(), "BM": 128}


def test_malformed_entries_are_dropped(fake_gpu):
    path = autotune.save_entry(FAKE, _entry())
    doc = json.loads(path.read_text())
    doc["entries"]["bad@1x1x1"] = {"kernel": "x", "M": "1", "config": []}
    path.write_text(json.dumps(doc))
    with pytest.warns(AutotuneCacheWarning, match="malformed"):
        assert list(autotune.load(path)["entries"]) == ["sgemm.k08_autotuned@4096x4096x4096"]


def _write_many(args):
    folder, worker = args
    os.environ["GEMMLAB_CACHE_DIR"] = folder
    from gemmlab import autotune as at

    gpu = at.GpuKey("FAKE H200", 132, "570")
    for i in range(15):
        at.save_entry(gpu, dict(kernel="sgemm.k08_autotuned", M=worker + 1, N=i + 1, K=1, config={"BM": 64},
                                time_ms=float(i), when="now"))
    return worker


def test_concurrent_writers_do_not_corrupt(cache):
    ctx = mp.get_context("spawn")
    with ctx.Pool(4) as pool:
        assert sorted(pool.map(_write_many, [(str(cache), w) for w in range(4)])) == [0, 1, 2, 3]
    path = autotune.tuned_path(FAKE)
    doc = json.loads(path.read_text())  # parses: no torn write
    assert len(doc["entries"]) == 60  # and, with the lock, no lost update
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


# Lookups and config_for -----------------------------------------------------------------------------

def test_config_for_prefers_a_tuned_config_only_for_this_gpu(monkeypatch):
    spec = registry.get("h10")
    shape = (3072, 3072, 3072)
    heuristic = spec.config_for(*shape, 132, tuned=False)
    assert heuristic["BN"] == 192
    tuned = {**heuristic, "BN": 128, "QSIZE": 3}
    autotune.save_entry(FAKE, _entry(kernel=spec.name, M=3072, N=3072, K=3072, config=tuned))
    autotune.save_entry(OTHER, _entry(kernel=spec.name, M=3072, N=3072, K=3072, config={**heuristic, "ORDER": 0}))

    assert spec.config_for(*shape, 132) == heuristic  # no GPU visible: the heuristic
    monkeypatch.setattr(store, "current_gpu", lambda: FAKE)
    monkeypatch.setattr(autotune, "current_gpu", lambda: FAKE)
    assert spec.config_for(*shape, 132) == tuned
    assert spec.config_for(*shape, 132, tuned=False) == heuristic
    assert spec.config_for(*shape, 114) == spec.config_for(*shape, 114, tuned=False)  # asked about another device
    assert spec.config_for(4096, 4096, 4096, 132) == spec.config_for(4096, 4096, 4096, 132, tuned=False)
    monkeypatch.setattr(store, "current_gpu", lambda: GpuKey("FAKE H200", 132, "575"))
    monkeypatch.setattr(autotune, "current_gpu", lambda: GpuKey("FAKE H200", 132, "575"))  # other driver
    assert spec.config_for(*shape, 132) == heuristic
    monkeypatch.setattr(store, "current_gpu", lambda: OTHER)
    monkeypatch.setattr(autotune, "current_gpu", lambda: OTHER)
    assert spec.config_for(*shape, 108) == {**heuristic, "ORDER": 0}


def test_stale_or_unrunnable_tuned_configs_are_ignored(monkeypatch):
    monkeypatch.setattr(store, "current_gpu", lambda: FAKE)
    monkeypatch.setattr(autotune, "current_gpu", lambda: FAKE)
    spec = registry.get("h10")
    base = spec.config_for(4096, 4096, 4096, 132, tuned=False)
    autotune.save_entry(FAKE, _entry(kernel=spec.name, config={**base, "QSIZE": 7}))  # no longer a choice
    autotune.save_entry(FAKE, _entry(kernel=spec.name, M=384, N=3072, config={**base, "CLUSTER": 2, "BN": 128}))
    autotune.save_entry(FAKE, _entry(kernel=spec.name, M=2048, config={"NOPE": 1}))
    assert spec.config_for(4096, 4096, 4096, 132) == base
    assert spec.config_for(384, 3072, 4096, 132) == spec.config_for(384, 3072, 4096, 132, tuned=False)
    assert autotune.best_config(spec, 2048, 4096, 4096) is None


def test_best_config_is_one_stat_until_the_file_changes(monkeypatch):
    spec = registry.get("k08")
    autotune.save_entry(FAKE, _entry(config={"BM": 64}))
    want = {**spec.default_config(), "BM": 64}
    assert autotune.best_config(spec, 4096, 4096, 4096, gpu=FAKE) == want  # no visible GPU: the one given
    assert autotune.best_config(spec, 4096, 4096, 4096, 108, gpu=FAKE) is None  # not that GPU's SM count
    real_load = autotune.load
    monkeypatch.setattr(store, "load", lambda path: pytest.fail("the file was read again"))
    assert autotune.best_config(spec, 4096, 4096, 4096, gpu=FAKE) == want
    autotune.best_config(spec, 4096, 4096, 4096, gpu=FAKE)["BM"] = 0  # callers get a copy
    assert autotune.best_config(spec, 4096, 4096, 4096, gpu=FAKE) == want
    monkeypatch.setattr(store, "load", real_load)
    autotune.save_entry(FAKE, _entry(config={"BM": 128}))  # a new file (os.replace): read again
    assert autotune.best_config(spec, 4096, 4096, 4096, gpu=FAKE) == {**spec.default_config(), "BM": 128}
    autotune.tuned_path(FAKE).unlink()
    assert autotune.best_config(spec, 4096, 4096, 4096, gpu=FAKE) is None


def test_fp32_matmul_path_picks_the_tuned_step_config(monkeypatch):
    from gemmlab import fp32

    spec, cfg = fp32.K10, fp32.config_for(1000, 1000, 1000, 132)
    tuned = next(c for c in spec.configs() if c != cfg and not spec.why_unsupported(1000, 1000, 1000, c))
    autotune.save_entry(FAKE, _entry(kernel=spec.name, M=1000, N=1000, K=1000, config=tuned))
    monkeypatch.setattr(store, "current_gpu", lambda: FAKE)
    monkeypatch.setattr(autotune, "current_gpu", lambda: FAKE)
    assert fp32.config_for(1000, 1000, 1000, 132) == tuned


def test_nearest_config(monkeypatch):
    monkeypatch.setattr(store, "current_gpu", lambda: FAKE)
    monkeypatch.setattr(autotune, "current_gpu", lambda: FAKE)
    spec = registry.get("k08")
    autotune.save_entry(FAKE, _entry(config={"BM": 64}))
    autotune.save_entry(FAKE, _entry(M=1024, N=1024, K=1024, config={"BM": 256, "MIN_BLOCKS": 1}))
    cfg, shape = autotune.nearest_config(spec, 4096, 4096, 2048)
    assert shape == (4096, 4096, 4096) and cfg["BM"] == 64
    assert autotune.nearest_config(spec, 1024, 1024, 1500) == ({**spec.default_config(), "BM": 256, "MIN_BLOCKS": 1},
                                                                (1024, 1024, 1024))
    assert autotune.nearest_config(spec, 2048, 2048, 2048) is None  # distance 3 from either
    assert autotune.best_config(spec, 4096, 4096, 2048) is None  # the exact lookup does not guess


# The command ----------------------------------------------------------------------------------------

def run(capsys, *argv):
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_tune_help(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["tune", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: gemmlab tune") and "--max-configs" in text and "--show" in text


def test_tune_without_gpu_is_a_clear_error(capsys):
    rc, _, err = run(capsys, "tune", "k08", "--shape", "4096,4096,4096")
    assert rc == 3 and "needs an NVIDIA GPU" in err and "--show" in err
    assert not autotune.tune_dir().exists()


@pytest.mark.parametrize("argv, rc, message", [
    (["tune", "k08"], 2, "name a step and a shape"),
    (["tune", "--shape", "64,64,64"], 2, "name a step and a shape"),
    (["tune", "h11", "--shape", "64,64,64"], 3, "needs an NVIDIA GPU"),  # tunable: it gets as far as the GPU
    (["tune", "nope", "--shape", "64,64,64"], 2, "no kernel named"),
])
def test_tune_usage_errors(capsys, argv, rc, message):
    got, _, err = run(capsys, *argv)
    assert got == rc and message in err


@pytest.mark.parametrize("argv", [["tune", "k08", "--shape", "64,64,64", "--rounds", "0"],
                                  ["tune", "k08", "--shape", "64,64,64", "--max-configs", "0"],
                                  ["tune", "k08", "--shape", "64,64,64", "--budget", "-1"]])
def test_tune_numbers_are_checked_by_the_parser(capsys, argv):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2 and "expected" in capsys.readouterr().err


def test_tune_on_a_fake_gpu(capsys, fake_gpu):
    fake_gpu(FakeBench(k08_speed))
    rc, out, _ = run(capsys, "tune", "k08", "--shape", "2048,2048,2048", "--max-configs", "12", "--rounds", "2")
    assert rc == 0
    assert "winner" in out and "the step's own choice" in out and "TFLOP/s" in out and "x cuBLAS" in out
    path = autotune.tuned_path(FAKE)
    assert f"saved to {path}" in " ".join(out.split())
    entry = autotune.load(path)["entries"]["sgemm.k08_autotuned@2048x2048x2048"]
    assert entry["rounds"] == 2 and entry["candidates"] == 12


def test_show_without_gpu_lists_every_gpu(capsys):
    rc, out, _ = run(capsys, "tune", "--show")
    assert rc == 0 and "no tuned results" in out
    autotune.save_entry(FAKE, _entry(config={"BM": 64}))
    autotune.save_entry(OTHER, _entry(kernel="hopper.h10_deep_pipeline", M=3072, N=3072, K=3072,
                                      config={"BN": 192}))
    rc, out, _ = run(capsys, "tune", "--show")
    assert rc == 0
    assert "FAKE H200 (132 SMs, driver 570)" in out and "FAKE A100 (108 SMs, driver 535)" in out
    assert "k08_autotuned" in out and "BM=64" in out and "h10_deep_pipeline" in out and "3072x3072x3072" in out
    rc, out, _ = run(capsys, "tune", "h10", "--show")
    assert "h10_deep_pipeline" in out and "k08_autotuned" not in out


def test_show_with_gpu_lists_this_gpu_only(capsys, fake_gpu):
    autotune.save_entry(FAKE, _entry(config={"BM": 64}))
    autotune.save_entry(OTHER, _entry(kernel="hopper.h10_deep_pipeline", config={"BN": 192}))
    rc, out, _ = run(capsys, "tune", "--show")
    assert rc == 0 and "k08_autotuned" in out and "h10_deep_pipeline" not in out and "FAKE H200" in out


def test_tune_as_json(capsys, fake_gpu):
    fake_gpu(FakeBench(k08_speed))
    rc, out, _ = run(capsys, "tune", "k08", "--shape", "2048,2048,2048", "--max-configs", "6", "--rounds", "2",
                     "--json")
    assert rc == 0
    d = json.loads(out)  # the tuner's progress lines go to stderr
    assert d["kernel"] == "sgemm.k08_autotuned" and d["shape"] == [2048, 2048, 2048]
    assert d["winner"] in [c["config"] for c in d["candidates"]] and d["saved_to"] == str(autotune.tuned_path(FAKE))
    rc, out, _ = run(capsys, "tune", "--show", "--json")
    (entry,) = json.loads(out)
    assert rc == 0 and entry["kernel"] == "sgemm.k08_autotuned" and entry["config"] == d["winner"]
