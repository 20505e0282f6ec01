"""gemmlab's one timer, used by the tests' benchmarks, the CLI, the benchmark suites and the MCP server.

Two protocols: GPU time under sustained load (``time_interleaved``, below), and what an eager call costs its
caller (``eager_host_us``, ``eager_wall_us``: no graphs, since a graph replay hides the host).

Protocol (the brief's): inputs rotate over several sets totalling at least 2x the L2, so no launch
reads a cache-warm operand; back-to-back launches are captured in one CUDA graph of about
``replay_ms``; each replay is timed with CUDA events, right after a write of twice the L2 (so what ran
before it, another candidate or nothing, leaves every candidate the same cache: a kernel that loads its
weight evict-first ran 2-3% slower after its twin without the hint than after torch.mm, and a write of
twice the L2 erases that, ``benchmarks/probes/probe_place.py``); candidates are interleaved round by round
(the order rotates each round; a sleep kernel opens each round, so no replay waits for the host), so clock
drift and thermal state hit all of them alike; the result is the
median per-launch time over the rounds. The SM clock, power and temperature are sampled during each
candidate's replay, every round (per candidate, and their run-wide median).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from .gpu import ClockSample, gpu_info, median_sample, sample_clocks


@dataclass
class Timing:
    name: str
    median_ms: float  # per launch
    min_ms: float
    max_ms: float
    launches_per_replay: int
    samples_ms: list[float] = field(default_factory=list)

    @property
    def spread(self) -> float:
        """(max - min) / median over the rounds: how much to trust a difference."""
        return (self.max_ms - self.min_ms) / self.median_ms if self.median_ms else math.inf


@dataclass
class TimingResult:
    timings: dict[str, Timing]
    clocks: ClockSample  # median over every sample of the run
    clocks_by_name: dict[str, ClockSample] = field(default_factory=dict)  # each candidate's own samples
    flush_bytes: int = 0  # the write before each timed replay (0: none; records say which protocol timed them)


def sets_for(bytes_per_set: int, l2_bytes: int, *, max_sets: int = 64) -> int:
    """How many input sets to rotate through so their total is at least twice the L2."""
    return max(1, min(max_sets, math.ceil(2 * l2_bytes / max(1, bytes_per_set))))


def _capture(fn: Callable[[int], None], n_sets: int, launches: int) -> torch.cuda.CUDAGraph:
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(launches):
            fn(i % n_sets)
    return g


def _replay_ms(g: torch.cuda.CUDAGraph) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def _per_launch_ms(fn: Callable[[int], None], n_sets: int) -> float:
    """GPU time of one launch, from a small graph (eager timing would measure Python's launch overhead)."""
    n = max(8, n_sets)
    g = _capture(fn, n_sets, n)
    g.replay()
    ms = min(_replay_ms(g) for _ in range(3)) / n
    del g
    return ms


ROUND_PAD_CYCLES = 2_000_000  # ~1-1.5 ms of GPU sleep before each round's first replay (time_interleaved)


def time_interleaved(candidates: dict[str, Callable[[int], None]], n_sets: int, *, replay_ms: float = 20.0,
                     rounds: int = 15, warmup_rounds: int = 2, max_launches: int = 4096,
                     lead_in: bool = False, flush_bytes: int | None = None) -> TimingResult:
    """Median per-launch time of each candidate. ``fn(i)`` launches one op on input set ``i``.

    What runs just before a timed replay (untimed, on the same stream): ``flush_bytes``, a write of that
    many bytes (one buffer zeroed; None, the default: twice the L2), so each candidate is timed after the
    same work; with 0 the previous candidate's replay. ``lead_in``: the candidate's own replay once more
    before the flush, if any (a probe's protocol, ``probe_place.py``).
    """
    graphs: dict[str, tuple[torch.cuda.CUDAGraph, int]] = {}
    expected_ms: dict[str, float] = {}
    side = torch.cuda.Stream()
    for name, fn in candidates.items():
        # Warm up outside capture (module load, cuBLAS handles and workspaces), on a side stream.
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i in range(min(3, n_sets)):
                fn(i)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        per = _per_launch_ms(fn, n_sets)
        n = max(1, min(max_launches, round(replay_ms / max(per, 1e-4))))
        graphs[name] = (_capture(fn, n_sets, n), n)
        expected_ms[name] = per * n
    torch.cuda.synchronize()
    for _ in range(warmup_rounds):
        for g, _n in graphs.values():
            g.replay()
    torch.cuda.synchronize()

    if flush_bytes is None:
        flush_bytes = 2 * gpu_info().l2_bytes
    flush = torch.empty(flush_bytes // 4, dtype=torch.int32, device="cuda") if flush_bytes > 0 else None
    names = list(graphs)
    samples: dict[str, list[float]] = {n: [] for n in names}
    clocks: dict[str, list[ClockSample]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        events = []
        # The GPU is idle after the last round's synchronize: a sleep kernel keeps it busy while the host queues
        # the round's first replay, so that replay does not start its timing waiting for the host.
        torch.cuda._sleep(ROUND_PAD_CYCLES)
        for name in order:
            g, n = graphs[name]
            if lead_in:
                g.replay()
            if flush is not None:
                flush.zero_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            g.replay()
            e.record()
            events.append((name, n, s, e))
            # Each candidate's own clock: sampled a little after its replay has started on the GPU. The
            # next candidate is enqueued while this replay still runs, so the GPU never waits for the host.
            clocks[name].append(sample_during(s, delay_s=min(0.005, expected_ms[name] / 4000)))
        torch.cuda.synchronize()
        for name, n, s, e in events:
            samples[name].append(s.elapsed_time(e) / n)
    out = {}
    for name in names:
        xs = samples[name]
        out[name] = Timing(name=name, median_ms=statistics.median(xs), min_ms=min(xs), max_ms=max(xs),
                           launches_per_replay=graphs[name][1], samples_ms=xs)
    del graphs
    every = [c for cs in clocks.values() for c in cs]
    return TimingResult(timings=out, clocks=median_sample(every),
                        clocks_by_name={n: median_sample(cs) for n, cs in clocks.items()}, flush_bytes=flush_bytes)


def sample_during(started, *, delay_s: float, poll_s: float = 5e-5, timeout_s: float = 10.0,
                  sampler: Callable[[], ClockSample] | None = None) -> ClockSample:
    """Clocks sampled ``delay_s`` after the GPU reaches the event ``started`` (so they are this work's).

    ``started`` is an event recorded just before the work; ``query()`` turns true when the GPU passes it.
    Gives up waiting after ``timeout_s`` and samples anyway (the sample is then merely less specific).
    """
    sampler = sampler or sample_clocks
    deadline = time.monotonic() + timeout_s
    while not started.query() and time.monotonic() < deadline:
        time.sleep(poll_s)
    if delay_s > 0:
        time.sleep(delay_s)
    return sampler()


# Eager calls --------------------------------------------------------------------------------------------

def eager_host_us(fn: Callable[[], object], *, calls: int = 100, rounds: int = 5,
                  busy_cycles: int = 150_000_000) -> float:
    """Host time of one call of ``fn`` in microseconds: the GPU is first given a sleep kernel of
    ``busy_cycles`` (75-115 ms at 1.3-2 GHz), so each call only queues its work and returns; ``calls``
    back-to-back calls over a wall clock, median over ``rounds``."""
    xs = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        torch.cuda._sleep(busy_cycles)
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        xs.append((time.perf_counter_ns() - t0) / calls / 1e3)
    torch.cuda.synchronize()
    return statistics.median(xs)


def eager_wall_us(fn: Callable[[], object], *, calls: int = 100, rounds: int = 5) -> float:
    """Eager wall time of one call in microseconds: ``calls`` back-to-back calls on an idle GPU and one
    synchronize (about the larger of the host time and the GPU time), median over ``rounds``."""
    xs = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        xs.append((time.perf_counter_ns() - t0) / calls / 1e3)
    return statistics.median(xs)
