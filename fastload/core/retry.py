"""Retry policy: classify a failed request, decide whether to retry, and how long to wait (full jitter).

Pure: the caller passes the attempt number, the elapsed time and a random number generator.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum


class Fault(Enum):
    """Why a request failed, as far as retrying is concerned."""

    THROTTLE = "throttle"  # 503 SlowDown / 429 / ServiceUnavailable
    SERVER = "server"  # 500, 502, 504, InternalError
    TIMEOUT = "timeout"  # RequestTimeout from the server, or no bytes for read_timeout (stall / hang)
    CONNECTION = "connection"  # reset, closed before or during the response
    UNREACHABLE = "unreachable"  # refused or no route/host at connect: nothing listens at the endpoint
    SHORT_BODY = "short_body"  # fewer body bytes than promised
    BAD_RANGE = "bad_range"  # a response that breaks the range contract (wrong Content-Range, ...)
    CHANGED = "changed"  # 412 Precondition Failed: the object changed (ETag no longer matches)
    NOT_FOUND = "not_found"  # 404 NoSuchKey / NoSuchBucket
    DENIED = "denied"  # 401 / 403
    CLIENT = "client"  # other 4xx: a bad request that will not get better


RETRYABLE = frozenset(
    {
        Fault.THROTTLE,
        Fault.SERVER,
        Fault.TIMEOUT,
        Fault.CONNECTION,
        Fault.UNREACHABLE,
        Fault.SHORT_BODY,
        Fault.BAD_RANGE,
    }
)

_THROTTLE_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TooManyRequests",
    "ServiceUnavailable",
}
_TIMEOUT_CODES = {"RequestTimeout", "RequestTimeoutException"}
_SERVER_CODES = {"InternalError", "ServiceUnavailable"}


def classify_status(status: int, code: str | None = None) -> Fault:
    """Fault for an HTTP error status and S3 error code."""
    if code in _THROTTLE_CODES or status in (429, 503):
        return Fault.THROTTLE
    if code in _TIMEOUT_CODES:
        return Fault.TIMEOUT
    if status == 412 or code == "PreconditionFailed":
        return Fault.CHANGED
    if status >= 500 or code in _SERVER_CODES:
        return Fault.SERVER
    if status == 404 or code in ("NoSuchKey", "NoSuchBucket", "NotFound"):
        return Fault.NOT_FOUND
    if status in (401, 403):
        return Fault.DENIED
    return Fault.CLIENT


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """Bounds and backoff for retrying one request (one byte range).

    Delay before retry ``n`` (1-based) is uniform in ``[0, min(max_backoff_s, base_backoff_s * 2**(n-1))]``
    (full jitter). Retrying stops after ``max_attempts`` attempts or once ``deadline_s`` has passed since the
    first attempt, whichever comes first. The defaults ride out a 5-10 s storm of 503 SlowDown.

    An endpoint that refuses connections and has never answered (a wrong ``AWS_ENDPOINT_URL``, a server not
    started) is retried only for ``unreachable_deadline_s`` (a server still starting gets that long): one
    that answered before is retried as any other fault (a restart, a load balancer swapping backends).
    """

    max_attempts: int = 20
    base_backoff_s: float = 0.05
    max_backoff_s: float = 4.0
    deadline_s: float = 120.0
    unreachable_deadline_s: float = 3.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts={self.max_attempts} must be >= 1")
        if self.base_backoff_s < 0 or self.max_backoff_s < self.base_backoff_s:
            raise ValueError(
                f"need 0 <= base_backoff_s ({self.base_backoff_s}) <= max_backoff_s ({self.max_backoff_s})"
            )
        if self.deadline_s <= 0 or self.unreachable_deadline_s <= 0:
            raise ValueError(f"{self.deadline_s=} and {self.unreachable_deadline_s=} must be > 0")

    def backoff(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based), full jitter."""
        cap = min(self.max_backoff_s, self.base_backoff_s * 2 ** min(attempt - 1, 60))
        return rng.uniform(0.0, cap)

    def decide(
        self, fault: Fault, attempt: int, elapsed_s: float, rng: random.Random, *, answered: bool = True
    ) -> float | None:
        """Seconds to wait before the next attempt, or None to give up now. ``answered``: whether the
        endpoint has ever answered a request (in this process)."""
        if fault not in RETRYABLE or attempt >= self.max_attempts:
            return None
        delay = self.backoff(attempt, rng)
        deadline_s = self.deadline_s
        if fault is Fault.UNREACHABLE and not answered:
            deadline_s = min(deadline_s, self.unreachable_deadline_s)
        if elapsed_s + delay >= deadline_s:
            return None
        return delay
