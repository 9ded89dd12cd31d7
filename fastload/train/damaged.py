"""Reading on past damaged samples (``on_error="skip"``): a task's samples where each one whose bytes fail
their CRC32C (:class:`~fastload.errors.SampleChecksumError`, raised by its format's check) is given as its
error in its place, and the samples around it are read again from the shard (a run's samples are checked
before any of them is given, so those before it in its run were not given yet)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from fastload.errors import SampleChecksumError

RawSample = dict[str, Any]


def read_past_damage(
    positions: tuple[int, ...],
    parse: Callable[[], Iterable[RawSample]],
    load: Callable[[tuple[int, ...]], Iterable[RawSample]],
    key_of: Callable[[int], str],
) -> Iterator[RawSample | SampleChecksumError]:
    """The samples at ``positions`` of one shard, in order: ``parse()``'s, and after a damaged one
    ``load(positions)``'s (read again). ``key_of(index)``: a sample's key, for an error that lacks it
    (a TFRecord record's). An error about a sample that is not one of them is raised."""
    segments: list[tuple[tuple[int, ...], Callable[[], Iterable[RawSample]] | SampleChecksumError]]
    segments = [(positions, parse)]  # a stack: the next segment last
    while segments:
        part_positions, part = segments.pop()
        if isinstance(part, SampleChecksumError):
            yield part
            continue
        done = 0
        try:
            for sample in part():
                yield sample
                done += 1
        except SampleChecksumError as exc:
            bad = position_of(exc.index, part_positions, done)
            if bad is None:  # (not one of these samples: nothing to skip it in favour of)
                raise
            if exc.key is None:
                exc.key = key_of(exc.index)
            after, before = part_positions[bad + 1 :], part_positions[done:bad]
            if after:
                segments.append((after, _later(load, after)))
            segments.append(((), exc))
            if before:
                segments.append((before, _later(load, before)))


def _later(
    load: Callable[[tuple[int, ...]], Iterable[RawSample]], positions: tuple[int, ...]
) -> Callable[[], Iterable[RawSample]]:
    return lambda: load(positions)


def position_of(index: int, positions: Sequence[int], start: int) -> int | None:
    """Where sample ``index`` of a shard first comes in ``positions`` from ``start`` on (None: nowhere)."""
    for k in range(start, len(positions)):
        if positions[k] == index:
            return k
    return None


def raising(exc: BaseException) -> Iterable[RawSample]:
    """A parse that raises ``exc`` (an error met while its task was fetched)."""
    raise exc
