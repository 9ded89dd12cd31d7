"""Which source each position of a mixture reads: a deterministic low-discrepancy schedule, pure arithmetic.

Weights become integer quotas ``m_s`` summing to a period ``D`` (exact fractions when their common
denominator is at most :data:`MAX_PERIOD`, else rounded to multiples of ``1/MAX_PERIOD``). One period is
scheduled by earliest-deadline-first over Pfair windows: the ``k``-th draw (from 0) of source ``s`` is
released at slot ``floor(k*D/m_s)`` and due before ``ceil((k+1)*D/m_s)``. EDF on one machine meets every
such deadline when the quotas sum to ``D`` (Baruah et al., Pfair scheduling, 1996), so after any ``t``
positions of a period source ``s`` has ``floor(w t)`` or ``ceil(w t)`` draws: its lag ``w t - count`` lies
in ``(-1, 1)``. The period repeats (every lag is 0 again at ``D``), seen from a seeded phase.

**The bound** (property-tested in ``tests/unit/test_mix.py``): in any window of ``N`` consecutive positions
that lies within one weight segment, every source has ``count`` draws with ``|count - w N| < 2``; a window
touching ``g`` segments of a schedule: ``|count - sum of w_j N_j| < 2 g``. Rounded weights add
``N * |m_s/D - w_s|``. Every rank uses the same choices, so per-source counts are equal across ranks.

Positions count samples of one rank from the start of a mixture epoch. A :class:`Schedule` answers, all
vectorised: the source at positions (:meth:`~Schedule.choices`), draws per source before a position
(:meth:`~Schedule.counts`), and the position of a source's ``k``-th draw (:meth:`~Schedule.positions`).
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

Ints = npt.NDArray[np.int64]
MAX_PERIOD = 1 << 16
STOP_RULES = ("first_exhausted", "all_exhausted", "never")
PASS_STRIDE = 1 << 32  # pass p of a source in mixture epoch E reads the source's epoch E * PASS_STRIDE + p


def quotas(weights: Sequence[float], *, max_period: int = MAX_PERIOD) -> tuple[int, ...]:
    """Integer quotas proportional to ``weights`` (non-negative, some positive), smallest exact ones when
    the common denominator is at most ``max_period``, else largest-remainder rounding to ``max_period``."""
    if not weights or any(not math.isfinite(w) or w < 0 for w in weights) or not any(w > 0 for w in weights):
        raise ValueError(f"weights {list(weights)} must be finite, >= 0, and not all 0")
    exact = [Fraction(w).limit_denominator(1_000_000) for w in weights]
    total = sum(exact)
    shares = [f / total for f in exact]
    period = math.lcm(*(f.denominator for f in shares))
    if period <= max_period:
        return tuple(int(f * period) for f in shares)
    raw = [f * max_period for f in shares]
    out = [int(r) for r in raw]
    by_remainder = sorted(range(len(raw)), key=lambda i: (-(raw[i] - out[i]), i))
    for i in by_remainder[: max_period - sum(out)]:
        out[i] += 1
    g = math.gcd(*out)
    return tuple(q // g for q in out)


def edf_period(quota: Sequence[int]) -> Ints:
    """One period (``sum(quota)`` slots) of the EDF Pfair schedule: the source of each slot."""
    period = sum(quota)
    out = np.empty(period, dtype=np.int64)
    released: list[tuple[int, int, int]] = []  # (deadline, source, draw)
    pending = [(0, s, 0) for s, m in enumerate(quota) if m > 0]  # (release, source, draw)
    heapq.heapify(pending)
    for t in range(period):
        while pending and pending[0][0] <= t:
            _, s, k = heapq.heappop(pending)
            heapq.heappush(released, (-(-(k + 1) * period // quota[s]), s, k))
        _, s, k = heapq.heappop(released)
        out[t] = s
        if k + 1 < quota[s]:
            heapq.heappush(pending, ((k + 1) * period // quota[s], s, k + 1))
    return out


@dataclass(frozen=True)
class Pattern:
    """One weight segment's period: quotas, the source of each slot, each source's slots in order."""

    quota: tuple[int, ...]
    choice: Ints
    slots: tuple[Ints, ...]

    @classmethod
    def of(cls, weights: Sequence[float]) -> Pattern:
        q = quotas(weights)
        choice = edf_period(q)
        return cls(q, choice, tuple(np.flatnonzero(choice == s).astype(np.int64) for s in range(len(q))))

    @property
    def period(self) -> int:
        return len(self.choice)

    def drawn(self, x: int) -> Ints:
        """Draws per source in slots ``[0, x)`` of the periodic pattern (``x`` >= 0, any size)."""
        whole, rest = divmod(x, self.period)
        pairs = zip(self.quota, self.slots, strict=True)
        return np.asarray([whole * m + int(np.searchsorted(sl, rest)) for m, sl in pairs], dtype=np.int64)


def phase_of(seed: int | None, epoch: int, segment: int, period: int) -> int:
    """Where in its period a segment starts: 0 without a seed, else a hash of (seed, epoch, segment)."""
    if seed is None:
        return 0
    digest = hashlib.sha256(f"fastload.mix\0{seed}\0{epoch}\0{segment}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % period


class Schedule:
    """The choices of one mixture epoch: segments starting at ``starts`` (positions, the first 0) with
    their weights, each segment's period seen from its seeded phase."""

    def __init__(
        self, starts: Sequence[int], weights: Sequence[Sequence[float]], *, seed: int | None, epoch: int
    ) -> None:
        if not starts or starts[0] != 0 or any(b <= a for a, b in itertools.pairwise(starts)):
            raise ValueError(f"segment starts {list(starts)} must begin at 0 and increase")
        if len(starts) != len(weights) or len({len(w) for w in weights}) != 1:
            raise ValueError("one weight list per segment, each with one weight per source")
        self.starts = np.asarray(starts, dtype=np.int64)
        self.patterns = [Pattern.of(w) for w in weights]
        self.sources = len(weights[0])
        self.phases = [phase_of(seed, epoch, j, p.period) for j, p in enumerate(self.patterns)]
        bases = [np.zeros(self.sources, dtype=np.int64)]
        for j in range(len(starts) - 1):
            bases.append(bases[-1] + self._within(j, int(self.starts[j + 1] - self.starts[j])))
        self.bases = np.stack(bases)  # draws per source before each segment

    def _within(self, j: int, n: int) -> Ints:
        """Draws per source in the first ``n`` positions of segment ``j``."""
        p, r = self.patterns[j], self.phases[j]
        return p.drawn(r + n) - p.drawn(r)

    def _segment(self, t: Ints) -> Ints:
        return np.searchsorted(self.starts, t, side="right").astype(np.int64) - 1

    def choices(self, t: Ints) -> Ints:
        """The source at each position of ``t`` (>= 0)."""
        t = np.asarray(t, dtype=np.int64)
        out = np.empty(len(t), dtype=np.int64)
        seg = self._segment(t)
        for j in np.unique(seg):
            pick = seg == j
            p = self.patterns[j]
            out[pick] = p.choice[(t[pick] - self.starts[j] + self.phases[j]) % p.period]
        return out

    def counts(self, t: int) -> Ints:
        """Draws per source in positions ``[0, t)``."""
        j = int(self._segment(np.asarray([t]))[0])
        out: Ints = self.bases[j] + self._within(j, t - int(self.starts[j]))
        return out

    def positions(self, source: int, k: Ints) -> Ints:
        """The position of draw ``k`` (from 0, an array) of ``source``; -1 where it never comes (the
        source's weight is 0 from some segment on)."""
        k = np.asarray(k, dtype=np.int64)
        col = self.bases[:, source]
        seg = np.searchsorted(col, k, side="right").astype(np.int64) - 1
        out = np.full(len(k), -1, dtype=np.int64)
        for j in np.unique(seg):
            p = self.patterns[j]
            m = p.quota[source]
            pick = seg == j
            if m == 0:
                continue
            last = j == len(self.patterns) - 1
            if not last:
                pick &= k < self.bases[j + 1, source]
            r = self.phases[j]
            g = int(p.drawn(r)[source]) + (k[pick] - col[j])
            x = (g // m) * p.period + p.slots[source][g % m]
            out[pick] = self.starts[j] + x - r
        return out

    def position(self, source: int, k: int) -> int | None:
        """:meth:`positions` of one draw (None: never)."""
        at = int(self.positions(source, np.asarray([k]))[0])
        return None if at < 0 else at


def epoch_end(schedule: Schedule, firsts: Sequence[int], drawn: Sequence[int], rule: str) -> int | None:
    """Where a mixture epoch ends (None: ``"never"``). ``firsts[s]``: samples left in source ``s``'s first
    pass (the fewest of any rank for ``first_exhausted``, the most for ``all_exhausted``), ``drawn[s]``:
    its draws before that pass began. ``first_exhausted`` ends at the first draw past a first pass,
    ``all_exhausted`` after the last sample of the last first pass to finish (earlier passes cycling)."""
    if rule not in STOP_RULES:
        raise ValueError(f"stop={rule!r}; choose one of {', '.join(STOP_RULES)}")
    if rule == "never":
        return None
    ends: list[int] = []
    for s, (n, k0) in enumerate(zip(firsts, drawn, strict=True)):
        if rule == "first_exhausted":
            at = schedule.position(s, k0 + n)
            if at is not None:
                ends.append(at)
        elif n > 0:
            at = schedule.position(s, k0 + n - 1)
            if at is None:
                raise ValueError(f"source {s} stops being drawn before its {n} samples are read")
            ends.append(at + 1)
    if rule == "first_exhausted":
        return min(ends)  # a source with weight in the last segment always gets there
    return max(ends, default=0)


def worker_mask(t: Ints, *, start: int, worker: int, workers: int, chunk: int) -> npt.NDArray[np.bool_]:
    """Which positions ``t`` (>= ``start``) DataLoader worker ``worker`` of ``workers`` reads when chunks of
    ``chunk`` positions from ``start`` go to workers in turn (as :func:`~fastload.core.sharding.
    worker_position_array` deals them)."""
    mask: npt.NDArray[np.bool_] = ((t - start) // chunk) % workers == worker
    return mask


def worker_position(j: Ints | int, *, start: int, worker: int, workers: int, chunk: int) -> Ints:
    """The position of worker ``worker``'s ``j``-th position (from 0) when chunks of ``chunk`` positions
    from ``start`` go to ``workers`` workers in turn."""
    j = np.asarray(j, dtype=np.int64)
    out: Ints = start + (j // chunk) * (workers * chunk) + worker * chunk + j % chunk
    return out


def worker_blocks(
    start: int,
    stop: int | None,
    *,
    worker: int,
    workers: int,
    chunk: int,
    skip: int = 0,
    block: int = 1 << 16,
) -> Iterator[Ints]:
    """The positions of ``[start, stop)`` (``stop`` None: endless) that worker ``worker`` reads, in order,
    after its first ``skip``, as arrays of ``block`` positions (the last one shorter)."""
    j = skip
    deal = {"start": start, "worker": worker, "workers": workers, "chunk": chunk}
    while True:
        out = worker_position(np.arange(j, j + block, dtype=np.int64), **deal)
        if stop is not None:
            out = out[out < stop]
        if not len(out):
            return
        yield out
        j += block


def dealt(n: int, worker: int, workers: int, chunk: int) -> int:
    """How many of ``n`` positions, dealt in chunks of ``chunk`` to ``workers`` in turn, ``worker`` gets."""
    full, rest = divmod(n, workers * chunk)
    return full * chunk + min(chunk, max(0, rest - worker * chunk))
