"""Advisory file locks between processes, possibly on other hosts: what a local append holds while it
publishes ``index.json`` (so two appenders never lose each other's update) and while it runs (so two runs
of the same inputs never share a journal).

POSIX record locks (``fcntl.lockf``): on Linux they work across hosts on NFSv4, and on NFSv3 where the
lock manager (``lockd``/``statd``) runs; a mount with ``nolock`` or ``local_lock=all`` keeps them on one
host only (two hosts can then both hold one: append from one host at a time there). A lock file that was
removed and made again while waited for is noticed (its inode changed) and locked anew. The file says who
holds it (host, pid, time), for the message of whoever waits in vain. A holder may remove the file as it
lets go (``release(remove=True)``): a waiter then locks the file made anew.

Record locks belong to a process, not a thread (a second thread's ``lockf`` succeeds at once, and closing
any descriptor of the file drops the process's lock), so threads of one process (writers appending from
threads) first take a :class:`threading.Lock` per lock file, and a waiter that times out on it names this
process without opening the file.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import os
import socket
import threading
import time
import weakref
from types import TracebackType


class LockHeld(Exception):
    """The lock is held by another process (``holder``: what its file says)."""

    def __init__(self, path: str, holder: str) -> None:
        super().__init__(f"{path} is locked by {holder}")
        self.path = path
        self.holder = holder


# (weak: a path's lock lives while a FileLock of it does, not for the process's life)
_THREAD_LOCKS: weakref.WeakValueDictionary[str, threading.Lock] = weakref.WeakValueDictionary()
_THREAD_LOCKS_GUARD = threading.Lock()


def _thread_lock(path: str) -> threading.Lock:
    """The lock the threads of this process take before ``path``'s record lock."""
    with _THREAD_LOCKS_GUARD:
        key = os.path.abspath(path)
        lock = _THREAD_LOCKS.get(key)
        if lock is None:
            lock = _THREAD_LOCKS[key] = threading.Lock()
        return lock


class FileLock:
    """An exclusive lock on the file ``path`` (made if missing): ``acquire(timeout_s)`` waits up to
    ``timeout_s`` (0: try once) and raises :class:`LockHeld` naming the holder; ``release()`` unlocks.
    A context manager (acquire with the timeout given to the constructor)."""

    def __init__(self, path: str, *, timeout_s: float = 0.0, poll_s: float = 0.05) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self._fd: int | None = None
        self._thread = _thread_lock(path)

    def acquire(self, timeout_s: float | None = None) -> None:
        limit = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        got = self._thread.acquire(timeout=limit) if limit > 0 else self._thread.acquire(blocking=False)
        if not got:
            raise LockHeld(self.path, f"another thread of this process (pid {os.getpid()})")
        try:
            self._lock_file(deadline)
        except BaseException:
            self._thread.release()
            raise

    def _lock_file(self, deadline: float) -> None:
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            except FileNotFoundError:  # its folder is not there (yet, or any more: a holder tidied it)
                os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
                continue
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno not in (errno.EACCES, errno.EAGAIN):
                    raise
                if time.monotonic() >= deadline:
                    raise LockHeld(self.path, self.holder()) from None
                time.sleep(self.poll_s)
                continue
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # removed (and maybe made again) while we waited: lock the file that is there now
                os.close(fd)
                continue
            stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            info = f"pid {os.getpid()} on {socket.gethostname()} since {stamp}".encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, info, 0)
            self._fd = fd
            return

    def holder(self) -> str:
        """Who holds the lock, as its file says (or "another process")."""
        try:
            with open(self.path, encoding="utf-8", errors="replace") as f:
                return f.read(200).strip() or "another process"
        except OSError:
            return "another process"

    def release(self, *, remove: bool = False) -> None:
        """Unlock (``remove``: delete the file first, while still held)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if remove:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        try:
            fcntl.lockf(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
            self._thread.release()

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


__all__ = ["FileLock", "LockHeld"]
