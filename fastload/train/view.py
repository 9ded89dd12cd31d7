"""The dataset being read, opened once: :func:`open_dataset` gives a :class:`DatasetView` (root, index,
format, filters and each shard's count of kept rows, partition values, S3 config, and per process the shard
cache and the sample tables kept between passes) that ``ShardDataset``, ``MapDataset`` and ``Mix`` (through
its sources) hold, and :meth:`DatasetView.entry` gives a shard's full entry (its table attached) the one way:
through the :class:`~fastload.formats.DatasetEntries` it is built on (root, index, S3 config: what verify,
inspect and the other flows without torch hold), with this process's cache and table memo.

It pickles with its dataset to DataLoader workers (fork or spawn): the manifest, the options and the
filtered view travel; the cache and the table memo are made again in each process.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from fastload import formats
from fastload.config import S3Config
from fastload.core.filters import Filter, and_filters, normalise, partition_types
from fastload.core.index import DatasetIndex, ShardEntry
from fastload.core.versions import at_version, versions_of
from fastload.errors import ConfigError
from fastload.formats import DatasetEntries
from fastload.gcpause import gc_paused
from fastload.storage.cache import ShardCache
from fastload.train.filtering import (
    FilteredView,
    check_projection,
    partition_filter,
    partition_parent,
    partition_values_of,
    plan_filter,
)
from fastload.train.options import CacheConfig
from fastload.train.source import open_index
from fastload.train.tablememo import TableMemo

Counts = np.ndarray[Any, np.dtype[np.int64]]


class DatasetView:
    """A dataset opened for reading (made by :func:`open_dataset`). ``filters``: the rows kept (the
    ones given and a partition folder's, combined), ``filtered``: which rows of each shard they keep (None
    without filters), ``counts``: each shard's count of kept rows, ``partitions``: each shard's partition
    values to add to its samples (None unless asked for)."""

    def __init__(
        self,
        root: str,
        index: DatasetIndex,
        *,
        s3_config: S3Config | None,
        filters: Filter | None,
        caching: CacheConfig,
        partition_columns: bool,
        on_bypass: Callable[[str], None] | None,
    ) -> None:
        self.entries = DatasetEntries(root, index, s3_config=s3_config)
        self.caching = caching
        self.on_bypass = on_bypass  # told of each shard read past the cache folder (picklable, or None)
        self._cache_obj: tuple[int, ShardCache] | None = None
        self._memo_obj: tuple[int, TableMemo] | None = None
        if caching.path is not None:
            self.cache()  # a bad folder fails here, not in a worker
        self.filters = filters
        self.filtered: FilteredView | None = None
        if filters is not None:
            with gc_paused():
                self.filtered = plan_filter(self.entries, filters, cache=self.cache())
        self.counts: Counts = (
            np.fromiter((s.samples for s in index.shards), np.int64, len(index.shards))
            if self.filtered is None
            else self.filtered.counts
        )
        self.partitions: Sequence[Mapping[str, Any]] | None = (
            partition_values_of(index) if partition_columns else None
        )

    @property
    def root(self) -> str:
        return self.entries.root

    @property
    def index(self) -> DatasetIndex:
        return self.entries.index

    @property
    def s3_config(self) -> S3Config | None:
        return self.entries.s3_config

    @property
    def shard_format(self) -> str:
        return self.index.shard_format

    @property
    def version(self) -> int:
        """The version of the dataset read (the newest when it was opened, or the one pinned)."""
        return versions_of(self.index)[-1].version

    def __repr__(self) -> str:
        return (
            f"DatasetView({self.root!r}, {len(self.index.shards)} shards, {int(self.counts.sum())} samples)"
        )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache_obj"] = state["_memo_obj"] = None  # locks and per-process checks stay in their process
        return state

    def shards(self) -> Sequence[ShardEntry]:
        """The shards' entries to read with: the manifest's, with the sample tables that ``filters``
        fetched to decide in place (:meth:`FilteredView.shards`: they are not fetched again)."""
        return self.index.shards if self.filtered is None else self.filtered.shards(self.index.shards)

    def cache(self) -> ShardCache | None:
        """This process's view of the shard cache (None without ``caching.path``)."""
        c = self.caching
        if c.path is None:
            return None
        if self._cache_obj is None or self._cache_obj[0] != os.getpid():
            cache = ShardCache(
                c.path,
                limit_bytes=c.limit_bytes,
                verify=c.verify,
                config=self.s3_config,
                on_bypass=self.on_bypass,
            )
            self._cache_obj = (os.getpid(), cache)
        return self._cache_obj[1]

    def table_memo(self) -> TableMemo | None:
        """This process's sample tables kept between passes (None with ``caching.tables_bytes=0``)."""
        budget = self.caching.tables_bytes
        if budget <= 0:
            return None
        if self._memo_obj is None or self._memo_obj[0] != os.getpid():
            self._memo_obj = (os.getpid(), TableMemo(budget))
        return self._memo_obj[1]

    def entry(self, shard: int) -> ShardEntry:
        """Shard ``shard``'s full entry (its sample table attached): as :meth:`shards` has it, or kept in
        :meth:`table_memo`, or fetched (through :meth:`cache`) and checked by its format, then kept
        (:meth:`fastload.formats.DatasetEntries.entry`)."""
        entry = self.shards()[shard]
        if not entry.detached:
            return entry
        with gc_paused():
            return self.entries.entry(shard, cache=self.cache(), memo=self.table_memo())


def open_dataset(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    s3_config: S3Config | None = None,
    key_column: str | None = None,
    filters: Any = None,
    columns: Sequence[str] | None = None,
    partition_columns: bool = False,
    caching: CacheConfig | None = None,
    on_bypass: Callable[[str], None] | None = None,
    version: int | None = None,
) -> DatasetView:
    """Open ``source`` (a dataset's folder or prefix, a partition folder of one, shards or Parquet files
    without an index: :func:`~fastload.train.source.open_index`) for reading: ``columns`` checked against
    the format and the schema, ``filters`` (pyarrow's DNF; a partition folder adds its own) planned,
    ``caching.path`` checked. ``on_bypass``: told of each shard the cache could not store (picklable).
    ``version``: the dataset as it was at that version (its first shards: :mod:`fastload.core.versions`);
    None: the newest."""
    parent = partition_parent(source, s3_config=s3_config)  # .../split=train of a dataset: a filter
    with gc_paused():  # a big index is many small objects
        root, index = open_index(
            parent[0] if parent else source, s3_config=s3_config, key_column=key_column, stacklevel=4
        )
    index = at_version(index, version, where=root)
    if columns is not None and not formats.by_name(index.shard_format).projects_columns:
        raise ConfigError(f"columns= projects Parquet shards; this dataset is {index.shard_format}")
    check_projection(index, columns, where=root)
    flt = normalise(filters)
    if parent is not None:
        types = partition_types(s.partition for s in index.shards)
        flt = and_filters(flt, partition_filter(parent[1], types))
    return DatasetView(
        root,
        index,
        s3_config=s3_config,
        filters=flt,
        caching=caching if caching is not None else CacheConfig(),
        partition_columns=partition_columns,
        on_bypass=on_bypass,
    )


__all__ = ["DatasetView", "open_dataset"]
