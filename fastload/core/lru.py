"""A least-recently-used map bounded by a count or a total weight (bytes): what random access keeps of
shards and Parquet row groups. Not thread safe (its owner locks); evicted values are handed back to the
caller, which closes them when it must."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """At most ``max_items`` values and ``max_weight`` total weight (None: no bound); the newest value is
    always kept, however heavy."""

    def __init__(self, *, max_items: int | None = None, max_weight: int | None = None) -> None:
        if max_items is not None and max_items < 1:
            raise ValueError(f"max_items={max_items} must be >= 1 (or None)")
        if max_weight is not None and max_weight < 0:
            raise ValueError(f"max_weight={max_weight} must be >= 0 (or None)")
        self.max_items, self.max_weight = max_items, max_weight
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self.weight = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def get(self, key: K) -> V | None:
        """The value of ``key`` (now the most recently used), or None."""
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: K, value: V, weight: int = 0) -> list[V]:
        """Keep ``value`` under ``key`` (replacing an older one); returns the values evicted (the replaced
        one included)."""
        evicted: list[V] = []
        old = self._items.pop(key, None)
        if old is not None:
            evicted.append(old[0])
            self.weight -= old[1]
        self._items[key] = (value, weight)
        self.weight += weight
        while len(self._items) > 1 and (
            (self.max_items is not None and len(self._items) > self.max_items)
            or (self.max_weight is not None and self.weight > self.max_weight)
        ):
            _, (value_out, w) = self._items.popitem(last=False)
            self.weight -= w
            evicted.append(value_out)
        return evicted

    def pop(self, key: K) -> V | None:
        """Remove ``key``; its value, or None."""
        item = self._items.pop(key, None)
        if item is None:
            return None
        self.weight -= item[1]
        return item[0]

    def clear(self) -> list[V]:
        """Remove everything; the values."""
        values = [v for v, _ in self._items.values()]
        self._items.clear()
        self.weight = 0
        return values
