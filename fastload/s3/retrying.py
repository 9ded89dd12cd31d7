"""The retry loop for one S3 request: attempt, classify, back off (policy from ``core.retry``), give up
with an error built by the caller. Sleep, clock and randomness are injected so tests run instantly."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError
from dataclasses import dataclass, field
from typing import TypeVar

from fastload.config import S3Config
from fastload.core.retry import Fault, RetryPolicy
from fastload.s3 import runtime
from fastload.s3.client import Failure, classify_exception, endpoint_key, fail_fast_error
from fastload.s3.gate import ConcurrencyGate
from fastload.s3.stats import S3Stats

T = TypeVar("T")
GiveUp = Callable[[Failure, int, float], Exception]
FAIL_FAST = (Fault.NOT_FOUND, Fault.DENIED, Fault.CLIENT)


def give_up_on(bucket: str, key: str, *, what: str, spent: GiveUp) -> GiveUp:
    """A ``give_up`` for :meth:`Retrier.call`: 404/403/4xx become :func:`fail_fast_error` (saying what to
    check for ``what``: "read", "list", "write to"); a spent budget becomes ``spent(failure, tries, s)``."""

    def give_up(failure: Failure, tries: int, elapsed_s: float) -> Exception:
        if failure.fault in FAIL_FAST:
            return fail_fast_error(failure, bucket, key, what=what)
        return spent(failure, tries, elapsed_s)

    return give_up


class BadResponse(Exception):
    """A response that broke the contract (wrong range, short body); carries its classified failure."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


@dataclass
class Retrier:
    """Runs attempts of one request under the process gate until success or the policy gives up; failures
    are counted in ``stats`` (this process's counters, when built by :meth:`from_config`)."""

    policy: RetryPolicy
    gate: ConcurrencyGate
    rng: random.Random = field(default_factory=random.Random)
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    stats: S3Stats = field(default_factory=S3Stats)
    # the endpoint requests go to, and the endpoints that ever answered (this process's, from from_config):
    # a refused connection to one never answered fails within seconds (RetryPolicy.unreachable_deadline_s)
    endpoint: str = ""
    answered: set[str] = field(default_factory=set)

    @classmethod
    def from_config(cls, config: S3Config, **kwargs: object) -> Retrier:
        policy = RetryPolicy(
            max_attempts=config.max_attempts,
            base_backoff_s=config.base_backoff_s,
            max_backoff_s=config.max_backoff_s,
            deadline_s=config.deadline_s,
        )
        process = runtime.current()
        kwargs.setdefault("stats", process.stats)
        kwargs.setdefault("endpoint", endpoint_key(config))
        kwargs.setdefault("answered", process.answered)
        return cls(policy, process.gate(config.process_max_concurrency), **kwargs)  # type: ignore[arg-type]

    def call(self, attempt: Callable[[], T], give_up: GiveUp, *, stop: threading.Event | None = None) -> T:
        """Result of the first successful ``attempt()``; ``give_up(failure, tries, elapsed_s)`` builds the
        error raised when a failure is not retryable or the budget is spent. Exceptions that are neither
        botocore/HTTP failures nor :class:`BadResponse` pass through untouched."""
        began = self.clock()
        tries = 0
        while True:
            if stop is not None and stop.is_set():
                raise CancelledError("request abandoned (the reader was closed or seeked away)")
            tries += 1
            self.gate.acquire()
            outcome = "error"
            cause: Exception
            try:
                try:
                    result = attempt()
                except BadResponse as exc:
                    failure, cause = exc.failure, exc
                except Exception as exc:
                    classified = classify_exception(exc)
                    if classified is None:
                        raise
                    failure, cause = classified, exc
                else:
                    outcome = "ok"
                    self.answered.add(self.endpoint)
                    return result
                if failure.status is not None:  # an HTTP response: the endpoint is there
                    self.answered.add(self.endpoint)
                if failure.fault is Fault.THROTTLE:
                    outcome = "throttle"
            finally:  # the slot is freed on every path, KeyboardInterrupt included
                self.gate.release(throttled=outcome == "throttle", succeeded=outcome == "ok")
            elapsed_s, answered = self.clock() - began, self.endpoint in self.answered
            delay = self.policy.decide(failure.fault, tries, elapsed_s, self.rng, answered=answered)
            self.stats.request_failed(failure.fault, retried=delay is not None)
            if delay is None:
                raise give_up(failure, tries, self.clock() - began) from cause
            if stop is not None and self.sleep is time.sleep:
                stop.wait(delay)  # woken early when the request is abandoned
            else:
                self.sleep(delay)
