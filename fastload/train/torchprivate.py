"""The only place fastload relies on names torch does not document (``tests/dataset/test_torchprivate.py``
checks each against the installed torch, so a torch upgrade that moves one fails there, by name):

- a multi-process DataLoader iterator's ``_shutdown_workers()``, to stop its workers now rather than when
  the iterator is collected (their unsent shared-memory slots are then removed at once);
- the words of torch's "DataLoader worker (pid N) is killed by signal" / "exited unexpectedly" errors,
  which are the only way it reports a worker that died.
"""

from __future__ import annotations

from typing import Any

WORKER_DEATH_WORDS = ("exited unexpectedly", "killed by signal")


def shut_down_workers(iterator: Any) -> bool:
    """Stop the worker processes of a DataLoader ``iterator`` now (False: it has none, e.g. num_workers=0)."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if not callable(shutdown):
        return False
    shutdown()
    return True


def is_worker_death(exc: BaseException) -> bool:
    """Whether ``exc`` is torch's report of a DataLoader worker that died."""
    return isinstance(exc, RuntimeError) and any(w in str(exc) for w in WORKER_DEATH_WORDS)


__all__ = ["WORKER_DEATH_WORDS", "is_worker_death", "shut_down_workers"]
