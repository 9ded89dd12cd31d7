"""A local disk cache of whole remote shards, shared by every worker and process that uses the same folder.

- A shard is downloaded once (the parallel ranged reader), its CRC32C computed on the way and compared
  with the index, and renamed into place complete: there are never torn files under a final name.
- Fills are serialised per shard with an advisory ``flock`` on a lock file: a second process waits for the
  first fill and then uses its file; the kernel drops a dead holder's lock, so a killed worker never
  deadlocks the others.
- A cached file is checked against the index (size, and CRC32C the first time each process uses it);
  one that does not match is deleted and fetched again, never used. A reader that later finds a sample of
  it that does not match its CRC32C (damage after the check) drops it (:meth:`ShardCache.discard`) and
  reads a fresh copy. An entry without a CRC32C (Parquet files of other tools indexed from their footers)
  is checked by size only (Parquet page checksums, where written, still check the bytes read).
- ``limit_bytes`` bounds the folder: least recently used shards (by the mtime each use refreshes) are
  evicted after a fill; fills under way (``.tmp``) count too. A shard larger than the limit is not cached.
  Files are opened under the shard's lock (:meth:`ShardCache.open`) and readers that have an evicted file
  open keep reading it (POSIX unlink semantics).
- A folder that cannot store a shard (a full disk, a quota, a read-only mount) does not stop a reader:
  :meth:`ShardCache.try_open` answers None and the caller reads the shard from its source, uncached. Such
  shards are counted (:attr:`ShardCache.bypassed`) and the first is warned of, naming the folder and why.
- A fill whose process died (SIGKILL) leaves its partial file in ``.tmp``; the next cache made on the
  folder, and each eviction, delete those no live fill holds (a fill holds its shard's lock).

Names are ``<digest of the URL>-<crc32c>-<shard name>``: two datasets never share an entry, and a
re-packed shard (new checksum) never matches an old file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import BinaryIO, TypeVar

from crc32c import crc32c

from fastload.config import S3Config
from fastload.core.index import ShardEntry
from fastload.errors import ConfigError, VerifyError
from fastload.storage.localfs import write_all as _write_all  # (tests inject a full disk here)

_BUF = 8 << 20
T = TypeVar("T")


class FillStopped(Exception):
    """A fill was abandoned because its reader stopped (nobody waits for the shard any more)."""


class CacheWriteError(OSError):
    """The cache folder could not store a shard (its local write failed: ``errno``, ``strerror`` and
    ``filename`` as the OSError's); :meth:`ShardCache.try_open` turns it into a read past the cache."""


def _local(what: str, path: str, call: Callable[[], T]) -> T:
    """``call()``, its OSError re-raised as :class:`CacheWriteError` (a local write, not the source)."""
    try:
        return call()
    except OSError as exc:
        raise CacheWriteError(exc.errno or errno.EIO, f"{what}: {exc.strerror or exc}", path) from exc


def _crc_of(f: BinaryIO) -> tuple[str, int]:
    """``(crc32c as 8 hex digits, size)`` of an open local file, read from its start with ``pread``."""
    crc, size = 0, 0
    fd = f.fileno()
    while data := os.pread(fd, _BUF, size):
        crc = crc32c(data, crc)
        size += len(data)
    return f"{crc:08x}", size


def file_crc32c(path: str) -> tuple[str, int]:
    """``(crc32c as 8 hex digits, size)`` of a local file."""
    with open(path, "rb", buffering=0) as f:
        return _crc_of(f)


class ShardCache:
    """Whole shards of remote datasets on local disk under ``folder`` (see the module docstring)."""

    def __init__(
        self,
        folder: str | os.PathLike[str],
        *,
        limit_bytes: int | None = None,
        verify: bool = True,
        config: S3Config | None = None,
        on_bypass: Callable[[str], None] | None = None,
    ) -> None:
        """``on_bypass(message)`` is called for each shard :meth:`try_open` reads past the cache (by default
        the first is warned of, once per cache object)."""
        if limit_bytes is not None and limit_bytes <= 0:
            raise ConfigError(f"cache_limit_bytes={limit_bytes} must be > 0 (or None for no limit)")
        self.folder = os.path.abspath(os.fspath(folder))
        self.limit_bytes = limit_bytes
        self.verify = verify
        self.config = config
        self._checked: dict[str, tuple[int, int]] = {}  # path -> (device, inode) checked by this process
        self._lock = threading.Lock()
        self.on_bypass = on_bypass
        self.hits = self.fills = self.refetched = self.bypassed = 0
        try:
            os.makedirs(os.path.join(self.folder, ".tmp"), exist_ok=True)
            os.makedirs(os.path.join(self.folder, ".locks"), exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"cache_dir={self.folder!r} cannot be created ({exc.strerror}); give a writable folder"
            ) from None
        self.sweep_partial_fills()

    def path_for(self, url: str, entry: ShardEntry) -> str:
        digest = hashlib.sha256(url.encode()).hexdigest()[:16]
        base = entry.name.replace("/", "_")
        return os.path.join(self.folder, f"{digest}-{entry.checksum}-{base}")

    def cacheable(self, entry: ShardEntry) -> bool:
        return self.limit_bytes is None or entry.bytes <= self.limit_bytes

    def get(self, url: str, entry: ShardEntry, *, stop: threading.Event | None = None) -> str:
        """A local path holding exactly the shard ``url`` described by ``entry``: filled if needed. (Another
        process may evict it at any time after this returns: to read it, use :meth:`open`.)"""
        self.open(url, entry, stop=stop).close()
        return self.path_for(url, entry)

    def open(self, url: str, entry: ShardEntry, *, stop: threading.Event | None = None) -> BinaryIO:
        """The cached shard, open for reading (filled if needed, checked against the index through the same
        handle; once it is open, an eviction by another process does no harm). The caller closes it.
        ``stop`` abandons a fill in progress (:class:`FillStopped`)."""
        path = self.path_for(url, entry)
        f = self._open_usable(path, entry)
        filled = False
        if f is None:
            with self._flock(path):  # evictions and fills of this shard wait for us
                f = self._open_usable(path, entry, locked=True)  # another process may have filled it
                if f is None:
                    self._fill(url, entry, path, stop)
                    f = open(path, "rb")  # noqa: SIM115 (returned to the caller)
                    filled = True
        if filled:
            try:
                self._evict(keep=path)
            except BaseException:
                f.close()
                raise
        else:
            with self._lock:
                self.hits += 1
        return f

    def try_open(
        self, url: str, entry: ShardEntry, *, stop: threading.Event | None = None
    ) -> BinaryIO | None:
        """As :meth:`open`, or None when the folder cannot store the shard (no space for it, or a write
        failed: full disk, quota, read-only): the caller then reads the shard from ``url`` itself. Such
        reads are counted in :attr:`bypassed` and reported through ``on_bypass``."""
        try:
            free = self._free_bytes()
            if free is not None and free < entry.bytes and not os.path.exists(self.path_for(url, entry)):
                raise CacheWriteError(
                    errno.ENOSPC, f"{entry.bytes:,} bytes needed, {free:,} free", self.folder
                )
            return self.open(url, entry, stop=stop)
        except CacheWriteError as exc:
            self._bypass(entry, url, exc)
            return None

    def sweep_partial_fills(self) -> int:
        """Delete the partial files in ``.tmp`` that no fill holds (left by a process killed mid-fill);
        return how many. A fill holds its shard's lock, so a free lock means a dead filler."""
        removed = 0
        tmp_dir = os.path.join(self.folder, ".tmp")
        with contextlib.suppress(FileNotFoundError), os.scandir(tmp_dir) as it:
            names = [e.name for e in it if e.is_file(follow_symlinks=False)]
        for name in names:
            base = name.rsplit(".", 2)[0]  # <final name>.<pid>.<thread>
            if base == name:
                continue
            lock_path = os.path.join(self.folder, ".locks", base + ".lock")
            try:
                fd = os.open(lock_path, os.O_RDWR)
            except FileNotFoundError:
                fd = -1  # no lock file: no fill of it can be under way
            except OSError:
                continue
            try:
                if fd >= 0:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        continue  # a live fill of that shard
                with contextlib.suppress(OSError):  # (gone already; a read-only folder: leave it)
                    os.unlink(os.path.join(tmp_dir, name))
                    removed += 1
            finally:
                if fd >= 0:
                    os.close(fd)
        return removed

    def discard(self, url: str, entry: ShardEntry) -> None:
        """Drop the cached copy of shard ``url`` (a reader found a sample in it that does not match the
        index): the next :meth:`open` fetches the shard again. Readers that have the file open keep it."""
        path = self.path_for(url, entry)
        with self._flock(path), contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self._checked.pop(path, None)
        with self._lock:
            self.refetched += 1

    # -- internals ------------------------------------------------------------------------------------

    def _open_usable(self, path: str, entry: ShardEntry, *, locked: bool = False) -> BinaryIO | None:
        """``path`` opened, if it holds the shard (size, and CRC32C once per process and file); a bad file
        is deleted (only if ``path`` still names that same file; ``locked``: the caller holds its lock)."""
        try:
            f = open(path, "rb")  # noqa: SIM115 (returned to the caller)
        except FileNotFoundError:
            return None
        try:
            st = os.fstat(f.fileno())
            stamp = (st.st_dev, st.st_ino)  # a re-filled file is a new inode
            good = st.st_size == entry.bytes
            if good and self.verify and entry.checksum and self._checked.get(path) != stamp:
                good = _crc_of(f) == (entry.checksum, entry.bytes)
        except BaseException:
            f.close()
            raise
        if not good:
            f.close()
            guard = contextlib.nullcontext() if locked else self._flock(path)
            with guard, contextlib.suppress(FileNotFoundError):
                now = os.stat(path)
                if (now.st_dev, now.st_ino) == stamp:
                    os.unlink(path)
            with self._lock:
                self.refetched += 1
            return None
        with contextlib.suppress(FileNotFoundError):
            os.utime(path)  # LRU: a use refreshes the mtime
        self._checked[path] = stamp
        return f

    def _free_bytes(self) -> int | None:
        """Bytes an unprivileged writer may still put in the folder's file system (None if unknown)."""
        try:
            st = os.statvfs(self.folder)
        except OSError:
            return None
        return st.f_bavail * st.f_frsize

    def _bypass(self, entry: ShardEntry, url: str, exc: CacheWriteError) -> None:
        with self._lock:
            self.bypassed += 1
            first = self.bypassed == 1
        message = (
            f"cache_dir={self.folder!r} cannot store shard {entry.name} ({exc.strerror}); it is read from "
            f"{url} instead, uncached, as is every shard the folder cannot hold (training goes on; "
            "epoch_report()['cache_bypassed'] counts them). Free space there, raise its quota, or give "
            "another cache_dir"
        )
        if self.on_bypass is not None:
            self.on_bypass(message)
        elif first:
            warnings.warn(message, RuntimeWarning, stacklevel=3)

    @contextlib.contextmanager
    def _flock(self, path: str) -> Iterator[None]:
        lock_path = os.path.join(self.folder, ".locks", os.path.basename(path) + ".lock")
        fd = _local(
            "creating a lock file", lock_path, lambda: os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _fill(self, url: str, entry: ShardEntry, path: str, stop: threading.Event | None) -> None:
        from fastload.storage import access as storage

        tmp = os.path.join(
            self.folder, ".tmp", f"{os.path.basename(path)}.{os.getpid()}.{threading.get_ident()}"
        )
        crc, size = 0, 0
        out = -1
        try:
            with storage.open_read(url, config=self.config) as src:
                flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
                out = _local("creating a fill", tmp, lambda: os.open(tmp, flags, 0o666))
                buf = memoryview(bytearray(_BUF))
                while n := src.readinto(buf):  # type: ignore[attr-defined]
                    if stop is not None and stop.is_set():
                        raise FillStopped(f"filling {entry.name} was abandoned (the reader stopped)")
                    crc = crc32c(buf[:n], crc)
                    _local("writing a fill", tmp, lambda: _write_all(out, buf[:n]))
                    size += n
                _local("closing a fill", tmp, lambda: os.close(out))
                out = -1
            if size != entry.bytes or (entry.checksum and f"{crc:08x}" != entry.checksum):
                raise VerifyError(
                    f"the shard's bytes do not match index.json (crc32c {crc:08x}, {size} bytes; the index "
                    f"says {entry.checksum}, {entry.bytes} bytes): the object was changed or the index is "
                    "stale; re-pack, or run `fastload verify` on the dataset",
                    shard=entry.name,
                )
            _local("renaming a fill into place", path, lambda: os.replace(tmp, path))
        except BaseException:
            if out >= 0:
                with contextlib.suppress(OSError):
                    os.close(out)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        st = os.stat(path)
        self._checked[path] = (st.st_dev, st.st_ino)
        with self._lock:
            self.fills += 1

    def _evict(self, *, keep: str) -> None:
        if self.limit_bytes is None:
            return
        self.sweep_partial_fills()
        files: list[tuple[int, int, str]] = []
        with os.scandir(self.folder) as it:
            for e in it:
                if e.is_file(follow_symlinks=False):
                    with contextlib.suppress(FileNotFoundError):
                        st = e.stat(follow_symlinks=False)
                        files.append((st.st_mtime_ns, st.st_size, e.path))
        filling = 0  # fills under way take room too (they are not evicted: their fillers rename them)
        with contextlib.suppress(FileNotFoundError), os.scandir(os.path.join(self.folder, ".tmp")) as it:
            for e in it:
                with contextlib.suppress(FileNotFoundError):
                    filling += e.stat(follow_symlinks=False).st_size
        total = filling + sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.limit_bytes:
                break
            if path == keep:
                continue
            with self._flock(path), contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            self._checked.pop(path, None)
            total -= size
