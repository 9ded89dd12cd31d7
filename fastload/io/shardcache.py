"""A local disk cache of whole remote shards, shared by every worker and process that uses the same folder.

- A shard is downloaded once (the parallel ranged reader), its CRC32C computed on the way and compared
  with the index, and renamed into place complete: there are never torn files under a final name.
- Fills are serialised per shard with an advisory ``flock`` on a lock file: a second process waits for the
  first fill and then uses its file; the kernel drops a dead holder's lock, so a killed worker never
  deadlocks the others.
- A cached file is checked against the index (size, and CRC32C the first time each process uses it);
  one that does not match is deleted and fetched again, never used.
- ``limit_bytes`` bounds the folder: least recently used shards (by the mtime each use refreshes) are
  evicted after a fill. A shard larger than the limit is not cached. Files are opened under the shard's
  lock (:meth:`ShardCache.open`) and readers that have an evicted file open keep reading it (POSIX unlink
  semantics).

Names are ``<digest of the URL>-<crc32c>-<shard name>``: two datasets never share an entry, and a
re-packed shard (new checksum) never matches an old file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
from collections.abc import Iterator
from typing import BinaryIO

from crc32c import crc32c

from fastload.config import S3Config
from fastload.core.index import ShardEntry
from fastload.errors import ConfigError, VerifyError

_BUF = 8 << 20


def file_crc32c(path: str) -> tuple[str, int]:
    """``(crc32c as 8 hex digits, size)`` of a local file."""
    crc, size = 0, 0
    buf = bytearray(_BUF)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            crc = crc32c(memoryview(buf)[:n], crc)
            size += n
    return f"{crc:08x}", size


class ShardCache:
    """Whole shards of remote datasets on local disk under ``folder`` (see the module docstring)."""

    def __init__(
        self,
        folder: str | os.PathLike[str],
        *,
        limit_bytes: int | None = None,
        verify: bool = True,
        config: S3Config | None = None,
    ) -> None:
        if limit_bytes is not None and limit_bytes <= 0:
            raise ConfigError(f"cache_limit_bytes={limit_bytes} must be > 0 (or None for no limit)")
        self.folder = os.path.abspath(os.fspath(folder))
        self.limit_bytes = limit_bytes
        self.verify = verify
        self.config = config
        self._checked: dict[str, tuple[int, int]] = {}  # path -> (device, inode) checked by this process
        self._lock = threading.Lock()
        self.hits = self.fills = self.refetched = 0
        try:
            os.makedirs(os.path.join(self.folder, ".tmp"), exist_ok=True)
            os.makedirs(os.path.join(self.folder, ".locks"), exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"cache_dir={self.folder!r} cannot be created ({exc.strerror}); give a writable folder"
            ) from None

    def path_for(self, url: str, entry: ShardEntry) -> str:
        digest = hashlib.sha256(url.encode()).hexdigest()[:16]
        base = entry.name.replace("/", "_")
        return os.path.join(self.folder, f"{digest}-{entry.checksum}-{base}")

    def cacheable(self, entry: ShardEntry) -> bool:
        return self.limit_bytes is None or entry.bytes <= self.limit_bytes

    def get(self, url: str, entry: ShardEntry) -> str:
        """A local path holding exactly the shard ``url`` described by ``entry``: filled if needed."""
        path = self.path_for(url, entry)
        if self._usable(path, entry):
            with self._lock:
                self.hits += 1
            return path
        with self._flock(path):
            if self._usable(path, entry):  # another process filled it while we waited
                with self._lock:
                    self.hits += 1
                return path
            self._fill(url, entry, path)
        self._evict(keep=path)
        return path

    def open(self, url: str, entry: ShardEntry) -> BinaryIO | None:
        """The cached shard, open for reading (filled if needed). The file is opened under the shard's lock,
        so another process's eviction cannot remove it in between (once open, an unlink is harmless).
        None if it kept being evicted before it could be opened: read the shard remotely then."""
        for _ in range(3):
            path = self.get(url, entry)
            with self._flock(path):
                try:
                    return open(path, "rb")  # the caller owns and closes it
                except FileNotFoundError:
                    continue
        return None

    # -- internals ------------------------------------------------------------------------------------

    def _usable(self, path: str, entry: ShardEntry) -> bool:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return False
        stamp = (st.st_dev, st.st_ino)  # a re-filled file is a new inode
        good = st.st_size == entry.bytes
        if good and self.verify and self._checked.get(path) != stamp:
            good = file_crc32c(path) == (entry.checksum, entry.bytes)
        if not good:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            with self._lock:
                self.refetched += 1
            return False
        with contextlib.suppress(FileNotFoundError):
            os.utime(path)  # LRU: a use refreshes the mtime
        self._checked[path] = stamp
        return True

    @contextlib.contextmanager
    def _flock(self, path: str) -> Iterator[None]:
        lock_path = os.path.join(self.folder, ".locks", os.path.basename(path) + ".lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _fill(self, url: str, entry: ShardEntry, path: str) -> None:
        from fastload.io import storage

        tmp = os.path.join(
            self.folder, ".tmp", f"{os.path.basename(path)}.{os.getpid()}.{threading.get_ident()}"
        )
        crc, size = 0, 0
        try:
            with storage.open_read(url, config=self.config) as src, open(tmp, "wb") as out:
                buf = memoryview(bytearray(_BUF))
                while n := src.readinto(buf):  # type: ignore[attr-defined]
                    crc = crc32c(buf[:n], crc)
                    out.write(buf[:n])
                    size += n
            if (f"{crc:08x}", size) != (entry.checksum, entry.bytes):
                raise VerifyError(
                    f"the shard's bytes do not match index.json (crc32c {crc:08x}, {size} bytes; the index "
                    f"says {entry.checksum}, {entry.bytes} bytes): the object was changed or the index is "
                    "stale; re-pack, or run `fastload verify` on the dataset",
                    shard=entry.name,
                )
            os.replace(tmp, path)
        except BaseException:
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
        files: list[tuple[int, int, str]] = []
        with os.scandir(self.folder) as it:
            for e in it:
                if e.is_file(follow_symlinks=False):
                    with contextlib.suppress(FileNotFoundError):
                        st = e.stat(follow_symlinks=False)
                        files.append((st.st_mtime_ns, st.st_size, e.path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.limit_bytes:
                break
            if path == keep:
                continue
            with self._flock(path), contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            self._checked.pop(path, None)
            total -= size
