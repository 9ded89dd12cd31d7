"""The process gate with real threads: never more than ``limit`` in flight; throttles shrink it, successes
grow it back."""

from __future__ import annotations

import threading
import time

import pytest

from fastload.s3.gate import ConcurrencyGate

JOIN_S = 10.0


class Meter:
    """Counts threads inside the gate and remembers the most seen at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.inside = 0
        self.most = 0

    def enter(self) -> None:
        with self._lock:
            self.inside += 1
            self.most = max(self.most, self.inside)

    def leave(self) -> None:
        with self._lock:
            self.inside -= 1


def crowd(gate: ConcurrencyGate, threads: int, hold_s: float, *, succeeded: bool = False) -> Meter:
    """``threads`` threads that each take a slot, hold it ``hold_s``, and give it back."""
    meter = Meter()
    start = threading.Barrier(threads)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            start.wait(JOIN_S)
            gate.acquire()
            meter.enter()
            time.sleep(hold_s)
            meter.leave()
            gate.release(succeeded=succeeded)
        except BaseException as exc:  # travels back to the test
            errors.append(exc)

    pool = [threading.Thread(target=work, daemon=True) for _ in range(threads)]
    for t in pool:
        t.start()
    deadline = time.monotonic() + JOIN_S
    for t in pool:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in pool), "threads still waiting on the gate"
    assert errors == []
    return meter


def started(target: object) -> tuple[threading.Thread, threading.Event]:
    done = threading.Event()

    def run() -> None:
        target()  # type: ignore[operator]
        done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, done


@pytest.mark.parametrize("limit", [1, 3, 8])
def test_never_more_than_limit_inside(limit: int) -> None:
    gate = ConcurrencyGate(limit)
    meter = crowd(gate, threads=4 * limit + 4, hold_s=0.01)
    assert meter.most == limit  # the gate bounds the crowd, and does not serialise it below the limit
    assert meter.inside == 0


def test_a_waiter_gets_in_as_soon_as_a_slot_frees() -> None:
    gate = ConcurrencyGate(1)
    gate.acquire()
    _, done = started(gate.acquire)
    assert not done.wait(0.1), "a second thread got past a full gate of 1"
    began = time.monotonic()
    gate.release()
    assert done.wait(JOIN_S)
    assert time.monotonic() - began < 0.4  # woken, not left to its 0.5 s poll
    gate.release()


def test_burst_of_throttles_halves_the_limit_once() -> None:
    gate = ConcurrencyGate(8)
    for _ in range(8):
        gate.acquire()
    for _ in range(8):
        gate.release(throttled=True)  # one burst: all within the 0.5 s cooldown
    assert gate.limit == 4
    time.sleep(0.55)
    gate.acquire()
    gate.release(throttled=True)
    assert gate.limit == 2


def test_after_throttle_fewer_get_in_then_successes_restore_the_limit() -> None:
    gate = ConcurrencyGate(8)
    gate.acquire()
    gate.release(throttled=True)
    assert gate.limit == 4
    meter = crowd(gate, threads=24, hold_s=0.01)  # plain releases: the limit stays put
    assert meter.most == 4
    assert gate.limit == 4
    # About 4 + 5 + 6 + 7 = 22 successes take it from 4 back to 8; give it plenty, it stops at 8.
    crowd(gate, threads=60, hold_s=0.001, succeeded=True)
    assert gate.limit == 8
    meter = crowd(gate, threads=40, hold_s=0.01)
    assert meter.most == 8


def test_a_lowered_limit_holds_back_new_requests_while_old_ones_drain() -> None:
    gate = ConcurrencyGate(4)
    for _ in range(4):
        gate.acquire()
    gate.release(throttled=True)  # limit 2, three still in flight
    assert gate.limit == 2
    _, done = started(gate.acquire)
    assert not done.wait(0.1)
    gate.release()  # two in flight: still at the limit
    assert not done.wait(0.1)
    gate.release()  # one in flight: room for one more
    assert done.wait(JOIN_S)
    gate.release()
    gate.release()
