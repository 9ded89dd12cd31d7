"""From sample references to samples: plan the reads (``core.readplan``, one shard at a time, as the
prefetcher reaches it: a v2 shard's sample table is fetched then, and dropped when the shard is done), fetch
them ahead (:class:`~fastload.train.prefetch.Prefetcher`), parse them
(:class:`~fastload.train.shardread.ShardReaders`), then decode and map each sample. Samples of a row group
read once for several references (a sample shuffle: ``ReadTask.serves``) wait here for their turn, within
``PrefetchConfig.hold_bytes``."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from typing import Any

from fastload.core.autotune import default_task_bytes
from fastload.errors import FastloadError, SampleChecksumError
from fastload.train.decode import decode_sample
from fastload.train.options import DecodeConfig, PrefetchConfig
from fastload.train.position import Iteration, SkippedSample
from fastload.train.prefetch import Prefetcher
from fastload.train.shardread import RawSample, ShardReaders
from fastload.train.telemetry import Tally, clock_ns, timed_fetch
from fastload.train.view import DatasetView

SAMPLE_EVERY = 8
"""With telemetry, one sample in this many is timed (decode, ``map=``, the consumer's time between
samples) and the task's times scaled from them: two clock reads a sample cost ~1% on 256-byte samples."""
SKIPPED = object()  # in the stream of read_samples(mark_skipped=True): a sample on_error="skip" left out


def read_samples(
    refs: Sequence[tuple[int, int]],
    view: DatasetView,
    *,
    decoding: DecodeConfig,
    prefetch: PrefetchConfig,
    progress: Iteration,
    mark_skipped: bool = False,
    on_skip: Callable[[], None] | None = None,
    report: Callable[[SkippedSample], None] | None = None,
    tally: Tally | None = None,
    tuning: Callable[[], tuple[int, ...] | None] | None = None,
) -> Generator[Any, None, None]:
    """The samples of ``refs`` (``(shard, position)`` pairs of ``view``'s shards, read with their entries
    :meth:`~fastload.train.view.DatasetView.shards`, its cache and its table memo) in order, decoded and
    mapped, with each shard's partition values where ``view`` has them (``partition_columns=True``).

    ``progress.consumed`` counts the references passed so far (delivered or skipped). A skipped sample is
    yielded as :data:`SKIPPED` with ``mark_skipped``, else reported to ``on_skip`` and left out; with
    ``on_error="skip"`` that is a sample that fails to decode or map, or whose bytes fail their CRC32C
    (after the cache had its chance to heal a cached copy). ``report``: told each skipped sample's name.
    ``tuning``: a tuned loader's settings (prefetch bytes, fetches at once, task size, most fetches at
    once; :meth:`~fastload.train.telemetry.SharedCounters.tuning`), or None when not tuned: asked again
    before each read task, they replace ``prefetch``'s.
    """
    shards, partitions = view.shards(), view.partitions
    tuned = tuning() if tuning is not None else None
    max_bytes = prefetch.max_bytes or 0
    task_bytes: int | Callable[[], int] = default_task_bytes(max_bytes)
    limits = parts = None
    threads = prefetch.threads
    if tuning is not None and tuned is not None:  # live: cells the loop's tuner writes, read between tasks
        max_bytes, threads = tuned[0], max(threads, tuned[3])
        task_bytes, limits = _live(tuning, tuned)
        part = view.s3_config.part_size_bytes if view.s3_config is not None else None
        if part is not None:  # a task's parts fetched at once (see fastload.train.autotune.MAX_PARTS)
            parts = functools.partial(_parts_of, task_bytes, part)
    readers = ShardReaders(
        view,
        refs,
        columns=decoding.columns,
        defer=max_bytes == 0 and tuned is None,
        verify=decoding.verify_samples,
        skip_damaged=decoding.on_error == "skip",
        parts=parts,
    )
    # with prefetch, the next shard's table is fetched while this one is read
    tasks = readers.tasks(
        refs,
        max_task_bytes=task_bytes,
        ahead=max_bytes > 0 or tuned is not None,
        hold_bytes=prefetch.hold_bytes,
    )
    prefetcher = Prefetcher(
        tasks,
        readers.fetch if tally is None else timed_fetch(readers.fetch, tally),
        max_bytes=max_bytes,
        max_tasks=prefetch.runs,
        threads=threads,
        release=readers.release,
        limits=limits,
    )
    held: dict[
        int, RawSample | SampleChecksumError
    ] = {}  # samples read ahead of their turn (tasks with ``serves``), by reference
    handed = 0  # references handed on (or skipped), in order
    times = [0, 0, 0]  # ns decoding, mapping, outside (in the consumer) of this task's timed samples
    started = count = timed = left = 0  # this task's: began, samples handed, those timed; last yield
    every = SAMPLE_EVERY if tally is not None else 0
    try:
        for task, parse in prefetcher:
            started, count, timed = clock_ns(), 0, 0
            name = shards[task.shard].name
            if partitions is not None:
                parse = _with_values(parse, partitions[task.shard])
            if task.serves is not None:  # its samples are for these references: kept until their turn
                for u, raw in zip(task.serves, parse(), strict=True):
                    if not isinstance(raw, SampleChecksumError):
                        raw["__shard__"] = name
                    held[u] = raw
                ready: Iterable[RawSample | SampleChecksumError] = _due(held, handed)
            else:  # the next references' samples, then any read ahead that follow them
                ready = itertools.chain(_named(parse(), name), _due(held, handed + len(task.positions)))
            for raw in ready:
                if isinstance(raw, SampleChecksumError):
                    if report is not None:
                        report(damaged(raw))
                    out = SKIPPED
                    timing = False
                else:  # (nothing to decode or map when plain: only damaged samples are skipped)
                    timing = every != 0 and count % every == 0  # one sample in SAMPLE_EVERY is timed
                    timed += timing
                    out = raw if decoding.plain else finish(raw, decoding, report, times if timing else None)
                progress.consumed += 1
                handed += 1
                count += 1
                if out is not SKIPPED or mark_skipped:
                    if timing:
                        left = clock_ns()
                        yield out
                        times[2] += clock_ns() - left
                    else:
                        yield out
                elif on_skip is not None:
                    on_skip()
            if tally is not None:
                _tally_task(tally, clock_ns() - started, count, timed, times)
                count = 0
        if held:  # (a planning error: every reference is read by exactly one task)
            raise RuntimeError(
                f"{len(held)} samples read were never due, the first for reference {min(held)}"
            )
    finally:
        prefetcher.close()
        readers.close()
        if tally is not None:  # (a consumer that stops at its last sample never resumes this task)
            if count:
                _tally_task(tally, left - started, count, timed, times)
            tally.flush()


def _parts_of(task_bytes: Callable[[], int], part: int) -> int:
    """The ranged GETs of ``part`` bytes a read task of the tuned size now spans."""
    return -(-task_bytes() // part)


def _live(
    tuning: Callable[[], tuple[int, ...] | None], first: tuple[int, ...]
) -> tuple[Callable[[], int], Callable[[], tuple[int, int]]]:
    """The task size and the prefetcher's ``(max_bytes, concurrency)`` as functions of the tuned settings
    now (the last ones seen if the tuning stopped)."""
    last = [first]

    def now() -> tuple[int, ...]:
        values = tuning()
        if values is not None:
            last[0] = values
        return last[0]

    return (lambda: now()[2]), (lambda: (now()[0], now()[1]))


def _tally_task(tally: Tally, ns: int, count: int, timed: int, times: list[int]) -> None:
    """One task's stages from its ``ns`` in this generator and its timed samples' ``times`` (decode,
    map, outside), scaled from ``timed`` samples to ``count``: parse is what is left. ``times`` is zeroed
    after, and the tally flushed."""
    scale = count / timed if timed else 0.0
    decode, mapped, away = (int(t * scale) for t in times)
    tally.stage("parse", max(0, ns - decode - mapped - away), count)
    if decode:
        tally.stage("decode", decode, count)
    if mapped:
        tally.stage("map", mapped, count)
    tally.count("samples", count)
    times[0] = times[1] = times[2] = 0
    tally.flush()


def _named(
    samples: Iterable[RawSample | SampleChecksumError], name: str
) -> Iterator[RawSample | SampleChecksumError]:
    for raw in samples:
        if not isinstance(raw, SampleChecksumError):
            raw["__shard__"] = name
        yield raw


def _due(
    held: dict[int, RawSample | SampleChecksumError], first: int
) -> Iterator[RawSample | SampleChecksumError]:
    """The samples of ``held`` for references ``first``, ``first + 1``, ... while there are, taken out."""
    while first in held:
        yield held.pop(first)
        first += 1


def _with_values(
    parse: Callable[[], Iterable[RawSample | SampleChecksumError]], values: Mapping[str, Any]
) -> Callable[[], Iterable[RawSample | SampleChecksumError]]:
    def more() -> Iterator[RawSample | SampleChecksumError]:
        for raw in parse():
            if not isinstance(raw, SampleChecksumError):
                raw.update(values)
            yield raw

    return more


def damaged(exc: SampleChecksumError) -> SkippedSample:
    """The name of a sample skipped because its bytes fail their CRC32C."""
    return SkippedSample(exc.shard, exc.key or "", exc.offset, "its bytes fail their CRC32C (damaged shard)")


def finish(
    raw: RawSample,
    decoding: DecodeConfig,
    report: Callable[[SkippedSample], None] | None = None,
    times: list[int] | None = None,
) -> Any:
    """One raw sample decoded and mapped; :data:`SKIPPED` if that failed and ``on_error="skip"`` (its name
    told to ``report``). The error says which step failed: decoding, or the ``map=`` function (by name).
    ``times``: nanoseconds decoding and mapping are added to its two cells."""
    started = clock_ns() if times is not None else 0
    try:
        sample = (
            decode_sample(raw, images=decoding.images, allow_pickle=decoding.allow_pickle)
            if decoding.decode
            else raw
        )
    except Exception as exc:
        return _failed(raw, decoding, report, exc, "decoding failed", "fix the data, pass decode=False")
    if times is not None:
        decoded = clock_ns()
        times[0] += decoded - started
    if decoding.map is None:
        return sample
    try:
        mapped = decoding.map(sample)
        if times is not None:
            times[1] += clock_ns() - decoded
        return mapped
    except Exception as exc:
        what = f"the map= function {function_name(decoding.map)} failed on it"
        return _failed(
            raw, decoding, report, exc, what, "fix the function (the exception it raised is chained)"
        )


def function_name(fn: Callable[..., Any]) -> str:
    """``module.qualname`` of a function (or the repr of another callable)."""
    inner = getattr(fn, "func", None)  # functools.partial
    if inner is not None and callable(inner):
        return f"functools.partial({function_name(inner)}, ...)"
    name = getattr(fn, "__qualname__", None) or getattr(type(fn), "__qualname__", None)
    module = getattr(fn, "__module__", None)
    if not name:
        return repr(fn)
    return f"{module}.{name}" if module and module != "builtins" else str(name)


def _failed(
    raw: RawSample,
    decoding: DecodeConfig,
    report: Callable[[SkippedSample], None] | None,
    exc: Exception,
    what: str,
    fix: str,
) -> Any:
    shard, key = raw.get("__shard__"), raw.get("__key__")
    if decoding.on_error == "skip":
        if report is not None:
            report(SkippedSample(str(shard), str(key), None, f"{what}: {exc!r}"))
        return SKIPPED
    raise FastloadError(
        f"shard {shard}, sample {key!r}: {what} ({exc!r}); {fix}, or on_error='skip'"
    ) from exc
