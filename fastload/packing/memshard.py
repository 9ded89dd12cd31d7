"""Shards of samples held in memory (``ShardWriter``, ``optimize``): each member's bytes as a pack input
(:func:`memory_sample`), so the formats' own shard writers write them as they write files, and the job of
one cut shard (:class:`MemoryShard`, a :class:`~fastload.packing.engine.ShardJob`)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from fastload import formats
from fastload.config import PackConfig
from fastload.core.keys import Sample
from fastload.formats.shard import ShardResult
from fastload.packing.engine import Advance
from fastload.storage.inputs import Input


class MemoryInput:
    """One in-memory member as a pack input: what the shard writers use of an
    :class:`~fastload.storage.inputs.Input` (``open()``, ``entry.size``, ``shown``) in one small object (it is
    its own entry and source: three objects per member cost the caller's loop ~15%)."""

    __slots__ = ("data", "path", "size")

    def __init__(self, path: str, data: bytes) -> None:
        self.data = data
        self.path = path
        self.size = len(data)

    @property
    def entry(self) -> MemoryInput:
        return self

    @property
    def source(self) -> MemoryInput:
        return self

    @property
    def relpath(self) -> str:
        return self.path

    @property
    def shown(self) -> str:
        return self.path

    version = ""
    unreadable = ""

    def open(self, entry: object = None) -> tuple[io.BytesIO, int]:
        return io.BytesIO(self.data), self.size


def memory_sample(key: str, members: Sequence[tuple[str, bytes]]) -> Sample[Input]:
    """A sample whose members are bytes, as the formats' shard writers take samples."""
    held = tuple((f, MemoryInput(f"{key}.{f}", data)) for f, data in members)
    return cast("Sample[Input]", Sample(key, held))


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
