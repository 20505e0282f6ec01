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
