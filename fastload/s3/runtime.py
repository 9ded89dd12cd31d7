"""This process's S3 state, in one object: sessions, clients and direct transports per ``S3Config``,
concurrency gates per limit, the pool of part buffers, the latency model and open hedged races
(``hedging``), and the counters ``fastload.s3_stats()`` reports.

Lifetime: :func:`current` creates the runtime on first use in a process. A forked child (a DataLoader
worker) never uses its parent's: it gets a fresh runtime on first use, with no clients, connections, gates,
buffers or counters from the parent (a reader opened in the parent re-attaches after the fork). The caches
are bounded: past ``max_configs`` entries the least recently used one is closed and dropped (a reader still
holding it keeps working; a closed client or transport reconnects on demand). :meth:`S3Runtime.close` closes
every client and idle connection (run at exit); :func:`reset` closes the current runtime and starts a fresh
one, so tests can isolate themselves without touching private state.

What goes into the caches is built by the modules that own it (:func:`fastload.s3.client.get_client`,
:func:`fastload.s3.transport.direct_transport`); this module imports neither, so it sits below both.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

from fastload.s3.gate import ConcurrencyGate
from fastload.s3.hedging import Hedger
from fastload.s3.partbuffers import BufferPool
from fastload.s3.stats import S3Stats

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
MAX_CONFIGS = 16


class KeyedCache(Generic[K, V]):
    """Objects by key, built on first use, at most ``max_entries`` of them: the least recently used one is
    dropped (and given to ``close``) to make room. Thread-safe; a value is built at most once per key."""

    def __init__(self, max_entries: int, *, close: Callable[[V], None] | None = None) -> None:
        if max_entries < 1:
            raise ValueError(f"{max_entries=} must be >= 1")
        self.max_entries = max_entries
        self._close = close
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K, make: Callable[[], V]) -> V:
        """The value for ``key``, built with ``make()`` if absent."""
        evicted: list[V] = []
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
                return value
            value = self._entries[key] = make()
            while len(self._entries) > self.max_entries:
                evicted.append(self._entries.popitem(last=False)[1])
        for old in evicted:  # closed outside the lock: closing may block on the network
            self._closed(old)
        return value

    def peek(self, key: K) -> V | None:
        """The value for ``key`` if present (not built, not counted as a use)."""
        with self._lock:
            return self._entries.get(key)

    def discard(self, key: K) -> None:
        """Close and drop the value for ``key``, if any."""
        with self._lock:
            value = self._entries.pop(key, None)
        if value is not None:
            self._closed(value)

    def clear(self) -> None:
        """Close and drop every value."""
        with self._lock:
            values = list(self._entries.values())
            self._entries.clear()
        for value in values:
            self._closed(value)

    def keys(self) -> list[K]:
        with self._lock:
            return list(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def _closed(self, value: V) -> None:
        if self._close is not None:
            self._close(value)


def _close(value: Any) -> None:
    value.close()


class S3Runtime:
    """One process's S3 state (see the module docstring). ``pid`` is the process it belongs to."""

    def __init__(self, *, max_configs: int = MAX_CONFIGS) -> None:
        self.pid = os.getpid()
        self.stats = S3Stats()
        self.buffers = BufferPool()
        self.hedging = Hedger(self.stats)
        self.sessions: KeyedCache[Hashable, Any] = KeyedCache(max_configs)
        self.clients: KeyedCache[Hashable, Any] = KeyedCache(max_configs, close=_close)
        self.transports: KeyedCache[Hashable, Any] = KeyedCache(max_configs, close=_close)
        # a gate in use is never closed; one evicted while readers hold it only stops being shared
        self.gates: KeyedCache[int, ConcurrencyGate] = KeyedCache(max_configs)
        # endpoints (``client.endpoint_key``) that answered a request: a refused connection to one of these
        # is retried in full; to any other it fails within seconds (``core.retry.RetryPolicy``). A forked
        # child starts with its parent's (a worker's first request may meet a restart the parent would ride)
        self.answered: set[str] = set()

    def gate(self, max_limit: int) -> ConcurrencyGate:
        """The gate shared by every request of this process whose config allows ``max_limit`` in flight."""
        return self.gates.get(max_limit, lambda: ConcurrencyGate(max_limit, stats=self.stats))

    def forget(self, config: Hashable) -> None:
        """Close and drop the client and transport of ``config`` (say, after its credentials changed)."""
        self.transports.discard(config)
        self.clients.discard(config)
        self.sessions.discard(config)

    def close(self) -> None:
        """Close every idle connection and client and free the idle buffers; the runtime stays usable (what
        is needed is rebuilt on use). Gates and counters stay: readers may still hold them."""
        self.transports.clear()
        self.clients.clear()
        self.buffers.clear()


_current: S3Runtime | None = None
_inherited: S3Runtime | None = None  # the parent's, in a forked child: kept (unused) rather than freed
_lock = threading.Lock()


def current() -> S3Runtime:
    """This process's runtime (created on first use; a new one in a forked child)."""
    runtime = _current
    if runtime is not None and runtime.pid == os.getpid():
        return runtime
    return _start(replace=False)


def reset() -> S3Runtime:
    """Close this process's runtime and start a fresh one (zeroed counters, no clients): for tests."""
    return _start(replace=True)


def _start(*, replace: bool) -> S3Runtime:
    global _current
    with _lock:
        old = _current if _current is not None and _current.pid == os.getpid() else None
        if old is not None and not replace:
            return old
        _current = S3Runtime()
        runtime = _current
        if old is None and not replace and _inherited is not None:
            runtime.answered |= _inherited.answered
    if old is not None:
        old.close()
    return runtime


def _after_fork_in_child() -> None:
    """The parent's runtime is not the child's (its lock may even have been held by a parent thread)."""
    global _current, _inherited, _lock
    _lock = threading.Lock()
    _inherited, _current = _current, None


def _close_at_exit() -> None:
    """Close pooled connections and clients at exit (instead of leaving them to the garbage collector)."""
    runtime = _current
    if runtime is not None and runtime.pid == os.getpid():
        runtime.close()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_close_at_exit)
