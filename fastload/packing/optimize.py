"""``fastload.optimize(fn, inputs, dst)``: a dataset made by a function of each input, in parallel.

    inputs (any iterable, taken a chunk at a time; each digested in order, for resume)
    -> fanout.ChunkMap: fn(input) -> sample dict | iterable of them | None, each sample encoded
       (packing.encode) in the worker processes (or Ray tasks)
    -> chunks' samples in input order -> samplewriter.SampleWriter: shards cut at shard_size_bytes,
       published (rename or S3 upload) and journaled by the pack driver, index.json last
    -> optimize_journal: for each published shard, where in the inputs it ends -> resume

So the bytes depend on the inputs, the function and the options only, never on ``workers``, ``engine`` or
``chunk_size``: one writer writes every sample, in input order. A run killed at any point resumes
(``resume=True``) to the bytes of an uninterrupted one: the shards published and journaled are kept, the
inputs before the last one's end are skipped (digested on the way and compared with the journal's digest),
and the run goes on from there, inside an input's fan-out if a shard ended there.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any

from fastload.config import PackConfig, S3Config
from fastload.core.fingerprint import RunningDigest, fn_fingerprint
from fastload.core.index import DatasetIndex, parse_index
from fastload.core.versions import fingerprint_digest, input_tag
from fastload.errors import AppendConflictError, ConfigError, InputFailedError, PackError, SampleError, Skip
from fastload.packing.append import AppendPlan
from fastload.packing.append_samples import append_mode, keys_of
from fastload.packing.dest import STORES, dest_url, destination, read_index_bytes
from fastload.packing.encode import Encoders, encode_sample
from fastload.packing.fanout import ChunkMap, ChunkResult, Failure, Task, chunks_of
from fastload.packing.journal import STATE_DIR, PackJournal
from fastload.packing.optimize_journal import (
    OptimizeJournal,
    Position,
    ShardEnd,
    ShardEnds,
    inputs_changed,
    interrupted_append,
    resume_point,
)
from fastload.packing.optimize_report import OptimizeReport
from fastload.packing.options import checked, output_options
from fastload.packing.progress import Progress
from fastload.packing.samplewriter import SampleWriter, ShardDone

ON_ERROR = ("raise", "skip")
PUBLISH_THREADS = 2  # shards written and published at once by the writer (the CPU work is in fn)
MAX_CHUNK = 64  # inputs per chunk at most, when chosen automatically


def optimize(
    fn: Callable[[Any], Any],
    inputs: Iterable[Any],
    dst: str | os.PathLike[str],
    *,
    workers: int | None = None,
    format: str = "tar",  # (the name every peer uses; shadows nothing used here)
    shard_size_bytes: int = 256 << 20,
    max_samples: int | None = None,
    prefix: str = "shard",
    compression: str = "none",
    encoders: Encoders | None = None,
    resume: bool = False,
    on_error: str = "raise",
    engine: str = "process",
    chunk_size: int | None = None,
    progress: bool | None = None,
    s3_config: S3Config | None = None,
    start_method: str | None = None,
    ray_address: str | None = None,
    mode: str = "create",
) -> OptimizeReport:
    """Run ``fn`` on every input, in ``workers`` processes, and write the samples it returns as a dataset
    in ``dst`` (a new or empty folder, or an ``s3://`` prefix): shards of ``format`` (tar, parquet,
    tfrecord) of about ``shard_size_bytes`` (and at most ``max_samples``), ``index.json`` last.

    ``fn(input)`` returns a sample dict (``{"__key__": "000001", "jpg": ..., "json": ...}``, values encoded
    as :class:`fastload.ShardWriter` encodes them, ``encoders`` for more types), an iterable of them, or
    None (nothing for this input). ``inputs``: any iterable (paths, URLs, rows...), taken ``chunk_size`` at a
    time (default: up to 64, fewer for a short sequence), never held whole. Samples are written in input
    order, so the output is byte-identical for any ``workers``, ``engine`` and ``chunk_size``.

    ``engine="ray"`` runs the chunks as Ray tasks (the running cluster, ``ray_address``, or a local one).
    Processes are forked when this process runs no other Python thread, else spawned (``start_method``
    forces one): a spawned worker gets ``fn`` pickled by value (cloudpickle), and the script must guard its
    call with ``if __name__ == "__main__":``. ``workers=1`` runs ``fn`` in this process.

    An exception in ``fn`` (or in encoding its samples) stops the run with
    :class:`~fastload.errors.InputFailedError` naming the input (no ``index.json``); with
    ``on_error="skip"`` the input is left out and listed in the report and ``index.json``'s ``skipped``.
    ``resume=True`` continues an interrupted run (killed, or stopped by an error) to the bytes of an
    uninterrupted one; it is refused (:class:`~fastload.errors.ResumeMismatchError`) if ``fn``'s code, the
    options or the inputs seen so far differ (best effort: see :mod:`fastload.core.fingerprint`). A
    progress bar (inputs, samples/s, ETA when ``inputs`` has a length) shows on a terminal unless
    ``progress=False``. ``mode="append"``: the samples join the dataset at ``dst`` as a new version, as
    with ``ShardWriter(dst, mode="append")``; its version records the function, options and inputs (the
    same appended again is refused once read, its shards removed); it resumes as any run does.

    Memory: up to ``2 x workers`` chunks of encoded samples in flight, plus the writer's shards (about
    ``(PUBLISH_THREADS + 3) x shard_size_bytes``).
    """
    append = append_mode(mode)
    if on_error not in ON_ERROR:
        raise ConfigError(f"on_error={on_error!r}; choose 'raise' or 'skip'")
    if not callable(fn):
        raise ConfigError(f"fn must be a function of one input, got {type(fn).__name__}")
    if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Iterable):
        raise ConfigError(
            "inputs must be an iterable of inputs (a list of paths, URLs, rows...), got "
            f"{type(inputs).__name__}"
        )
    workers = workers if workers is not None else os.cpu_count() or 1
    for name, value in (("workers", workers), ("chunk_size", chunk_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{name}={value!r} must be an integer >= 1")
    config = checked(
        PackConfig(
            shard_format=format,
            shard_size_bytes=shard_size_bytes,
            max_samples=max_samples,
            prefix=prefix,
            compression=compression,
            workers=PUBLISH_THREADS,
        )
    )
    length = len(inputs) if isinstance(inputs, Sized) else None
    if chunk_size is None:
        chunk_size = max(1, min(MAX_CHUNK, (length or MAX_CHUNK * 4 * workers) // (4 * workers)))
    url = os.fspath(dst)
    url = dest_url(url)
    if url.startswith(STORES):
        s3_config = s3_config or S3Config.from_env()
    fn_print = fn_fingerprint(fn)
    shown_options = {**output_options(config), "encoders": sorted(encoders or {})}
    options_print = hashlib.sha256(
        json.dumps(
            {**shown_options, "encoders": fn_fingerprint(dict(encoders or {}))}, sort_keys=True
        ).encode()
    ).hexdigest()
    # (index.json records the fingerprint: the inputs' kind does not change the bytes, so it is left out)
    fingerprint = hashlib.sha256(f"{fn_print}/{options_print}".encode()).hexdigest()
    state = {"fn": fn_print, "options": options_print, "length": length, "shown": shown_options}

    began = time.monotonic()
    task = Task(fn, functools.partial(encode_sample, encoders=encoders))
    with ChunkMap(task, workers=workers, engine=engine, start=start_method, ray_address=ray_address) as cmap:
        run = _Run(url, config, state, fingerprint, s3_config=s3_config, on_error=on_error)
        if append:
            run.appending(resume)
        done = run.complete(inputs) if resume else None
        if done is not None:
            return OptimizeReport(url, done, seconds=time.monotonic() - began, already_complete=True)
        run.open(resume)
        with Progress(
            total=length,
            initial=run.start.input,
            enabled=progress,
            desc="optimize",
            items="samples",
            unit="input",
        ) as bar:
            try:
                run.write(cmap, iter(inputs), chunk_size, bar)
            except AppendConflictError as exc:  # (resume of an append that had landed: found at the end)
                if not (resume and exc.version is not None):
                    raise
                found = read_index_bytes(run.dest) or ("", b"")
                index = parse_index(found[1], where=found[0])
                return OptimizeReport(url, index, seconds=time.monotonic() - began, already_complete=True)
    return run.report(time.monotonic() - began)


class _Run:
    """One optimize run's writing: the journal, the writer, the inputs skipped on resume, the loop."""

    def __init__(
        self,
        url: str,
        config: PackConfig,
        state: dict[str, Any],
        fingerprint: str,
        *,
        s3_config: S3Config | None,
        on_error: str,
    ) -> None:
        self.url = url
        self.config = config
        self.state = state
        self.fingerprint = fingerprint
        self.s3_config = s3_config
        self.on_error = on_error
        self.dest = destination(url, STATE_DIR, config=s3_config)
        self.journal = OptimizeJournal(self.dest)
        self.writer_journal = PackJournal(self.dest)
        self.writer_print = fingerprint  # (an append's: the fingerprint and its run's nonce)
        self.append = False
        self.inputs_digest = ""
        self.start = Position()
        self.kept: list[ShardEnd] = []
        self.failures: list[Failure] = []
        self.inputs = 0
        self.samples = 0
        self.result: Any = None

    def complete(self, inputs: Iterable[Any]) -> DatasetIndex | None:
        """The index, when ``dst`` already holds this run's dataset (resume of a finished run; of an
        append with nothing to resume: the inputs, if they can be read twice, digested and looked for
        among the versions)."""
        if self.writer_journal.exists():
            return None
        found = read_index_bytes(self.dest)
        if found is None:
            return None
        index = parse_index(found[1], where=found[0])
        if self.append:
            if iter(inputs) is inputs:  # (an iterator: read once, by the run)
                return None
            digest = RunningDigest()
            for item in inputs:
                digest.add(item)
            mine = self._version_print(digest.hexdigest())
            return index if any(v.fingerprint == mine for v in index.versions) else None
        if index.options.get("optimize", {}).get("fingerprint") == self.fingerprint:
            return index
        raise PackError(
            f"{self.url} holds a finished dataset of another function, inputs or options; write into an "
            "empty folder instead of resuming"
        )

    def _version_print(self, inputs_digest: str) -> str:
        """What an append's version records of its function, options and inputs."""
        return fingerprint_digest(f"{self.fingerprint}/inputs/{inputs_digest}")

    def appending(self, resume: bool) -> None:
        """This run appends: its journals in ``.fastload-pack/append-<tag>/``, where ``tag`` comes from the
        fingerprint and a nonce, that of the interrupted append of this function and options on resume."""
        self.append = True
        found = interrupted_append(self.dest, self.fingerprint) if resume else None
        self.writer_print = found or f"{self.fingerprint}/append-{uuid.uuid4().hex}"
        tag = input_tag(self.writer_print)
        folder = f"{STATE_DIR}/append-{tag}"
        restart = f"run again without resume (a new append; delete {folder}/ and the *-{tag}.* shards left)"
        self.journal = OptimizeJournal(self.dest, f"{folder}/optimize", restart=restart)
        self.writer_journal = PackJournal(self.dest, folder)

    def open(self, resume: bool) -> None:
        writer_journal = self.writer_journal
        if not resume and self.journal.exists():  # (said here: the writer knows no resume of its own)
            raise PackError(
                f"{self.url} holds an interrupted optimize (its journal .fastload-pack/ is there: the run "
                "was killed or stopped by an error, or is still running); pass resume=True (--resume) with "
                "the same function, inputs and options to finish it, or choose an empty or new folder"
            )
        # (killed between the writer's journal and ours, before any shard: nothing to check, nothing kept)
        if resume and (self.journal.exists() or (writer_journal.exists() and writer_journal.finished())):
            self.journal.check(self.state)
            ends = self.journal.ends()
            self.kept = resume_point(ends, set(ends))
        first = len(self.kept)
        before = self.kept[-1].samples if self.kept else 0
        self.start = self.kept[-1].end if self.kept else Position()
        self.ends = ShardEnds(first_shard=first, samples=before, start=self.start)
        self.writer = SampleWriter(
            self.url,
            self.config,
            fingerprint=self.writer_print,
            resume=resume,
            append=self.append,
            start_shard=first,
            start_sample=before,
            on_shard=self._published,
            options={"optimize": {"fingerprint": self.fingerprint}},
            s3_config=self.s3_config,
        )
        lost = [n for n in range(first) if n not in self.writer.kept]
        if lost:
            self.writer.abort(remove=False)
            raise PackError(
                f"shard(s) {', '.join(map(str, lost[:10]))} of the interrupted optimize in {self.url} are "
                f"missing or damaged, so it cannot be resumed; {self.journal.restart}"
            )
        if first and self.writer.keys.rule != "off":  # (their samples are not given again: their keys)
            entries = [self.writer.kept[n].entry for n in range(first)]
            fmt = self.config.shard_format
            self.writer.keys.seen(keys_of(self.writer.url, fmt, entries, s3_config=self.s3_config))
        for n in sorted(self.writer.kept):  # kept past the resume point: cut again, not rewritten
            if n >= first:
                self._record(self.ends.published(n, self.writer.kept[n].entry.samples))
        if not resume or not self.kept:
            self.journal.start(self.state)
        for end in self.kept:
            self.failures += end.failures

    def _published(self, done: ShardDone) -> None:
        self._record(self.ends.published(done.number, done.samples))

    def _record(self, ends: list[ShardEnd]) -> None:
        for end in ends:
            self.journal.record(end)

    def _inputs(self, items: Iterator[Any]) -> Iterator[Any]:
        """``items`` from the resume point on, those before it digested and checked against the journal;
        each digested and its running digest given to the shard-end tracker."""
        digest = RunningDigest()
        for n in range(self.start.input):
            item = next(items, _MISSING)
            if item is _MISSING:
                detail = f"{n} inputs now, the interrupted run had more than {n}"
                raise inputs_changed(self.url, detail, restart=self.journal.restart)
            digest.add(item)
        if self.kept and digest.hexdigest() != self.kept[-1].digest:
            detail = f"the first {self.start.input} inputs are not the same"
            raise inputs_changed(self.url, detail, restart=self.journal.restart)
        self.ends.input_seen(self.start.input, digest.hexdigest())
        number = self.start.input
        for item in items:
            digest.add(item)
            number += 1
            self.ends.input_seen(number, digest.hexdigest())
            yield item
        self.inputs = number
        self.inputs_digest = digest.hexdigest()

    def write(self, cmap: ChunkMap, items: Iterator[Any], chunk_size: int, bar: Progress) -> None:
        try:
            chunks = chunks_of(self._inputs(items), chunk_size, first=self.start.input)
            for result in cmap.map(chunks):
                self._take(result, bar)
            self.writer.skipped = [Skip(f"input #{f.number}: {f.shown}", f.error) for f in self.failures]
            if isinstance(self.writer.plan, AppendPlan):  # (the version records fn, options and inputs)
                self.writer.plan.digest = self._version_print(self.inputs_digest)
            self.result = self.writer.close()
        except BaseException:
            self.writer.abort(remove=False)  # published shards and the journal stay, for resume
            raise

    def _take(self, result: ChunkResult, bar: Progress) -> None:
        for i, outcome in enumerate(result.outcomes):
            number = result.first + i
            if outcome.failure is not None:
                f = outcome.failure
                if self.on_error == "raise":
                    raise InputFailedError(
                        number=f.number, input=f.shown, error=f.error, traceback=f.traceback
                    )
                self.failures.append(f)
                self.ends.failed(f)
                bar.advance(1, 0)
                continue
            samples = outcome.samples
            skip = self.start.offset if number == self.start.input else 0
            for j in range(skip, len(samples)):
                key, members = samples[j]
                try:
                    self.writer.add(key, members)
                except SampleError as exc:
                    raise PackError(
                        f"input #{number}: the function's sample {key!r} cannot be written: {exc}"
                    ) from exc
                last = j == len(samples) - 1
                self._record(self.ends.sample(Position(number + 1, 0) if last else Position(number, j + 1)))
            self.samples += len(samples) - skip
            bar.advance(1, len(samples) - skip)

    def report(self, seconds: float) -> OptimizeReport:
        r = self.result
        return OptimizeReport(
            self.url,
            r.index,
            inputs=self.inputs,
            samples=r.index.samples,
            failures=self.failures,
            shards_written=len(r.index.shards) - r.kept,
            shards_kept=r.kept,
            seconds=seconds,
        )


_MISSING = object()


__all__ = ["OptimizeReport", "optimize"]
