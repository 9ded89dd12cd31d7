"""The public engine interface: who writes a pack's planned shards.

A pack (of files, or of token documents) is planned into :class:`ShardJob` s: each knows its number, its
final name and how to write its shard to a local file. An :class:`Engine` runs a stream of jobs; whoever runs
a job does it through :func:`publish_shard` (write to a temporary name, publish under the final name, then
its sample table as a sidecar next to it, record both in the resume journal), so a shard and its table
appear whole or not at all whatever the engine, and the tables are written in parallel, by whoever wrote
the shards.

Engines: :class:`LocalEngine` (threads of this process) here, and
:class:`fastload.packing.ray_engine.RayEngine` (Ray tasks on a cluster); the output is the same, byte for
byte.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Protocol

from fastload import formats
from fastload.errors import DestinationWriteError
from fastload.formats.shard import ShardResult
from fastload.packing.dest import Destination, write_failed
from fastload.packing.journal import PackJournal, shard_record
from fastload.storage.tables import split_entry

Advance = Callable[[int, int], None]  # (payload bytes, files) written since the last call
Done = Callable[[int, ShardResult], None]  # (shard number, its result) once the shard is published


class ShardJob(Protocol):
    """One planned shard, able to write itself (to run on Ray it must pickle: the engine ships it)."""

    @property
    def number(self) -> int: ...

    @property
    def name(self) -> str: ...

    @property
    def shard_format(self) -> str:
        """The registered format the job writes (``index.json``'s ``shard_format``)."""
        ...

    def write(self, tmp_path: str, *, on_sample: Advance, open_threads: int) -> ShardResult:
        """Write the shard at ``tmp_path`` (removed again on error); ``on_sample`` reports progress;
        ``open_threads`` > 0 opens (fetches) inputs ahead with that many threads."""
        ...

    def local_folders(self) -> set[str]:
        """Local folders the job reads from (a Ray node must see them at the same path)."""
        ...


class Engine(Protocol):
    """Runs jobs, each through :func:`publish_shard`, calling ``done`` as each shard is published. On a
    failure it stops taking jobs and raises; shards published so far stay in the journal for resume."""

    def write(self, jobs: Iterable[ShardJob], *, advance: Advance, done: Done) -> None: ...


def publish_shard(
    job: ShardJob, dest: Destination, journal: PackJournal, *, on_sample: Advance, open_threads: int
) -> ShardResult:
    """Write ``job`` to a temporary file in ``dest``, publish it under its final name, then its sample
    table (``<name>.fltable``, also through a temporary file), then journal both. The result's entry is the
    shard's manifest entry (index v2: no per-sample columns, so what travels back to the driver is small
    whatever the shard holds). A failed local write raises :class:`~fastload.errors.DestinationWriteError`
    naming ``dest`` (and its staging folder): the shard is then neither published nor journaled."""
    tmp = os.path.join(dest.tmp_dir, f"{job.number:06d}.part")
    try:
        result = job.write(tmp, on_sample=on_sample, open_threads=open_threads)
    except DestinationWriteError as exc:
        raise write_failed(dest, exc, exc.path) from exc
    prefix = formats.sidecar_prefix(job.shard_format)
    entry, table = split_entry(result.entry, shard_format=job.shard_format, prefix=prefix)
    dest.publish(tmp, job.name)
    tmp_table = os.path.join(dest.tmp_dir, f"{job.number:06d}.table.part")
    try:
        with open(tmp_table, "wb") as f:
            f.write(table)
            config = getattr(job, "config", None)  # (pack --fsync: the sidecar too, as its shard)
            if getattr(config, "fsync", False):
                f.flush()
                os.fsync(f.fileno())
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp_table)
        raise write_failed(dest, exc, tmp_table) from exc
    dest.publish(tmp_table, formats.table_path(job.name, job.shard_format))
    published = ShardResult(entry, result.skipped, result.payload_bytes, result.files)
    journal.record(shard_record(job.number, published))
    return published


class LocalEngine:
    """Jobs written by up to ``workers`` threads of this process.

    The job stream is consumed in the calling thread: a job is submitted as soon as a writer is free, and
    the stream is asked for the next one only then, so at most ``workers + 1`` jobs exist at once. A job
    may be produced by slow work in the stream (pack-tokens writes each shard while reading); if the engine
    stops early it closes the stream, so that a generator can clean up, and each job taken from it that
    never ran has its ``discard()`` called, if it has one (what it made while produced is removed).
    """

    def __init__(
        self, dest: Destination, journal: PackJournal, *, workers: int, open_threads: int = 0
    ) -> None:
        if workers < 1:
            raise ValueError(f"{workers=} must be >= 1")
        self.dest = dest
        self.journal = journal
        self.workers = workers
        self.open_threads = open_threads

    def write(self, jobs: Iterable[ShardJob], *, advance: Advance, done: Done) -> None:
        running: dict[Future[ShardResult], ShardJob] = {}
        iterator = iter(jobs)
        waiting: ShardJob | None = None  # taken from the stream, not yet submitted
        with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="fastload-pack") as pool:
            try:
                for waiting in iterator:
                    while len(running) >= self.workers:
                        _collect(running, done)
                    fut = pool.submit(
                        publish_shard,
                        waiting,
                        self.dest,
                        self.journal,
                        on_sample=advance,
                        open_threads=self.open_threads,
                    )
                    running[fut], waiting = waiting, None
                while running:
                    _collect(running, done)
            except BaseException as exc:
                unrun = [job for fut, job in running.items() if fut.cancel()]
                for job in [*unrun, *([waiting] if waiting is not None else [])]:
                    discard = getattr(job, "discard", None)
                    if discard is not None:
                        discard()
                close = getattr(iterator, "close", None)
                if close is not None:
                    close()  # a generator producing jobs cleans up (e.g. aborts a shard it feeds)
                if isinstance(exc, DestinationWriteError) and exc.destination is None:
                    # a shard written by the job stream (pack-tokens): name the destination too
                    raise write_failed(self.dest, exc, exc.path) from exc
                raise


def _collect(running: dict[Future[ShardResult], ShardJob], done: Done) -> None:
    """Wait for at least one job to finish; hand on its result, or raise its error."""
    finished, _ = wait(running, return_when=FIRST_COMPLETED)
    for fut in finished:
        job = running.pop(fut)
        done(job.number, fut.result())
