"""``fastload.storage.locks.FileLock`` between threads of one process: POSIX record locks belong to the
process, so without the per-file thread lock two threads would both "hold" it (two ShardWriters appending
from threads lost an update so)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from fastload.storage.locks import FileLock, LockHeld


def test_a_second_thread_waits_for_the_holder_and_is_told_who(tmp_path: Path) -> None:
    path = str(tmp_path / "index.lock")
    first = FileLock(path)
    first.acquire()
    got: list[str] = []

    def other() -> None:
        with pytest.raises(LockHeld, match=f"another thread of this process \\(pid {os.getpid()}\\)"):
            FileLock(path).acquire(0)
        waiter = FileLock(path, timeout_s=10)
        waiter.acquire()
        got.append("locked")
        waiter.release()

    t = threading.Thread(target=other)
    t.start()
    time.sleep(0.3)
    assert got == []  # still waiting: the first holds it
    first.release(remove=True)
    t.join(timeout=10)
    assert got == ["locked"]


def test_threads_take_turns(tmp_path: Path) -> None:
    path = str(tmp_path / "index.lock")
    inside: list[int] = []
    overlaps: list[int] = []

    def work(j: int) -> None:
        for _ in range(20):
            lock = FileLock(path, timeout_s=30)
            lock.acquire()
            inside.append(j)
            if len(inside) > 1:
                overlaps.append(j)
            time.sleep(0.001)
            inside.remove(j)
            lock.release(remove=j % 2 == 0)

    threads = [threading.Thread(target=work, args=(j,)) for j in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert overlaps == []


def test_a_paths_thread_lock_lives_as_long_as_its_file_locks(tmp_path: Path) -> None:
    """Threads of one process share a path's lock while FileLocks of it exist; once none does, it is gone
    (a long-lived process locking many paths keeps none of them)."""
    import gc

    from fastload.storage import locks

    path = str(tmp_path / "gone.lock")
    first, second = FileLock(path), FileLock(path)
    assert first._thread is second._thread
    key = os.path.abspath(path)
    assert key in locks._THREAD_LOCKS
    del first, second
    gc.collect()
    assert key not in locks._THREAD_LOCKS
