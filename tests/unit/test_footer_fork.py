"""The Parquet footer cache's lock in a forked child (a DataLoader worker): a thread of the parent that held
it at the fork must not leave the child's cache locked for ever."""

from __future__ import annotations

import os
import threading

import pytest

from fastload.formats.parquet import footer


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_the_lock_is_made_anew_in_a_forked_child() -> None:
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with footer._lock:
            held.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert held.wait(10)
        pid = os.fork()
        if pid == 0:  # the child: the parent's holder does not exist here
            os._exit(0 if footer._lock.acquire(timeout=5) else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        thread.join()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "the child found the lock held"
