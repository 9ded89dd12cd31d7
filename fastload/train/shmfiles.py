"""Shared-memory slot files in /dev/shm (for :mod:`fastload.train.shmbatch`): made with their pages
reserved, owned through an ``flock`` their owner holds while it lives, and swept when left by a process
that is gone, in a way that holds across PID namespaces sharing /dev/shm (a process id in a name says
nothing there: the lock does)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import mmap
import os
import time
from collections.abc import Callable

SHM_DIR = "/dev/shm"
PREFIX = "fastload"
STALE_SECONDS = 60.0  # an unlocked slot file older than this is left from a process that is gone
_counter = itertools.count()


def shm_free_bytes() -> int:
    """Bytes free in :data:`SHM_DIR` (0 if it cannot be read)."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


def create_slot(pid: int, token: str, size: int) -> tuple[str, mmap.mmap, int] | None:
    """A new slot file ``fastload-<pid>-<token>-<n>`` of ``size`` bytes, its tmpfs pages reserved, mapped and
    locked (the returned descriptor holds the lock: keep it open while the owner lives); None if it does
    not fit (or there is no /dev/shm)."""
    path = os.path.join(SHM_DIR, f"{PREFIX}-{pid}-{token}-{next(_counter)}")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.posix_fallocate(fd, 0, size)  # ENOSPC now rather than SIGBUS when a page is first written
        mm = mmap.mmap(fd, size)
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        return None
    return path, mm, fd


def owner(name: str) -> str:
    """``"<pid>-<token>"`` of a slot file name ``fastload-<pid>-<token>-<n>``."""
    return "-".join(name.split("-")[1:3])


def unlink_matching(match: Callable[[str], bool]) -> None:
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return
    for name in names:
        if name.startswith(PREFIX + "-") and match(name):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(SHM_DIR, name))


def unheld(path: str, *, older_than: float) -> bool:
    """Whether nobody holds the slot file at ``path`` (its owner holds an flock while it lives) and it was
    last changed over ``older_than`` seconds ago."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        if time.time() - os.fstat(fd).st_mtime < older_than:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False
            raise
        return True
    finally:
        os.close(fd)


def sweep_stale(*, older_than: float = STALE_SECONDS) -> None:
    """Remove slot files left by processes that are gone (a training job that was killed): files nobody
    holds a lock on, older than ``older_than`` seconds. Holds across PID namespaces sharing /dev/shm, where
    a process id in a name may be another process's."""
    unlink_matching(lambda name: unheld(os.path.join(SHM_DIR, name), older_than=older_than))


def _gone(pid: int) -> bool:
    """Whether process ``pid`` (a child of this one) has ended: no such process, or a zombie not yet reaped
    (torch's SIGCHLD handler reports a killed worker before anything waits for it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


def remove_dead(pids: set[int]) -> set[int]:
    """Remove the slot files of processes ``pids`` (this process's own children, so their pids mean the
    same here) that are gone and whose files nobody holds: a killed worker's unsent slots. Returns the
    pids found gone."""
    dead = {pid for pid in list(pids) if _gone(pid)}

    def theirs(name: str) -> bool:
        part = name.split("-")[1:2]
        pid = int(part[0]) if part and part[0].isdigit() else -1
        return pid in dead and unheld(os.path.join(SHM_DIR, name), older_than=0)

    unlink_matching(theirs)
    return dead
