"""A ``ray.data`` Datasink that writes fastload shards: each write task turns its rows into samples, cuts
them into shards and writes each as a pack job (:class:`fastload.packing.write.FileShard`, through
:func:`fastload.packing.ray_engine.write_in_task`: the shard, then its sample table); the driver
(:func:`fastload.raydata.from_ray`) writes ``index.json`` from the manifest entries the tasks return.

Imports Ray at the top: import this module only after :func:`fastload.packing.ray_engine.require_ray`.
"""

from __future__ import annotations

import io
import numbers
from collections.abc import Iterable
from typing import Any, BinaryIO

from ray.data.block import Block, BlockAccessor
from ray.data.datasource import Datasink

from fastload.config import PackConfig, S3Config
from fastload.core.keys import KeyRuleError, Sample, split_key
from fastload.core.plan import plan_shards
from fastload.errors import ConfigError
from fastload.packing.plan import shard_sizes
from fastload.packing.ray_engine import write_in_task
from fastload.packing.write import FileShard
from fastload.storage.inputs import Input
from fastload.storage.listing import FileEntry

KEY = "__key__"


class _InMemory:
    """The values of a write task's rows, opened like files (``Opener``)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def add(self, name: str, data: bytes) -> FileEntry:
        self.data[name] = data
        return FileEntry(name, name, len(data), "")

    def open(self, entry: FileEntry) -> tuple[BinaryIO, int]:
        data = self.data[entry.path]
        return io.BytesIO(data), len(data)


def as_bytes(key: str, field: str, value: Any) -> bytes:
    """A row value as a member's bytes: bytes-like as is, ``str`` as UTF-8, integers as decimal text
    (WebDataset's ``cls`` convention)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return b"%d" % int(value)
    raise ConfigError(
        f"sample {key!r}, column {field!r}: a {type(value).__name__} value; from_ray writes bytes, str or "
        "int values: encode it first (e.g. ds.map(lambda r: {..., 'npy': to_npy_bytes(r['npy'])}))"
    )


def to_samples(rows: Iterable[dict[str, Any]], opener: _InMemory) -> list[Sample[Input]]:
    """Rows (``__key__`` plus one column per field; None = the sample lacks that field) as samples."""
    samples: list[Sample[Input]] = []
    for row in rows:
        key = row.get(KEY)
        if not isinstance(key, str) or not key:
            raise ConfigError(
                f"a row has __key__={key!r}; every row needs a non-empty string '__key__' (the sample "
                "name, e.g. 'train/000123'), and one column per field"
            )
        members = []
        for field in sorted(row):
            value = row[field]
            if field == KEY or value is None:
                continue
            name = f"{key}.{field}"
            try:
                split = split_key(name)
            except KeyRuleError as exc:
                raise ConfigError(f"sample {key!r}, column {field!r}: member {name!r}: {exc}") from None
            if split != (key, field):
                raise ConfigError(
                    f"sample {key!r}, column {field!r}: the member name {name!r} would read back as key "
                    f"{split[0]!r}, field {split[1]!r}; keys must not contain a dot after the last '/'"
                )
            members.append((field, Input(opener, opener.add(name, as_bytes(key, field, value)))))
        if not members:
            raise ConfigError(f"sample {key!r} has no non-null field; every sample needs at least one")
        samples.append(Sample(key, tuple(members)))
    return samples


class ShardSink(Datasink[list[dict[str, Any]]]):
    """Writes each write task's rows as shards ``{prefix}-{task:06d}-{n:06d}`` in ``dest_url``."""

    def __init__(
        self, dest_url: str, config: PackConfig, fields: list[str], s3_config: S3Config | None
    ) -> None:
        self.dest_url = dest_url
        self.config = config
        self.fields = fields
        self.s3_config = s3_config
        self.returns: list[dict[str, Any]] = []

    @property
    def min_bytes_per_write(self) -> int:
        """Ask Ray Data for about one shard's worth of rows per write task."""
        return self.config.shard_size_bytes

    def write(self, blocks: Iterable[Block], ctx: Any) -> list[dict[str, Any]]:
        config = self.config
        opener = _InMemory()
        rows: list[dict[str, Any]] = []
        for block in blocks:
            accessor: Any = BlockAccessor.for_block(block)
            rows.extend(dict(r) for r in accessor.iter_rows(public_row_format=True))
        samples = to_samples(rows, opener)
        del rows
        # Sizes as fastload.pack plans them, so shards are cut the same way.
        sizes, overhead, suffix = shard_sizes(config, samples, len(self.fields))
        shards = plan_shards(
            sizes,
            shard_bytes=config.shard_size_bytes,
            max_samples=config.max_samples,
            prefix=f"{config.prefix}-{ctx.task_idx:06d}",
            suffix=suffix,
            overhead_bytes=overhead,
        )
        out = []
        for shard in shards:
            job = FileShard(
                plan=shard, samples=samples[shard.start : shard.stop], fields=self.fields, config=config
            )
            result = write_in_task(job, self.dest_url, self.s3_config)
            out.append(
                {
                    "entry": result.entry.manifest_dict(),
                    "fields": sorted({f for s in samples[shard.start : shard.stop] for f, _ in s.members}),
                    "payload_bytes": result.payload_bytes,
                    "files": result.files,
                }
            )
        return out

    def on_write_complete(self, write_result: Any) -> None:
        """Runs on the driver: keep what every task wrote (``WriteResult`` since Ray 2.4x, a list before)."""
        returns = getattr(write_result, "write_returns", write_result)
        self.returns = [shard for task in returns for shard in task]
