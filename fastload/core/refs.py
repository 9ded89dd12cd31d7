"""A rank's sample references without a list: ``(shard, position)`` pairs addressed by arithmetic.

A :class:`Refs` is spans of consecutive positions (shard ``shards[k]``, positions ``firsts[k]`` onwards,
``lens[k]`` of them) laid end to end, optionally repeated cyclically up to a longer length (``even="pad"``),
optionally read through a permutation (the sample shuffle), seen through a window ``[lo, hi)``. Memory is
O(spans) (+ O(length) for a permutation); the reference at any position costs a binary search, and a whole
slice is a few vectorised numpy operations. It is a ``Sequence[tuple[int, int]]``, so code written for a
list of pairs keeps working; :meth:`Refs.pairs` makes the list a worker actually reads.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt

Ints = npt.NDArray[np.int64]
_CHUNK = 1 << 16  # references made per step of an iteration


def _ints(values: Any) -> Ints:
    return np.ascontiguousarray(values, dtype=np.int64)


class Refs(Sequence[tuple[int, int]]):
    """``(shard, position)`` references in order, random access (see the module docstring)."""

    __slots__ = ("_base", "_begins", "_firsts", "_hi", "_lo", "_perm", "_shards")

    def __init__(self, shards: Any, firsts: Any, lens: Any) -> None:
        lens_a = _ints(lens)
        keep = lens_a > 0  # empty spans never address anything
        self._shards, self._firsts = _ints(shards)[keep], _ints(firsts)[keep]
        lens_a = lens_a[keep]
        self._begins = np.zeros(len(lens_a) + 1, dtype=np.int64)
        np.cumsum(lens_a, out=self._begins[1:])
        self._base = int(self._begins[-1])
        self._perm: Ints | None = None
        self._lo, self._hi = 0, self._base

    @classmethod
    def empty(cls) -> Refs:
        return cls((), (), ())

    @classmethod
    def from_arrays(cls, shards: Ints, positions: Ints) -> Refs:
        """References given one by one, stored as runs of consecutive positions of one shard."""
        if len(shards) == 0:
            return cls.empty()
        new = np.ones(len(shards), dtype=bool)
        new[1:] = (shards[1:] != shards[:-1]) | (positions[1:] != positions[:-1] + 1)
        starts = np.flatnonzero(new)
        lens = np.diff(np.append(starts, len(shards)))
        return cls(shards[starts], positions[starts], lens)

    def _view(self, lo: int, hi: int) -> Refs:
        out = object.__new__(Refs)
        for name in ("_shards", "_firsts", "_begins", "_base", "_perm"):
            setattr(out, name, getattr(self, name))
        out._lo, out._hi = lo, hi
        return out

    def __len__(self) -> int:
        return self._hi - self._lo

    def _virtual(self, positions: Ints) -> Ints:
        """Positions of this view -> indexes into the (cyclic) concatenation of the spans."""
        at = positions + self._lo
        return self._perm[at] if self._perm is not None else at

    def take(self, positions: Any) -> tuple[Ints, Ints]:
        """``(shards, positions in shard)`` of the references at ``positions`` (of this view), as arrays."""
        pos = _ints(positions)
        if len(pos) and (pos.min() < 0 or pos.max() >= len(self)):
            raise IndexError(f"positions outside [0, {len(self)})")
        v = self._virtual(pos)
        if self._base and len(v) and v.max() >= self._base:
            v = v % self._base
        k = np.searchsorted(self._begins, v, side="right") - 1
        return self._shards[k], self._firsts[k] + (v - self._begins[k])

    def arrays(self) -> tuple[Ints, Ints]:
        """Every reference of this view as ``(shards, positions)`` arrays."""
        return self.take(np.arange(len(self), dtype=np.int64))

    def pairs(self, positions: Any = None) -> list[tuple[int, int]]:
        """The references (at ``positions``, default all) as a list of ``(shard, position)`` tuples."""
        shards, pos = self.arrays() if positions is None else self.take(positions)
        return list(zip(shards.tolist(), pos.tolist(), strict=True))

    def permuted(self, perm: Ints) -> Refs:
        """This view read in the order ``perm`` (a permutation of ``range(len(self))``)."""
        out = self._view(0, len(perm))
        out._perm = self._virtual(_ints(perm))
        return out

    def cycled(self, length: int) -> Refs:
        """This view repeated from its start up to ``length`` references (``length >= len(self)``)."""
        if len(self) == 0:
            if length:
                raise ValueError(f"cannot repeat no references up to {length}")
            return self
        if self._lo == 0 and self._hi == self._base and self._perm is None:
            return self._view(0, length)
        shards, pos = self.arrays()
        return Refs.from_arrays(shards, pos).cycled(length)

    @overload
    def __getitem__(self, i: int) -> tuple[int, int]: ...

    @overload
    def __getitem__(self, i: slice) -> Refs: ...

    def __getitem__(self, i: int | slice) -> Any:
        n = len(self)
        if isinstance(i, slice):
            a, b, step = i.indices(n)
            if step != 1:
                return self.pairs(np.arange(a, b, step, dtype=np.int64))
            return self._view(self._lo + a, self._lo + max(a, b))
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            raise IndexError(f"reference {i} of {n}")
        shards, pos = self.take([j])
        return int(shards[0]), int(pos[0])

    def __iter__(self) -> Iterator[tuple[int, int]]:
        for a in range(0, len(self), _CHUNK):
            yield from self[a : a + _CHUNK].pairs()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        if len(other) != len(self):
            return False
        if isinstance(other, Refs):
            a, b = self.arrays(), other.arrays()
            return bool(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]))
        return self.pairs() == [tuple(x) for x in other]

    __hash__ = None  # type: ignore[assignment]

    def __add__(self, other: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        return self.pairs() + list(other)

    def __radd__(self, other: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        return list(other) + self.pairs()

    def __repr__(self) -> str:
        head = self[:3].pairs()
        return f"Refs({len(self)} references: {head}{'...' if len(self) > 3 else ''})"
