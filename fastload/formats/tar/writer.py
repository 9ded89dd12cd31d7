"""Writing one tar shard: samples' files copied once, through one reusable buffer, with CRC32C on the fly (of
the whole file, and of each sample's byte range while its bytes are still in the buffer)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import BinaryIO

from fastload.core.keys import Sample
from fastload.errors import DestinationWriteError, Skip
from fastload.formats.shard import DEFAULT_BUFFER_BYTES, ShardOutput, ShardResult, write_shard
from fastload.formats.tar.header import BLOCK, END_OF_ARCHIVE, member_header, padded
from fastload.formats.tar.layout import set_layout
from fastload.storage.inputs import (
    Input,
    Member,
    changed_while_read,
    read_exactly,
    read_problem,
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
    )
    set_layout(result.entry, layouts)
    return result
