"""A process-wide gate on requests in flight, sized by the AIMD controller (fork-safe)."""

from __future__ import annotations

import os
import threading
import time

from fastload.core.throttle import Aimd
from fastload.s3.stats import STATS


class ConcurrencyGate:
    """Blocks ``acquire`` while the in-flight count is at the current AIMD limit."""

    def __init__(self, max_limit: int) -> None:
        self._cond = threading.Condition()
        self._aimd = Aimd(max_limit=max_limit)
        self._in_flight = 0

    @property
    def limit(self) -> int:
        return self._aimd.allowed

    def acquire(self) -> None:
        with self._cond:
            while self._in_flight >= self._aimd.allowed:
                self._cond.wait(0.5)
            self._in_flight += 1
            STATS.set_concurrency(self._aimd.allowed, self._in_flight)

    def release(self, *, throttled: bool = False, succeeded: bool = False) -> None:
        with self._cond:
            self._in_flight -= 1
            if throttled:
                self._aimd.on_throttle(time.monotonic())
            elif succeeded:
                self._aimd.on_success()
            STATS.set_concurrency(self._aimd.allowed, self._in_flight)
            self._cond.notify_all()


_gates: dict[tuple[int, int], ConcurrencyGate] = {}
_lock = threading.Lock()


def process_gate(max_limit: int) -> ConcurrencyGate:
    """The gate shared by all readers of this process (a new one after fork)."""
    ident = (os.getpid(), max_limit)
    with _lock:
        gate = _gates.get(ident)
        if gate is None:
            gate = _gates[ident] = ConcurrencyGate(max_limit)
        return gate
