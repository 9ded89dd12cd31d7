"""Tail tolerance: what a GET of ``n`` bytes normally costs on this endpoint, the deadlines that follow, and
when a lagging request gets a second ("hedged") GET for its remaining bytes.

Pure: the caller feeds :class:`LatencyModel` with finished requests and passes ``now``; it owns the clock,
the threads and the lock. The rules (AWS's S3 guidance: track latency, retry the slowest requests early,
on a new connection):

- **deadlines** adapt to the endpoint: the first-byte deadline is ``multiplier x`` the p99 first-byte time,
  the progress deadline ``multiplier x`` the p99 of the longest wait for a body piece in a request (before
  such waits are known: the time one piece takes at the slow (p5) per-connection throughput), the
  completion deadline of ``n`` bytes ``multiplier x`` its predicted p95 time (p95 first byte + ``n`` / p5
  throughput). Each is bounded below by ``floor_s`` and above by ``ceiling_s`` (``read_timeout_s``, which
  stays the hard limit of a silent socket). A cold model (too few samples) gives ``cold_factor x floor_s``
  (0.5 s by default) until it knows this endpoint.
- **patience** (:class:`Patience`) stretches every deadline when hedges keep losing to the GETs they
  hedged (sent too early: the endpoint, or a busy machine's scheduling, is slower than the model says) and
  shrinks back when hedges win (a real stall), so a loaded but healthy setup stops hedging on its own.
- **stranded**: a request without a response head is given only ``multiplier x`` the *median* first-byte
  time when no request its reader still waits for has a head and at least ``STRANDED_RATIO x`` as many
  GETs of that reader as there are such silent ones have finished since its range was first asked for
  (:func:`stranded`: its reader's other GETs, sent with it, came back whole; a busy machine delays them all
  alike, a stall only a few). Its reader is idle meanwhile, so an early hedge costs little.
- **starvation is not lag** (:class:`Starvation`): time this process did not run (its watchdog woke late:
  a loaded machine, another job's burst, a GIL held) is not counted against a request; after 300 ms off
  the CPU every GET in flight looks 300 ms late, though none lagged, and hedging them all would double the
  requests and help none.
- **hedge** a request that has passed one of them, unless the endpoint throttled within
  ``throttle_quiet_s`` (503s: the AIMD gate is in charge, more requests would make it worse), the budget
  is spent (at most ``burst + max_fraction x requests`` hedges) or the request already has ``max_hedges``.
- **split**: the hedge of a request without a response head fetches its remaining bytes as up to
  ``max_split`` concurrent ranges of at least ``split_min_bytes``, so many that each takes about one median
  first-byte time at the median per-connection throughput (:meth:`Deadlines.pieces`): a stalled part is
  usually the last its reader waits for, and one connection moves only so many bytes per second. Every
  range is a GET that can stall too, which is why ``max_split`` is 2: with 5% of GETs stalling (the tail
  benchmark), 3-4 ranges failed a sixth of the split hedges and gained nothing overall; 2 did better.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from itertools import pairwise

from fastload.core.ranges import ByteRange

PIECE_BYTES = 256 << 10  # what one body read asks for; progress is seen (and a stall loses at most) a piece
STRANDED_RATIO = 3  # finished GETs per silent one before a reader's silent GETs count as stranded
STARVED_MIN_S = 0.05  # a watchdog waking later than this did not run for the excess (GIL waits are shorter)


def size_class(nbytes: int) -> int:
    """Requests are modelled by size in powers of 4 (64 KiB, 256 KiB, 1 MiB, 4 MiB, ... share a class)."""
    return max(0, (max(nbytes, 1).bit_length() - 1) // 2)


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of sorted ``values`` (nearest rank); ``values`` must not be empty."""
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


class LatencyModel:
    """First-byte times (all requests) and per-connection throughput (by size class) of finished GETs, the
    last ``window`` of each. Not thread-safe: the caller holds a lock."""

    def __init__(self, window: int = 512, min_samples: int = 16) -> None:
        if window < 1 or min_samples < 1:
            raise ValueError(f"{window=} and {min_samples=} must be >= 1")
        self.window, self.min_samples = window, min_samples
        self._first: deque[float] = deque(maxlen=window)
        self._rates: dict[int, deque[float]] = {}
        self._all_rates: deque[float] = deque(maxlen=window)
        self._gaps: deque[float] = deque(maxlen=window)
        self._sorted: dict[object, list[float]] = {}
        self.observed = 0

    def observe(
        self, nbytes: int, first_byte_s: float, total_s: float, max_gap_s: float | None = None
    ) -> None:
        """One finished GET: ``nbytes`` of body, its response head after ``first_byte_s``, done after
        ``total_s`` (both from sending the request), the longest wait for a body piece ``max_gap_s``."""
        self.observed += 1
        self._first.append(max(0.0, first_byte_s))
        if max_gap_s is not None:
            self._gaps.append(max(0.0, max_gap_s))
        body_s = max(total_s - first_byte_s, 1e-6)
        if nbytes >= PIECE_BYTES // 4:  # tiny bodies say little about a connection's speed
            rate = nbytes / body_s
            self._rates.setdefault(size_class(nbytes), deque(maxlen=self.window)).append(rate)
            self._all_rates.append(rate)
        self._sorted.clear()

    def _quantile(self, key: object, samples: deque[float], q: float) -> float | None:
        if len(samples) < self.min_samples:
            return None
        ordered = self._sorted.get(key)
        if ordered is None:
            ordered = self._sorted[key] = sorted(samples)
        return quantile(ordered, q)

    def first_byte_s(self, q: float) -> float | None:
        """The ``q`` quantile of first-byte times, or None while too few are known."""
        return self._quantile("first", self._first, q)

    def gap_s(self, q: float) -> float | None:
        """The ``q`` quantile of the longest wait for a body piece per request, or None while too few."""
        return self._quantile("gap", self._gaps, q)

    def rate(self, nbytes: int, q: float) -> float | None:
        """The ``q`` quantile of per-connection throughput (bytes/s) for requests of about ``nbytes`` (of
        every size when that class has too few samples), or None while too few are known."""
        cls = size_class(nbytes)
        own = self._rates.get(cls)
        if own is not None and len(own) >= self.min_samples:
            return self._quantile(cls, own, q)
        return self.all_rates(q)

    def slow_rates(self, q: float) -> dict[int, float]:
        """The ``q`` quantile of throughput of every size class with enough samples."""
        out = {}
        for cls, samples in self._rates.items():
            value = self._quantile(cls, samples, q)
            if value is not None:
                out[cls] = value
        return out

    def all_rates(self, q: float) -> float | None:
        """The ``q`` quantile of throughput over every size."""
        return self._quantile("rate", self._all_rates, q)

    def predict_s(self, nbytes: int, q: float = 0.95) -> float | None:
        """Seconds a GET of ``nbytes`` takes at the ``q`` quantile (slow first byte + slow throughput)."""
        first = self.first_byte_s(q)
        if first is None:
            return None
        if nbytes <= 0:
            return first
        rate = self.rate(nbytes, 1.0 - q)
        return None if rate is None else first + nbytes / rate


@dataclass(frozen=True, kw_only=True)
class HedgePolicy:
    """Bounds of the adaptive deadlines and of hedging (see the module docstring)."""

    floor_s: float = 0.1
    ceiling_s: float = 10.0
    multiplier: float = 3.0
    cold_factor: float = 10.0
    max_fraction: float = 0.05
    burst: int = 3
    max_hedges: int = 2
    throttle_quiet_s: float = 2.0
    max_split: int = 2
    split_min_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if not 0 < self.floor_s <= self.ceiling_s:
            raise ValueError(f"need 0 < floor_s ({self.floor_s}) <= ceiling_s ({self.ceiling_s})")
        if self.multiplier < 1 or self.cold_factor < 1:
            raise ValueError(f"{self.multiplier=} and {self.cold_factor=} must be >= 1")
        if not 0 <= self.max_fraction <= 1:
            raise ValueError(f"max_fraction={self.max_fraction} must be within [0, 1]")
        if self.burst < 0 or self.max_hedges < 0 or self.throttle_quiet_s < 0:
            raise ValueError(f"{self.burst=}, {self.max_hedges=} and {self.throttle_quiet_s=} must be >= 0")
        if self.max_split < 1 or self.split_min_bytes < 1:
            raise ValueError(f"{self.max_split=} and {self.split_min_bytes=} must be >= 1")

    @property
    def enabled(self) -> bool:
        return self.max_fraction > 0 and self.max_hedges > 0

    def bound(self, seconds: float | None) -> float:
        """``multiplier x seconds`` within the bounds; the cold deadline when ``seconds`` is unknown."""
        if seconds is None:
            return min(self.ceiling_s, self.cold_factor * self.floor_s)
        return min(self.ceiling_s, max(self.floor_s, self.multiplier * seconds))


class Patience:
    """How many times the model's deadline of each kind (:class:`Lag`) a lagging request is given:
    ``grow`` x after a hedge of that kind the original GET beat, ``shrink`` x after one that won, within
    ``[1, most]`` (by kind: hedges of slow but healthy transfers that lose must not delay the rescue of
    silent ones). Not thread-safe."""

    def __init__(self, *, grow: float = 2.0, shrink: float = 0.5, most: float = 8.0) -> None:
        if grow < 1 or not 0 < shrink <= 1 or most < 1:
            raise ValueError(f"need {grow=} >= 1, 0 < {shrink=} <= 1, {most=} >= 1")
        self.grow, self.shrink, self.most = grow, shrink, most
        self.factors: dict[Lag, float] = dict.fromkeys(Lag, 1.0)

    def hedge_ended(self, why: Lag, *, won: bool) -> None:
        """A race hedged because it lagged ``why`` closed: ``won`` when a hedge had the bytes first."""
        f = self.factors[why]
        self.factors[why] = max(1.0, f * self.shrink) if won else min(self.most, f * self.grow)


@dataclass(frozen=True)
class Deadlines:
    """Seconds a request may take before it counts as lagging: to its response head (``stranded_s`` when
    its reader waits for nothing else, see the module docstring), between two body pieces, and
    (:meth:`completion_s`) in all for its size."""

    first_byte_s: float
    progress_s: float
    policy: HedgePolicy
    first_byte_p95_s: float | None
    slow_rates: dict[int, float]  # p5 throughput by size class (classes with enough samples)
    slow_rate: float | None  # p5 throughput over every size
    slow_stretch: float = 1.0  # the patience for Lag.SLOW (the others are in first_byte_s, progress_s)
    stranded_s: float | None = None  # None: no shorter first-byte deadline for a stranded request
    bytes_per_first_byte: float | None = None  # median throughput x median first-byte time

    def pieces(self, nbytes: int) -> int:
        """How many concurrent ranges the hedge of a request without a head uses for ``nbytes`` (see the
        module docstring; 1 while the model does not know this endpoint)."""
        policy, per = self.policy, self.bytes_per_first_byte
        most = min(policy.max_split, nbytes // policy.split_min_bytes)
        if most <= 1 or per is None:
            return 1
        return max(1, min(most, math.ceil(nbytes / max(per, 1.0))))

    def completion_s(self, nbytes: int) -> float:
        rate = self.slow_rates.get(size_class(nbytes), self.slow_rate)
        first = self.first_byte_p95_s
        seconds = self.policy.bound(None if first is None or rate is None else first + nbytes / rate)
        return min(self.policy.ceiling_s, seconds * self.slow_stretch)


def deadlines(
    model: LatencyModel, policy: HedgePolicy, stretch: Mapping[Lag, float] | None = None
) -> Deadlines:
    """The deadlines ``model`` and ``policy`` give now, each ``stretch[kind]`` x (the :class:`Patience`
    factors; none: 1) within the ceiling (compute once per check, not per request)."""
    times = stretch or {}
    gap = model.gap_s(0.99)
    if gap is None:
        slow_rate = model.rate(PIECE_BYTES, 0.05)
        gap = None if slow_rate is None else PIECE_BYTES / slow_rate
    median_first, median_rate = model.first_byte_s(0.5), model.all_rates(0.5)
    stranded = per_first = None
    if median_first is not None:
        stranded = min(policy.ceiling_s, policy.bound(median_first) * times.get(Lag.STRANDED, 1))
        per_first = None if median_rate is None else median_rate * median_first
    return Deadlines(
        first_byte_s=min(
            policy.ceiling_s, policy.bound(model.first_byte_s(0.99)) * times.get(Lag.FIRST_BYTE, 1)
        ),
        progress_s=min(policy.ceiling_s, policy.bound(gap) * times.get(Lag.STALLED, 1)),
        policy=policy,
        first_byte_p95_s=model.first_byte_s(0.95),
        slow_rates=model.slow_rates(0.05),
        slow_rate=model.all_rates(0.05),
        slow_stretch=times.get(Lag.SLOW, 1),
        stranded_s=stranded,
        bytes_per_first_byte=per_first,
    )


class Starvation:
    """Seconds this process did not run, as its watchdog's late wake-ups show (see the module docstring):
    the caller notes each sleep (:meth:`slept`, on one thread) and shifts a request's times by
    :meth:`since` before asking :func:`lag`, so a request is only late by time the process was running."""

    def __init__(self, keep: int = 512) -> None:
        self.total = 0.0
        self._woke: list[float] = []  # when each late wake-up ended ...
        self._totals: list[float] = []  # ... and the total after it
        self._base = 0.0  # the total before the oldest kept wake-up
        self._keep = keep

    def slept(self, asked_s: float, began: float, woke: float) -> None:
        """A sleep of ``asked_s`` that began at ``began`` ended at ``woke``."""
        late = woke - began - asked_s - STARVED_MIN_S
        if late <= 0:
            return
        self.total += late
        self._woke.append(woke)
        self._totals.append(self.total)
        if len(self._woke) > 2 * self._keep:  # forget the oldest (requests do not live that long)
            self._base = self._totals[-self._keep - 1]
            del self._woke[: -self._keep], self._totals[: -self._keep]

    def since(self, t: float) -> float:
        """Seconds of starvation noted after ``t`` (a wake-up that ended after ``t`` counts whole)."""
        i = bisect_right(self._woke, t)
        return self.total - (self._totals[i - 1] if i else self._base)

    def excuse(self, flight: Flight) -> Flight:
        """``flight`` with its send and last-progress times moved later by the starvation since each."""
        if not self._woke:
            return flight
        return Flight(
            flight.sent_at + self.since(flight.sent_at),
            flight.head_at,
            flight.progress_at + self.since(flight.progress_at),
            flight.nbytes,
            flight.stranded,
        )


def split_range(whole: ByteRange, pieces: int) -> list[ByteRange]:
    """``whole`` cut into ``pieces`` consecutive ranges that differ by at most a byte (fewer when it is
    shorter than ``pieces`` bytes): what a split hedge asks for, each piece on a connection of its own."""
    count = max(1, min(pieces, whole.length))
    cuts = [whole.start + whole.length * i // count for i in range(count + 1)]
    return [ByteRange(a, b) for a, b in pairwise(cuts)]


def stranded(*, finished: int, silent: int, answered: int) -> bool:
    """Whether a reader's silent requests (``silent`` open ones without a response head; ``answered``:
    open ones with one) are stranded, ``finished`` of its GETs having finished since the one asked about
    was first sent (see the module docstring)."""
    return answered == 0 and silent > 0 and finished >= STRANDED_RATIO * silent


class Lag(Enum):
    """Why a request lags."""

    FIRST_BYTE = "first_byte"  # no response head by the first-byte deadline
    STRANDED = "stranded"  # no response head by the (shorter) deadline of a stranded request
    STALLED = "stalled"  # no body bytes for the progress deadline
    SLOW = "slow"  # past the completion deadline of its size


@dataclass(frozen=True)
class Flight:
    """What a check sees of the newest request for one byte range (the original GET or its last hedge):
    when it was sent, when its head and its last body bytes arrived, the bytes it asked for, and whether
    it is :func:`stranded`)."""

    sent_at: float
    head_at: float | None
    progress_at: float
    nbytes: int
    stranded: bool = False


def lag(flight: Flight, now: float, limits: Deadlines) -> Lag | None:
    """Why ``flight`` lags at ``now``, or None if it does not."""
    if flight.head_at is None:
        waited = now - flight.sent_at
        if waited > limits.first_byte_s:
            return Lag.FIRST_BYTE
        stranded = flight.stranded and limits.stranded_s is not None and waited > limits.stranded_s
        return Lag.STRANDED if stranded else None
    if now - flight.progress_at > limits.progress_s:
        return Lag.STALLED
    if now - flight.sent_at > limits.completion_s(flight.nbytes):
        return Lag.SLOW
    return None


class Verdict(Enum):
    """The answer for a lagging request."""

    HEDGE = "hedge"
    THROTTLED = "throttled"  # not while the endpoint throttles
    NO_BUDGET = "no_budget"  # hedges would pass max_fraction of requests
    ENOUGH = "enough"  # this request has max_hedges already


def decide(
    policy: HedgePolicy,
    *,
    now: float,
    last_throttle_at: float | None,
    requests: int,
    hedges: int,
    hedges_of_this: int,
) -> Verdict:
    """Whether a lagging request gets a hedge now: ``requests`` and ``hedges`` sent so far by the process,
    ``hedges_of_this`` by this request."""
    if last_throttle_at is not None and now - last_throttle_at < policy.throttle_quiet_s:
        return Verdict.THROTTLED
    if hedges_of_this >= policy.max_hedges:
        return Verdict.ENOUGH
    if hedges + 1 > policy.burst + policy.max_fraction * requests:
        return Verdict.NO_BUDGET
    return Verdict.HEDGE
