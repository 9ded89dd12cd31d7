"""Samples from Python into a dataset: :class:`SampleWriter`, the layer under ``fastload.ShardWriter`` (and
``fastload.optimize``), as one more plan of the pack driver (``packing.driver``).

``add(key, members)`` (members already bytes, sorted by field) from the caller's thread cuts shards on the fly
by the format's exact sample sizes (``ShardFormat.sample_sizes``: cuts depend only on the samples, in order,
so a re-run cuts the same shards); each complete shard goes through a bounded queue to the driver, which runs
on a thread of its own: its plan's jobs iterator takes shards from the queue (``Target.shards`` None, as
pack-tokens' jobs are cut while read), and the local engine's threads write each one with the format's own
shard writer (the samples' bytes are in-memory inputs, ``memshard``), publish it (rename, or S3
multipart upload), write its sample table and journal it: the driver's ``publish_shard``, so encoding in the
caller's thread overlaps writing and uploading, and nothing of pack's publishing is copied. ``close()`` sends
the end, waits, and the driver writes ``index.json`` last. ``abort()`` stops the driver and removes what
this writer published (and its journal): the destination is as before.

Several writers, one dataset (``part`` of ``parts``): ``packing.parts``.

Memory: the shard being filled, one in the queue, and up to ``workers + 1`` held by the engine, so at most
about ``(workers + 3) x shard_size_bytes`` of samples.
"""

from __future__ import annotations

import hashlib
import json
import queue
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastload import formats
from fastload.config import PackConfig, S3Config
from fastload.core.index import DatasetIndex
from fastload.core.keys import Sample
from fastload.errors import PackError, SampleError, Skip
from fastload.formats.shard import ShardResult
from fastload.packing.append_samples import WRITER_OPTIONS, SamplesAppendPlan, create_refusal, release_of
from fastload.packing.dest import Destination, dest_url
from fastload.packing.driver import Plan, Target, run
from fastload.packing.encode import KeyRule
from fastload.packing.engine import Engine, LocalEngine
from fastload.packing.journal import STATE_DIR, PackJournal
from fastload.packing.memshard import MemoryShard, memory_sample
from fastload.packing.options import checked, output_options
from fastload.packing.parts import NotifyingJournal, open_part, part_index_name, shard_name
from fastload.storage.inputs import Input

Kept = dict[int, ShardResult] | None
Columns = Sequence[str] | None
_END = object()
_ABORT = object()
_POLL_S = 0.1


@dataclass(frozen=True)
class ShardDone:
    """A published shard: number, name, its samples ``[first, first + samples)`` in the writer's order."""

    number: int
    name: str
    first: int
    samples: int
    bytes: int
    payload_bytes: int


@dataclass
class WriteResult:
    """What a :class:`SampleWriter` published: the index (written to ``index_name`` in ``url``), each shard's
    result by number, how many were kept from an interrupted run, and the time taken."""

    url: str
    index: DatasetIndex
    index_name: str
    results: dict[int, ShardResult] = field(default_factory=dict)
    kept: int = 0
    seconds: float = 0.0
    already_complete: bool = False
    appended: tuple[Any, DatasetIndex] | None = None  # an append: (its Version, the dataset's index now)


class _Aborted(PackError):
    """The writer was aborted (the driver thread's way out)."""


class SampleWriter:
    """Encoded samples in, in order; shards cut at ``config.shard_size_bytes`` (and ``config.max_samples``
    per shard), published in the background, ``index.json`` last (see the module docstring).

    ``fields``: the fields every shard's schema has (Parquet: given, or the first sample's; a sample with
    another is refused). ``keys``: ``"check"`` refuses a key given twice (a set of every key: about 100
    bytes per sample), ``"ordered"`` refuses a key not greater than the one before (no memory), ``"off"``.
    ``on_shard(ShardDone)`` is called (on a publishing thread) as each shard is published and journaled.
    ``resume`` with the ``fingerprint`` of an interrupted run keeps its published shards (:attr:`kept`);
    shards it holds are cut again but not rewritten. ``start_shard``/``start_sample``: numbering begins
    there (a resumed caller that skips the samples of kept shards). ``options``: recorded in the index.
    ``append``: the shards join the dataset at ``url`` as a new version (``packing.append_samples``).
    The constructor opens the destination: a destination that cannot be written raises here.
    """

    def __init__(
        self,
        url: str,
        config: PackConfig,
        *,
        fields: Sequence[str] | None = None,
        part: int | None = None,
        parts: int | None = None,
        keys: str = "check",
        fingerprint: str = "",
        resume: bool = False,
        start_shard: int = 0,
        start_sample: int = 0,
        on_shard: Callable[[ShardDone], None] | None = None,
        options: Mapping[str, Any] | None = None,
        s3_config: S3Config | None = None,
        append: bool = False,
    ) -> None:
        self.config = checked(config)
        self.fmt = formats.by_name(config.shard_format)
        self.url = dest_url(url)
        if self.url.startswith("s3://"):
            s3_config = s3_config or S3Config.from_env()
        self.part, self.parts = part, parts
        self.on_shard = on_shard
        self.keys = KeyRule(keys)
        self._fixed = tuple(fields) if fields is not None else None
        self._fields: dict[str, None] = dict.fromkeys(fields or ())
        self._number, self._first = start_shard, start_sample
        self._samples: list[Sample[Input]] = []
        self._overhead = self._size_of(memory_sample("k", [("x", b"")]))[1]
        self._used = self._overhead
        self._ranges: dict[int, tuple[int, int]] = {}
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._opened = threading.Event()
        self._published: list[str] = []
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._result: WriteResult | None = None
        self._closed = False
        self.kept: dict[int, ShardResult] = {}
        self.skipped: list[Skip] = []  # inputs the caller left out (optimize's on_error="skip"): in the index
        self.dest: Destination | None = None
        self.journal: PackJournal | None = None
        body = {**output_options(self.config), "part": part, "parts": parts, **(options or {})}
        self.options = body
        print_ = (
            fingerprint or hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()
        )
        if append and not fingerprint:  # (each append its own: no resume, never "the same inputs")
            print_ += f"/append-{uuid.uuid4().hex}"
        self._inner = _SamplesPlan(
            self,
            Target(
                url=self.url,
                fingerprint=print_,
                layout=print_,
                shards=None,
                resume=resume,
                progress=False,
                s3_config=s3_config,
            ),
        )
        self.plan: Plan[WriteResult] = SamplesAppendPlan(self._inner, writer=self) if append else self._inner
        self._thread = threading.Thread(target=self._drive, name="fastload-writer", daemon=True)
        self._thread.start()
        self._opened.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    # -- the caller's side ----------------------------------------------------------------------------------

    def add(self, key: str, members: Sequence[tuple[str, bytes]]) -> None:
        """Take one sample (``members``: ``(field, bytes)`` sorted by field); raises :class:`SampleError`
        (nothing taken) for a repeated key or, with fixed fields, another field."""
        if self._closed:
            raise PackError(f"the writer of {self.url} is closed; open another to write more")
        self.keys.check(key)
        for f, _ in members:
            if f not in self._fields:
                if self._fixed is not None:
                    raise SampleError(
                        f"sample {key!r} has field {f!r}, which the {self.fmt.label} shards' columns "
                        f"({', '.join(self._fixed)}) do not; pass fields=[...] naming every field",
                        key=key,
                        field=f,
                    )
                self._fields[f] = None
        if self._fixed is None and getattr(self.fmt, "read_as_folder", False):
            # (Parquet: other tools read the folder as one table, so every shard has the same columns: the
            # first sample's fields)
            self._fixed = tuple(sorted(self._fields))
        sample = memory_sample(key, members)
        size = self._size_of(sample)[0]
        n = len(self._samples)
        limit = self.config.max_samples
        if n and (self._used + size > self.config.shard_size_bytes or (limit is not None and n >= limit)):
            self._cut()
        self.keys.add(key)
        self._samples.append(sample)
        self._used += size

    def close(self) -> WriteResult:
        """Write the last shard, wait for every shard to be published, write the index; the result."""
        if self._result is not None:
            return self._result
        if self._closed:
            raise PackError(f"the writer of {self.url} was aborted; nothing more to close")
        if self._samples:
            self._cut()
        self._put(_END)
        self._closed = True
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def abort(self, *, remove: bool = True) -> list[str]:
        """Stop: no index is written; with ``remove``, the shards this run published, their tables and the
        journal are deleted (else kept for ``resume``). Returns the shard names removed."""
        if self._result is not None:
            return []
        self._closed = True
        self._samples = []
        if self._thread.is_alive():
            self._put(_ABORT)
            self._thread.join()
        if not remove or self.dest is None or self.journal is None:
            return []
        with self._lock:
            names = list(self._published)
        for name in names:
            self.dest.remove(name)
            self.dest.remove(formats.table_path(name, self.fmt.name))
        self.journal.remove()
        release_of(self.plan)()
        return names

    @property
    def fields(self) -> list[str]:
        return sorted(self._fields)

    def _size_of(self, sample: Sample[Input]) -> tuple[int, int]:
        sizes, overhead = self.fmt.sample_sizes(
            [sample], n_fields=max(1, len(self._fields)), config=self.config
        )
        return sizes[0], overhead

    def _cut(self) -> None:
        self._ranges[self._number] = (self._first, len(self._samples))
        self._put((self._number, self._samples, tuple(self._fixed or self.fields)))
        self._first += len(self._samples)
        self._number += 1
        self._samples, self._used = [], self._overhead

    def _put(self, item: object) -> None:
        """Hand ``item`` to the driver; raise its error if it stopped."""
        while True:
            if self._error is not None or not self._thread.is_alive():
                self._closed = True
                if self._error is not None:
                    raise self._error
                raise PackError(f"the writer of {self.url} stopped")
            try:
                self._queue.put(item, timeout=_POLL_S)
                return
            except queue.Full:
                continue

    # -- the driver's side ----------------------------------------------------------------------------------

    def opened(self, dest: Destination, journal: PackJournal, kept: Kept, *, fields: Columns = None) -> None:
        """The driver opened ``dest`` (``fields``: every shard's columns, an appended Parquet dataset's)."""
        if fields is not None:
            self._fixed, self._fields = tuple(fields), dict.fromkeys(fields)
        self.dest, self.journal, self.kept = dest, journal, dict(kept or {})
        self._opened.set()

    def _drive(self) -> None:
        try:
            self._result = run(self.plan)
        except BaseException as exc:  # handed to the caller's thread
            self._error = exc
        finally:
            release_of(self.plan)()
            self._opened.set()

    def _shard_jobs(self, kept: Mapping[int, ShardResult]) -> Iterator[MemoryShard]:
        while True:
            item = self._queue.get()
            if item is _END:
                return
            if item is _ABORT:
                raise _Aborted(f"the writer of {self.url} was aborted")
            number, samples, fields = item
            if number in kept:
                continue
            yield MemoryShard(
                number=number,
                name=self._inner.name_of(number),
                samples=samples,
                fields=list(fields),
                config=self.config,
            )

    def recorded(self, record: dict[str, Any]) -> None:
        number = int(record["number"])
        entry = record["entry"]
        with self._lock:
            self._published.append(str(entry["name"]))
        if self.on_shard is not None:
            first, count = self._ranges.get(number, (-1, int(entry["samples"])))
            self.on_shard(
                ShardDone(
                    number, str(entry["name"]), first, count, int(entry["bytes"]), record["payload_bytes"]
                )
            )


class _SamplesPlan(Plan[WriteResult]):
    """The driver's plan of a :class:`SampleWriter`: jobs from its queue, index from its shards."""

    progress_items = "members"

    def __init__(self, writer: SampleWriter, target: Target) -> None:
        self.w = writer
        self.target = target
        self._suffix = writer.fmt.suffixes[0]

    def name_of(self, number: int) -> str:
        return shard_name(self.w.config.prefix, number, self._suffix, self.w.part)

    def open(self) -> tuple[Destination, PackJournal, dict[int, ShardResult] | None]:
        w = self.w
        if w.part is None:
            try:
                dest, _, kept = super().open()
            except PackError as exc:
                raise create_refusal(self.target, exc, by=str(w.options.get("writer", ""))) from None
            journal: PackJournal = NotifyingJournal(dest, STATE_DIR, w.recorded)
        else:
            dest, journal, kept = open_part(
                self.target,
                part=w.part,
                parts=w.parts or 1,
                prefix=w.config.prefix,
                shard_format=w.fmt.name,
                name_of=self.name_of,
                on_record=w.recorded,
            )
        w.opened(dest, journal, kept)
        return dest, journal, kept

    def output_options(self) -> dict[str, Any]:
        return {k: v for k, v in self.w.options.items() if k not in WRITER_OPTIONS}

    def engine(self, dest: Destination, journal: PackJournal, todo: int | None) -> Engine:
        return LocalEngine(dest, journal, workers=self.w.config.worker_count)

    def jobs(self, dest: Destination, kept: Mapping[int, ShardResult]) -> Iterator[MemoryShard]:
        return self.w._shard_jobs(kept)

    def progress_desc(self) -> str:
        return "writing"

    def index(self, results: Mapping[int, ShardResult]) -> DatasetIndex:
        numbers = sorted(results)
        missing = sorted(set(range(len(numbers) and numbers[-1] + 1)) - set(numbers))
        if missing:
            raise PackError(
                f"shard(s) {', '.join(map(str, missing[:10]))} of {self.target.url} were neither written nor "
                "kept (a resumed writer must be given the samples of every shard not kept)"
            )
        if not numbers and self.w.part is None:
            raise PackError(f"no samples were written to {self.target.url}: nothing to publish")
        return DatasetIndex(
            shard_format=self.w.fmt.name,
            fields=self.w.fields,
            shards=[results[n].entry for n in numbers],
            options=dict(self.w.options),
            skipped=[{"path": s.path, "reason": s.reason} for s in self.w.skipped],
            payload_bytes=sum(r.payload_bytes for r in results.values()),
        )

    def index_name(self, index: DatasetIndex) -> str:
        return super().index_name(index) if self.w.part is None else part_index_name(self.w.part)

    def report(
        self, url: str, index: DatasetIndex, results: Mapping[int, ShardResult], *, kept: int, seconds: float
    ) -> WriteResult:
        return WriteResult(url, index, self.index_name(index), dict(results), kept=kept, seconds=seconds)

    def complete(self, url: str, index: DatasetIndex, *, skipped: list[Skip], seconds: float) -> WriteResult:
        return WriteResult(
            url, index, self.index_name(index), kept=len(index.shards), seconds=seconds, already_complete=True
        )
