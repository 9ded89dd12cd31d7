"""Which request gets which fault: faults, rules and a seeded, clock-injected plan.

Pure: the proxy passes ``now`` and owns the lock. A rule pairs one :class:`Fault` with a filter (method, key
substring, Range present) and a schedule (the next N matches, match numbers, a time window, a probability
drawn from a ``random.Random`` seeded from the plan's seed and the rule's serial number)::

    plan = FaultPlan(seed=7)
    plan.add(Rule(Fault.slowdown(), method="GET", key="shard-0003", times=2), now=0.0)
    plan.add(Rule(Fault.reset_mid_body(after_bytes=1000), has_range=True, nth={3, 7}), now=0.0)
    plan.add(Rule(Fault.internal_error(), for_s=5.0, probability=0.5), now=0.0)

Rules are consulted in the order added; the first one that fires decides the request's fault (one fault
per request). Every rule whose filter matches counts the request, fired or not, so ``nth`` numbers the
matching requests the proxy saw since the rule was added.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection
from dataclasses import KW_ONLY, dataclass, field
from typing import Literal, TypeVar, get_args
from urllib.parse import unquote, urlsplit

FaultKind = Literal[
    "slowdown",
    "internal_error",
    "request_timeout",
    "access_denied",
    "reset_before_response",
    "reset_mid_body",
    "truncate_body",
    "stall_mid_body",
    "hang",
    "ignore_range",
    "shift_range",
    "wrong_content_range",
    "latency",
    "bandwidth",
    "overwrite_before",
]
FAULT_KINDS: tuple[FaultKind, ...] = get_args(FaultKind)
_N = TypeVar("_N", int, float)


@dataclass(frozen=True)
class RequestInfo:
    """What a rule (or an ``overwrite_before`` callback) sees of a request."""

    number: int
    """1-based count of requests the proxy has read, over all connections."""
    method: str
    target: str
    """The request-target as sent, e.g. ``/bucket/key%20a?partNumber=1``."""
    headers: tuple[tuple[str, str], ...]

    @property
    def path(self) -> str:
        """The percent-decoded path without the query: ``/bucket/key a``."""
        return unquote(urlsplit(self.target).path)

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in reversed(self.headers) if k.lower() == name), None)

    @property
    def range(self) -> str | None:
        return self.header("range")


@dataclass(frozen=True)
class Fault:
    """One fault kind with its parameters; build it with a class method: ``Fault.hang(duration_s=5)``."""

    kind: FaultKind
    _: KW_ONLY
    after_bytes: int = 0
    """Body bytes sent before a mid-body fault (capped so at least one byte is withheld)."""
    duration_s: float = 0.0
    """How long ``stall_mid_body`` and ``hang`` keep the connection silent before closing it."""
    delay_s: float = 0.0
    shift_bytes: int = 0
    bytes_per_s: float = 0.0
    callback: Callable[[RequestInfo], object] | None = field(default=None, compare=False)

    @classmethod
    def slowdown(cls) -> Fault:
        """Answer 503 SlowDown (S3's XML body) without contacting the upstream."""
        return cls("slowdown")

    @classmethod
    def internal_error(cls) -> Fault:
        """Answer 500 InternalError without contacting the upstream."""
        return cls("internal_error")

    @classmethod
    def access_denied(cls) -> Fault:
        """Answer 403 AccessDenied without contacting the upstream (as S3 answers a HEAD of another
        account's bucket, or a request its policy refuses)."""
        return cls("access_denied")

    @classmethod
    def request_timeout(cls) -> Fault:
        """Answer 400 RequestTimeout and close the connection, as S3 does."""
        return cls("request_timeout")

    @classmethod
    def reset_before_response(cls) -> Fault:
        """Read the request, then reset the connection (RST) without contacting the upstream."""
        return cls("reset_before_response")

    @classmethod
    def reset_mid_body(cls, *, after_bytes: int = 0) -> Fault:
        """Forward the response head and ``after_bytes`` body bytes, then reset the connection."""
        return cls("reset_mid_body", after_bytes=_nonnegative("after_bytes", after_bytes))

    @classmethod
    def truncate_body(cls, *, after_bytes: int = 0) -> Fault:
        """Forward the head (full Content-Length) and ``after_bytes`` body bytes, then close cleanly (FIN)."""
        return cls("truncate_body", after_bytes=_nonnegative("after_bytes", after_bytes))

    @classmethod
    def stall_mid_body(cls, *, after_bytes: int = 0, duration_s: float = 10.0) -> Fault:
        """Forward the head and ``after_bytes`` body bytes, send nothing for ``duration_s``, then close."""
        return cls(
            "stall_mid_body",
            after_bytes=_nonnegative("after_bytes", after_bytes),
            duration_s=_nonnegative("duration_s", duration_s),
        )

    @classmethod
    def hang(cls, *, duration_s: float = 10.0) -> Fault:
        """Read the request and answer nothing for ``duration_s``, then close."""
        return cls("hang", duration_s=_nonnegative("duration_s", duration_s))

    @classmethod
    def ignore_range(cls) -> Fault:
        """Drop the Range header before forwarding: the upstream answers 200 with the whole object.

        Rewriting a request breaks its SigV4 signature; see the proxy's ``resign`` for servers that check.
        """
        return cls("ignore_range")

    @classmethod
    def shift_range(cls, *, shift_bytes: int) -> Fault:
        """Forward ``Range: bytes=a-b`` as ``bytes=(a+shift)-(b+shift)``; the 206 comes back unchanged.

        No effect on suffix (``bytes=-n``) or multi-range requests, or without Range.
        """
        if shift_bytes <= 0:
            raise ValueError(f"{shift_bytes=} must be > 0")
        return cls("shift_range", shift_bytes=shift_bytes)

    @classmethod
    def wrong_content_range(cls, *, shift_bytes: int = 1) -> Fault:
        """Forward normally, but make the response's Content-Range claim a range ``shift_bytes`` later.

        No effect on a response without Content-Range (a 200).
        """
        if shift_bytes == 0:
            raise ValueError(f"{shift_bytes=} must not be 0")
        return cls("wrong_content_range", shift_bytes=shift_bytes)

    @classmethod
    def latency(cls, *, delay_s: float) -> Fault:
        """Wait ``delay_s`` after the upstream's response head arrives, before forwarding it."""
        return cls("latency", delay_s=_nonnegative("delay_s", delay_s))

    @classmethod
    def bandwidth(cls, *, bytes_per_s: float) -> Fault:
        """Pace the response body to ``bytes_per_s`` (one token bucket per response)."""
        if bytes_per_s <= 0:
            raise ValueError(f"{bytes_per_s=} must be > 0")
        return cls("bandwidth", bytes_per_s=bytes_per_s)

    @classmethod
    def overwrite_before(cls, callback: Callable[[RequestInfo], object]) -> Fault:
        """Call ``callback(request)`` (e.g. one that overwrites the object upstream) before forwarding.

        The callback runs on a proxy thread; point its S3 client at the upstream, not at the proxy.
        """
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {callback!r}")
        return cls("overwrite_before", callback=callback)


def _nonnegative(name: str, value: _N) -> _N:
    if value < 0:
        raise ValueError(f"{name}={value} must be >= 0")
    return value


@dataclass(frozen=True)
class Rule:
    """A fault, which requests it may hit (all filters must match) and when it fires (all must hold).

    Without ``times``, ``nth`` or ``for_s`` the rule fires on every matching request until removed.
    """

    fault: Fault
    _: KW_ONLY
    method: str | None = None
    """HTTP method, e.g. ``"GET"``; None matches any."""
    key: str | None = None
    """A substring of the percent-decoded path (``/bucket/key``); None matches any."""
    has_range: bool | None = None
    """True: only requests with a Range header; False: only without; None: either."""
    where: Callable[[RequestInfo], bool] | None = field(default=None, compare=False)
    """Any further predicate on the request."""
    times: int | None = None
    """Fire at most this many times (the next N matching requests, with ``probability=1``)."""
    nth: Collection[int] | None = None
    """Fire only on these matching requests, counted from 1 since the rule was added (e.g. ``{3, 7}``)."""
    for_s: float | None = None
    """Fire only within this many seconds after the rule was added (a storm)."""
    from_first: bool = False
    """With ``for_s``: the window starts at the first matching request, not when the rule was added (a
    storm of known length however late the first request comes, e.g. from a client on a loaded machine)."""
    probability: float = 1.0
    """Fire on each otherwise eligible request with this probability, drawn from the rule's seeded RNG."""

    def __post_init__(self) -> None:
        if self.method is not None:
            object.__setattr__(self, "method", self.method.upper())
        if self.nth is not None:
            nth = frozenset(self.nth)
            if not nth or min(nth) < 1:
                raise ValueError(f"nth={sorted(nth)} must be non-empty request numbers >= 1")
            object.__setattr__(self, "nth", nth)
        if self.times is not None and self.times < 1:
            raise ValueError(f"times={self.times} must be >= 1 (remove the rule instead)")
        if self.for_s is not None and self.for_s <= 0:
            raise ValueError(f"for_s={self.for_s} must be > 0")
        if self.from_first and self.for_s is None:
            raise ValueError("from_first=True needs for_s (the window it starts)")
        if not 0.0 <= self.probability <= 1.0:
            raise ValueError(f"probability={self.probability} must be within [0, 1]")

    def matches(self, request: RequestInfo) -> bool:
        """Whether the request passes this rule's filters (not its schedule)."""
        if self.method is not None and request.method != self.method:
            return False
        if self.key is not None and self.key not in request.path:
            return False
        if self.has_range is not None and (request.range is not None) != self.has_range:
            return False
        return self.where is None or bool(self.where(request))


class ActiveRule:
    """A rule added to a plan, with its counters: ``matched`` requests and ``fired`` faults."""

    def __init__(self, rule: Rule, *, serial: int, added_at: float, seed: int) -> None:
        self.rule = rule
        self.serial = serial
        self.added_at = added_at
        self.matched = 0
        self.fired = 0
        self.first_at: float | None = None  # when the first matching request came
        self._rng = random.Random(f"{seed}:{serial}")

    def _fires(self, now: float) -> bool:
        rule = self.rule
        if rule.times is not None and self.fired >= rule.times:
            return False
        if rule.nth is not None and self.matched not in rule.nth:
            return False
        began = self.first_at if rule.from_first and self.first_at is not None else self.added_at
        if rule.for_s is not None and now - began >= rule.for_s:
            return False
        return rule.probability >= 1.0 or self._rng.random() < rule.probability

    @property
    def done(self) -> bool:
        """True once the schedule can never fire again (times spent, past the last nth)."""
        rule = self.rule
        spent = rule.times is not None and self.fired >= rule.times
        return spent or (rule.nth is not None and self.matched >= max(rule.nth))

    def __repr__(self) -> str:
        kind, serial = self.rule.fault.kind, self.serial
        return f"ActiveRule({kind}, {serial=}, matched={self.matched}, fired={self.fired})"


class FaultPlan:
    """An ordered list of active rules; :meth:`decide` picks at most one fault per request."""

    def __init__(self, *, seed: int = 0) -> None:
        self.seed = seed
        self._rules: list[ActiveRule] = []
        self._serial = 0

    def add(self, rule: Rule, *, now: float) -> ActiveRule:
        self._serial += 1
        active = ActiveRule(rule, serial=self._serial, added_at=now, seed=self.seed)
        self._rules.append(active)
        return active

    def remove(self, active: ActiveRule) -> None:
        if active in self._rules:
            self._rules.remove(active)

    def clear(self) -> None:
        self._rules.clear()

    @property
    def rules(self) -> tuple[ActiveRule, ...]:
        return tuple(self._rules)

    def decide(self, request: RequestInfo, *, now: float) -> ActiveRule | None:
        """The rule whose fault this request gets, or None; advances the counters of matching rules."""
        chosen = None
        for active in self._rules:
            if not active.rule.matches(request):
                continue
            active.matched += 1
            if active.first_at is None:
                active.first_at = now
            if chosen is None and active._fires(now):
                active.fired += 1
                chosen = active
        return chosen
