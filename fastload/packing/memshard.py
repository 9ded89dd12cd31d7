"""Shards of samples held in memory (``ShardWriter``, ``optimize``): each member's bytes as a pack input
(:func:`memory_sample`), so the formats' own shard writers write them as they write files, and the job of
one cut shard (:class:`MemoryShard`, a :class:`~fastload.packing.engine.ShardJob`)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

from fastload import formats
from fastload.config import PackConfig
from fastload.core.keys import Sample
from fastload.formats.shard import ShardResult
from fastload.packing.engine import Advance
from fastload.storage.inputs import Input
from fastload.storage.listing import FileEntry


class _Bytes:
    """An in-memory member as a pack input (an :class:`~fastload.storage.inputs.Opener`)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def open(self, entry: FileEntry) -> tuple[io.BytesIO, int]:
        return io.BytesIO(self.data), len(self.data)


def memory_sample(key: str, members: Sequence[tuple[str, bytes]]) -> Sample[Input]:
    """A sample whose members are bytes, as the formats' shard writers take samples."""
    return Sample(
        key,
        tuple(
            (f, Input(_Bytes(data), FileEntry(f"{key}.{f}", f"{key}.{f}", len(data), "")))
            for f, data in members
        ),
    )


@dataclass(frozen=True, kw_only=True)
class MemoryShard:
    """One cut shard of in-memory samples, written by its format's shard writer (local engine only)."""

    number: int
    name: str
    samples: list[Sample[Input]]
    fields: list[str]
    config: PackConfig

    def write(self, tmp_path: str, *, on_sample: Advance, open_threads: int) -> ShardResult:
        return formats.by_name(self.config.shard_format).write(
            self.name, self.samples, tmp_path, fields=self.fields, config=self.config, on_sample=on_sample
        )

    @property
    def shard_format(self) -> str:
        return self.config.shard_format

    def local_folders(self) -> set[str]:
        return set()
