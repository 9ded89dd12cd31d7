"""From sample references to samples: plan the reads (``core.readplan``, one shard at a time, as the
prefetcher reaches it: a v2 shard's sample table is fetched then, and dropped when the shard is done), fetch
them ahead (:class:`~fastload.train.prefetch.Prefetcher`), parse them
(:class:`~fastload.train.shardread.ShardReaders`), then decode and map each sample. Samples of a row group
read once for several references (a sample shuffle: ``ReadTask.serves``) wait here for their turn, within
``PrefetchConfig.hold_bytes``."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from typing import Any

from fastload.config import S3Config
from fastload.core.index import ShardEntry
from fastload.errors import FastloadError
from fastload.storage.cache import ShardCache
from fastload.train.decode import decode_sample
from fastload.train.options import DecodeConfig, PrefetchConfig
from fastload.train.position import Iteration
from fastload.train.prefetch import Prefetcher
from fastload.train.shardread import RawSample, ShardReaders
from fastload.train.tablememo import TableMemo

SKIPPED = object()  # in the stream of read_samples(mark_skipped=True): a sample on_error="skip" left out


def read_samples(
    refs: Sequence[tuple[int, int]],
    *,
    root: str,
    shards: Sequence[ShardEntry],
    shard_format: str,
    decoding: DecodeConfig,
    prefetch: PrefetchConfig,
    s3_config: S3Config | None,
    cache: ShardCache | None,
    progress: Iteration,
    mark_skipped: bool = False,
    on_skip: Callable[[], None] | None = None,
    partitions: Sequence[Mapping[str, Any]] | None = None,
    memo: TableMemo | None = None,
) -> Generator[Any, None, None]:
    """The samples of ``refs`` (``(shard, position)`` pairs of ``shards``, manifest entries of
    ``shard_format``: attached or v2) in order, decoded and mapped.

    ``progress.consumed`` counts the references passed so far (delivered or skipped). A skipped sample is
    yielded as :data:`SKIPPED` with ``mark_skipped``, else reported to ``on_skip`` and left out.
    ``partitions``: each shard's partition values, added to its samples (``partition_columns=True``).
    ``memo``: sample tables kept between passes (:mod:`fastload.train.tablememo`).
    """
    max_bytes = prefetch.max_bytes or 0
    # without prefetch nothing is held ahead, and local shards stream sample by sample: bigger tasks only
    # mean fewer of them
    task_bytes = 16 << 20 if max_bytes == 0 else max(1 << 20, min(16 << 20, max_bytes // 4))
    readers = ShardReaders(
        root,
        shards,
        refs,
        shard_format=shard_format,
        columns=decoding.columns,
        config=s3_config,
        cache=cache,
        defer=max_bytes == 0,
        verify=decoding.verify_samples,
        memo=memo,
    )
    # with prefetch, the next shard's table is fetched while this one is read
    tasks = readers.tasks(
        refs, max_task_bytes=task_bytes, ahead=max_bytes > 0, hold_bytes=prefetch.hold_bytes
    )
    prefetcher = Prefetcher(
        tasks,
        readers.fetch,
        max_bytes=max_bytes,
        max_tasks=prefetch.runs,
        threads=prefetch.threads,
        release=readers.release,
    )
    held: dict[int, RawSample] = {}  # samples read ahead of their turn (tasks with ``serves``), by reference
    handed = 0  # references handed on (or skipped), in order
    try:
        for task, parse in prefetcher:
            name = shards[task.shard].name
            if partitions is not None:
                parse = _with_values(parse, partitions[task.shard])
            if task.serves is not None:  # its samples are for these references: kept until their turn
                for u, raw in zip(task.serves, parse(), strict=True):
                    raw["__shard__"] = name
                    held[u] = raw
                ready: Iterable[RawSample] = _due(held, handed)
            else:  # the next references' samples, then any read ahead that follow them
                ready = itertools.chain(_named(parse(), name), _due(held, handed + len(task.positions)))
            if decoding.plain:  # nothing to decode or map: nothing can fail or be skipped
                for raw in ready:
                    progress.consumed += 1
                    handed += 1
                    yield raw
                continue
            for raw in ready:
                out = finish(raw, decoding)
                progress.consumed += 1
                handed += 1
                if out is not SKIPPED or mark_skipped:
                    yield out
                elif on_skip is not None:
                    on_skip()
        if held:  # (a planning error: every reference is read by exactly one task)
            raise RuntimeError(
                f"{len(held)} samples read were never due, the first for reference {min(held)}"
            )
    finally:
        prefetcher.close()
        readers.close()


def _named(samples: Iterable[RawSample], name: str) -> Iterator[RawSample]:
    for raw in samples:
        raw["__shard__"] = name
        yield raw


def _due(held: dict[int, RawSample], first: int) -> Iterator[RawSample]:
    """The samples of ``held`` for references ``first``, ``first + 1``, ... while there are, taken out."""
    while first in held:
        yield held.pop(first)
        first += 1


def _with_values(
    parse: Callable[[], Iterable[RawSample]], values: Mapping[str, Any]
) -> Callable[[], Iterable[RawSample]]:
    def more() -> Iterator[RawSample]:
        for raw in parse():
            raw.update(values)
            yield raw

    return more


def finish(raw: RawSample, decoding: DecodeConfig) -> Any:
    """One raw sample decoded and mapped; :data:`SKIPPED` if that failed and ``on_error="skip"``."""
    try:
        sample = (
            decode_sample(raw, images=decoding.images, allow_pickle=decoding.allow_pickle)
            if decoding.decode
            else raw
        )
        return decoding.map(sample) if decoding.map is not None else sample
    except Exception as exc:
        if decoding.on_error == "skip":
            return SKIPPED
        raise FastloadError(
            f"shard {raw.get('__shard__')}, sample {raw.get('__key__')!r}: decoding failed ({exc!r}); "
            "fix the data, pass decode=False, or on_error='skip'"
        ) from exc
