"""S3 counters: requests, bytes, retries by cause, throttles, concurrency, latency percentiles, hedged
requests (this process's are in :mod:`fastload.s3.runtime`)."""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from typing import Any

from fastload.core.retry import Fault


class S3Stats:
    """Thread-safe counters shared by every reader and writer in the process."""

    def __init__(self, latency_window: int = 10_000) -> None:
        self._lock = threading.Lock()
        self._latencies: deque[float] = deque(maxlen=latency_window)
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.requests = 0
            self.bytes = 0
            self.retries: Counter[str] = Counter()
            self.failures = 0
            self.throttles = 0
            self.concurrency_limit = 0
            self.in_flight = 0
            self.last_throttle_at: float | None = None  # time.monotonic() of the last 503/429
            self.hedges: Counter[str] = Counter()
            self._latencies.clear()

    def request_done(self, first_byte_s: float, nbytes: int) -> None:
        with self._lock:
            self.requests += 1
            self.bytes += nbytes
            self._latencies.append(first_byte_s)

    def request_failed(self, fault: Fault, *, retried: bool) -> None:
        with self._lock:
            self.requests += 1
            if fault is Fault.THROTTLE:
                self.throttles += 1
                self.last_throttle_at = time.monotonic()
            if retried:
                self.retries[fault.value] += 1
            else:
                self.failures += 1

    def throttled(self) -> None:
        """A 503/429 outside the retry loop (a hedge): counted, and it holds hedging back."""
        with self._lock:
            self.throttles += 1
            self.last_throttle_at = time.monotonic()

    def hedge_event(self, **counts: int) -> None:
        """Add to the hedge counters (``sent``, ``won``, ``wasted_bytes``, ``suppressed_throttle``, ...)."""
        with self._lock:
            self.hedges.update(counts)

    def add_bytes(self, nbytes: int) -> None:
        with self._lock:
            self.bytes += nbytes

    def set_concurrency(self, limit: int, in_flight: int) -> None:
        self.concurrency_limit = limit
        self.in_flight = in_flight

    def snapshot(self) -> dict[str, Any]:
        """All counters as a plain dict (latency percentiles in milliseconds)."""
        with self._lock:
            lat = sorted(self._latencies)
            pct = {}
            for p in (50, 90, 99):
                pct[f"p{p}_ms"] = (
                    round(1000 * lat[min(len(lat) - 1, len(lat) * p // 100)], 2) if lat else None
                )
            return {
                "requests": self.requests,
                "bytes": self.bytes,
                "retries": dict(self.retries),
                "retries_total": sum(self.retries.values()),
                "failures": self.failures,
                "throttles": self.throttles,
                "concurrency_limit": self.concurrency_limit,
                "in_flight": self.in_flight,
                "first_byte_latency": pct,
                "hedges": {
                    name: self.hedges.get(name, 0)
                    for name in (
                        "sent",
                        "gets",
                        "stranded",
                        "won",
                        "failed",
                        "wasted_bytes",
                        "cut",
                        "suppressed_throttle",
                        "suppressed_budget",
                    )
                },
            }
