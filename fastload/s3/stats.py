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
        self._unsent: deque[float] = deque(maxlen=latency_window)  # latencies since the last delta()
        self._sent: dict[str, Any] = _zero()
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
            self._unsent.clear()
            self._sent = _zero()

    def request_done(self, first_byte_s: float, nbytes: int) -> None:
        with self._lock:
            self.requests += 1
            self.bytes += nbytes
            self._latencies.append(first_byte_s)
            self._unsent.append(first_byte_s)

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

    def delta(self) -> dict[str, Any] | None:
        """What was counted since the last call (requests, bytes, retries, failures, throttles, hedges and
        the first-byte latencies), or None if nothing was: a DataLoader worker sends it with each batch so
        that the training process's counters include the workers' (:meth:`merge`)."""
        with self._lock:
            now: dict[str, Any] = {
                "requests": self.requests,
                "bytes": self.bytes,
                "failures": self.failures,
                "throttles": self.throttles,
                "retries": dict(self.retries),
                "hedges": dict(self.hedges),
            }
            sent, self._sent = self._sent, now
            latencies = list(self._unsent)
            self._unsent.clear()
        out: dict[str, Any] = {k: now[k] - sent[k] for k in ("requests", "bytes", "failures", "throttles")}
        for name in ("retries", "hedges"):
            before = sent[name]
            out[name] = {k: v - before.get(k, 0) for k, v in now[name].items() if v != before.get(k, 0)}
        out["latencies"] = latencies
        if not any(out.values()):
            return None
        return out

    def merge(self, delta: dict[str, Any]) -> None:
        """Add another process's :meth:`delta` to these counters (they are reported as one)."""
        with self._lock:
            self.requests += delta["requests"]
            self.bytes += delta["bytes"]
            self.failures += delta["failures"]
            self.throttles += delta["throttles"]
            self.retries.update(delta["retries"])
            self.hedges.update(delta["hedges"])
            self._latencies.extend(delta["latencies"])
            # a later delta() of this process includes them, as it includes the merged counts
            self._unsent.extend(delta["latencies"])

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


def _zero() -> dict[str, Any]:
    return {"requests": 0, "bytes": 0, "failures": 0, "throttles": 0, "retries": {}, "hedges": {}}
