"""Cutting ``pack-tokens`` documents into row groups and shards (:class:`ShardCutter`), and the job that
writes one such shard (:class:`TokenShard`, a :class:`~fastload.packing.engine.ShardJob`).

Row groups hold up to ``row_group_bytes`` of token data (a larger document gets a group of its own); a shard
holds whole row groups, up to ``shard_size_bytes`` (or one group, if larger); a document never spans two.
The cuts depend only on the documents' lengths in input order, so every run of the same input and options
cuts the same shards, whatever the number of writers, and a resumed run finds the same shards again.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastload.formats.tar.writer import ShardResult
from fastload.packing.engine import Advance
from fastload.packing.token_docs import Chunk


@dataclass(frozen=True)
class TokenGroup:
    """One row group: document keys, their lengths in tokens, and their ids, concatenated, as stored."""

    keys: list[str]
    lengths: np.ndarray
    values: np.ndarray


@dataclass(frozen=True, kw_only=True)
class TokenShard:
    """One Parquet token shard, its row groups in memory: ``__key__`` plus one binary column ``field`` of
    little-endian ids per document (Arrow's binary layout: the flat id buffer plus byte offsets)."""

    number: int
    name: str
    field: str
    groups: list[TokenGroup]
    compression: str

    def write(self, tmp_path: str, *, on_sample: Advance, open_threads: int) -> ShardResult:
        import pyarrow as pa

        from fastload.formats.parquet.writer import parquet_schema, write_row_groups

        schema = parquet_schema([self.field])

        def tables() -> Iterator[Any]:
            for g in self.groups:
                offsets = np.concatenate(([0], np.cumsum(g.lengths) * g.values.itemsize)).astype(np.int32)
                column = pa.Array.from_buffers(
                    pa.binary(), len(g.keys), [None, pa.py_buffer(offsets), pa.py_buffer(g.values)]
                )
                yield pa.Table.from_arrays([pa.array(g.keys, type=pa.string()), column], schema=schema)
                on_sample(g.values.nbytes, len(g.keys))

        entry = write_row_groups(self.name, tmp_path, schema, tables(), compression=self.compression)
        for g in self.groups:
            entry.keys.extend(g.keys)
        return ShardResult(
            entry,
            payload_bytes=sum(g.values.nbytes for g in self.groups),
            files=sum(len(g.keys) for g in self.groups),
        )

    def local_folders(self) -> set[str]:
        return set()


class ShardCutter:
    """Documents in (chunks, in input order), shards out (``(number, row groups)``, numbered from 0)."""

    def __init__(self, *, dtype: np.dtype[Any], row_group_bytes: int, shard_size_bytes: int) -> None:
        self.dtype = dtype
        self.row_group_bytes = min(row_group_bytes, shard_size_bytes)
        self.shard_size_bytes = shard_size_bytes
        self.shards = 0  # shards cut so far
        self._group: list[Chunk] = []
        self._group_bytes = 0
        self._shard: list[TokenGroup] = []
        self._shard_bytes = 0

    def add(self, chunk: Chunk) -> Iterator[tuple[int, list[TokenGroup]]]:
        """Take a chunk of documents; yield the shards it completes."""
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

    def finish(self) -> Iterator[tuple[int, list[TokenGroup]]]:
        """Yield the last shard, if any documents are left."""
        yield from self._close_group()
        if self._shard:
            yield self._close_shard()

    def _close_group(self) -> Iterator[tuple[int, list[TokenGroup]]]:
        if not self._group:
            return
        group = TokenGroup(
            [k for c in self._group for k in c.keys],
            np.concatenate([c.lengths for c in self._group]),
            np.concatenate([c.ids for c in self._group]).astype(self.dtype),
        )
        group_bytes = self._group_bytes
        self._group, self._group_bytes = [], 0
        if self._shard and self._shard_bytes + group_bytes > self.shard_size_bytes:
            yield self._close_shard()
        self._shard.append(group)
        self._shard_bytes += group_bytes

    def _close_shard(self) -> tuple[int, list[TokenGroup]]:
        out = (self.shards, self._shard)
        self.shards += 1
        self._shard, self._shard_bytes = [], 0
        return out
