"""Cutting ``pack-tokens`` documents into row groups and shards (:class:`ShardCutter`), and the job that
writes one such shard (:class:`TokenShard`, a :class:`~fastload.packing.engine.ShardJob`).

Row groups hold up to ``row_group_bytes`` of token data (a larger document gets a group of its own); a shard
holds whole row groups, up to ``shard_size_bytes`` (or one group, if larger); a document never spans two.
The cuts depend only on the documents' lengths in input order, so every run of the same input and options
cuts the same shards, whatever the number of writers, and a resumed run finds the same shards again.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastload.errors import PackError
from fastload.formats.tar.writer import ShardResult
from fastload.packing.engine import Advance
from fastload.packing.token_docs import Chunk

QUEUE_GROUPS = 2  # row groups handed over ahead of a shard's writer
_POLL_S = 0.05  # how often a blocked reader or writer looks whether the other side gave up


@dataclass(frozen=True)
class TokenGroup:
    """One row group: document keys, their lengths in tokens, and their ids, concatenated, as stored."""

    keys: list[str]
    lengths: np.ndarray
    values: np.ndarray


class TokenShard:
    """One Parquet token shard, written as its row groups arrive: ``__key__`` plus one binary column
    ``field`` of little-endian ids per document (Arrow's binary layout: the flat id buffer plus byte
    offsets). The reader :meth:`put` s groups and :meth:`close` s it; the writer thread takes them from a
    queue of ``QUEUE_GROUPS``, so a shard is never held whole. Local engine only (it does not pickle)."""

    def __init__(self, *, number: int, name: str, field: str, compression: str) -> None:
        self.number = number
        self.name = name
        self.field = field
        self.compression = compression
        self._queue: queue.Queue[TokenGroup | None] = queue.Queue(QUEUE_GROUPS)
        self._aborted = threading.Event()  # the reader failed: the writer gives up
        self._stopped = threading.Event()  # the writer returned or failed: the reader stops putting

    def put(self, group: TokenGroup) -> None:
        """Hand the writer the next row group (waits while the queue is full; dropped if it stopped)."""
        self._offer(group)

    def close(self) -> None:
        """No more row groups: the writer finishes the shard."""
        self._offer(None)

    def abort(self) -> None:
        """The reader failed: the writer stops and removes its file."""
        self._aborted.set()

    def _offer(self, item: TokenGroup | None) -> None:
        while not self._stopped.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return
            except queue.Full:
                continue

    def _groups(self) -> Iterator[TokenGroup]:
        while True:
            try:
                group = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                if self._aborted.is_set():
                    raise PackError(f"shard {self.name}: reading its documents failed; not written") from None
                continue
            if group is None:
                return
            yield group

    def write(self, tmp_path: str, *, on_sample: Advance, open_threads: int) -> ShardResult:
        import pyarrow as pa

        from fastload.formats.parquet.writer import parquet_schema, write_row_groups

        schema = parquet_schema([self.field])
        keys: list[str] = []
        payload = 0

        def tables() -> Iterator[Any]:
            nonlocal payload
            for g in self._groups():
                offsets = np.concatenate(([0], np.cumsum(g.lengths) * g.values.itemsize)).astype(np.int32)
                column = pa.Array.from_buffers(
                    pa.binary(), len(g.keys), [None, pa.py_buffer(offsets), pa.py_buffer(g.values)]
                )
                yield pa.Table.from_arrays([pa.array(g.keys, type=pa.string()), column], schema=schema)
                keys.extend(g.keys)
                payload += g.values.nbytes
                on_sample(g.values.nbytes, len(g.keys))

        try:
            entry = write_row_groups(self.name, tmp_path, schema, tables(), compression=self.compression)
        finally:
            self._stopped.set()
        entry.keys = keys
        return ShardResult(entry, payload_bytes=payload, files=len(keys))

    def local_folders(self) -> set[str]:
        return set()


class ShardCutter:
    """Documents in (chunks, in input order), row groups out as ``(shard number, group)``: shard numbers
    count up from 0, and a new number means the previous shard is complete."""

    def __init__(self, *, dtype: np.dtype[Any], row_group_bytes: int, shard_size_bytes: int) -> None:
        self.dtype = dtype
        self.row_group_bytes = min(row_group_bytes, shard_size_bytes)
        self.shard_size_bytes = shard_size_bytes
        self.shards = 0  # shards begun so far
        self._group: list[Chunk] = []
        self._group_bytes = 0
        self._shard_bytes = 0

    def add(self, chunk: Chunk) -> Iterator[tuple[int, TokenGroup]]:
        """Take a chunk of documents; yield the row groups it completes."""
        nbytes = chunk.lengths * self.dtype.itemsize
        offsets = np.concatenate(([0], np.cumsum(chunk.lengths)))
        pos, n = 0, len(chunk.keys)
        while pos < n:
            cum = np.cumsum(nbytes[pos:])
            take = int(np.searchsorted(cum, self.row_group_bytes - self._group_bytes, side="right"))
            if take == 0 and not self._group:
                take = 1  # a document larger than a row group gets one of its own
            if take:
                stop = pos + take
                self._group.append(
                    Chunk(
                        chunk.keys[pos:stop],
                        chunk.rows[pos:stop],
                        chunk.ids[offsets[pos] : offsets[stop]],
                        chunk.lengths[pos:stop],
                    )
                )
                self._group_bytes += int(cum[take - 1])
                pos = stop
            if take == 0 or self._group_bytes >= self.row_group_bytes:
                yield from self._close_group()

    def finish(self) -> Iterator[tuple[int, TokenGroup]]:
        """Yield the last row group, if any documents are left."""
        yield from self._close_group()

    def _close_group(self) -> Iterator[tuple[int, TokenGroup]]:
        if not self._group:
            return
        group = TokenGroup(
            [k for c in self._group for k in c.keys],
            np.concatenate([c.lengths for c in self._group]),
            np.concatenate([c.ids for c in self._group]).astype(self.dtype),
        )
        group_bytes = self._group_bytes
        self._group, self._group_bytes = [], 0
        if not self.shards or self._shard_bytes + group_bytes > self.shard_size_bytes:
            self.shards += 1
            self._shard_bytes = 0
        self._shard_bytes += group_bytes
        yield self.shards - 1, group
