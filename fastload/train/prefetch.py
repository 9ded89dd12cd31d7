"""Ordered prefetch: run read tasks ahead of the consumer on a thread pool, bounded in bytes.

Results come back in task order whatever order the threads finish in; an error in a task is re-raised in
the consumer when it reaches that task (so it surfaces with the task it belongs to). Tasks are taken from
their iterator only as the bounds let them in (the iterator may plan them lazily, in the consumer's thread).
The pool has one owner, a stop event that running fetches can watch, and ``close()``.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

from fastload.core.readplan import ReadTask

T = TypeVar("T")


class Prefetcher(Generic[T]):
    """``fetch(task, stop)`` for each task of ``tasks`` (any iterable, read once), run ahead of iteration.

    At most ``max_bytes`` worth of tasks (by their ``nbytes``) and at most ``max_tasks`` tasks are fetched
    or fetching but not yet consumed, and always at least one. ``max_bytes=0`` fetches each task in the
    consumer's thread when it is reached (no prefetch). ``release(task)`` is called after the consumer
    is done with a task's result (before the next one is handed over).

    ``limits``: a function giving ``(max_bytes, concurrency)`` now (a tuned loader's,
    :mod:`fastload.train.autotune`), asked before tasks are let in: it replaces ``max_bytes`` and caps the
    fetches running at once at ``concurrency`` (``threads`` is then the most it may ask for). Tasks are
    fetched ahead, at least one, even at 0 bytes. Results still come back in task order.
    """

    def __init__(
        self,
        tasks: Iterable[ReadTask],
        fetch: Callable[[ReadTask, threading.Event], T],
        *,
        max_bytes: int,
        max_tasks: int = 64,
        threads: int = 8,
        release: Callable[[ReadTask], None] | None = None,
        limits: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        if max_bytes < 0 or max_tasks < 1 or threads < 1:
            raise ValueError(f"{max_bytes=} must be >= 0, {max_tasks=} and {threads=} >= 1")
        self._tasks = tasks
        self._fetch = fetch
        self._max_bytes, self._max_tasks = max_bytes, max_tasks
        self._threads = threads
        self._release = release
        self._limits = limits
        self._stop = threading.Event()
        self._pool: ThreadPoolExecutor | None = None
        self._pending: deque[tuple[ReadTask, Future[T]]] = deque()

    def __iter__(self) -> Iterator[tuple[ReadTask, T]]:
        try:
            if self._max_bytes == 0 and self._limits is None:
                for task in self._tasks:
                    yield task, self._fetch(task, self._stop)
                    self._done(task)
                return
            self._pool = ThreadPoolExecutor(max_workers=self._threads, thread_name_prefix="fastload-prefetch")
            tasks = iter(self._tasks)
            failed: list[Exception] = []  # planning the next task failed: raised after the tasks before it
            nxt = _next(tasks, failed)
            in_flight = 0
            max_bytes, running = self._max_bytes, self._running
            while nxt is not None or self._pending:
                if self._limits is not None:
                    max_bytes, concurrency = self._limits()
                    running = self._running_below(concurrency)
                while nxt is not None and (
                    not self._pending
                    or (
                        len(self._pending) < self._max_tasks
                        and in_flight + nxt.nbytes <= max_bytes
                        and running()
                    )
                ):
                    self._pending.append((nxt, self._pool.submit(self._fetch, nxt, self._stop)))
                    in_flight += nxt.nbytes
                    nxt = _next(tasks, failed)
                task, future = self._pending[0]
                result = future.result()
                self._pending.popleft()
                in_flight -= task.nbytes
                yield task, result
                del result
                self._done(task)
            if failed:
                raise failed[0]
        finally:
            self.close()

    @staticmethod
    def _running() -> bool:
        return True  # (no cap but the pool's threads)

    def _running_below(self, concurrency: int) -> Callable[[], bool]:
        """Whether fewer than ``concurrency`` of the pending fetches are still running."""
        return lambda: sum(not f.done() for _, f in self._pending) < concurrency

    def _done(self, task: ReadTask) -> None:
        if self._release is not None:
            self._release(task)

    def close(self) -> None:
        """Stop: queued tasks are cancelled, running fetches see the stop event; does not wait for them."""
        for _, future in self._pending:  # cancelled before the stop, so no freed thread starts one
            future.cancel()
        self._stop.set()
        self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _next(tasks: Iterator[ReadTask], failed: list[Exception]) -> ReadTask | None:
    """The next task, or None at the end or when getting it raised (the error kept in ``failed``)."""
    try:
        return next(tasks, None)
    except Exception as exc:
        failed.append(exc)
        return None
