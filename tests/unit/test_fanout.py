"""``packing.fanout``: the ordered chunked map of ``fastload.optimize`` (in order, bounded, failures as
values, clear errors for what cannot run in a worker)."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from fastload.errors import ConfigError, PackError
from fastload.packing.fanout import Task, chunks_of, ordered_map


def identity(x: Any) -> Any:
    return x


def fan(n: int) -> Any:
    """No samples for multiples of 3, else ``n % 4`` samples."""
    if n % 3 == 0:
        return None
    return ({"__key__": f"{n}-{i}"} for i in range(n % 4))


def flatten(results: Iterator[Any]) -> list[Any]:
    return [s for r in results for o in r.outcomes for s in o.samples]


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_results_come_in_input_order_whatever_the_workers(workers: int) -> None:
    task = Task(fan, identity)
    got = flatten(ordered_map(task, chunks_of(range(40), 3), workers=workers))
    want = [{"__key__": f"{n}-{i}"} for n in range(40) if n % 3 for i in range(n % 4)]
    assert got == want


def test_a_lambda_runs_in_forked_and_spawned_workers() -> None:
    k = 5
    task = Task(lambda x: {"v": x * k}, identity)
    for start in ("fork", "spawn"):
        got = flatten(ordered_map(task, chunks_of(range(6), 2), workers=2, start=start))
        assert got == [{"v": 5 * x} for x in range(6)]


def test_a_failure_names_the_input_and_keeps_the_traceback() -> None:
    def bad(x: int) -> dict[str, int]:
        if x == 4:
            raise ValueError("no four")
        return {"v": x}

    results = list(ordered_map(Task(bad, identity), chunks_of(range(6), 4), workers=2, start="fork"))
    failures = [o.failure for r in results for o in r.outcomes if o.failure]
    assert len(failures) == 1
    f = failures[0]
    assert (f.number, f.shown, f.error) == (4, "4", "ValueError: no four")
    assert "in bad" in f.traceback


def test_a_bad_return_value_is_a_failure() -> None:
    results = list(ordered_map(Task(lambda x: "text", identity), chunks_of([1], 1), workers=1))
    failure = results[0].outcomes[0].failure
    assert failure is not None and "return a sample dict" in failure.error


def test_a_function_that_cannot_be_pickled_is_refused_clearly() -> None:
    lock = threading.Lock()
    task = Task(lambda x: {"locked": lock.locked()}, identity)
    with pytest.raises(ConfigError, match=r"cannot be sent to worker processes.*workers=1"):
        list(ordered_map(task, chunks_of(range(4), 2), workers=2, start="spawn"))


def suicide(x: int) -> dict[str, int]:
    if x == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return {"v": x}


def test_a_worker_killed_is_an_error_naming_the_chunk() -> None:
    with pytest.raises(PackError, match=r"worker process died.*resume"):
        list(ordered_map(Task(suicide, identity), chunks_of(range(8), 2), workers=2, start="fork"))


def test_inputs_are_taken_a_bounded_number_of_chunks_ahead() -> None:
    taken = []

    def inputs() -> Iterator[int]:
        for i in range(1000):
            taken.append(i)
            yield i

    results = ordered_map(Task(lambda x: {"v": x}, identity), chunks_of(inputs(), 5), workers=2, start="fork")
    next(results)
    assert len(taken) <= 5 * (2 * 2 + 1) + 1  # in flight (2 per worker) + the one being taken
    results.close()
