"""Samples from Python appended to a dataset: ``ShardWriter(dst, mode="append")`` and
``optimize(..., mode="append")``.

:class:`SamplesAppendPlan` is ``fastload pack --append``'s :class:`~fastload.packing.append.AppendPlan`
around a sample writer's plan, so an append from Python opens, names and publishes exactly as the CLI's
does: the dataset's index read and its options checked (another format or option refused, naming it), a
journal of its own in ``.fastload-pack/append-<tag>/``, shards numbered after the existing ones and tagged
(existing files never rewritten), and ``index.json`` joined as a new version under the lock file (local)
or with a conditional PUT (S3). What it adds: the journal tells the writer of each shard it publishes (as
the writer's own journal does), and the writer's key rule learns the dataset's keys (:func:`keys_of`), so
``keys="check"`` refuses a key the dataset holds already.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from fastload import formats
from fastload.config import S3Config
from fastload.core.index import DatasetIndex, ShardEntry
from fastload.errors import ConfigError, PackError, UnfinishedPackError
from fastload.formats.shard import ShardResult
from fastload.packing.append import AppendPlan
from fastload.packing.dest import Destination, destination, read_index_bytes
from fastload.packing.driver import Plan, R, Target
from fastload.packing.encode import KeyRule
from fastload.packing.journal import STATE_DIR, PackJournal
from fastload.packing.parts import NotifyingJournal
from fastload.storage.manifest import OPTIMIZE_HOW, unfinished_by

MODES = ("create", "append")
WRITER_OPTIONS = ("part", "parts", "writer", "optimize")  # recorded, but free to differ in an append


def append_mode(mode: str, *, part: int | None = None) -> bool:
    """Whether ``mode`` ("create" or "append") appends; a :class:`ConfigError` for another mode, or for
    an append in parts (``part=``), which is not supported."""
    if mode not in MODES:
        raise ConfigError(
            f"mode={mode!r}; choose 'create' (a new dataset in an empty folder) or 'append' (new shards "
            "after an existing dataset's, as a new version)"
        )
    if mode == "append" and part is not None:
        raise ConfigError(
            "mode='append' with part=/parts= is not supported: writers in parts publish through "
            "ShardWriter.merge, which creates a dataset. Append from one writer "
            "(ShardWriter(dst, mode='append')), or write the parts into a new folder"
        )
    return mode == "append"


class Writer(Protocol):
    """What :class:`SamplesAppendPlan` needs of the sample writer whose plan it appends."""

    keys: KeyRule

    @property
    def fields(self) -> list[str]: ...

    def opened(
        self,
        dest: Destination,
        journal: PackJournal,
        kept: dict[int, ShardResult] | None,
        *,
        fields: Sequence[str] | None = None,
    ) -> None: ...

    def recorded(self, record: dict[str, Any]) -> None: ...


class SamplesAppendPlan(AppendPlan[R]):
    """The plan ``inner`` of ``writer`` (a sample writer) appended to the dataset at its target (see the
    module docstring)."""

    def __init__(self, inner: Plan[R], *, writer: Writer) -> None:
        super().__init__(inner)
        self.writer = writer

    def open(self) -> tuple[Destination, PackJournal, dict[int, ShardResult] | None]:
        dest, journal, kept = super().open()
        notifying = NotifyingJournal(dest, journal.folder, self.writer.recorded)
        rule = self.writer.keys.rule
        if self.base is not None and rule != "off":
            theirs = [s for s in self.base.shards if not self._is_mine(s.name)]  # (ours: a resume's, landed)
            shards = theirs if rule == "check" else theirs[-1:]
            config = getattr(dest, "config", None)
            fmt = self.base.shard_format
            self.writer.keys.seen(keys_of(dest.url, fmt, shards, s3_config=config))
        self.writer.opened(dest, notifying, kept, fields=self._columns())
        return dest, notifying, kept

    def _columns(self) -> list[str] | None:
        """The columns of the Parquet dataset appended to, which every new shard must have (other tools
        read the folder as one table); a :class:`ConfigError` when the writer was given others."""
        base = self.base
        if base is None or not base.shards or not formats.by_name(base.shard_format).read_as_folder:
            return None
        given = self.writer.fields
        if given and given != sorted(base.fields):
            raise ConfigError(
                f"cannot append to {self.target.url}: fields={given} differ from the dataset's columns "
                f"{sorted(base.fields)}; its shards are read as one table, so pass its fields (or none)"
            )
        return sorted(base.fields)

    def release(self) -> None:
        super().release()
        if not self.target.url.startswith(("s3://", "gs://", "az://")):
            with contextlib.suppress(OSError):  # (no .fastload-pack/ left behind once nothing uses it)
                os.rmdir(os.path.join(os.path.abspath(self.target.url), STATE_DIR))


def keys_of(
    root: str, shard_format: str, shards: list[ShardEntry], *, s3_config: S3Config | None
) -> Iterator[str]:
    """The keys of ``shards`` (in ``root``, of ``shard_format``), read from their sample tables in order
    (an append's dataset; the shards a resumed run kept)."""
    some = DatasetIndex(shard_format=shard_format, fields=[], shards=list(shards))
    for shard in formats.attach_tables(root, some, s3_config=s3_config).shards:
        yield from shard.keys


def create_refusal(target: Target, exc: PackError, *, by: str) -> PackError:
    """What a sample writer creating a dataset (``mode="create"``; ``by``: "ShardWriter", or "" for
    ``optimize``) says for the refusal ``exc`` of its destination: where a dataset is, that
    ``mode="append"`` adds to it; where an interrupted run is, what left it (optimize, or a writer) and how
    to finish or start again; else ``exc``."""
    text = str(exc)
    if "is not empty" in text:
        dest = destination(target.url, STATE_DIR, config=target.s3_config)
        if read_index_bytes(dest) is not None:
            return PackError(
                f"{target.url} holds a dataset (index.json); pass mode='append' to add these samples to it "
                "as a new version (its format and options), or write into an empty or new folder"
            )
    if target.resume or ("pass --resume" not in text and OPTIMIZE_HOW not in text):
        return exc
    if unfinished_by(target.url, s3_config=target.s3_config) == "optimize":
        return UnfinishedPackError(target.url, what="written to", how=OPTIMIZE_HOW)
    return PackError(
        f"{target.url} holds an interrupted write (its journal .fastload-pack/ is there: a {by or 'writer'} "
        "was killed, or is still running); delete the folder and write again, or write elsewhere"
    )


def release_of(plan: Plan[Any]) -> Callable[[], None]:
    """What ends ``plan``'s run: an append's :meth:`~AppendPlan.release`, else nothing."""
    return plan.release if isinstance(plan, AppendPlan) else (lambda: None)


__all__ = [
    "MODES",
    "WRITER_OPTIONS",
    "SamplesAppendPlan",
    "Writer",
    "append_mode",
    "create_refusal",
    "keys_of",
    "release_of",
]
