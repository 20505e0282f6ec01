"""The ping-pong consumers' ring protocol (kernels/engine/gemm.cu, pipeline.cuh: Ring, RingCursor::skip,
Turns), emulated on the host with the mbarrier's parity semantics and random interleavings.

PTX ISA "mbarrier.try_wait.parity": a wait with parity P passes while the barrier's current (incomplete)
phase has the other parity. A waiter one phase ahead of the barrier therefore blocks, as it should; one
phase behind passes at once (it would read a slot before its loads land); two ahead blocks for ever. The
kernel relies on every wait being at most one phase ahead: the producer by walking the ring in order, a
consumer that skipped the other's k-steps by the turn it waits for. The emulation runs the producer (one
thread: acquire a slot, its loads complete later) and two consumers (wait for their turn, wait full, read,
release, pass the turn) as actors picked at random whenever they can move, checks that every k-step a
consumer reads is the one it expects and that the run never stalls, and shows that without the turns the
same emulation reads wrong slots.
"""
import random

import pytest


class Barrier:
    """An mbarrier: `count` arrivals complete the current phase."""

    def __init__(self, count: int):
        self.count, self.pending, self.phase = count, count, 0

    def passes(self, parity: int) -> bool:  # try_wait.parity
        return self.phase % 2 != parity

    def arrive(self):
        self.pending -= 1
        if self.pending == 0:
            self.phase, self.pending = self.phase + 1, self.count


class Cursor:
    """RingCursor: stage and parity; skip(n) flips the parity once per wrap."""

    def __init__(self, stages: int):
        self.stages, self.stage, self.phase = stages, 0, 0

    def advance(self):
        self.skip(1)

    def skip(self, n: int):
        s = self.stage + n
        self.phase ^= (s // self.stages) & 1
        self.stage = s % self.stages


def run(units: list[int], stages: int, seed: int, turns: bool = True) -> list[str]:
    """Emulate one CTA: `units` = k-steps of each work unit (consumer u % 2 takes unit u). Returns the
    errors (wrong k-step read, a stall), empty when the protocol held."""
    rng = random.Random(seed)
    full = [Barrier(1) for _ in range(stages)]
    empty = [Barrier(1) for _ in range(stages)]  # SLOT_READERS = 1 in ping-pong
    turn = [Barrier(1), Barrier(1)]
    slot_data = [None] * stages
    in_flight = []  # (slot, k-step id): loads issued, not landed
    steps = [(u, k) for u, n in enumerate(units) for k in range(n)]
    errors = []

    def producer():
        cur, i = Cursor(stages), 0
        while i < len(steps):
            if not empty[cur.stage].passes(cur.phase ^ 1):
                yield False
                continue
            in_flight.append((cur.stage, steps[i]))  # expect_tx + the TMA loads
            cur.advance()
            i += 1
            yield True

    def consumer(c):
        cur, parity = Cursor(stages), 0
        for u, n in enumerate(units):
            if u % 2 != c:
                cur.skip(n)
                continue
            if turns and u > 0:
                while not turn[c].passes(parity):
                    yield False
                parity ^= 1
            for k in range(n):
                while not full[cur.stage].passes(cur.phase):
                    yield False
                if slot_data[cur.stage] != (u, k):
                    errors.append(f"consumer {c} read {slot_data[cur.stage]} for {(u, k)}")
                empty[cur.stage].arrive()
                cur.advance()
                yield True
            if turns:
                turn[c ^ 1].arrive()

    def landing():
        while True:
            if in_flight and rng.random() < 0.5:
                slot, data = in_flight.pop(0)
                slot_data[slot] = data
                full[slot].arrive()
                yield True
            else:
                yield bool(in_flight)

    actors = {"producer": producer(), "c0": consumer(0), "c1": consumer(1), "tma": landing()}
    done = set()
    idle = 0
    while len(done) < 3:
        name = rng.choice([a for a in actors if a not in done])
        try:
            moved = next(actors[name])
        except StopIteration:
            done.add(name)
            continue
        idle = 0 if moved else idle + 1
        if idle > 400:
            errors.append(f"stalled: {sorted(set(actors) - done - {'tma'})} waiting")
            break
    return errors


CASES = [([5, 5, 5, 5], 4), ([1, 1, 1, 1, 1], 2), ([9, 2, 7, 1, 3, 8], 3), ([3], 6), ([2, 2], 9),
         ([16, 16, 16], 5), ([1, 7, 1, 7, 1], 4)]


@pytest.mark.parametrize("units,stages", CASES, ids=[f"{len(u)}units-{s}stages" for u, s in CASES])
def test_turns_keep_every_read_in_order(units, stages):
    for seed in range(40):
        assert run(units, stages, seed) == [], (units, stages, seed)


def test_random_unit_lengths_and_ring_depths():
    rng = random.Random(7)
    for seed in range(150):
        units = [rng.randint(1, 12) for _ in range(rng.randint(1, 7))]
        stages = rng.randint(2, 9)
        assert run(units, stages, seed) == [], (units, stages, seed)


def test_without_turns_a_consumer_reads_the_wrong_k_step():
    """The emulation can fail: the same protocol without the turns lets the second consumer wait on slots
    a phase behind (it skipped the first unit's k-steps) and read them before its own loads land."""
    assert any(run([6, 6, 6, 6], 3, seed, turns=False) for seed in range(40))
