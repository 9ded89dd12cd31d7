"""Additive-increase / multiplicative-decrease control of how many requests may be in flight.

Pure: the caller reports outcomes with the current time; the controller answers the new limit.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Aimd:
    """Concurrency limit that halves on throttling and grows back by one per ``limit`` successes.

    A burst of 503s from requests that were all in flight together counts as one congestion signal: after a
    decrease, further throttles within ``cooldown_s`` do not decrease again.
    """

    max_limit: int
    min_limit: int = 1
    decrease_factor: float = 0.5
    cooldown_s: float = 0.5
    limit: float = 0.0
    _last_decrease: float = float("-inf")

    def __post_init__(self) -> None:
        if not 1 <= self.min_limit <= self.max_limit:
            raise ValueError(f"need 1 <= min_limit ({self.min_limit}) <= max_limit ({self.max_limit})")
        if not 0 < self.decrease_factor < 1:
            raise ValueError(f"decrease_factor={self.decrease_factor} must be in (0, 1)")
        if self.limit == 0.0:
            self.limit = float(self.max_limit)

    @property
    def allowed(self) -> int:
        """Requests that may be in flight now."""
        return max(self.min_limit, min(self.max_limit, int(self.limit)))

    def on_success(self) -> int:
        self.limit = min(float(self.max_limit), self.limit + 1.0 / max(self.limit, 1.0))
        return self.allowed

    def on_throttle(self, now: float) -> int:
        if now - self._last_decrease >= self.cooldown_s:
            self.limit = max(float(self.min_limit), self.limit * self.decrease_factor)
            self._last_decrease = now
        return self.allowed
