"""The ordered parallel map of ``fastload.optimize``: chunks of inputs in, each chunk's outcomes out in input
order, the user's function run in worker processes (or Ray tasks, or this process).

A :class:`Task` (the function and the sample encoder) runs one chunk (:meth:`Task.run`): for each input the
function's samples (a dict, an iterable of dicts, or None), each encoded where it was made, or the failure
(input number, a short repr, the error and its traceback as text: an exception need not pickle), so the
parent only hands bytes to the shard writer. :func:`ordered_map` runs the chunks:

- ``workers == 1``: in this process, one chunk at a time (no pickling; a debugger works);
- processes: a :class:`~concurrent.futures.ProcessPoolExecutor` of ``workers`` processes, forked when this
  process runs no other Python thread (the function needs no pickling, a lambda or a function of
  ``__main__`` works) and spawned otherwise (the function is pickled by value with cloudpickle);
- Ray: one task per chunk (:mod:`fastload.packing.ray_engine`'s connection; the function put once).

At most ``in_flight`` chunks are submitted and not yet consumed (default ``2 * workers``), so memory is
bounded by ``in_flight`` chunks' encoded samples whatever the inputs' number; results are taken in
submission order, so the output does not depend on how many workers there are or which finishes first.
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import pickle
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

from fastload.errors import ConfigError, PackError

ENGINES = ("process", "ray")
MAX_SHOWN = 120  # characters of an input's repr in messages and reports


@dataclass(frozen=True)
class Failure:
    """The function raised on input ``number`` (``shown``: a short repr of it)."""

    number: int
    shown: str
    error: str
    traceback: str = ""


@dataclass
class Outcome:
    """One input's encoded samples, in the order the function gave them, or its failure."""

    samples: list[Any] = field(default_factory=list)
    failure: Failure | None = None


@dataclass
class ChunkResult:
    """The outcomes of the inputs numbered ``first``, ``first + 1``, ... of one chunk."""

    first: int
    outcomes: list[Outcome]


@dataclass(frozen=True)
class Task:
    """What a worker runs per input: ``fn(input)`` -> samples -> ``encode(sample)`` each."""

    fn: Callable[[Any], Any]
    encode: Callable[[Any], Any]

    def run(self, first: int, inputs: list[Any]) -> ChunkResult:
        return ChunkResult(first, [self.one(first + i, item) for i, item in enumerate(inputs)])

    def one(self, number: int, item: Any) -> Outcome:
        try:
            made = self.fn(item)
            if made is None:
                return Outcome()
            if isinstance(made, Mapping):
                return Outcome([self.encode(made)])
            if isinstance(made, (str, bytes)) or not isinstance(made, Iterable):
                raise TypeError(
                    f"the function returned {type(made).__name__}: return a sample dict, an iterable of "
                    "them, or None"
                )
            return Outcome([self.encode(sample) for sample in made])
        except Exception as exc:
            return Outcome(failure=failure_of(number, item, exc))


def failure_of(number: int, item: Any, exc: BaseException) -> Failure:
    """The failure of input ``number`` with exception ``exc`` (its traceback text kept)."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return Failure(number, short_repr(item), f"{type(exc).__name__}: {exc}", tb)


def short_repr(item: Any) -> str:
    """``repr(item)``, cut to :data:`MAX_SHOWN` characters."""
    try:
        shown = repr(item)
    except Exception as exc:
        shown = f"<{type(item).__name__}: repr failed: {exc}>"
    return shown if len(shown) <= MAX_SHOWN else shown[: MAX_SHOWN - 3] + "..."


def chunks_of(inputs: Iterable[Any], size: int, *, first: int = 0) -> Iterator[tuple[int, list[Any]]]:
    """``(number of the first input, inputs)`` of up to ``size`` consecutive inputs, numbered from
    ``first``; an iterable is taken ``size`` items at a time, never whole."""
    chunk: list[Any] = []
    start = first
    for item in inputs:
        chunk.append(item)
        if len(chunk) >= size:
            yield start, chunk
            start += len(chunk)
            chunk = []
    if chunk:
        yield start, chunk


# -- worker processes -------------------------------------------------------------------------------------

_TASK: Task | None = None  # the task of this worker process (set by _init_worker)


def _init_worker(task: Task | bytes) -> None:
    global _TASK
    _TASK = pickle.loads(task) if isinstance(task, bytes) else task


def _run_chunk(first: int, inputs: list[Any]) -> ChunkResult:
    if _TASK is None:
        raise RuntimeError("fastload.optimize worker started without its task")
    return _TASK.run(first, inputs)


def start_method(requested: str | None = None) -> str:
    """The process start method: ``requested``, else ``fork`` where the platform has it and this process
    runs no other Python thread (forking a process whose other threads may hold locks can deadlock the
    child), else ``spawn``."""
    if requested is not None:
        if requested not in multiprocessing.get_all_start_methods():
            raise ConfigError(
                f"start_method={requested!r} is not available here; choose one of "
                f"{', '.join(multiprocessing.get_all_start_methods())}"
            )
        return requested
    if "fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1:
        return "fork"
    return "spawn"


def pickled_task(task: Task) -> bytes:
    """``task`` pickled by value (cloudpickle: lambdas, closures and functions of ``__main__`` travel), or a
    :class:`ConfigError` saying what could not be pickled and what to do."""
    try:
        import cloudpickle
    except ImportError:
        dumps: Callable[[Any], bytes] = pickle.dumps
    else:
        dumps = cloudpickle.dumps
    try:
        return dumps(task)
    except Exception as exc:
        raise ConfigError(
            f"the function {getattr(task.fn, '__qualname__', task.fn)!r} cannot be sent to worker "
            f"processes: {type(exc).__name__}: {exc}. Define it at the top level of a module (not inside "
            "another function holding locks, files or connections), pass workers=1 to run it in this "
            "process, or start_method='fork' on Linux"
        ) from exc


class ChunkMap:
    """The map of one run (see the module docstring): :meth:`open` starts the worker processes (all of them,
    before the caller starts threads of its own: forking is safe only then; a function that cannot be
    pickled for spawned workers is refused here, before anything is written) or connects to Ray;
    :meth:`map` runs chunks; :meth:`close` (or the ``with`` block's end) stops the workers."""

    def __init__(
        self,
        task: Task,
        *,
        workers: int,
        engine: str = "process",
        in_flight: int | None = None,
        start: str | None = None,
        ray_address: str | None = None,
    ) -> None:
        if engine not in ENGINES:
            raise ConfigError(f"engine={engine!r}; choose one of {', '.join(ENGINES)}")
        self.task = task
        self.workers = workers
        self.engine = engine
        self.in_flight = in_flight if in_flight is not None else 2 * workers
        self._start = start
        self._ray_address = ray_address
        self._pool: ProcessPoolExecutor | None = None
        self._ray: Any = None
        self._ray_exit: contextlib.ExitStack | None = None
        self._ray_task: Any = None
        self._ray_fn: Any = None

    def open(self) -> ChunkMap:
        if self.engine == "ray":
            from fastload.packing.ray_engine import connected

            pickled = pickled_task(self.task)  # (refused here, before Ray starts, if it cannot be)
            self._ray_exit = contextlib.ExitStack()
            self._ray = self._ray_exit.enter_context(connected(self._ray_address))
            self._ray_fn = self._ray.remote(max_retries=3)(_ray_chunk)
            self._ray_task = self._ray.put(pickled)
        elif self.workers > 1:
            method = start_method(self._start)
            shipped: Task | bytes = self.task if method == "fork" else pickled_task(self.task)
            context = multiprocessing.get_context(method)
            self._pool = ProcessPoolExecutor(
                self.workers, mp_context=context, initializer=_init_worker, initargs=(shipped,)
            )
            try:
                self._pool.submit(int).result()  # every process started now (all at once when forked)
            except BrokenProcessPool as exc:
                self.close()
                raise PackError(
                    f"the worker processes could not start ({exc}); if they were spawned, the script that "
                    "calls fastload.optimize must guard it with `if __name__ == '__main__':`"
                ) from exc
        return self

    def __enter__(self) -> ChunkMap:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._ray_exit is not None:
            self._ray_exit.close()
            self._ray_exit = None

    def map(self, chunks: Iterable[tuple[int, list[Any]]]) -> Iterator[ChunkResult]:
        """Each chunk's :class:`ChunkResult`, in the order of ``chunks``."""
        if self._ray is not None:
            yield from self._ray_map(chunks)
        elif self._pool is not None:
            yield from self._process_map(self._pool, chunks)
        else:
            for first, inputs in chunks:
                yield self.task.run(first, inputs)

    def _process_map(
        self, pool: ProcessPoolExecutor, chunks: Iterable[tuple[int, list[Any]]]
    ) -> Iterator[ChunkResult]:
        pending: collections.deque[tuple[int, Future[ChunkResult]]] = collections.deque()
        try:
            for first, inputs in chunks:
                while len(pending) >= self.in_flight:
                    yield _result(*pending.popleft())
                try:
                    pending.append((first, pool.submit(_run_chunk, first, inputs)))
                except BrokenProcessPool as exc:
                    raise _died(first, exc) from exc
            while pending:
                yield _result(*pending.popleft())
        finally:
            for _, fut in pending:
                fut.cancel()

    def _ray_map(self, chunks: Iterable[tuple[int, list[Any]]]) -> Iterator[ChunkResult]:
        ray = self._ray
        pending: collections.deque[tuple[int, Any]] = collections.deque()
        try:
            for first, inputs in chunks:
                while len(pending) >= self.in_flight:
                    yield self._ray_result(*pending.popleft())
                pending.append((first, self._ray_fn.remote(self._ray_task, first, inputs)))
            while pending:
                yield self._ray_result(*pending.popleft())
        finally:
            for _, left in pending:
                ray.cancel(left)

    def _ray_result(self, first: int, ref: Any) -> ChunkResult:
        """The chunk's result; a task that failed outside the function (its worker could not unpickle the
        function or the inputs, or died past its retries) as a :class:`PackError` naming the chunk."""
        try:
            return self._ray.get(ref)  # type: ignore[no-any-return]
        except self._ray.exceptions.RayError as exc:
            cause = getattr(exc, "cause", None) or exc
            lines = str(cause).strip().splitlines() or [""]
            raise PackError(
                f"the Ray task running the function on the inputs from #{first} failed "
                f"({type(cause).__name__}: {lines[-1]}); a function from a module the Ray workers cannot "
                "import must be defined in the calling script or shipped with runtime_env (working_dir, "
                "py_modules). The shards finished so far are journaled: run again with resume=True"
            ) from exc


def ordered_map(
    task: Task, chunks: Iterable[tuple[int, list[Any]]], *, workers: int, **options: Any
) -> Iterator[ChunkResult]:
    """:meth:`ChunkMap.map` of a map opened for these ``chunks`` alone, closed at the end."""
    with ChunkMap(task, workers=workers, **options) as chunk_map:
        yield from chunk_map.map(chunks)


def _result(first: int, fut: Future[ChunkResult]) -> ChunkResult:
    try:
        return fut.result()
    except BrokenProcessPool as exc:
        raise _died(first, exc) from exc
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise PackError(
            f"the inputs from #{first} or their samples could not be passed between processes "
            f"({type(exc).__name__}: {exc}); inputs must pickle (paths, URLs, rows of plain values), or "
            "pass workers=1"
        ) from exc


def _died(first: int, exc: BaseException) -> PackError:
    return PackError(
        f"a worker process died while running the function on the chunk of inputs from #{first} ({exc}); "
        "it was killed (out of memory? a signal?) or crashed in native code. The shards finished so far "
        "are journaled: run again with resume=True (--resume), with fewer workers or smaller chunks if "
        "memory ran out"
    )


def _ray_chunk(task: bytes, first: int, inputs: list[Any]) -> ChunkResult:
    return pickle.loads(task).run(first, inputs)  # type: ignore[no-any-return]


__all__ = ["ChunkMap", "ChunkResult", "Failure", "Outcome", "Task", "chunks_of", "ordered_map", "short_repr"]
