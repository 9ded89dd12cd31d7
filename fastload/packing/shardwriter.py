"""``fastload.ShardWriter``: write a dataset from Python, one sample dict at a time.

The face over :class:`~fastload.packing.samplewriter.SampleWriter`: options checked, each sample checked and
encoded in the caller's thread (:mod:`fastload.packing.encode`) before any of it is written, a context
manager that publishes ``index.json`` on a clean exit and, on an exception, removes what it wrote, and the
report. Several processes write one dataset with ``part=i, parts=n`` and :meth:`ShardWriter.merge`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from fastload.config import PackConfig, S3Config
from fastload.core.index import DatasetIndex
from fastload.errors import ConfigError, PackError
from fastload.packing.append_samples import append_mode
from fastload.packing.encode import Encoders, encode_sample
from fastload.packing.parts import merge_parts
from fastload.packing.samplewriter import SampleWriter, WriteResult


@dataclass
class WriteReport:
    """What a :class:`ShardWriter` (or a merge of parts) published."""

    dst: str
    index: DatasetIndex
    seconds: float = 0.0
    part: int | None = None
    parts: int | None = None
    merged: bool = False
    appended: tuple[Any, DatasetIndex] | None = None  # mode="append": (its Version, the dataset's index now)

    @property
    def samples(self) -> int:
        return self.index.samples

    @property
    def shards(self) -> int:
        return len(self.index.shards)

    def summary(self) -> str:
        idx = self.index
        mb = idx.payload_bytes / 1e6
        what = f"{idx.samples:,} samples ({mb:,.1f} MB) in {len(idx.shards)} {idx.shard_format} shard(s)"
        if self.merged:
            return f"merged {self.parts} part(s) into {self.dst}: {what}; index.json written"
        rate = (
            f", {idx.samples / self.seconds:,.0f} samples/s, {mb / self.seconds:,.1f} MB/s"
            if self.seconds
            else ""
        )
        where = f"part {self.part} of {self.parts} of {self.dst}" if self.part is not None else self.dst
        tail = "" if self.part is None else "; merge the parts (ShardWriter.merge) once all are written"
        if self.appended is not None:
            version, now = self.appended
            number = f"version {version.version}" if version is not None else "a new version"
            tail = (
                f"; appended as {number}: {self.dst} now holds {now.samples:,} samples in "
                f"{len(now.shards)} shard(s) (`fastload inspect --versions` lists the versions)"
            )
        return f"wrote {what} into {where} in {self.seconds:.1f}s{rate}{tail}"


class ShardWriter:
    """Write samples (dicts with ``__key__``) into a new dataset at ``dst`` (a local folder or ``s3://``
    prefix): shards of ``format`` ("tar", "parquet", "tfrecord") cut at ``shard_size_bytes`` (and
    ``max_samples_per_shard``), each published whole as it fills (written and uploaded by ``workers`` (2)
    background threads while you produce the next samples), their sample tables, and ``index.json`` last,
    on :meth:`close` (or the end of a ``with`` block).

    Values are encoded by type (``fastload.packing.encode``: bytes as they are, str as UTF-8, int/float as
    text, dict/list as JSON, numpy arrays as ``.npy``, PIL images by the field's extension; ``encoders``
    maps an extension to a function for the rest). A bad sample raises
    :class:`~fastload.errors.SampleError` from :meth:`write` before any of it is written; the writer stays
    usable. ``keys``: ``"check"`` (default) refuses a repeated key, holding every key (about 100 bytes each);
    ``"ordered"`` needs increasing keys and holds none; ``"off"`` trusts you.

    Parquet shards have ``__key__`` and one binary column per field holding the bytes written (``fields``,
    or the first sample's: a later sample with another field is refused). An exception inside the ``with``
    block, or :meth:`abort`, publishes no ``index.json`` and removes the shards written.

    ``mode="append"``: ``dst`` holds a dataset (or nothing yet, to start one) and the samples join it as
    a new version (``index.json``'s ``versions``): shards of its format and options, numbered after its
    shards and tagged, existing files never rewritten, ``index.json`` joined under a lock (local) or a
    conditional PUT (S3), as ``fastload pack --append`` does; with ``keys="check"`` the dataset's keys are
    read first (its sample tables) and a key it holds is refused. ``mode="create"`` (default) refuses a
    destination that is not empty.

    ``part=i, parts=n``: this is writer ``i`` of ``n`` writing one dataset (processes, ranks); its shard
    names cannot collide with the others', and :meth:`merge` publishes the dataset once all have closed
    (a new dataset only: ``mode="append"`` with parts is refused).
    Memory: up to about ``(workers + 3) x shard_size_bytes`` of samples are held. One thread writes to a
    writer at a time (a process or rank each: ``part=``).
    """

    def __init__(
        self,
        dst: str | os.PathLike[str],
        *,
        format: str = "tar",
        shard_size_bytes: int = 256 << 20,
        max_samples_per_shard: int | None = None,
        prefix: str = "shard",
        fields: Sequence[str] | None = None,
        encoders: Encoders | None = None,
        keys: str = "check",
        part: int | None = None,
        parts: int | None = None,
        row_group_bytes: int = 64 << 20,
        compression: str = "none",
        workers: int = 2,
        mode: str = "create",
        s3_config: S3Config | None = None,
    ) -> None:
        if (part is None) != (parts is None):
            raise ConfigError(f"part={part!r}, parts={parts!r}: give both (writer part of parts) or neither")
        if parts is not None and part is not None:
            if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
                raise ConfigError(f"parts={parts!r} must be an int >= 1")
            if isinstance(part, bool) or not isinstance(part, int) or not 0 <= part < parts:
                raise ConfigError(f"part={part!r} must be an int in 0..{parts - 1}")
        append = append_mode(mode, part=part)
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ConfigError(f"workers={workers!r} must be an int >= 1")
        if encoders is not None and not isinstance(encoders, Mapping):
            raise ConfigError(
                "encoders= maps a field's extension to a function returning bytes, e.g. {'pth': fn}"
            )
        config = PackConfig(
            shard_format=format,
            shard_size_bytes=shard_size_bytes,
            max_samples=max_samples_per_shard,
            prefix=prefix,
            row_group_bytes=row_group_bytes,
            compression=compression,
            workers=workers,
        )
        self.dst = os.fspath(dst)
        self.encoders = encoders
        self._began = time.monotonic()
        self._writer = SampleWriter(
            self.dst,
            config,
            fields=fields,
            part=part,
            parts=parts,
            keys=keys,
            options={"writer": "ShardWriter"},
            s3_config=s3_config,
            append=append,
        )
        self._report: WriteReport | None = None
        self._aborted = False

    def write(self, sample: Mapping[str, Any]) -> None:
        """Add one sample (``{"__key__": ..., field: value, ...}``)."""
        if self._aborted:
            raise PackError(f"the writer of {self.dst} was aborted; open another to write more")
        key, members = encode_sample(sample, self.encoders)
        self._writer.add(key, members)

    def close(self) -> WriteReport:
        """Publish the last shard and the index (``index.json``, or this part's index); the report."""
        if self._report is None:
            if self._aborted:
                raise PackError(f"the writer of {self.dst} was aborted; nothing to close")
            try:
                result = self._writer.close()
            except BaseException:
                self._writer.abort()
                raise
            self._report = self._make_report(result)
        return self._report

    def abort(self) -> None:
        """Stop without publishing: no ``index.json``; the shards written so far are removed."""
        if self._report is None and not self._aborted:
            self._aborted = True
            self._writer.abort()

    @property
    def report(self) -> WriteReport:
        """The report of a closed writer."""
        if self._report is None:
            raise PackError(
                "the writer is not closed yet: its report comes from close() or the with block's end"
            )
        return self._report

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.close()
            return
        removed = 0 if self._aborted else len(self._writer.abort())
        self._aborted = True
        note = (
            f"fastload.ShardWriter: {self.dst} was not published (no index.json: not a dataset); the "
            f"{removed} shard(s) written were removed"
        )
        add_note = getattr(exc, "add_note", None)  # (Python 3.11+)
        if add_note is not None:
            add_note(note)

    @staticmethod
    def merge(
        dst: str | os.PathLike[str], *, check_keys: bool = True, s3_config: S3Config | None = None
    ) -> WriteReport:
        """Publish the dataset written in parts (``ShardWriter(dst, part=i, parts=n)``, all closed): one
        ``index.json`` listing every part's shards in part order. ``check_keys`` reads the parts' sample
        tables and refuses a key written by two parts. Raises :class:`~fastload.errors.PackError` naming
        parts not finished (nothing is published)."""
        began = time.monotonic()
        url = os.fspath(dst)
        index = merge_parts(url, check_keys=check_keys, s3_config=s3_config)
        parts = index.options.get("parts")
        return WriteReport(url, index, time.monotonic() - began, parts=parts, merged=True)

    def _make_report(self, result: WriteResult) -> WriteReport:
        w = self._writer
        return WriteReport(
            result.url,
            result.index,
            time.monotonic() - self._began,
            part=w.part,
            parts=w.parts,
            appended=result.appended,
        )
