"""Local file system helpers: atomic writes and publishing by rename."""

from __future__ import annotations

import contextlib
import os
import tempfile


def fsync_dir(path: str) -> None:
    """Make a rename inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    """The process's umask, read without changing it where Linux says it (os.umask would set it, racing
    other threads that create files)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode ``open()`` gives a new file (``0o666`` less the umask): what fastload gives the files it
    makes for users, including those it creates with ``mkstemp`` (whose 0600 is meant for secrets)."""
    return 0o666 & ~_umask()


def atomic_write(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the whole new one, never a part."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(folder)


def publish(tmp: str, final: str) -> None:
    """Move a finished temporary file to its final name (same file system), creating folders."""
    folder = os.path.dirname(final)
    os.makedirs(folder, exist_ok=True)
    os.replace(tmp, final)


def write_all(fd: int, data: memoryview) -> None:
    """Write every byte of ``data`` to ``fd`` (``os.write`` may write less than asked)."""
    while data:
        data = data[os.write(fd, data) :]
