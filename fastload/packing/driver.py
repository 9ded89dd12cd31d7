"""The one pack driver: a :class:`Plan` in, a published dataset and its report out.

Every way of writing a dataset (``fastload.pack`` of files, of table rows, ``pack_tokens``; next: samples from
Python, ``optimize``, appends) is a plan: what to write and how to account for it. :func:`run` does the rest,
the same for all of them:

    open the destination and its journal (``plan.open``: fresh, resumed, or already complete)
    -> already complete: the plan's shards to retry (``plan.retry``: inputs it had to skip, fixed since), else
       the plan's "nothing to do" report (skips still refused unless allowed)
    -> the plan's engine writes the plan's jobs (each through ``engine.publish_shard``: temp, publish, sample
       table, journal) under one progress bar
    -> ``index.json`` (``plan.index`` from the shards' results) written last, the journal removed
    -> the plan's report; inputs skipped while writing refused unless allowed.

A failed write to the destination (no space, no permission) becomes a :class:`~fastload.errors.PackError`
naming it and what to do (:func:`destination_errors`). Jobs may be planned ahead (``shards`` known) or cut
while their inputs stream in (``shards`` None: the jobs iterator produces them, pack-tokens does; a plan fed
by a Python generator of samples does the same).
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fastload.config import S3Config
from fastload.core.index import INDEX_NAME, DatasetIndex, parse_index
from fastload.errors import DestinationWriteError, PackError, Skip, SkippedInputError
from fastload.formats import index_name
from fastload.formats.shard import ShardResult
from fastload.packing.dest import Destination, read_index_bytes
from fastload.packing.engine import Engine, ShardJob
from fastload.packing.journal import PackJournal, open_pack, reopen_pack
from fastload.packing.progress import Progress
from fastload.packing.report import ListingNotes, PackReport

R = TypeVar("R")


@dataclass(frozen=True, kw_only=True)
class Target:
    """Where and under what identity a plan writes: ``fingerprint`` (inputs and options: a resume refuses
    another), ``layout`` (what a finished pack records: ``--resume`` on it is "already complete"), ``shards``
    (how many, when planned ahead; None when cut while writing)."""

    url: str
    fingerprint: str
    layout: str
    shards: int | None
    resume: bool = False
    allow_skip: bool = False
    progress: bool | None = None
    s3_config: S3Config | None = None


@dataclass(frozen=True)
class Retry:
    """Shards of a finished pack to write again (:func:`~fastload.packing.journal.reopen_pack`): ``retry``,
    among all of them in plan order ``numbers``; ``totals(n)``: a kept shard's payload bytes and files."""

    numbers: Sequence[int]
    retry: frozenset[int]
    totals: Callable[[int], tuple[int, int]]


class Plan(ABC, Generic[R]):
    """What one pack writes, for :func:`run`; ``R`` is its report type. Subclasses give names, an engine,
    jobs, the index and the reports; ``open`` (a fresh or resumed pack into an empty destination) and
    ``retry`` (none) have defaults that an append and a pack of files override."""

    target: Target
    progress_items = "files"  # what the bar's rate counts

    @abstractmethod
    def name_of(self, number: int) -> str | None:
        """Shard ``number``'s file name (None: not in this plan)."""

    def open(self) -> tuple[Destination, PackJournal, dict[int, ShardResult] | None]:
        """The destination, its journal and the shards kept from an interrupted run (None: already
        complete). A fresh pack needs an empty destination."""
        t = self.target
        return open_pack(
            t.url,
            fingerprint=t.fingerprint,
            layout=t.layout,
            resume=t.resume,
            shards=t.shards,
            name_of=self.name_of,
            s3_config=t.s3_config,
        )

    def retry(self, index: DatasetIndex) -> Retry | None:
        """Of a finished pack of this plan (``index``), the shards to write again; None: none."""
        return None

    def output_options(self) -> dict[str, Any] | None:
        """The options its ``index.json`` records that decide the shards' bytes (what an append must share
        with the dataset it joins: ``packing.append``); None: this plan cannot append."""
        return None

    def joined_options(self, current: dict[str, Any], added: dict[str, Any]) -> dict[str, Any]:
        """The options of a dataset (``current``) once an append of this plan's shards (whose index has
        ``added``) joined it: ``current``'s; a plan that records totals there adds its own."""
        return current

    def publish(self, dest: Destination, index: DatasetIndex) -> DatasetIndex:
        """Write ``index`` as the dataset's ``index.json`` (last, once every shard is published) and return
        what was written; an append joins it to the index there is now instead."""
        dest.write_bytes(self.index_name(index), index.to_json())
        return index

    @abstractmethod
    def engine(self, dest: Destination, journal: PackJournal, todo: int | None) -> Engine:
        """The engine for ``todo`` shards still to write (None: not known ahead)."""

    @abstractmethod
    def jobs(self, dest: Destination, kept: Mapping[int, ShardResult]) -> Iterable[ShardJob]:
        """The jobs of the shards not ``kept``, in order."""

    def progress_total(self) -> int | None:
        """Payload bytes the bar counts to (None: not known ahead)."""
        return None

    def progress_desc(self) -> str:
        return f"packing {self.target.shards} shards" if self.target.shards is not None else "packing"

    @abstractmethod
    def index(self, results: Mapping[int, ShardResult]) -> DatasetIndex:
        """The dataset's index from every shard's result; raise :class:`PackError` if there is nothing to
        publish (the journal is removed first)."""

    @abstractmethod
    def report(
        self, url: str, index: DatasetIndex, results: Mapping[int, ShardResult], *, kept: int, seconds: float
    ) -> R:
        """The report of a run that wrote (some of) the shards into ``url``, ``kept`` of them from an
        interrupted one."""

    @abstractmethod
    def complete(self, url: str, index: DatasetIndex, *, skipped: list[Skip], seconds: float) -> R:
        """The report when the destination already holds this pack (nothing written)."""

    def index_name(self, index: DatasetIndex) -> str:
        """Where ``index`` is written, relative to the destination (``index.json``, beside the shards or
        in ``_fastload/``; one part of a dataset of several writers puts its own elsewhere, to be merged)."""
        return index_name(index.shard_format)

    def late_skips(self, results: Mapping[int, ShardResult]) -> list[Skip]:
        """Inputs skipped while writing (refused after ``index.json`` unless ``allow_skip``)."""
        return written_skips(results)


def written_skips(results: Mapping[int, ShardResult]) -> list[Skip]:
    """The skips the shards' writers met, in shard order."""
    return [s for n in sorted(results) for s in results[n].skipped]


def results_index(
    results: Mapping[int, ShardResult],
    *,
    numbers: Sequence[int],
    shard_format: str,
    fields: list[str],
    options: dict[str, Any],
    planned_skips: list[Skip],
) -> DatasetIndex:
    """The index of a pack planned ahead: shards in plan order ``numbers``, the skips of planning then of
    writing, the payload summed."""
    skipped = planned_skips + written_skips(results)
    return DatasetIndex(
        shard_format=shard_format,
        fields=fields,
        shards=[results[n].entry for n in numbers],
        options=options,
        skipped=[{"path": s.path, "reason": s.reason} for s in skipped],
        payload_bytes=sum(r.payload_bytes for r in results.values()),
    )


def pack_report(
    url: str,
    index: DatasetIndex,
    results: Mapping[int, ShardResult],
    *,
    planned_skips: list[Skip],
    kept: int,
    seconds: float,
    shards: int,
    empty_files: int = 0,
    notes: ListingNotes | None = None,
) -> PackReport:
    """The :class:`PackReport` of a pack planned ahead (of ``shards`` shards) that wrote into ``url``."""
    return PackReport(
        url,
        index,
        skipped=planned_skips + written_skips(results),
        shards_written=shards - kept,
        shards_kept=kept,
        files=sum(r.files for r in results.values()),
        empty_files=empty_files,
        seconds=seconds,
        notes=notes or ListingNotes(),
    )


def run(plan: Plan[R]) -> R:
    """Write ``plan`` (see the module docstring) and return its report."""
    began = time.monotonic()
    t = plan.target
    with destination_errors(t.url):
        dest, journal, kept = plan.open()
        if kept is None:  # complete: but the inputs it had to skip may be fixed now
            where, raw = read_index_bytes(dest) or (f"{dest.url}/{INDEX_NAME}", b"")
            index = parse_index(raw, where=where)
            retry = plan.retry(index)
            if retry is None or not retry.retry:
                skipped = [Skip(s["path"], s["reason"]) for s in index.skipped]
                if skipped and not t.allow_skip:
                    raise SkippedInputError(skipped, written=True)
                return plan.complete(dest.url, index, skipped=skipped, seconds=time.monotonic() - began)
            kept = reopen_pack(
                dest,
                journal,
                index,
                numbers=retry.numbers,
                retry=retry.retry,
                totals=retry.totals,
                name_of=plan.name_of,
                fingerprint=t.fingerprint,
            )
        results: dict[int, ShardResult] = dict(kept)
        todo = None if t.shards is None else max(1, t.shards - len(kept))
        engine = plan.engine(dest, journal, todo)
        with Progress(
            total=plan.progress_total(),
            initial=sum(r.payload_bytes for r in results.values()),
            enabled=t.progress,
            desc=plan.progress_desc(),
            items=plan.progress_items,
        ) as bar:
            try:
                engine.write(plan.jobs(dest, kept), advance=bar.advance, done=results.__setitem__)
            except BaseException:
                dest.cleanup()
                raise
        try:
            index = plan.index(results)
        except PackError:
            journal.remove()
            raise
        index = plan.publish(dest, index)
        journal.remove()
        report = plan.report(dest.url, index, results, kept=len(kept), seconds=time.monotonic() - began)
    late = plan.late_skips(results)
    if late and not t.allow_skip:
        raise SkippedInputError(late, written=True)
    return report


_DESTINATION_ERRORS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is used up",
    errno.EROFS: "it is on a read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}


@contextlib.contextmanager
def destination_errors(dst: str) -> Iterator[None]:
    """A write to the destination ``dst`` that fails for want of space or permission becomes a
    :class:`PackError` naming the destination and what to do (finished shards are kept for ``--resume``);
    a permission error elsewhere (a source) passes unchanged."""
    try:
        yield
    except DestinationWriteError:
        raise  # already names the destination (and staging folder) and what to do
    except OSError as exc:
        why = _DESTINATION_ERRORS.get(exc.errno or 0)
        where = exc.filename if isinstance(exc.filename, str) else dst
        if why is None or (exc.errno in (errno.EACCES, errno.EPERM) and not _inside(where, dst)):
            raise
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            todo = (
                "free some space (or pack elsewhere), then run the same command with --resume: the "
                "shards finished so far are kept"
            )
        else:
            todo = "choose a destination you can write to (or fix its permissions)"
        detail = f" ({where})" if where != dst else ""
        raise PackError(f"cannot write to {dst}: {why}{detail}; {todo}") from exc


def _inside(path: str, dst: str) -> bool:
    """Whether ``path`` is ``dst`` or below it (``/data/out2`` is not below ``/data/out``)."""
    remote = dst.startswith(("s3://", "gs://", "az://"))
    root = dst.rstrip("/") if remote else os.path.abspath(dst)
    return path == root or path.startswith(root + ("/" if remote else os.sep))
