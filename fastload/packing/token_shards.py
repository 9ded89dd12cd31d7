"""Cutting ``pack-tokens`` documents into row groups and shards (:class:`ShardCutter`), writing each shard
as its row groups arrive (:func:`shard_jobs`), and the job that checksums and hands it on for publishing
(:class:`TokenShard`, a :class:`~fastload.packing.engine.ShardJob`).

Row groups hold up to ``row_group_bytes`` of token data (a larger document gets a group of its own); a shard
holds whole row groups, up to ``shard_size_bytes`` (or one group, if larger); a document never spans two.
The cuts depend only on the documents' lengths in input order, so every run of the same input and options
cuts the same shards, whatever the number of writers, and a resumed run finds the same shards again.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Container, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastload.core.index import ShardEntry
from fastload.formats.shard import ShardResult
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
    """One Parquet token shard, already written by the reader (see :func:`shard_jobs`) at ``part_path``:
    the job checksums it and hands it to the engine's publisher. Local engine only."""

    number: int
    name: str
    part_path: str
    rows_per_group: list[int]
    keys: list[str]
    payload_bytes: int

    def write(self, tmp_path: str, *, on_sample: Advance, open_threads: int) -> ShardResult:
        from fastload.formats.parquet.writer import finish_entry

        os.replace(self.part_path, tmp_path)
        entry = ShardEntry(name=self.name, bytes=0, checksum="", keys=self.keys)
        finish_entry(entry, tmp_path, self.rows_per_group)
        on_sample(self.payload_bytes, len(self.keys))
        return ShardResult(entry, payload_bytes=self.payload_bytes, files=len(self.keys))

    def discard(self) -> None:
        """Remove the shard written ahead (the engine stopped before this job ran)."""
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.part_path)

    @property
    def shard_format(self) -> str:
        return "parquet"

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


def shard_jobs(
    groups: Iterable[tuple[int, TokenGroup]],
    *,
    tmp_dir: str,
    name_of: Callable[[int], str],
    field: str,
    compression: str,
    skip: Container[int] = (),
) -> Iterator[TokenShard]:
    """Write each shard of ``groups`` (``(shard number, group)`` in order, as :class:`ShardCutter` gives
    them) into ``tmp_dir`` as its row groups arrive, in this thread (one row group in memory; Arrow and
    Parquet work stay on one thread), and yield it as a job once complete; shards in ``skip`` (kept from
    an interrupted run, their keys in their sample tables) are read through and dropped. A shard being
    written when ``groups`` fails is removed."""
    from fastload.formats.parquet.writer import parquet_schema, write_tables

    schema = parquet_schema([field])
    stream = _Runs(groups)
    while (number := stream.next_run()) is not None:
        if number in skip:
            for _ in stream.run():
                pass
            continue
        keys: list[str] = []
        payload = [0]
        part = os.path.join(tmp_dir, f"{number:06d}.tokens")
        rows = write_tables(
            part, schema, _tables(stream.run(), schema, keys, payload), compression=compression
        )
        yield TokenShard(
            number=number,
            name=name_of(number),
            part_path=part,
            rows_per_group=rows,
            keys=keys,
            payload_bytes=payload[0],
        )


def _tables(groups: Iterable[TokenGroup], schema: Any, keys: list[str], payload: list[int]) -> Iterator[Any]:
    """Each group as an Arrow table of ``schema``; adds its keys and token bytes to ``keys``, ``payload``."""
    import pyarrow as pa

    for g in groups:
        offsets = np.concatenate(([0], np.cumsum(g.lengths) * g.values.itemsize)).astype(np.int32)
        column = pa.Array.from_buffers(
            pa.binary(), len(g.keys), [None, pa.py_buffer(offsets), pa.py_buffer(g.values)]
        )
        yield pa.Table.from_arrays([pa.array(g.keys, type=pa.string()), column], schema=schema)
        keys.extend(g.keys)
        payload[0] += g.values.nbytes


class _Runs:
    """``(number, item)`` pairs taken as runs of one number at a time."""

    def __init__(self, pairs: Iterable[tuple[int, TokenGroup]]) -> None:
        self._pairs = iter(pairs)
        self._head: tuple[int, TokenGroup] | None = None
        self._done = False

    def next_run(self) -> int | None:
        """The number of the next run (its items not yet taken), or None at the end."""
        if self._head is None and not self._done:
            self._head = next(self._pairs, None)
            self._done = self._head is None
        return None if self._head is None else self._head[0]

    def run(self) -> Iterator[TokenGroup]:
        """The items of the current run."""
        number = self.next_run()
        while self._head is not None and self._head[0] == number:
            yield self._head[1]
            self._head = None
            self.next_run()
