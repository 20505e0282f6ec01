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
