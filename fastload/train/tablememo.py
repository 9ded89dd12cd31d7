"""Index v2 sample tables kept between passes over a dataset, up to a memory budget.

Each pass fetches a shard's sample table when it reaches the shard and drops it when the shard is done
(:class:`~fastload.train.shardread.ShardReaders`), so a process holds the tables of the shards in flight
only, whatever the dataset's size. A dataset whose tables are small next to the budget would then fetch and
decode every table again each epoch (and each block of a mixture): a GET per shard from S3, ~0.5 us a sample
from local disk. :class:`TableMemo` keeps the full entries of the shards read most recently, least recently
used dropped first, within ``max_bytes`` (estimated from each table's samples and footer). One per process:
its lock does not cross a fork.
"""

from __future__ import annotations

import threading

from fastload.core.index import ShardEntry
from fastload.core.lru import LRU

# a full entry's Python objects per sample (offsets, sizes, CRC, member sizes, key ends): measured ~240-320
BYTES_PER_SAMPLE = 320


def entry_weight(entry: ShardEntry) -> int:
    """The estimated memory of a full (attached) entry, in bytes."""
    return entry.samples * BYTES_PER_SAMPLE + (entry.payload.nbytes() if entry.payload is not None else 0)


class TableMemo:
    """Full entries of shards by their number in the dataset's manifest, within ``max_bytes``; thread safe.
    An entry heavier than the whole budget is not kept."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes={max_bytes} must be >= 1")
        self.max_bytes = max_bytes
        self._lru: LRU[int, ShardEntry] = LRU(max_weight=max_bytes)
        self._lock = threading.Lock()
        self.hits = 0

    def get(self, shard: int) -> ShardEntry | None:
        """Shard ``shard``'s full entry if kept (counted in :attr:`hits`)."""
        with self._lock:
            entry = self._lru.get(shard)
            if entry is not None:
                self.hits += 1
            return entry

    def put(self, shard: int, entry: ShardEntry) -> None:
        """Keep ``entry`` (shard ``shard``'s full entry), dropping the least recently used past the budget."""
        weight = entry_weight(entry)
        if weight > self.max_bytes:
            return
        with self._lock:
            self._lru.put(shard, entry, weight)

    @property
    def weight(self) -> int:
        """The estimated bytes kept."""
        with self._lock:
            return self._lru.weight

    def __len__(self) -> int:
        with self._lock:
            return len(self._lru)
