"""The timer's host-side logic that runs without a GPU: input-set sizing and per-candidate clock sampling."""

from gemmlab.gpu import ClockSample
from gemmlab.timer import sample_during, sets_for


def test_sets_cover_twice_the_l2():
    assert sets_for(10 * 2**20, 60 * 2**20) == 12
    assert sets_for(10 * 2**30, 60 * 2**20) == 1
    assert sets_for(1, 60 * 2**20, max_sets=64) == 64


class _Event:
    """Stands in for a CUDA event that the GPU reaches after a few polls."""

    def __init__(self, polls_until_done: int):
        self.left = polls_until_done
        self.polled = 0

    def query(self) -> bool:
        self.polled += 1
        self.left -= 1
        return self.left < 0


def test_clock_is_sampled_after_the_work_starts():
    ev = _Event(3)
    seen = []

    def sampler():
        seen.append(ev.left < 0)  # the event had completed when the clock was read
        return ClockSample(1500.0, 3200.0, 650.0, 60.0)

    got = sample_during(ev, delay_s=0.0, poll_s=0.0, sampler=sampler)
    assert got.sm_mhz == 1500.0 and seen == [True] and ev.polled == 4


def test_clock_sampling_gives_up_waiting():
    ev = _Event(10**9)
    got = sample_during(ev, delay_s=0.0, poll_s=0.0, timeout_s=0.01,
                        sampler=lambda: ClockSample(None, None, None, None))
    assert got.sm_mhz is None and ev.polled > 1


def test_eager_turns_ratio_is_the_median_of_paired_turns(monkeypatch):
    """bench._interleaved_eager: host times are the best turn, wall times the median turn, and the ratio
    the median of each turn's own torch-over-ours ratio. Fake timers: turn i runs ours at 10 + i us and
    torch at 10.5 + i us (a clock that drifts between turns), host 20 + i / 22 + i; one outlier turn."""
    import gemmlab.bench as bench

    turn = {"n": 0}
    walls = [(10.0, 10.5), (11.0, 11.55), (12.0, 12.6), (30.0, 12.0), (14.0, 14.7)]

    def wall(fn, calls):
        o, t = walls[turn["n"] // 2]
        turn["n"] += 1
        return o if fn is ours else t

    def host(fn, calls):
        return 20.0 + turn["n"] // 2 if fn is ours else 22.0 + turn["n"] // 2

    ours, theirs = (lambda: None), (lambda: None)
    monkeypatch.setattr(bench, "eager_wall_us", wall)
    monkeypatch.setattr(bench, "eager_host_us", host)
    out = bench._interleaved_eager(ours, theirs, reps=5, calls=10)
    ratios = sorted(t / o for o, t in walls)
    assert abs(out["ratio"] - ratios[2]) < 1e-12 and abs(out["ratio"] - 1.05) < 1e-9
    assert out["ratio_min"] == ratios[0] < 0.5  # the outlier turn shows in ratio_min only
    assert out["wall_us"] == 12.0 and out["baseline_wall_us"] == 12.0  # median turns
    assert out["host_us"] == 20.0 and out["baseline_host_us"] == 22.0 and out["host_excess_us"] == -2.0
    assert out["reps"] == 5


class _FakeCuda:
    """Stands in for torch.cuda in ``time_interleaved``: graphs record the launches made while capturing and
    every replay, event record and flush lands in one log, in stream order."""

    def __init__(self):
        self.log = []
        self.capturing = None
        cuda = self

        class Graph:
            def __init__(self):
                self.launches = []

            def replay(self):
                cuda.log.append(("replay", self.launches[0]))

        class Event:
            def __init__(self, enable_timing=False):
                pass

            def record(self):
                cuda.log.append(("record", None))

            def elapsed_time(self, other):
                return 1.0

            def query(self):
                return True

        class Stream:
            def wait_stream(self, other):
                pass

        self.CUDAGraph, self.Event, self.Stream = Graph, Event, Stream

    def graph(self, g):
        cuda = self

        class Capture:
            def __enter__(self):
                cuda.capturing = g

            def __exit__(self, *exc):
                cuda.capturing = None

        return Capture()

    def stream(self, s):
        return self.graph(None)

    def current_stream(self):
        return self.Stream()

    def synchronize(self):
        self.log.append(("synchronize", None))

    def _sleep(self, cycles):
        self.log.append(("sleep", cycles))

    def launch(self, name):
        if self.capturing is not None:
            self.capturing.launches.append(name)


def _time_with_fakes(monkeypatch, **kw):
    import types

    import gemmlab.timer as timer

    cuda = _FakeCuda()

    class Buffer:
        def __init__(self, n):
            self.n = n

        def zero_(self):
            cuda.log.append(("flush", self.n * 4))

    fake = types.SimpleNamespace(cuda=cuda, int32="int32", empty=lambda n, dtype=None, device=None: Buffer(n))
    monkeypatch.setattr(timer, "torch", fake)
    monkeypatch.setattr(timer, "sample_during", lambda ev, delay_s: ClockSample(1500.0, 3200.0, 600.0, 60.0))
    monkeypatch.setattr(timer, "gpu_info", lambda: types.SimpleNamespace(l2_bytes=50 * 2**20))
    monkeypatch.setattr(timer, "_per_launch_ms", lambda fn, n_sets: 0.1)
    cands = {name: (lambda i, name=name: cuda.launch(name)) for name in ("torch", "a", "b")}
    res = timer.time_interleaved(cands, 2, rounds=3, warmup_rounds=0, replay_ms=1.0, **kw)
    timed = [i for i, (kind, _) in enumerate(cuda.log) if kind == "record"][::2]  # each timed replay's start
    return res, cuda.log, timed


def test_every_timed_replay_follows_a_flush_of_twice_the_l2(monkeypatch):
    res, log, timed = _time_with_fakes(monkeypatch)
    assert len(timed) == 9 and set(res.timings) == {"torch", "a", "b"}
    for i in timed:
        assert log[i - 1] == ("flush", 100 * 2**20) and log[i + 1][0] == "replay"
    # the order still rotates: each round starts with another candidate
    assert [log[timed[k] + 1][1] for k in (0, 3, 6)] == ["torch", "a", "b"]


def test_without_flush_a_replay_follows_the_previous_candidate(monkeypatch):
    _, log, timed = _time_with_fakes(monkeypatch, flush_bytes=0)
    assert not any(kind == "flush" for kind, _ in log)
    assert all(log[i - 1][0] != "flush" for i in timed)


def test_lead_in_replays_the_candidate_itself_first(monkeypatch):
    _, log, timed = _time_with_fakes(monkeypatch, lead_in=True, flush_bytes=0)
    for i in timed:
        assert log[i - 1] == log[i + 1] and log[i + 1][0] == "replay"


def test_each_round_starts_with_the_gpu_kept_busy(monkeypatch):
    """After a round's synchronize the GPU idles; a sleep kernel comes first in the next round, so the first
    timed replay is queued while the GPU is still busy."""
    _, log, timed = _time_with_fakes(monkeypatch)
    firsts = [timed[k] for k in (0, 3, 6)]
    for i in firsts:
        j = max(k for k in range(i) if log[k][0] == "synchronize")
        assert [kind for kind, _ in log[j + 1:i]] == ["sleep", "flush"]
