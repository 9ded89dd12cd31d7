"""Local staging folders of packs to S3: ``$TMPDIR/fastload-pack-*`` (and ``fastload-ray-*`` of Ray tasks),
where shards are written whole before their upload (up to workers x shard size at a time).

A pack holds an ``flock`` on its folder's ``.lock`` for as long as it runs, and removes the folder when it
ends. A pack killed (SIGKILL, the OOM killer, a lost node) cannot; the kernel drops its lock, and the next
pack on the machine (``--resume`` or any other) deletes every staging folder nobody holds. Folders without a
lock file (made by an older fastload) are deleted once nothing in them has changed for an hour.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time

PREFIXES = ("fastload-pack-", "fastload-ray-")
LOCK = ".lock"
UNLOCKED_AGE_S = 3600.0


class StagingFolder:
    """A new staging folder under ``root`` (default: the temporary folder), held until :meth:`close`."""

    def __init__(self, prefix: str = "fastload-pack-", *, root: str | None = None) -> None:
        self.path = tempfile.mkdtemp(prefix=prefix, dir=root)
        self._pid = os.getpid()
        self._fd = os.open(os.path.join(self.path, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def close(self) -> None:
        """Remove the folder and let go of it (only in the process that made it)."""
        if self._pid != os.getpid():
            return
        shutil.rmtree(self.path, ignore_errors=True)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def sweep_stale(root: str | None = None, *, now: float | None = None) -> list[str]:
    """Delete the staging folders under ``root`` (default: the temporary folder) that no live pack holds;
    return their paths."""
    root = root if root is not None else tempfile.gettempdir()
    now = time.time() if now is None else now
    removed = []
    try:
        entries = [e for e in os.scandir(root) if e.name.startswith(PREFIXES)]
    except OSError:
        return []
    for entry in entries:
        with contextlib.suppress(OSError):
            if not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != os.geteuid():
                continue
            if _stale(entry.path, now):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
    return removed


def _stale(path: str, now: float) -> bool:
    try:
        fd = os.open(os.path.join(path, LOCK), os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:  # an older fastload's (or one made this instant: the age rule spares it)
        return now - _newest_mtime(path) > UNLOCKED_AGE_S
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # a live pack's
    finally:
        os.close(fd)  # (a lock taken here goes with it: the folder is deleted next)
    return True


def _newest_mtime(path: str) -> float:
    newest = os.stat(path).st_mtime
    with os.scandir(path) as it:
        for e in it:
            with contextlib.suppress(OSError):
                newest = max(newest, e.stat(follow_symlinks=False).st_mtime)
    return newest
