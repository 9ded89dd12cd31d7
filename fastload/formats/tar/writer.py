"""Writing one tar shard: samples' files copied once, through one reusable buffer, with CRC32C on the fly (of
the whole file, and of each sample's byte range while its bytes are still in the buffer)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import BinaryIO

from fastload.core.keys import Sample
from fastload.errors import DestinationWriteError, Skip
from fastload.formats import native
from fastload.formats.shard import DEFAULT_BUFFER_BYTES, ShardOutput, ShardResult, write_shard
from fastload.formats.tar.header import BLOCK, END_OF_ARCHIVE, member_header, padded
from fastload.formats.tar.layout import set_layout
from fastload.storage.inputs import (
    CHANGED_WHILE_READ,
    READ_ATTEMPTS,
    Input,
    Member,
    changed_while_read,
    open_failed,
    plain_local,
    read_exactly,
    read_problem,
    resized,
    shrunk,
)


def _copy_member(out: ShardOutput, name: str, f: BinaryIO, size: int, mtime: int) -> bool:
    """Write one member; whether its header was one plain block (no pax header before it)."""
    header = member_header(name, size, mtime=mtime)
    total = len(header) + padded(size)
    if total <= len(out.buf):
        room = out.reserve(total)
        room[: len(header)] = header
        read_exactly(f, room[len(header) : len(header) + size])
        room[len(header) + size :] = bytes(total - len(header) - size)
        return len(header) == BLOCK
    out.write(header)
    left = size
    while left:
        chunk = min(left, len(out.buf))
        read_exactly(f, out.reserve(chunk))
        left -= chunk
    out.write(bytes(padded(size) - size))
    return len(header) == BLOCK


def write_tar_shard(
    name: str,
    samples: Sequence[Sample[Input]],
    tmp_path: str,
    *,
    mtime: int = 0,
    buffer_bytes: int = DEFAULT_BUFFER_BYTES,
    fsync: bool = False,
    open_threads: int = 0,
    window_bytes: int = 64 << 20,
    on_sample: Callable[[int, int], None] | None = None,
) -> ShardResult:
    """Write ``samples`` as a tar shard at ``tmp_path``; return its index entry (named ``name``).

    A sample whose file cannot be opened, or shrinks while being read, is rolled back out of the shard
    and reported in ``skipped``; the other samples are unaffected. ``on_sample(payload_bytes, files)`` is
    called after each sample written. With ``open_threads`` > 0 inputs are opened (fetched, for remote
    sources) ahead by that many threads, at most ``window_bytes`` ahead.
    """

    layouts: list[tuple[tuple[str, ...], list[int]] | None] = []

    def write_sample(out: ShardOutput, key: str, members: Sequence[Member]) -> Skip | None:
        plain = True
        for m in members:
            try:
                plain &= _copy_member(out, f"{key}.{m.field}", m.file, m.size, mtime)
            except DestinationWriteError:
                raise  # the destination's fault: the pack stops, naming it
            except OSError as exc:
                return Skip(m.item.shown, read_problem(exc))
        changed = changed_while_read(members)
        if changed is not None:
            return changed
        layouts.append((tuple(m.field for m in members), [m.size for m in members]) if plain else None)
        return None

    fill = None
    if native.tar_fill is not None and open_threads == 0 and plain_local(samples):
        fill = _NativeFill(samples, mtime, layouts, on_sample)
    result = write_shard(
        name,
        samples,
        tmp_path,
        write_sample,
        trailer=END_OF_ARCHIVE,
        sample_crcs=True,
        buffer_bytes=buffer_bytes,
        fsync=fsync,
        open_threads=open_threads,
        window_bytes=window_bytes,
        on_sample=on_sample,
        fill=fill,
    )
    set_layout(result.entry, layouts)
    return result


# the C loop's results: (sample, kind, ...) by kind (fastload/_native.c, tar_fill)
_OK, _OPEN, _RESIZED, _READ, _SHRUNK, _CHANGED = range(6)
_FULL, _PYTHON = 1, 2  # why it returned: the buffer is full (flush it); a sample for write_sample


class _NativeFill:
    """:func:`~fastload.formats.shard.write_shard`'s ``fill`` for local files: ``fastload._native.tar_fill``
    writes whole samples into the output's buffer (open, fstat, header, read, padding, fstat again, the
    sample's CRC32C; the GIL released for the batch), leaving to ``write_sample`` the samples it does not
    take (pax headers, more bytes than the buffer holds)."""

    def __init__(
        self,
        samples: Sequence[Sample[Input]],
        mtime: int,
        layouts: list[tuple[tuple[str, ...], list[int]] | None],
        on_sample: Callable[[int, int], None] | None,
    ) -> None:
        self.samples, self.mtime, self.layouts, self.on_sample = samples, mtime, layouts, on_sample
        self.paths: list[str] = []
        self.names: list[str] = []
        self.sizes: list[int] = []
        self.counts: list[int] = []
        self.starts: list[int] = []  # each sample's first member
        for sample in samples:
            self.starts.append(len(self.paths))
            self.counts.append(len(sample.members))
            for field_name, item in sample.members:
                self.paths.append(item.entry.path)
                self.names.append(f"{sample.key}.{field_name}")
                self.sizes.append(item.entry.size)

    def __call__(self, out: ShardOutput, result: ShardResult, first: int) -> int:
        samples, stop = self.samples, len(self.samples)
        i, member = first, self.starts[first] if first < stop else 0
        while i < stop:
            before = (result.payload_bytes, result.files)
            fill, i, member, status, done = native.tar_fill(  # type: ignore[misc]
                out.buf, out.fill, self.paths, self.names, self.sizes, self.counts,
                i, member, stop, self.mtime, READ_ATTEMPTS,
            )  # fmt: skip
            base, out.fill = out.flushed, fill
            for k, kind, a, b, c in done:
                sample = samples[k]
                if kind == _OK:
                    result.add(sample, base + a, b, c)
                    self.layouts.append(
                        (tuple(f for f, _ in sample.members), [it.entry.size for _, it in sample.members])
                    )
                else:
                    result.leave_out(sample, self._failed(sample.members[a][1], kind, b, c))
            if self.on_sample is not None and result.files > before[1]:
                self.on_sample(result.payload_bytes - before[0], result.files - before[1])
            if status == _FULL:
                out.flush()
            elif status == _PYTHON:
                return i
        return stop

    @staticmethod
    def _failed(item: Input, kind: int, value: int, err: int) -> Skip:
        if kind == _OPEN:
            return open_failed(item, OSError(err, os.strerror(err), item.entry.path))
        if kind == _RESIZED:
            return resized(item, value)
        if kind == _READ:
            return Skip(item.shown, read_problem(OSError(err, os.strerror(err))))
        if kind == _SHRUNK:
            return Skip(item.shown, read_problem(shrunk(value, item.entry.size)))
        return Skip(item.shown, CHANGED_WHILE_READ)
