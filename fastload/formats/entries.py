"""A dataset's index and its shards' full entries, checked by their format: ``index.json`` loaded and each
entry checked (:func:`load_index`, :func:`check_index`), a manifest entry completed with its sample table
(:func:`full_entry`, :func:`attach_tables`) and the format's per-shard payload read from what core stored
(:func:`read_payload`: ``docs/INDEX-FORMAT.md``, "Index format note"). Once per shard or dataset, never per
sample.

:class:`DatasetEntries` is a dataset held for that (root, index, S3 config): ``entry(shard)`` is the one way
a flow gets a shard's full entry (through a shard cache and an entry memo when it has them). The read side's
``fastload.train.view.DatasetView`` is built on it; verify, ``index --upgrade``, inspect, Ray and bench hold
one."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Protocol

from fastload.formats.registry import ShardFormat, by_name, names

if TYPE_CHECKING:
    from fastload.config import S3Config
    from fastload.core.index import DatasetIndex, ShardEntry
    from fastload.storage.cache import ShardCache


class EntryMemo(Protocol):
    """Full entries kept by shard number (``fastload.train.tablememo.TableMemo``), safe across threads."""

    def get(self, shard: int) -> ShardEntry | None: ...

    def put(self, shard: int, entry: ShardEntry) -> None: ...


class DatasetEntries:
    """The dataset at ``root`` (its folder or prefix) listed by ``index``, read with ``s3_config``, whose
    shards' full entries :meth:`entry` makes, the one way; it pickles with what it holds."""

    def __init__(self, root: str, index: DatasetIndex, *, s3_config: S3Config | None = None) -> None:
        self.root, self.index, self.s3_config = root, index, s3_config

    @classmethod
    def open(cls, dataset: str | os.PathLike[str], *, s3_config: S3Config | None = None) -> DatasetEntries:
        """The dataset whose folder, prefix or ``index.json`` is ``dataset``: its index loaded and checked
        (:func:`load_index`), its root the folder its shard names are relative to (:func:`dataset_root`)."""
        return cls(dataset_root(dataset), load_index(dataset, s3_config=s3_config), s3_config=s3_config)

    @property
    def shard_format(self) -> str:
        return self.index.shard_format

    def __repr__(self) -> str:
        return f"DatasetEntries({self.root!r}, {len(self.index.shards)} {self.shard_format} shards)"

    def entry(
        self, shard: int, *, cache: ShardCache | None = None, memo: EntryMemo | None = None
    ) -> ShardEntry:
        """Shard number ``shard``'s full entry (:func:`full_entry`: its sample table fetched, through
        ``cache``, and checked by its format, its payload read): kept in ``memo`` and taken from it when
        given (a shard with a table only). Raises what :func:`full_entry` raises, naming the shard or its
        table."""
        held = self.index.shards[shard]
        kept = memo.get(shard) if memo is not None and held.detached else None
        if kept is not None:
            return kept
        full = full_entry(
            self.root, held, shard_format=self.shard_format, s3_config=self.s3_config, cache=cache
        )
        if memo is not None and held.detached:
            memo.put(shard, full)
        return full


def check_index(index: DatasetIndex, *, where: str) -> ShardFormat:
    """The format of ``index``, after checking each shard entry describes a shard of it; raises
    :class:`~fastload.errors.IndexFormatError` naming ``where`` and the shard."""
    from fastload.errors import IndexFormatError

    if index.shard_format not in names():
        raise IndexFormatError(f"{where}: unknown shard_format {index.shard_format!r}")
    fmt = by_name(index.shard_format)
    for i, shard in enumerate(index.shards):
        if shard.detached:  # a v2 manifest entry: checked when its sample table is attached
            continue
        index.shards[i] = shard = read_payload(fmt, shard, where=where)
        problem = fmt.check_entry(shard)
        if problem is not None:
            raise IndexFormatError(f"{where}: {fmt.name} shard {shard.name} {problem}")
    return fmt


def read_payload(fmt: ShardFormat, entry: ShardEntry, *, where: str) -> ShardEntry:
    """``entry`` with its format's payload read from what is stored (:meth:`ShardFormat.read_payload`), and
    what was stored dropped once read (the payload writes it again); as it is when it has a payload or
    nothing stored. Raises :class:`~fastload.errors.IndexFormatError` naming ``where`` and the shard for
    what the format refuses."""
    import dataclasses

    if entry.payload is not None or (not entry.extra and entry.table_extra is None):
        return entry
    return _with_payload(fmt, dataclasses.replace(entry), where=where)


def _with_payload(fmt: ShardFormat, entry: ShardEntry, *, where: str) -> ShardEntry:
    """``entry`` (one this module made or copied) given its payload in place (see :func:`read_payload`)."""
    from fastload.core.payload import NO_EXTRA
    from fastload.errors import IndexFormatError

    try:
        payload = fmt.read_payload(entry)
    except ValueError as exc:
        raise IndexFormatError(
            f"{where}: {fmt.name} shard {entry.name}: {exc}; re-run `fastload index --upgrade`"
        ) from None
    if payload is not None:
        entry.payload, entry.extra, entry.table_extra = payload, NO_EXTRA, None
    return entry


def load_index(
    dataset: str | os.PathLike[str], *, s3_config: S3Config | None = None, tables: bool = False
) -> DatasetIndex:
    """A dataset's ``index.json`` (:func:`fastload.storage.manifest.load_index`), checked against its
    format (:func:`check_index`). With ``tables``, every shard's sample table is attached too
    (:func:`attach_tables`): for tools and tests that need the per-sample data of a whole dataset; the
    read path attaches only the shards it reads (:func:`full_entry`)."""
    from fastload.core.index import INDEX_NAME
    from fastload.storage import access as storage
    from fastload.storage.manifest import load_index as read_index

    index = read_index(dataset, s3_config=s3_config)
    url = storage.normalise(dataset)
    check_index(index, where=url if url.endswith(".json") else storage.join(url, INDEX_NAME))
    if tables:
        index = attach_tables(dataset_root(url), index, s3_config=s3_config)
    return index


def dataset_root(dataset: str | os.PathLike[str]) -> str:
    """The folder or prefix a dataset's shard names are relative to (given it, or its ``index.json``)."""
    from fastload.storage import access as storage

    url = storage.normalise(dataset)
    if not url.endswith(".json"):
        return url
    return url.rsplit("/", 1)[0] if storage.is_remote(url) else os.path.dirname(url)


def attach_tables(
    root: str, index: DatasetIndex, *, s3_config: S3Config | None = None, threads: int = 16
) -> DatasetIndex:
    """``index`` with every shard attached (:func:`full_entry`: its sidecar fetched and checked, ``threads``
    at a time); an index whose shards are attached already (v1, in memory) as it is."""
    import dataclasses
    from concurrent.futures import ThreadPoolExecutor

    if not index.detached:
        return index
    entries = DatasetEntries(root, index, s3_config=s3_config)
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(index.shards)))) as pool:
        shards = list(pool.map(entries.entry, range(len(index.shards))))
    return dataclasses.replace(index, shards=shards)


def full_entry(
    root: str,
    entry: ShardEntry,
    *,
    shard_format: str,
    s3_config: S3Config | None = None,
    cache: ShardCache | None = None,
) -> ShardEntry:
    """``entry`` with its per-sample columns (a v2 manifest entry: its sample table fetched and checked
    by the format, :meth:`ShardFormat.check_entry`) and its format's payload read (:func:`read_payload`);
    an attached entry with its payload read."""
    from fastload.errors import IndexFormatError
    from fastload.storage.tables import fetch_table

    fmt = by_name(entry.format or shard_format)
    if not entry.detached:
        return read_payload(fmt, entry, where=root)
    full = _with_payload(fmt, fetch_table(root, entry, s3_config=s3_config, cache=cache), where=root)
    problem = fmt.check_entry(full)
    if problem is not None:
        raise IndexFormatError(f"{root}: {fmt.name} shard {entry.name} {problem}; re-run `fastload index`")
    return full
