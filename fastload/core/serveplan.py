"""The trainer's ledger of remote feeders (``fastload.serve``): which batch of the epoch each feeder is
making, which have arrived, and the watermark of batches delivered to the training loop.

A batch is named by its index in the rank's epoch (batch ``i``: positions ``[start + i*B, start +
(i+1)*B)`` of the rank's order), a pure function of the dataset and settings, so any feeder makes the
same bytes for it. The ledger decides and remembers; it never waits, sends or reads (``train/serve.py``
does, telling it what happened):

- :meth:`ServeLedger.assign`: hand each feeder new work, at most ``max_in_flight`` batches at a time
  (back-pressure), lowest index first, and never an index ``window`` or more past the watermark (so at most
  ``window`` batches are held, arrived out of order or in flight, per trainer);
- :meth:`ServeLedger.arrived`: a feeder's batch came (kept only if that feeder still owes it: a batch from
  a feeder declared lost, or a second copy, is refused);
- :meth:`ServeLedger.lose`: a feeder died; what it owed goes back to be assigned again, lowest first;
- :meth:`ServeLedger.add`: a feeder joined; it gets work on the next :meth:`assign`;
- :meth:`ServeLedger.deliver`: the next batch in order if it arrived; the watermark moves past it.

The watermark is all a checkpoint needs: batches below it were delivered, none above it were.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from typing import Generic, TypeVar

F = TypeVar("F", bound=Hashable)


class ServeLedger(Generic[F]):
    """Batches ``[first, total)`` of one epoch, made by feeders named ``F`` and delivered in order.

    Memory bound: at most ``window`` batch indices are assigned or arrived but not delivered."""

    def __init__(self, total: int, *, first: int = 0, max_in_flight: int = 2, window: int = 8) -> None:
        if not 0 <= first <= total:
            raise ValueError(f"first={first} must be within [0, total={total}]")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight={max_in_flight} must be >= 1")
        if window < 1:
            raise ValueError(f"window={window} must be >= 1")
        self.total, self.max_in_flight, self.window = total, max_in_flight, window
        self.watermark = first  # batches below it were delivered
        self._next = first  # the lowest index never assigned
        self._returned: list[int] = []  # indices a lost feeder owed (a heap): assigned again first
        self._owed: dict[F, set[int]] = {}  # feeder -> the indices it is making
        self._arrived: set[int] = set()

    @property
    def feeders(self) -> list[F]:
        return list(self._owed)

    def owed(self, feeder: F) -> set[int]:
        """The indices ``feeder`` is making (a copy)."""
        return set(self._owed.get(feeder, ()))

    @property
    def done(self) -> bool:
        """Every batch delivered."""
        return self.watermark >= self.total

    def add(self, feeder: F) -> None:
        """A feeder joined (or was restarted under a new name); it gets work on the next :meth:`assign`."""
        if feeder in self._owed:
            raise ValueError(f"feeder {feeder!r} is already in the ledger")
        self._owed[feeder] = set()

    def lose(self, feeder: F) -> list[int]:
        """``feeder`` is gone: what it owed is assigned again, lowest first. Returns those indices."""
        owed = sorted(self._owed.pop(feeder, ()))
        for index in owed:
            heapq.heappush(self._returned, index)
        return owed

    def _take(self) -> int | None:
        """The next index to assign, or None if none may be (all assigned, or the window is full)."""
        if self._returned:
            return heapq.heappop(self._returned)  # below the window's end: it was assigned once
        if self._next < self.total and self._next < self.watermark + self.window:
            self._next += 1
            return self._next - 1
        return None

    def assign(self) -> list[tuple[F, int]]:
        """New work, ``(feeder, index)``: the feeders with the fewest batches in flight first, each up to
        ``max_in_flight``. Call after every event; nothing is assigned without a feeder."""
        out: list[tuple[F, int]] = []
        while True:
            free = [f for f, owed in self._owed.items() if len(owed) < self.max_in_flight]
            if not free:
                return out
            feeder = min(free, key=lambda f: len(self._owed[f]))
            index = self._take()
            if index is None:
                return out
            self._owed[feeder].add(index)
            out.append((feeder, index))

    def arrived(self, feeder: F, index: int) -> bool:
        """``feeder`` finished batch ``index``. True: keep it for :meth:`deliver`; False: drop it (the
        feeder was declared lost, or no longer owes that index)."""
        owed = self._owed.get(feeder)
        if owed is None or index not in owed:
            return False
        owed.discard(index)
        self._arrived.add(index)
        return True

    def deliver(self) -> int | None:
        """The next index in order if it arrived (the watermark moves past it), else None."""
        if self.watermark in self._arrived:
            self._arrived.discard(self.watermark)
            self.watermark += 1
            return self.watermark - 1
        return None

    def held(self) -> int:
        """How many batches are assigned or arrived and not yet delivered (at most ``window``)."""
        return sum(len(v) for v in self._owed.values()) + len(self._arrived)


__all__ = ["ServeLedger"]
