"""``ShardDataset(filters=...)``: the filtered dataset, decided before an epoch is planned, so that
splitting over ranks and workers, the even policies, shuffling and resume all work on it as on any other.

Per shard, the filter (:mod:`fastload.core.filters`) is evaluated on its hive partition values (its
``partition``, e.g. ``"year=2024/month=01"``, typed as pyarrow's hive partitioning types them) and its
min/max statistics from the manifest (written by ``fastload pack``): a shard that cannot match is dropped
unread, one whose rows all match is kept whole. Only the undecided shards (Parquet) are looked into, in
parallel: their row groups' footer statistics, then the filter's columns of the row groups those leave
undecided (:mod:`fastload.formats.parquet.select`). The result is each shard's exact count of kept rows,
and the runs of kept rows where a shard is kept in part (:class:`FilteredView`): the planner deals out
positions among kept rows, which :meth:`FilteredView.rows` maps to the shard's rows. The sample tables
fetched to decide are kept (up to :data:`KEPT_TABLE_BYTES` of them) and read with
(:meth:`FilteredView.shards`), so a shard's table is not fetched again to read it in this process (nor in
a DataLoader worker, which gets the view with the dataset).

Also :func:`partition_parent`: a partition folder of a dataset (``.../split=train``) read as the dataset
filtered on that partition.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from fastload import formats
from fastload.config import S3Config
from fastload.core import filters as F
from fastload.core import selection
from fastload.core.index import DatasetIndex, ShardEntry
from fastload.errors import ConfigError, IndexFormatError
from fastload.storage import access as storage
from fastload.storage.cache import ShardCache
from fastload.storage.manifest import has_index

Ints = np.ndarray[Any, np.dtype[np.int64]]

# sidecar bytes of the sample tables fetched while deciding that are kept for reading (decoded, a table
# takes a few times its sidecar's size in memory); the tables past it are fetched again when read
KEPT_TABLE_BYTES = 16 << 20


@dataclasses.dataclass
class FilteredView:
    """The kept rows of each shard of a dataset: ``counts`` (per shard, 0 for a dropped one) and, for the
    shards kept in part, their runs of kept rows (``spans``). ``fetched_bytes``: what deciding cost.
    ``entries``: full entries (sample tables) fetched while deciding, kept for reading (:meth:`shards`)."""

    counts: Ints
    spans: dict[int, selection.Spans]
    fetched_bytes: int = 0
    entries: dict[int, ShardEntry] = dataclasses.field(default_factory=dict, repr=False, compare=False)
    _flat: tuple[Any, Ints, Ints, Ints] | None = dataclasses.field(default=None, repr=False, compare=False)
    _shards: tuple[Sequence[ShardEntry], list[ShardEntry]] | None = dataclasses.field(
        default=None, repr=False, compare=False
    )

    def shards(self, shards: Sequence[ShardEntry]) -> Sequence[ShardEntry]:
        """``shards`` (the manifest's entries) with the full entries fetched while deciding in their
        place: what reading uses, so those tables are not fetched again."""
        if not self.entries:
            return shards
        made = self._shards
        if made is None or made[0] is not shards:  # (made once: a Mix reads a block at a time)
            made = self._shards = (shards, [self.entries.get(i, s) for i, s in enumerate(shards)])
        return made[1]

    def rows(self, shards: Ints, positions: Ints) -> Ints:
        """The shard rows of ``positions`` among each shard's kept rows (vectorised: one search over every
        kept-in-part shard's runs, laid end to end)."""
        if not self.spans:
            return positions
        if self._flat is None:
            base = np.zeros(len(self.counts), dtype=np.int64)
            begins, starts, at = [], [], 0
            for shard in sorted(self.spans):
                s = self.spans[shard]
                if not len(s):
                    continue  # (no kept row: never referenced)
                lengths = s[:, 1] - s[:, 0]
                base[shard] = at
                begins.append(at + np.concatenate(([0], np.cumsum(lengths)[:-1])))
                starts.append(s[:, 0])
                at += int(lengths.sum())
            has = np.zeros(len(self.counts), dtype=bool)
            has[list(self.spans)] = True
            begins.append(np.zeros(0, np.int64))
            starts.append(np.zeros(0, np.int64))
            self._flat = (has, base, np.concatenate(begins).astype(np.int64), np.concatenate(starts))
        has, base, begins_all, starts_all = self._flat
        out: Ints = positions.copy()
        mine = np.flatnonzero(has[shards])
        q = base[shards[mine]] + positions[mine]
        k = np.searchsorted(begins_all, q, side="right") - 1
        out[mine] = starts_all[k] + (q - begins_all[k])
        return out


def shard_stats(fmt: formats.ShardFormat, entry: ShardEntry, *, where: str) -> dict[str, F.ColumnStats]:
    """The per-shard statistics of ``entry`` its format knows (Parquet's, in the manifest:
    :meth:`~fastload.formats.ShardFormat.column_stats`) as :class:`~fastload.core.filters.ColumnStats`."""
    try:
        stats = fmt.column_stats(entry)
    except ValueError as exc:
        raise IndexFormatError(
            f"{where}: {fmt.name} shard {entry.name}: {exc}; re-run `fastload index`"
        ) from None
    return {c: F.ColumnStats(lo, hi, nulls, entry.samples) for c, (lo, hi, nulls) in stats.items()}


def plan_filter(
    dataset: formats.DatasetEntries, flt: F.Filter, *, cache: ShardCache | None, threads: int = 16
) -> FilteredView:
    """The rows of ``dataset`` that ``flt`` keeps (see the module docstring); the undecided shards' tables
    fetched through ``cache``."""
    root, index, s3_config = dataset.root, dataset.index, dataset.s3_config
    fmt = formats.by_name(index.shard_format)
    types = F.partition_types(s.partition for s in index.shards)
    known = list(index.fields) + list(types) + ["__key__"]
    F.check_columns(flt, known, where=root)
    counts = np.zeros(len(index.shards), dtype=np.int64)
    undecided: list[int] = []
    for i, shard in enumerate(index.shards):
        verdict = F.verdict(
            flt,
            partition=F.partition_values(shard.partition, types),
            stats=shard_stats(fmt, shard, where=root),
        )
        if verdict == F.ALL:
            counts[i] = shard.samples
        elif verdict == F.SOME and shard.samples:
            undecided.append(i)
    view = FilteredView(counts, {})
    if not undecided:
        return view
    if not fmt.selects_rows:
        cols = [c for c in F.columns_of(flt) if c not in types]
        raise ConfigError(
            f"filters on {', '.join(map(repr, cols))} need Parquet shards (their row statistics); this "
            f"dataset is {index.shard_format}: filter on its partition columns ({', '.join(types) or 'none'})"
        )

    def one(i: int) -> tuple[int, list[tuple[int, int]], int, ShardEntry]:
        from fastload.train.shardreader import ShardReader

        entry = dataset.entry(i, cache=cache)
        reader = ShardReader(storage.join(root, entry.name), entry, config=s3_config)
        try:
            runs, nbytes = reader.select(flt, F.partition_values(entry.partition, types))
        finally:
            reader.close()
        return i, runs, nbytes, entry

    kept = 0
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(undecided)))) as pool:
        for i, runs, nbytes, entry in pool.map(one, undecided):
            s = selection.spans(runs)
            view.counts[i] = selection.count(s)
            view.fetched_bytes += nbytes
            if view.counts[i] != index.shards[i].samples:
                view.spans[i] = s
            table = index.shards[i].table
            if view.counts[i] and table is not None and kept + table.bytes <= KEPT_TABLE_BYTES:
                view.entries[i] = entry  # (fetched: read with it, not fetched again)
                kept += table.bytes
    return view


def partition_parent(source: Any, *, s3_config: S3Config | None) -> tuple[str, str] | None:
    """``(dataset root, partition)`` when ``source`` is a partition folder (``.../split=train``, nested
    ``.../year=2024/month=01`` too) of a dataset whose ``index.json`` is in a parent folder and not in
    ``source`` itself; else None."""
    if not isinstance(source, str) and not hasattr(source, "__fspath__"):
        return None
    url = storage.normalise(source)
    tail: list[str] = []
    here = url
    while True:
        head, sep, last = here.rpartition("/")
        if not sep or "=" not in last or not head or head.endswith(":/"):
            break
        if not tail and has_index(url, s3_config=s3_config):
            return None  # a dataset of its own
        tail.insert(0, last)
        here = head
        if has_index(here, s3_config=s3_config):
            return here, "/".join(tail)
    return None


def partition_filter(partition: str, types: dict[str, type]) -> F.Filter:
    """The filter that keeps the shards of partition folder ``partition``."""
    values = F.partition_values(partition, types)
    clause = tuple(
        F.Predicate(k, "==", v) if v is not None else F.Predicate(k, "in", (None,)) for k, v in values.items()
    )
    return (clause,)


def partition_values_of(index: DatasetIndex) -> list[dict[str, Any]]:
    """Each shard's typed partition values (what ``partition_columns=True`` adds to its samples)."""
    types = F.partition_types(s.partition for s in index.shards)
    return [F.partition_values(s.partition, types) for s in index.shards]


def check_projection(index: DatasetIndex, columns: Sequence[str] | None, *, where: str) -> None:
    """:class:`ConfigError` naming a column of ``columns=`` that the dataset does not have (its fields and
    partition columns; nothing is checked when the index lists no fields)."""
    if columns is None or not index.fields:
        return
    known = list(index.fields) + list(F.partition_types(s.partition for s in index.shards))
    unknown = [c for c in columns if c not in known and not c.startswith("__")]
    if unknown:
        raise ConfigError(
            f"columns= names {', '.join(map(repr, unknown))}, not a column of {where}; its columns: "
            f"{', '.join(sorted(known))}"
        )


def selection_state(flt: F.Filter | None, columns: Sequence[str] | None) -> dict[str, Any]:
    """What a checkpoint records of the rows and columns read (another selection is refused on restore)."""
    return {"filters": F.describe(flt), "columns": None if columns is None else list(columns)}


def check_selection(state: dict[str, Any], flt: F.Filter | None, columns: Sequence[str] | None) -> None:
    """:class:`ConfigError` when checkpoint ``state`` was taken with other filters or columns (a
    checkpoint from before they were recorded read everything, unfiltered)."""
    mine = selection_state(flt, columns)
    for name in ("filters", "columns"):
        if name == "columns" and name not in state:
            continue  # (columns do not change positions: older checkpoints resume with any)
        theirs = state.get(name)
        if theirs != mine[name]:
            raise ConfigError(
                f"cannot resume: the checkpoint was taken with {name}={theirs!r}, this run has "
                f"{name}={mine[name]!r}; resume with the same {name} (a checkpoint's position counts the "
                "rows it selected)"
            )
