"""The ordered prefetcher: results in task order whatever order the threads finish in, outstanding work
bounded in bytes and in tasks, errors re-raised at their task, ``release`` once per task in order, and a
consumer that stops early leaves no thread behind."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from fastload.core.readplan import ReadTask
from fastload.train.prefetch import Prefetcher

PREFIX = "fastload-prefetch"


def make_tasks(sizes: list[int]) -> list[ReadTask]:
    return [ReadTask(i % 3, (i,), n) for i, n in enumerate(sizes)]


def number(task: ReadTask) -> int:
    return task.positions[0]


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(PREFIX) and t.is_alive()]


def wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


@pytest.fixture(autouse=True)
def no_leftover_threads() -> Iterator[None]:
    """Every test leaves the prefetch threads it started finished (bounded wait)."""
    yield
    assert wait_until(lambda: not prefetch_threads()), prefetch_threads()


class Tracker:
    """Fetches that sleep a random time and record what is outstanding (started, not yet consumed)."""

    def __init__(self, tasks: list[ReadTask], seed: int, max_delay_s: float = 0.004) -> None:
        self.tasks = tasks
        self.rng = random.Random(seed)
        self.delays = [self.rng.uniform(0, max_delay_s) for _ in tasks]
        self.lock = threading.Lock()
        self.outstanding: set[int] = set()
        self.snapshots: list[frozenset[int]] = []  # the outstanding set each time a fetch starts
        self.released: list[int] = []
        self.threads: set[str] = set()

    def fetch(self, task: ReadTask, stop: threading.Event) -> tuple[int, int]:
        n = number(task)
        with self.lock:
            self.outstanding.add(n)
            self.snapshots.append(frozenset(self.outstanding))
            self.threads.add(threading.current_thread().name)
        time.sleep(self.delays[n])
        return n, n * n

    def consumed(self, task: ReadTask) -> None:
        with self.lock:
            self.outstanding.discard(number(task))

    def release(self, task: ReadTask) -> None:
        self.released.append(number(task))

    def nbytes(self, snapshot: frozenset[int]) -> int:
        return sum(self.tasks[n].nbytes for n in snapshot)


@pytest.mark.parametrize("seed", range(4))
def test_results_come_in_task_order_under_random_delays(seed: int) -> None:
    tasks = make_tasks([10] * 40)
    tracker = Tracker(tasks, seed)
    got = []
    for task, result in Prefetcher(tasks, tracker.fetch, max_bytes=1000, threads=6, release=tracker.release):
        tracker.consumed(task)
        got.append((number(task), result))
    assert got == [(i, (i, i * i)) for i in range(40)]
    assert tracker.released == list(range(40))
    assert len(tracker.threads) > 1  # the fetches really ran concurrently, so order had to be restored
    assert max(len(s) for s in tracker.snapshots) > 1


@pytest.mark.parametrize("seed", range(3))
def test_outstanding_bytes_stay_within_max_bytes(seed: int) -> None:
    rng = random.Random(seed)
    max_bytes = 1000
    # mostly small tasks, some near the bound and some larger than it (fetched on their own)
    sizes = [
        rng.choice([rng.randrange(1, 200), rng.randrange(200, 1000), rng.randrange(1000, 3000)])
        for _ in range(60)
    ]
    tasks = make_tasks(sizes)
    tracker = Tracker(tasks, seed)
    got = []
    prefetcher = Prefetcher(tasks, tracker.fetch, max_bytes=max_bytes, threads=16, max_tasks=64)
    for task, _ in prefetcher:
        time.sleep(0.001)  # a consumer slower than nothing, so prefetch runs ahead
        tracker.consumed(task)
        got.append(number(task))
    assert got == list(range(60))
    assert len(tracker.snapshots) == 60
    for snapshot in tracker.snapshots:
        assert tracker.nbytes(snapshot) <= max_bytes or len(snapshot) == 1, sorted(snapshot)
    assert max(len(s) for s in tracker.snapshots) >= 3  # it did prefetch


def test_outstanding_tasks_stay_within_max_tasks() -> None:
    tasks = make_tasks([1] * 30)
    tracker = Tracker(tasks, 1)
    for task, _ in Prefetcher(tasks, tracker.fetch, max_bytes=1 << 30, max_tasks=3, threads=8):
        time.sleep(0.002)
        tracker.consumed(task)
    assert max(len(s) for s in tracker.snapshots) == 3


@pytest.mark.parametrize("max_bytes", [0, 1 << 20], ids=["inline", "threads"])
@pytest.mark.parametrize("failing", [0, 5, 19])
def test_an_error_surfaces_at_its_task(max_bytes: int, failing: int) -> None:
    tasks = make_tasks([10] * 20)
    tracker = Tracker(tasks, failing)
    boom = OSError(f"task {failing} failed")

    def fetch(task: ReadTask, stop: threading.Event) -> tuple[int, int]:
        result = tracker.fetch(task, stop)
        if number(task) == failing:
            raise boom
        return result

    got = []
    with pytest.raises(OSError) as caught:
        for task, _ in Prefetcher(tasks, fetch, max_bytes=max_bytes, threads=4, release=tracker.release):
            got.append(number(task))
    assert caught.value is boom
    assert got == list(range(failing))
    assert tracker.released == list(range(failing))


def test_max_bytes_zero_fetches_in_the_consumers_thread_when_reached() -> None:
    tasks = make_tasks([10] * 8)
    events: list[str] = []
    me = threading.current_thread()

    def fetch(task: ReadTask, stop: threading.Event) -> int:
        assert threading.current_thread() is me
        events.append(f"fetch {number(task)}")
        return number(task)

    def release(task: ReadTask) -> None:
        events.append(f"release {number(task)}")

    for task, result in Prefetcher(tasks, fetch, max_bytes=0, release=release):
        assert result == number(task)
        events.append(f"consume {number(task)}")
    assert events == [f"{what} {i}" for i in range(8) for what in ("fetch", "consume", "release")]
    assert not prefetch_threads()


def test_release_follows_consumption_in_order() -> None:
    tasks = make_tasks([5] * 25)
    tracker = Tracker(tasks, 3)
    for task, _ in Prefetcher(tasks, tracker.fetch, max_bytes=40, threads=4, release=tracker.release):
        # handed over only after every earlier task was released, and this one not yet
        assert tracker.released == list(range(number(task)))
    assert tracker.released == list(range(25))


@pytest.mark.parametrize("how", ["break", "close"])
def test_stopping_early_cancels_queued_tasks_and_stops_running_ones(how: str) -> None:
    tasks = make_tasks([1] * 50)
    started: list[int] = []
    stops: list[threading.Event] = []
    finished: list[int] = []
    lock = threading.Lock()
    before = {t for t in threading.enumerate() if not t.daemon}

    def fetch(task: ReadTask, stop: threading.Event) -> int:
        with lock:
            started.append(number(task))
            stops.append(stop)
        if number(task) >= 3:
            stop.wait(30)  # a slow fetch that watches the stop event
        with lock:
            finished.append(number(task))
        return number(task)

    prefetcher = Prefetcher(tasks, fetch, max_bytes=1 << 20, max_tasks=20, threads=2)
    got = []
    if how == "break":
        for task, _ in prefetcher:
            got.append(number(task))
            if len(got) == 3:
                assert wait_until(lambda: len(started) >= 5)  # 3 and 4 are running, 5.. are queued
                break
    else:
        iterator = iter(prefetcher)
        got = [number(next(iterator)[0]) for _ in range(3)]
        assert wait_until(lambda: len(started) >= 5)
        prefetcher.close()
    assert got == [0, 1, 2]
    assert stops and all(s is stops[0] for s in stops) and stops[0].is_set()
    # the running fetches return promptly (they saw the stop event) and their threads end
    assert wait_until(lambda: not prefetch_threads(), 5.0), prefetch_threads()
    assert sorted(started) == [0, 1, 2, 3, 4]  # nothing queued ran after the stop
    assert sorted(finished) == [0, 1, 2, 3, 4]
    assert {t for t in threading.enumerate() if not t.daemon} <= before


def test_bad_arguments_raise() -> None:
    tasks = make_tasks([1])
    for kwargs in ({"max_bytes": -1}, {"max_bytes": 1, "max_tasks": 0}, {"max_bytes": 1, "threads": 0}):
        with pytest.raises(ValueError):
            Prefetcher(tasks, lambda t, s: None, **kwargs)  # type: ignore[arg-type]


def test_no_tasks_yields_nothing() -> None:
    for max_bytes in (0, 100):
        assert list(Prefetcher([], lambda t, s: None, max_bytes=max_bytes)) == []


def test_tasks_are_taken_from_their_iterator_only_as_the_bounds_let_them_in() -> None:
    taken: list[int] = []

    def planned() -> Iterator[ReadTask]:
        for i in range(20):
            taken.append(i)
            yield ReadTask(0, (i,), 100)

    prefetcher = Prefetcher(planned(), lambda t, s: number(t), max_bytes=300, max_tasks=64, threads=2)
    it = iter(prefetcher)
    assert next(it)[1] == 0
    assert len(taken) <= 5  # 3 in flight within 300 bytes, and the one looked at next
    assert [r for _, r in it] == list(range(1, 20))


@pytest.mark.parametrize("max_bytes", [0, 1 << 20])
def test_an_error_planning_a_later_task_comes_after_the_tasks_before_it(max_bytes: int) -> None:
    def planned() -> Iterator[ReadTask]:
        yield from make_tasks([10, 10, 10])
        raise RuntimeError("no sample table for shard 7")

    got: list[int] = []
    with pytest.raises(RuntimeError, match="shard 7"):
        for task, _ in Prefetcher(planned(), lambda t, s: None, max_bytes=max_bytes, threads=2):
            got.append(number(task))
    assert got == [0, 1, 2]
