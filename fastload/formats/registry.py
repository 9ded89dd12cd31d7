"""The shard-format protocol and its registry: every flow (pack, index, verify, inspect, read) chooses a
format here, by name (``index.json``'s ``shard_format``, ``--format``) or by file name, never by checking
suffixes itself. The lookups run once per shard or per dataset, never per sample.

A format is one object implementing :class:`ShardFormat`; the built-in ones (tar, Parquet, TFRecord) are
registered when :mod:`fastload.formats` is imported, and :func:`register` adds another (a test's toy format,
a user's own container). A format subclasses :class:`ShardFormat` to inherit the defaults of its optional
members (capabilities off, no per-shard payload).

Each format owns its per-shard fields beyond core's (``docs/INDEX-FORMAT.md``, "Index format note"): core
keeps them as stored (:attr:`ShardEntry.extra`, :attr:`ShardEntry.table_extra`) and
:func:`fastload.formats.entries.read_payload` has the format read and check them into its
:attr:`ShardEntry.payload`, once per full entry. A dataset's index checked and its full entries made by
their format: :mod:`fastload.formats.entries`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol, runtime_checkable

from fastload.errors import ConfigError, VerifyError

if TYPE_CHECKING:
    from fastload.config import PackConfig, S3Config
    from fastload.core.index import DatasetIndex, ShardEntry
    from fastload.core.keys import Sample
    from fastload.core.payload import ShardPayload
    from fastload.formats.shard import ShardResult
    from fastload.storage.inputs import Input

RawSample = dict[str, Any]
Problem = VerifyError  # what verify and lint report: names the shard, the sample/offset and what to do


class SampleSource(Protocol):
    """One open shard's samples, for the read path (:meth:`ShardFormat.samples`)."""

    def load(
        self, positions: Sequence[int], columns: Sequence[str] | None = None, *, defer: bool = False
    ) -> Callable[[], Iterable[RawSample]]:
        """Do the I/O for the samples at ``positions`` (index order of the shard) now; the returned function
        makes them into samples (``defer``: it is called at once in this thread)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class ShardFormat(Protocol):
    """What a shard format implements. ``suffixes[0]`` is the one ``fastload pack`` names shards with.
    The members with a value or a body here are optional: a format that subclasses this class inherits them
    (a format that does not must define them all)."""

    name: str  # as in index.json and --format: "tar"
    label: str  # as messages say it: "TFRecord"
    suffixes: tuple[str, ...]  # file names this format claims (see matches)
    pack_options: tuple[str, ...]  # PackConfig fields that change this format's bytes (beyond the common)
    foreign: bool  # files written by other tools can be indexed (table) and linted without an index
    projects_columns: bool  # its read path reads only the fields asked for (ShardDataset(columns=...))
    # its datasets are read by other tools listing the folder (Parquet): fastload's files go in _fastload/
    read_as_folder: bool = False
    # its SampleSource has select(filter, partition): the rows a filter keeps (filters on non-partition
    # columns need it)
    selects_rows: bool = False
    # its SampleSource.load takes any positions in any order: a shard that fits in one read task is planned
    # without its sample table (core.readplan.iter_reads(whole=)), and whole_entry may complete it
    any_positions: bool = False
    # table(..., key_column=) can take keys from a column of the files (Parquet)
    keys_from_column: bool = False

    def read_payload(self, entry: ShardEntry) -> ShardPayload | None:
        """This format's per-shard data of ``entry`` as stored (:attr:`ShardEntry.extra`, the keys of its
        ``index.json`` object beyond core's; :attr:`ShardEntry.table_extra`, its part of the sample table
        when attached), read and checked: raise :class:`ValueError` saying what is wrong. None: nothing
        stored (the default: a format without per-shard data of its own)."""
        return None

    def whole_entry(self, entry: ShardEntry, data: bytes) -> ShardEntry | None:
        """``entry`` (detached) completed from its whole shard's bytes ``data`` (checked against its size
        and CRC32C by the caller), so a read of a whole shard needs no table; None: it cannot be (the
        default). Called only for formats with :attr:`any_positions`."""
        return None

    def column_stats(self, entry: ShardEntry) -> dict[str, list[Any]]:
        """``{column: [min, max, nulls]}`` of the whole shard, for filters to skip it unread (detached or
        attached); ``{}`` when unknown (the default)."""
        return {}

    def matches(self, name: str) -> bool:
        """Whether a file name is one of this format's shards."""
        ...

    def sample_sizes(
        self, samples: Sequence[Sample[Input]], *, n_fields: int, config: PackConfig
    ) -> tuple[list[int], int]:
        """Each sample's exact bytes in a shard, and the per-shard overhead: what pack plans shards by."""
        ...

    def write(
        self,
        name: str,
        samples: Sequence[Sample[Input]],
        tmp_path: str,
        *,
        fields: Sequence[str],
        config: PackConfig,
        on_sample: Callable[[int, int], None] | None = None,
        open_threads: int = 0,
    ) -> ShardResult:
        """Write one shard at ``tmp_path``; its index entry (named ``name``) and what was skipped."""
        ...

    def check_entry(self, entry: ShardEntry) -> str | None:
        """Why ``entry`` cannot describe a shard of this format (e.g. no per-sample offsets), or None."""
        ...

    def table(
        self,
        named: Sequence[tuple[str, str]],
        *,
        threads: int,
        s3_config: S3Config | None,
        key_column: str | None = None,
    ) -> tuple[DatasetIndex, list[Problem]]:
        """The index of foreign shards ``(url, name)`` (names relative to the index's folder), read once;
        with problems the index is not to be used. ``key_column``: only for formats with
        :attr:`keys_from_column` (and passed only when given)."""
        ...

    def samples(
        self,
        entry: ShardEntry,
        *,
        read: Callable[[int, int], bytes],
        file: BinaryIO,
        fd: int | None,
    ) -> SampleSource:
        """The read path of one open shard: ``read(offset, size)`` returns exactly those bytes (thread
        safe), ``file`` is the open shard, ``fd`` its descriptor when it is a local file. ``read.many``,
        where the caller has it (a remote shard read by ``ShardDataset``), takes ``[(start, end)]`` ranges
        and returns their bytes, fetched at once on the caller's pool; ``read.data``, where not None, is the
        whole shard in memory, checked against the entry's CRC32C."""
        ...

    def verify(self, file: BinaryIO, shard: ShardEntry) -> list[Problem]:
        """Check a whole shard, read from its start, against its index entry: CRC32C, samples, keys and
        byte ranges (the caller checks the file size)."""
        ...

    def lint(self, url: str, *, s3_config: S3Config | None) -> tuple[list[Problem], int, int]:
        """Check a foreign file without an index: its problems, samples and stored bytes."""
        ...

    def describe(self, index: DatasetIndex) -> list[str]:
        """Extra lines for ``fastload inspect`` (may be empty)."""
        ...


_FORMATS: dict[str, ShardFormat] = {}


def register(fmt: ShardFormat, *, replace: bool = False) -> ShardFormat:
    """Add ``fmt`` to the registry (``replace``: over one of the same name); returns it."""
    if not isinstance(fmt, ShardFormat):
        raise ConfigError(
            f"{fmt!r} does not implement fastload.formats.ShardFormat (subclass it for the defaults of its "
            "optional members)"
        )
    if not fmt.name or not fmt.suffixes:
        raise ConfigError(f"format {fmt.name!r} needs a name and at least one suffix")
    if fmt.name in _FORMATS and not replace:
        raise ConfigError(f"a shard format named {fmt.name!r} is registered already (pass replace=True)")
    _FORMATS[fmt.name] = fmt
    return fmt


def unregister(name: str) -> None:
    """Remove the format ``name`` (for tests that register their own)."""
    _FORMATS.pop(name, None)


def names() -> tuple[str, ...]:
    """The registered formats' names, in registration order (the built-ins first: tar, parquet, tfrecord)."""
    return tuple(_FORMATS)


def all_formats() -> tuple[ShardFormat, ...]:
    return tuple(_FORMATS.values())


def by_name(name: str, *, what: str = "shard_format") -> ShardFormat:
    """The format called ``name``; :class:`ConfigError` naming ``what`` and the choices when there is none."""
    try:
        return _FORMATS[name]
    except (KeyError, TypeError):
        raise ConfigError(f"{what}={name!r}; choose one of {', '.join(_FORMATS)}") from None


def for_path(url: str) -> ShardFormat | None:
    """The format whose shards are named like ``url`` (``x.tar``, ``x.tfrecord.gz``), or None."""
    for fmt in _FORMATS.values():
        if fmt.matches(url):
            return fmt
    return None


def foreign_format(url: str) -> ShardFormat | None:
    """The format of ``url`` if its files can be indexed and linted without an ``index.json``, else None."""
    fmt = for_path(url)
    return fmt if fmt is not None and fmt.foreign else None


def sidecar_prefix(shard_format: str) -> str:
    """Where a dataset of ``shard_format`` keeps fastload's files (``index.json``, sample tables), relative
    to its root: ``"_fastload/"`` for a format whose datasets other tools read by listing the folder (the
    format's optional ``read_as_folder``: Parquet), where they skip names starting with ``_``; else ``""``,
    beside the shards."""
    from fastload.core.index import SIDECAR_DIR

    return f"{SIDECAR_DIR}/" if by_name(shard_format).read_as_folder else ""


def index_name(shard_format: str) -> str:
    """The manifest's path, relative to the dataset's root, that a writer of ``shard_format`` uses."""
    from fastload.core.index import INDEX_NAME

    return sidecar_prefix(shard_format) + INDEX_NAME


def table_path(shard_name: str, shard_format: str) -> str:
    """Where a writer puts a shard's sample table, relative to the dataset's root (the manifest records it
    and readers follow the record: older Parquet datasets have tables beside their files)."""
    from fastload.core.table import table_name

    return sidecar_prefix(shard_format) + table_name(shard_name)


def index_files(
    urls: Sequence[str],
    *,
    s3_config: S3Config | None = None,
    threads: int = 8,
    key_column: str | None = None,
    root: str | None = None,
) -> tuple[str, DatasetIndex]:
    """``(root, index)`` for shards without an ``index.json``, given by URL (all local or all on S3, all of
    one format that can be read so: :func:`foreign_format`), read once; names are relative to ``root``.
    ``key_column``: the column whose values are the keys (Parquet only). ``root``: the folder the URLs were
    listed under (names relative to it, as ``fastload index`` names them), else their common folder.
    Raises :class:`ConfigError` for other files or a mix of formats, :class:`VerifyError` for the first
    bad shard."""
    from fastload.storage import access as storage
    from fastload.storage.access import split_root

    if not urls:
        raise ConfigError("no shards given")
    urls = [storage.normalise(u) for u in urls]
    kinds: dict[str, ShardFormat] = {}
    for u in urls:
        fmt = foreign_format(u)
        if fmt is None:
            readable = ", ".join(f"*{s}" for f in all_formats() if f.foreign for s in f.suffixes)
            raise ConfigError(
                f"{u}: only shards named {readable} (TFRecord also with .gz) can be read without an "
                "index.json"
            )
        kinds.setdefault(fmt.name, fmt)
    if len(kinds) > 1:
        labels = " and ".join(f.label for f in kinds.values())
        raise ConfigError(f"the shards given are {labels} files; one dataset reads one format")
    (fmt,) = kinds.values()
    if root is None:
        root, names = split_root(urls)
    else:
        root = storage.normalise(root)
        names = [u[len(root) :].lstrip("/").replace(os.sep, "/") for u in urls]
    named = list(zip(urls, names, strict=True))
    if key_column is None:
        index, problems = fmt.table(named, threads=threads, s3_config=s3_config)
    elif fmt.keys_from_column:
        index, problems = fmt.table(named, threads=threads, s3_config=s3_config, key_column=key_column)
    else:
        raise ConfigError(f"key_column={key_column!r} names a Parquet column; these are {fmt.label} files")
    if problems:
        raise problems[0]
    return root, index
