"""A gate on requests in flight, sized by the AIMD controller; this process's gates are in
:mod:`fastload.s3.runtime` (one per limit, shared by every reader)."""

from __future__ import annotations

import threading
import time

from fastload.core.throttle import Aimd
from fastload.s3.stats import S3Stats


class ConcurrencyGate:
    """Blocks ``acquire`` while the in-flight count is at the current AIMD limit; reports the limit and the
    count to ``stats``."""

    def __init__(self, max_limit: int, *, stats: S3Stats | None = None) -> None:
        self._cond = threading.Condition()
        self._aimd = Aimd(max_limit=max_limit)
        self._in_flight = 0
        self._stats = stats if stats is not None else S3Stats()

    @property
    def limit(self) -> int:
        return self._aimd.allowed

    def acquire(self) -> None:
        with self._cond:
            while self._in_flight >= self._aimd.allowed:
                self._cond.wait(0.5)
            self._in_flight += 1
            self._stats.set_concurrency(self._aimd.allowed, self._in_flight)

    def release(self, *, throttled: bool = False, succeeded: bool = False) -> None:
        with self._cond:
            self._in_flight -= 1
            if throttled:
                self._aimd.on_throttle(time.monotonic())
            elif succeeded:
                self._aimd.on_success()
            self._stats.set_concurrency(self._aimd.allowed, self._in_flight)
            self._cond.notify_all()
