"""Loader telemetry in and between processes: :class:`SharedCounters`, one shared-memory block of a
:mod:`fastload.core.telemetry` vector per dataset that every DataLoader worker adds into (a lock per
flush, about once per read task or batch), and :class:`Tally`, a process's own counts between flushes.

The hot path stays per task and per batch: a stage is timed with two ``time.perf_counter_ns()`` calls and
added to a local dict of the cells touched; of the per-sample steps (decode, ``map=``) one sample in 8 is
timed (``reading.SAMPLE_EVERY``). A tally adds what it holds into its block when flushed and starts again
from zero.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.context import get_spawning_popen
from typing import Any

from fastload.core import telemetry as core
from fastload.s3 import runtime

clock_ns = time.perf_counter_ns
TUNED = ("prefetch_bytes", "concurrency", "task_bytes", "max_concurrency")
_MAXED = frozenset(core.counter_cell(name) for name in core.MAXED)


class SharedCounters:
    """One telemetry vector in shared memory, summed over every process that flushes into it (the
    training process and the DataLoader workers, persistent or not, forked or spawned)."""

    def __init__(self) -> None:
        spawn = multiprocessing.get_context("spawn")
        self.cells = spawn.RawArray(ctypes.c_int64, core.SIZE)
        self.lock = spawn.Lock()
        self.active = spawn.RawValue(ctypes.c_bool, True)  # off: no stage timing (benchmarks/telemetry.py)
        # a tuned loader's settings for its workers (TUNED; zeros: not tuned), see fastload.train.autotune
        self.tuned = spawn.RawArray(ctypes.c_int64, len(TUNED))

    @property
    def on(self) -> bool:
        return bool(self.active.value)

    def __getstate__(self) -> dict[str, Any]:
        if get_spawning_popen() is None:  # plain pickling (a copy kept, sent to Ray): a block of its own
            return {"detached": True}
        return self.__dict__  # to a spawned DataLoader worker: the same block

    def __setstate__(self, state: dict[str, Any]) -> None:
        if state.get("detached"):
            self.__init__()  # type: ignore[misc]
        else:
            self.__dict__.update(state)

    def add(self, cells: Mapping[int, int]) -> None:
        """Add ``{cell: value}`` (a :meth:`Tally.take`): only the cells a tally touched."""
        if not cells:
            return
        into = self.cells
        with self.lock:
            for i, v in cells.items():
                into[i] = max(into[i], v) if i in _MAXED else into[i] + v

    def vector(self) -> list[int]:
        with self.lock:
            return list(self.cells)

    def tuning(self) -> tuple[int, ...] | None:
        """The tuned settings the workers read between read tasks, in ``TUNED`` order (None: not tuned).
        (Each cell is one aligned 8-byte word, written whole: no lock.)"""
        values = tuple(self.tuned)
        return values if values[1] else None


class Tally:
    """A process's counts since its last :meth:`flush` (thread-safe: prefetch threads add fetches).

    ``s3=True`` also takes this process's S3 counters (:meth:`~fastload.s3.stats.S3Stats.delta`) at each
    flush: for a torch DataLoader's workers, whose S3 counters nothing else sends to the training process.
    ``cache``: a shard cache whose hits and fills (misses) since the last flush are added."""

    def __init__(self, into: SharedCounters | None = None, *, s3: bool = False, cache: Any = None) -> None:
        self.into = into
        self.s3 = s3
        self.cache = cache
        self._cache_seen = (0, 0) if cache is None else (cache.hits, cache.fills)
        self._lock = threading.Lock()
        self.cells: dict[int, int] = {}  # only the cells touched since the last take

    def stage(self, name: str, ns: int, items: int = 1) -> None:
        i = core.stage_cell(name)
        with self._lock:
            cells = self.cells
            cells[i] = cells.get(i, 0) + 1
            cells[i + 1] = cells.get(i + 1, 0) + items
            cells[i + 2] = cells.get(i + 2, 0) + ns

    def count(self, name: str, n: int = 1) -> None:
        i = core.counter_cell(name)
        with self._lock:
            if i in _MAXED:
                self.cells[i] = max(self.cells.get(i, 0), n)
            else:
                self.cells[i] = self.cells.get(i, 0) + n

    def observe(self, sketch: str, ns: int) -> None:
        i = core.sketch_base(sketch) + core.bucket(ns)
        with self._lock:
            self.cells[i] = self.cells.get(i, 0) + 1

    def s3_delta(self, delta: dict[str, Any] | None) -> None:
        """Add one :meth:`~fastload.s3.stats.S3Stats.delta` (requests, bytes, retries, throttles,
        failures, hedges sent and first-byte latencies)."""
        if not delta:
            return
        self.count("s3_requests", delta["requests"])
        self.count("s3_bytes", delta["bytes"])
        self.count("s3_retries", sum(delta["retries"].values()))
        self.count("s3_throttles", delta["throttles"])
        self.count("s3_failures", delta["failures"])
        self.count("s3_hedges", delta["hedges"].get("sent", 0))
        for seconds in delta["latencies"]:
            self.observe("first_byte_ns", int(seconds * 1e9))

    def take(self) -> dict[int, int]:
        """What was counted since the last take (S3 and cache counters included) as ``{cell: value}``,
        zeroed here."""
        if self.s3:
            self.s3_delta(runtime.current().stats.delta())
        cache = self.cache
        if cache is not None:
            hits, fills = cache.hits, cache.fills
            if (hits, fills) != self._cache_seen:
                self.count("cache_hits", hits - self._cache_seen[0])
                self.count("cache_misses", fills - self._cache_seen[1])
                self._cache_seen = (hits, fills)
        with self._lock:
            cells, self.cells = self.cells, {}
        return cells

    def peek(self) -> list[int]:
        """A copy of what is counted, as a whole vector (a tally never flushed: the loop's own)."""
        out = core.zeros()
        with self._lock:
            for i, v in self.cells.items():
                out[i] = v
        return out

    def flush(self) -> None:
        if self.into is not None:
            self.into.add(self.take())


def timed_fetch(fetch: Callable[[Any, threading.Event], Any], tally: Tally) -> Callable[..., Any]:
    """``fetch(task, stop)`` that adds its time and the task's bytes to ``tally`` (stage ``fetch``, the
    ``fetch_ns`` sketch, the largest task)."""

    def timed(task: Any, stop: threading.Event) -> Any:
        started = clock_ns()
        out = fetch(task, stop)
        ns = clock_ns() - started
        tally.stage("fetch", ns, task.nbytes)
        tally.observe("fetch_ns", ns)
        tally.count("largest_task_bytes", task.nbytes)
        return out

    return timed


def report(vector: Sequence[int], **extra: Any) -> dict[str, Any]:
    """:func:`fastload.core.telemetry.summary` of ``vector`` with ``extra`` keys added."""
    out = core.summary(vector)
    out.update(extra)
    return out


class TelemetryMethods:
    """``report()`` and ``telemetry_vector()`` of a dataset whose processes flush into ``_telemetry``."""

    _telemetry: SharedCounters

    def set_telemetry(self, on: bool) -> None:
        """Turn the stage timing of every process reading this dataset on (the default) or off: what
        ``benchmarks/telemetry.py`` uses to measure its cost; the loop's wait and step are always timed."""
        self._telemetry.active.value = on

    def report(self) -> dict[str, Any]:
        """Per-stage telemetry of every process that read this dataset (DataLoader workers included): time
        and counts of planning, fetch, parse, decode, ``map=`` (and, read by ``fastload.DataLoader``,
        collate and the shared-memory hand-over), cache hits and misses, and the S3 requests of a torch
        DataLoader's workers; see :func:`fastload.core.telemetry.summary`."""
        return report(self.telemetry_vector())

    def telemetry_vector(self) -> list[int]:
        """The raw counters behind :meth:`report` (a :mod:`fastload.core.telemetry` vector)."""
        return self._telemetry.vector()
