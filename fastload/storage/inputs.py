"""What shard writers read: the files of a sample, opened (and, for remote sources, fetched) ahead of the
writer by a bounded pool, so per-object latency overlaps with writing."""

from __future__ import annotations

import contextlib
import errno
import io
import os
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, BinaryIO, Protocol

from fastload.config import S3Config
from fastload.core.keys import Sample
from fastload.errors import NotFoundError, PackError, Skip
from fastload.storage import access as storage
from fastload.storage.listing import FileEntry, LocalSource, display


class Opener(Protocol):
    """A source that can open one of its listed entries: the file (at offset 0) and its current size."""

    def open(self, entry: FileEntry) -> tuple[BinaryIO, int]: ...


@dataclass(frozen=True)
class Input:
    """A listed file together with the source that can open it."""

    source: Opener
    entry: FileEntry

    @property
    def relpath(self) -> str:
        return self.entry.relpath

    @property
    def shown(self) -> str:
        """The path or URL as printed in messages."""
        return display(self.entry.path)

    def open(self) -> tuple[BinaryIO, int]:
        return self.source.open(self.entry)


@dataclass(frozen=True)
class Member:
    """One opened member of a sample: its field, file object, size and the input it came from, and for a
    local file its :func:`stamp` when opened (to tell a file rewritten while it was read)."""

    field: str
    file: BinaryIO
    size: int
    item: Input
    stamp: tuple[int, int, int] | None = None


CHANGED_WHILE_READ = (
    "file changed as we read it (written to while being packed: its size, mtime or ctime moved, "
    "again when re-read); pack again once the files stop changing"
)
READ_ATTEMPTS = 3  # reads of a sample whose file changes while read, before it is left out


def stamp(f: IO[bytes]) -> tuple[int, int, int] | None:
    """``(size, mtime_ns, ctime_ns)`` of an open local file (any write moves one of them), else None (a
    remote object: its reads are pinned to one version by ETag instead)."""
    try:
        st = os.fstat(f.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return None
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns


def changed_while_read(members: Sequence[Member]) -> Skip | None:
    """The first member whose file changed since it was opened (GNU tar's "file changed as we read it"):
    what was read may mix two versions, so the caller reads the sample again (:func:`open_sample`) or,
    after :data:`READ_ATTEMPTS`, leaves it out. Checked after the sample's bytes are read."""
    for m in members:
        if m.stamp is not None and stamp(m.file) != m.stamp:
            return Skip(m.item.shown, CHANGED_WHILE_READ)
    return None


class ShrunkError(OSError):
    """A file gave fewer bytes than its size said (it shrank while being read)."""


def read_exactly(f: BinaryIO, view: memoryview) -> None:
    """Fill ``view`` from ``f`` or raise :class:`ShrunkError`; never leaves a short read unnoticed."""
    got = 0
    total = len(view)
    while got < total:
        n = f.readinto(view[got:])  # type: ignore[attr-defined]
        if not n:
            raise shrunk(got, total)
        got += n


def shrunk(got: int, total: int) -> ShrunkError:
    """The error for a file that gave ``got`` of its ``total`` bytes."""
    return ShrunkError(f"file ended after {got} of {total} bytes (it shrank while being packed)")


class ChangedError(OSError):
    """A file changed while it was read, each of :data:`READ_ATTEMPTS` times."""


def read_whole(url: str, *, config: S3Config | None = None) -> bytes:
    """All bytes of ``url`` (:func:`fastload.storage.access.read_bytes`); a local file is checked against
    change while read (:func:`stamp` before and after) and read again if it changed, up to
    :data:`READ_ATTEMPTS` times, then :class:`ChangedError`. (An object is pinned to one version by ETag.)"""
    if storage.is_remote(url):
        return storage.read_bytes(url, config=config)
    for _ in range(READ_ATTEMPTS):
        try:
            with open(url, "rb", buffering=0) as f:
                before = stamp(f)
                data = f.readall()
                if stamp(f) == before:
                    return data
        except FileNotFoundError:
            raise NotFoundError(f"{url} does not exist", path=url) from None
    raise ChangedError(CHANGED_WHILE_READ)


def read_problem(exc: BaseException) -> str:
    """Plain words for an error met while opening or reading a listed file."""
    if isinstance(exc, ShrunkError):
        return str(exc)
    if isinstance(exc, ChangedError):
        return CHANGED_WHILE_READ
    if isinstance(exc, FileNotFoundError):
        return "vanished after it was listed (deleted or moved during the pack)"
    if isinstance(exc, PermissionError):
        return "unreadable: permission denied; fix its permissions"
    if isinstance(exc, IsADirectoryError):
        return "became a folder after it was listed"
    if isinstance(exc, OSError) and exc.strerror:
        return f"unreadable: {exc.strerror}"
    return f"unreadable: {exc}"


def close_all(members: Iterable[Member]) -> None:
    for m in members:
        with contextlib.suppress(OSError):
            m.file.close()


def open_sample(sample: Sample[Input]) -> tuple[list[Member], Skip | None]:
    """Open every member of ``sample``; on the first failure close the rest and say why."""
    members: list[Member] = []
    for field_name, item in sample.members:
        try:
            f, size = item.open()
        except OSError as exc:
            close_all(members)
            return [], open_failed(item, exc)
        members.append(Member(field_name, f, size, item, stamp(f)))
        if size != item.entry.size:
            close_all(members)
            return [], resized(item, size)
    return members, None


def open_failed(item: Input, exc: OSError) -> Skip:
    """The skip for an input that could not be opened; raises :class:`~fastload.errors.PackError` when
    this process is out of file descriptors (skipping would hide that)."""
    if exc.errno in (errno.EMFILE, errno.ENFILE):  # this process, not the file
        raise PackError(
            f"too many open files while opening {item.shown} ({exc.strerror}); raise the limit "
            "(`ulimit -n`) or pack with fewer --workers"
        ) from exc
    return Skip(item.shown, read_problem(exc))


def resized(item: Input, size: int) -> Skip:
    """The skip for an input whose size when opened (``size``) is not the listed one."""
    change = "emptied" if size == 0 else ("shrank" if size < item.entry.size else "grew")
    return Skip(
        item.shown,
        f"changed after it was listed ({change}: {item.entry.size} -> {size} bytes); "
        "pack again once the files stop changing",
    )


_PLAIN_OPEN = LocalSource.open  # (as defined: a subclass's or a patched open is not plain)


def plain_local(samples: Sequence[Sample[Input]]) -> bool:
    """Whether every input of ``samples`` is a local file that its source opens the plain way
    (:meth:`LocalSource.open <fastload.storage.listing.LocalSource.open>`: ``open`` of its path, its size by
    ``fstat``): what a C writer may open and read itself (``fastload._native.tar_fill``)."""
    if LocalSource.open is not _PLAIN_OPEN:
        return False
    return all(type(item.source) is LocalSource for sample in samples for _, item in sample.members)


Opened = tuple[Sample[Input], list[Member], Skip | None]


def open_ahead(samples: Sequence[Sample[Input]], *, threads: int, window_bytes: int) -> Iterator[Opened]:
    """``open_sample`` for each sample, in order. With ``threads > 0`` samples are opened by a pool ahead
    of the consumer, keeping at most ``window_bytes`` (by listed size, at least one sample) opened ahead."""
    if threads <= 0:
        for sample in samples:
            yield (sample, *open_sample(sample))
        return
    pending: deque[tuple[Sample[Input], int, Future[tuple[list[Member], Skip | None]]]] = deque()
    ahead = 0
    nxt = 0
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="fastload-open") as pool:
        try:
            while nxt < len(samples) or pending:
                while nxt < len(samples) and (not pending or ahead < window_bytes):
                    sample = samples[nxt]
                    size = sum(item.entry.size for _, item in sample.members)
                    pending.append((sample, size, pool.submit(open_sample, sample)))
                    ahead += size
                    nxt += 1
                sample, size, fut = pending.popleft()
                ahead -= size
                yield (sample, *fut.result())
        finally:
            for _, _, fut in pending:
                if not fut.cancel():
                    with contextlib.suppress(Exception):
                        close_all(fut.result()[0])
