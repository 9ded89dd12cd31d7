"""The shard kit every format shares: the loop that writes one shard from samples (:func:`write_shard`: inputs
opened ahead, each sample written by its format, rolled back when an input fails, CRC32C on the fly), its
buffered, checksummed, rewindable output (:class:`ShardOutput`), the written shard's result
(:class:`ShardResult`), a stream that checksums what is read through it (:class:`ChecksumReader`, for
verify and indexing), and the error for a shard shorter than its index (:func:`short_read`)."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO, cast

from crc32c import crc32c as _crc32c_package

from fastload.core.index import ShardEntry
from fastload.core.keys import Sample
from fastload.errors import Skip, VerifyError, write_error
from fastload.formats import native
from fastload.storage.inputs import (
    CHANGED_WHILE_READ,
    READ_ATTEMPTS,
    Input,
    Member,
    Opened,
    close_all,
    open_ahead,
    open_sample,
)
from fastload.storage.localfs import write_all

# The output's buffer: bytes are written out while still in cache (the page-cache copy of a cold 8 MiB
# buffer cost 1.9x GNU tar's per byte: 2.8-3.8 CPU s for 1.2 GB against 1.0-1.4 s with 1 MiB)
DEFAULT_BUFFER_BYTES = 1 << 20
crc32c = native.crc32c or _crc32c_package  # (the C one: ~2.5x faster where a CRC32C instruction is)


@dataclass
class ShardResult:
    """A written shard's index entry, the inputs it had to leave out, and the payload bytes copied."""

    entry: ShardEntry
    skipped: list[Skip] = field(default_factory=list)
    payload_bytes: int = 0
    files: int = 0

    def add(self, sample: Sample[Input], offset: int, size: int, crc: int | None) -> None:
        """Record ``sample``, written at ``offset`` (``size`` bytes, CRC32C ``crc`` when kept)."""
        entry = self.entry
        cast(list[str], entry.keys).append(sample.key)  # (a list while written: see write_shard)
        entry.offsets.append(offset)
        entry.sizes.append(size)
        if crc is not None:
            entry.crcs.append(crc)
        self.payload_bytes += sum(item.entry.size for _, item in sample.members)
        self.files += len(sample.members)

    def leave_out(self, sample: Sample[Input], failed: Skip) -> None:
        """Record ``sample`` as left out of this shard because of ``failed`` (one of its inputs)."""
        self.skipped.append(
            Skip(failed.path, f"{failed.reason}; sample {sample.key!r} left out of {self.entry.name}")
        )


# Fill(out, result, first) -> the first sample it leaves to write_sample: see write_shard
Fill = Callable[["ShardOutput", ShardResult, int], int]


class ShardOutput:
    """Buffered, checksummed, rewindable writer to a file descriptor (of the file at ``path``).

    A failed write, truncate or read-back of the output raises
    :class:`~fastload.errors.DestinationWriteError` (naming ``path``), so no writer can take a full disk
    for an unreadable source; the output is then in no defined state: the caller removes it.

    ``crc`` is the CRC32C of every byte flushed. Between :meth:`begin_sample` and :meth:`end_sample` the
    bytes written are also checksummed on their own (each byte once more, while still in the buffer: in
    cache), so a sample's CRC32C costs no re-read.
    """

    def __init__(self, fd: int, buffer_bytes: int, *, path: str = "") -> None:
        self.fd = fd
        self.path = path
        self.buf = bytearray(buffer_bytes)
        self.view = memoryview(self.buf)
        self.fill = 0
        self.flushed = 0
        self.crc = 0
        self._sample_at: int | None = None  # where the open sample begins (begin_sample)
        self._sample_crc = 0  # CRC32C of its bytes flushed so far

    @property
    def position(self) -> int:
        return self.flushed + self.fill

    def flush(self) -> None:
        if self.fill:
            data = self.view[: self.fill]
            self.crc = crc32c(data, self.crc)
            if self._sample_at is not None:
                at = max(0, self._sample_at - self.flushed)
                self._sample_crc = crc32c(self.view[at : self.fill], self._sample_crc)
            try:
                write_all(self.fd, data)
            except OSError as exc:
                raise write_error(exc, self.path) from exc
            self.flushed += self.fill
            self.fill = 0

    def reserve(self, n: int) -> memoryview:
        """Room for ``n`` bytes at the current position (flushing first if needed; ``n`` <= buffer)."""
        if self.fill + n > len(self.buf):
            self.flush()
        out = self.view[self.fill : self.fill + n]
        self.fill += n
        return out

    def write(self, data: bytes) -> None:
        self.reserve(len(data))[:] = data

    def begin_sample(self) -> None:
        """Start checksumming a sample's bytes on their own, from the current position."""
        self._sample_at, self._sample_crc = self.position, 0

    def end_sample(self) -> int:
        """The CRC32C of the bytes written since :meth:`begin_sample`."""
        if self._sample_at is None:
            raise RuntimeError("end_sample without begin_sample")
        at = max(0, self._sample_at - self.flushed)
        crc = crc32c(self.view[at : self.fill], self._sample_crc)
        self._sample_at = None
        return crc

    def mark(self) -> tuple[int, int, int]:
        """A point to :meth:`rewind` to: the position, the bytes flushed and their CRC32C."""
        return self.position, self.flushed, self.crc

    def rewind(self, mark: tuple[int, int, int]) -> None:
        """Forget everything after ``mark`` (from :meth:`mark`), and the open sample."""
        position, flushed, crc = mark
        self._sample_at = None
        if position >= self.flushed:
            self.fill = position - self.flushed
            return
        # bytes [flushed, position) were in the buffer at the mark and have been flushed since (rare: a
        # sample failed after filling the buffer): checksum them again from the file
        try:
            back = os.pread(self.fd, position - flushed, flushed)
            if len(back) != position - flushed:
                raise OSError(errno.EIO, f"read back {len(back)} of {position - flushed} bytes written")
            crc = crc32c(back, crc)
            os.ftruncate(self.fd, position)
            os.lseek(self.fd, position, os.SEEK_SET)
        except OSError as exc:
            raise write_error(exc, self.path) from exc
        self.flushed, self.fill, self.crc = position, 0, crc


def write_shard(
    name: str,
    samples: Sequence[Sample[Input]],
    tmp_path: str,
    write_sample: Callable[[ShardOutput, str, Sequence[Member]], Skip | None],
    *,
    trailer: bytes = b"",
    sample_crcs: bool = False,
    buffer_bytes: int = DEFAULT_BUFFER_BYTES,
    fsync: bool = False,
    open_threads: int = 0,
    window_bytes: int = 64 << 20,
    on_sample: Callable[[int, int], None] | None = None,
    fill: Fill | None = None,
) -> ShardResult:
    """The shard loop every format shares: open inputs ahead, ``write_sample(out, key, members)`` each
    sample (it returns the failed input, if any: the sample is then rolled back and reported; one that
    changed as it was read, :func:`~fastload.storage.inputs.changed_while_read`, is read again, up to
    ``READ_ATTEMPTS`` times), record
    offsets and sizes (and with ``sample_crcs`` the CRC32C of each sample's bytes), end with ``trailer``,
    CRC32C on the fly; the file is removed on any error. A failed write of the output raises
    :class:`~fastload.errors.DestinationWriteError`; errors reading inputs are the samples' skips.

    ``fill(out, result, first)``, a format's batch writer (with ``open_threads`` 0): writes the samples
    from ``first`` on into ``out`` itself, as ``write_sample`` would (whole samples, flushing ``out`` as it
    fills), records each (:meth:`ShardResult.add`, :meth:`ShardResult.leave_out`, ``on_sample``) and
    returns the first sample it leaves to ``write_sample`` (``len(samples)`` when none)."""
    result = ShardResult(ShardEntry(name=name, bytes=0, checksum="", keys=[]))
    entry = result.entry
    try:
        fd = os.open(
            tmp_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o666
        )  # (less the umask); read: see rewind
    except OSError as exc:
        raise write_error(exc, tmp_path) from exc
    try:
        out = ShardOutput(fd, buffer_bytes, path=tmp_path)
        for sample, members, failed in _opened(samples, out, result, fill, open_threads, window_bytes):
            mark = out.mark()
            start = out.position
            for attempt in range(1, READ_ATTEMPTS + 1):
                if sample_crcs:
                    out.begin_sample()
                try:
                    if failed is None:
                        failed = write_sample(out, sample.key, members)
                finally:
                    close_all(members)
                if failed is None or failed.reason != CHANGED_WHILE_READ or attempt == READ_ATTEMPTS:
                    break
                out.rewind(mark)  # torn: read the sample again, from a fresh open
                members, failed = open_sample(sample)
            if failed is not None:
                out.rewind(mark)
                result.leave_out(sample, failed)
                continue
            result.add(sample, start, out.position - start, out.end_sample() if sample_crcs else None)
            if on_sample is not None:
                on_sample(sum(m.size for m in members), len(members))
        if trailer:
            out.write(trailer)
        out.flush()
        if fsync:
            try:
                os.fsync(fd)
            except OSError as exc:
                raise write_error(exc, tmp_path) from exc
        entry.bytes = out.position
        entry.checksum = f"{out.crc:08x}"
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp_path)
        raise
    try:
        os.close(fd)  # (a network file system may report a failed write only here)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp_path)
        raise write_error(exc, tmp_path) from exc
    return result


def _opened(
    samples: Sequence[Sample[Input]],
    out: ShardOutput,
    result: ShardResult,
    fill: Fill | None,
    open_threads: int,
    window_bytes: int,
) -> Iterator[Opened]:
    """The samples for ``write_sample``, opened (ahead, with ``open_threads``); with ``fill``, only those
    it leaves (it writes the others itself, in between)."""
    if fill is None or open_threads > 0:
        yield from open_ahead(samples, threads=open_threads, window_bytes=window_bytes)
        return
    i = 0
    while (i := fill(out, result, i)) < len(samples):
        yield (samples[i], *open_sample(samples[i]))
        i += 1


class ChecksumReader:
    """Wraps a binary stream; tracks position and CRC32C of everything read through it."""

    def __init__(self, f: BinaryIO, chunk_bytes: int = 4 << 20) -> None:
        self.f = f
        self.crc = 0
        self.pos = 0
        self._buf = bytearray(chunk_bytes)
        self._view = memoryview(self._buf)

    def _take(self, data: bytes | memoryview) -> None:
        """Account for ``data``, just read (subclasses track more)."""
        self.crc = crc32c(data, self.crc)
        self.pos += len(data)

    def read(self, n: int) -> bytes:
        data = self.f.read(n)
        self._take(data)
        return data

    def skip(self, n: int) -> int:
        """Read and discard up to ``n`` bytes; return how many were there."""
        left = n
        while left:
            got = self.f.readinto(self._view[: min(left, len(self._buf))])  # type: ignore[attr-defined]
            if not got:
                break
            self._take(self._view[:got])
            left -= got
        return n - left

    def drain(self) -> None:
        while self.skip(len(self._buf)):
            pass


def short_read(shard: str, size: int, offset: int, key: str | None = None) -> VerifyError:
    """The error for a shard that ends before the bytes its index lists."""
    return VerifyError(
        f"shard is shorter than its index says (wanted {size} bytes at {offset}); "
        "it was truncated or replaced: re-download or re-pack it",
        shard=shard,
        key=key,
        offset=offset,
    )


__all__ = [
    "DEFAULT_BUFFER_BYTES",
    "ChecksumReader",
    "ShardOutput",
    "ShardResult",
    "short_read",
    "write_shard",
]
