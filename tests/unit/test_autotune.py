"""The rules of a loader that tunes itself (fastload.core.autotune), and the live pieces they drive: a read
plan whose task size changes while it is planned, a prefetcher whose depth and concurrency change while
it runs."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload.core import advice, autotune
from fastload.core import telemetry as tel
from fastload.core.autotune import Limits, Settings, Window, decide, decide_workers
from fastload.core.index import ShardEntry
from fastload.core.readplan import ReadTask, iter_reads
from fastload.train.prefetch import Prefetcher

MIB = 1 << 20
LIMITS = Limits(memory_bytes=1 << 30, cores=8)
POOR = Settings(prefetch_bytes=MIB, concurrency=1, task_bytes=MIB, workers=2)


def io_bound(**kw: float) -> Window:
    """A window where the loop waits and the workers idle, waiting for 20 ms first bytes."""
    base = dict(wall_s=1.0, wait_s=0.9, step_s=0.1, fetch_s=1.0, fetches=40, fetch_bytes=40 * MIB)
    base |= dict(busy_s=0.1, first_byte_s=0.02, samples=1000)
    return Window(**(base | kw))  # type: ignore[arg-type]


def test_a_loop_that_does_not_wait_changes_nothing() -> None:
    d = decide(io_bound(wait_s=0.05, step_s=0.95), POOR, LIMITS)
    assert d.settings == POOR and d.changes == ()


def test_io_bound_raises_concurrency_task_size_and_the_prefetch_to_hold_them() -> None:
    d = decide(io_bound(), POOR, LIMITS)
    knobs = {c.knob: (c.old, c.new) for c in d.changes}
    assert knobs == {
        "concurrency": (1, 2),
        "task_bytes": (MIB, 2 * MIB),  # the first byte is half of each fetch's time
        "prefetch_bytes": (MIB, 2 * 2 * 2 * MIB),  # room for twice the tasks fetched at once
    }
    assert d.settings == Settings(prefetch_bytes=8 * MIB, concurrency=2, task_bytes=2 * MIB, workers=2)
    for c in d.changes:  # each change says what, from, to and why, on one line
        line = c.line()
        assert line.startswith(f"autotune: {c.knob} ") and "->" in line and "waits 90%" in line
        assert "\n" not in line


def test_a_raise_that_costs_is_undone_one_that_gains_nothing_kept_and_the_tuner_settles() -> None:
    first = decide(io_bound(), POOR, LIMITS)
    assert first.trial == autotune.Trial(POOR, 1000.0)
    # the next window delivers 850 samples/s: 15% fewer; once may be noise, measured again
    once = decide(io_bound(samples=850), first.settings, LIMITS, trial=first.trial)
    assert once.changes == () and not once.settle and once.trial == autotune.Trial(POOR, 1000.0, strikes=1)
    # twice: back to where it was, and settle
    d = decide(io_bound(samples=850), first.settings, LIMITS, trial=once.trial)
    assert d.settle and d.settings == POOR and d.trial is None
    assert {(c.knob, c.old, c.new) for c in d.changes} == {
        ("concurrency", 2, 1),
        ("task_bytes", 2 * MIB, MIB),
        ("prefetch_bytes", 8 * MIB, MIB),
    }
    assert all("cost throughput (850 samples/s against 1,000 before)" in c.reason for c in d.changes)
    # 1,030: no gain, no loss: the raise is kept, and nothing more raised
    d = decide(io_bound(samples=1030), first.settings, LIMITS, trial=first.trial)
    assert d.settle and d.settings == first.settings and d.changes == ()
    # settled: nothing raised; a raise that pays is kept and judged again
    assert decide(io_bound(), POOR, LIMITS, explore=False).changes == ()
    kept = decide(io_bound(samples=1200), first.settings, LIMITS, trial=first.trial)
    assert not kept.settle and kept.settings.concurrency == 4
    assert kept.trial == autotune.Trial(first.settings, 1200.0)
    # a raise that paid 1.5x or more: the next one goes 4x
    fast = decide(io_bound(samples=1500), first.settings, LIMITS, trial=first.trial)
    assert fast.settings.concurrency == 8 and fast.settings.task_bytes == 8 * MIB
    # a loop that stopped waiting keeps the raise that got it there
    assert (
        decide(
            io_bound(samples=900, wait_s=0.01, step_s=0.99), first.settings, LIMITS, trial=first.trial
        ).changes
        == ()
    )


def test_prefetch_that_holds_fewer_tasks_than_concurrency_is_raised_first() -> None:
    start = Settings(prefetch_bytes=2 * MIB, concurrency=8, task_bytes=MIB, workers=2)
    d = decide(io_bound(first_byte_s=0.001), start, LIMITS)  # not latency-bound: task size stays
    assert [(c.knob, c.old, c.new) for c in d.changes] == [("prefetch_bytes", 2 * MIB, 16 * MIB)]


def test_throttling_halves_concurrency_and_raises_nothing() -> None:
    start = Settings(prefetch_bytes=64 * MIB, concurrency=16, task_bytes=4 * MIB, workers=2)
    d = decide(io_bound(throttles=3), start, LIMITS)
    assert [(c.knob, c.old, c.new) for c in d.changes] == [("concurrency", 16, 8)]
    assert "throttled" in d.changes[0].reason


def test_cpu_bound_workers_get_no_deeper_prefetch_but_more_workers_at_the_epoch_end() -> None:
    cpu = io_bound(busy_s=1.8)  # two workers 90% busy
    assert decide(cpu, POOR, LIMITS).changes == ()
    # 1000 samples/s delivered, the step takes 64 samples in 10 ms (6400/s): 2 * 6400 * 1.2 / 1000 = 16
    d = decide_workers(cpu, POOR, Limits(memory_bytes=1 << 30, cores=8), batch_size=64, batches=10)
    assert [(c.knob, c.old, c.new) for c in d.changes] == [("workers", 2, 7)]  # the cores less one
    assert "CPU-bound" in d.changes[0].reason
    # never above the cores less one, nor with an I/O-bound or compute-bound loop
    assert (
        decide_workers(cpu, POOR, Limits(memory_bytes=1 << 30, cores=2), batch_size=64, batches=10).changes
        == ()
    )
    assert decide_workers(io_bound(), POOR, LIMITS, batch_size=64, batches=10).changes == ()
    assert (
        decide_workers(
            cpu, Settings(**{**POOR.as_dict(), "workers": 0}), LIMITS, batch_size=64, batches=10
        ).changes
        == ()
    )


def test_limits_hold_knobs_and_say_so() -> None:
    top = Settings(prefetch_bytes=2 * 64 * 64 * MIB, concurrency=64, task_bytes=64 * MIB, workers=1)
    d = decide(io_bound(), top, Limits(memory_bytes=1 << 40, cores=8))
    assert d.changes == () and dict(d.held) == {"concurrency": "max_concurrency=64"}
    tight = Limits(memory_bytes=8 * MIB, cores=8)
    d = decide(io_bound(), POOR, tight)
    assert d.settings.workers * (d.settings.prefetch_bytes + d.settings.task_bytes) <= 8 * MIB
    assert "prefetch_bytes" in dict(d.held)


@settings(max_examples=200, deadline=None)
@given(
    prefetch=st.integers(0, 256 * MIB),
    concurrency=st.integers(1, 64),
    task=st.integers(1, 64 * MIB),
    workers=st.integers(0, 16),
    memory_mib=st.integers(1, 8192),
    wait=st.floats(0, 1),
    busy=st.floats(0, 20),
    first_byte=st.one_of(st.none(), st.floats(0, 0.5)),
    throttles=st.integers(0, 3),
    rounds=st.integers(1, 12),
)
def test_tuning_never_leaves_the_memory_and_machine_limits(
    prefetch: int,
    concurrency: int,
    task: int,
    workers: int,
    memory_mib: int,
    wait: float,
    busy: float,
    first_byte: float | None,
    throttles: int,
    rounds: int,
) -> None:
    """Started within the limits, no sequence of decisions leaves them: memory for every worker's
    read-ahead, concurrency, task size, cores; and a decision without changes keeps the settings."""
    limits = Limits(memory_bytes=memory_mib * MIB, cores=4, max_concurrency=64, max_task_bytes=64 * MIB)
    s = Settings(prefetch_bytes=prefetch, concurrency=concurrency, task_bytes=task, workers=min(workers, 3))
    if max(1, s.workers) * (s.prefetch_bytes + s.task_bytes) > limits.memory_bytes:
        return
    w = io_bound(wait_s=wait, step_s=1 - wait, busy_s=busy, first_byte_s=first_byte, throttles=throttles)
    trial = None
    for i in range(rounds):
        d = decide(w if i % 3 else io_bound(samples=1), s, limits, trial=trial)
        if not d.changes:
            assert d.settings == s
        s, trial = d.settings, d.trial
        assert max(1, s.workers) * (s.prefetch_bytes + s.task_bytes) <= limits.memory_bytes
        assert 1 <= s.concurrency <= limits.max_concurrency and s.task_bytes <= limits.max_task_bytes
    d = decide_workers(w, s, limits, batch_size=8, batches=10)
    assert d.settings.workers <= max(s.workers, limits.cores - 1)


def test_window_of_two_telemetry_vectors() -> None:
    before = tel.zeros()
    now = tel.zeros()
    fetch = tel.stage_cell("fetch")
    now[fetch : fetch + 3] = [4, 8 * MIB, 2_000_000_000]
    now[tel.stage_cell("parse") + 2] = 300_000_000
    now[tel.stage_cell("decode") + 2] = 200_000_000
    now[tel.counter_cell("samples")] = 500
    now[tel.counter_cell("s3_throttles")] = 2
    now[tel.sketch_base("first_byte_ns") + tel.bucket(20_000_000)] = 4
    w = Window.of(now, before, wall_s=2.0, wait_s=1.5, step_s=0.5)
    assert (w.fetches, w.fetch_bytes, w.fetch_s, w.samples, w.throttles) == (4, 8 * MIB, 2.0, 500, 2)
    assert w.busy_s == pytest.approx(0.5) and w.wait_share == 0.75
    assert w.first_byte_s == pytest.approx(0.02, rel=0.1)


def test_the_bench_advice_applies_the_same_rules() -> None:
    """One set of thresholds and rules: the advice's verdict, dominant stage and workers rule are the
    tuner's (fastload bench and the live tuner cannot disagree)."""
    assert advice.LOADER_BOUND_SHARE is autotune.LOADER_BOUND_SHARE
    assert advice.covers is autotune.covers and advice.demand is autotune.demand
    for share in (0.05, 0.0999, 0.10, 0.5):
        facts = advice.Facts(batch_size=8, num_workers=2, wait_share=share, step_s=0.01, cores=4)
        assert (advice.advise(facts).verdict == "loader-bound") == autotune.loader_bound(share)
    stages = advice.StageTimes(fetch_s=5e-4, parse_s=1e-4, decode_s=1e-4, collate_s=1e-4)
    facts = advice.Facts(
        batch_size=8, num_workers=2, wait_share=0.5, step_s=0.01, cores=4, stages=stages, remote=True
    )
    assert autotune.dominant_stage(stages.shares()) == "fetch"
    assert any("autotune=True" in line for line in advice.advise(facts).lines)


def test_iter_reads_asks_the_task_size_for_each_task() -> None:
    """A task size that changes while tasks are planned cuts the later tasks at the new size; the tasks
    still read the references in order, each once."""
    sizes = [MIB // 4] * 64
    offsets = [i * MIB // 4 for i in range(64)]
    keys = [f"{i}" for i in range(64)]
    entry = ShardEntry(name="s.tar", bytes=16 * MIB, checksum="", keys=keys, offsets=offsets, sizes=sizes)
    refs = [(0, i) for i in range(64)]
    cap = [MIB]
    tasks: list[ReadTask] = []
    for task in iter_reads(refs, lambda s: entry, max_task_bytes=lambda: cap[0]):
        tasks.append(task)
        if len(tasks) == 2:
            cap[0] = 4 * MIB
    assert [len(t.positions) for t in tasks[:3]] == [4, 4, 16]
    assert [p for t in tasks for p in t.positions] == list(range(64))


def test_prefetcher_follows_live_depth_and_concurrency_in_order() -> None:
    """Fetches running at once never exceed the concurrency asked for at that moment; raising it lets
    more run; results come back in task order."""
    running = peak = 0
    lock = threading.Lock()
    peaks: list[int] = []
    limits = [(64 * MIB, 1)]

    def fetch(task: ReadTask, stop: threading.Event) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.01)
        with lock:
            running -= 1
        return task.shard

    tasks = [ReadTask(i, (0,), MIB) for i in range(40)]
    pre = Prefetcher(tasks, fetch, max_bytes=0, threads=8, limits=lambda: limits[0])
    out = []
    for i, (_task, result) in enumerate(pre):
        out.append(result)
        if i == 10:
            peaks.append(peak)
            limits[0] = (64 * MIB, 4)
            peak = 0
    peaks.append(peak)
    assert out == list(range(40))
    assert peaks[0] == 1 and 2 <= peaks[1] <= 4
    # a byte bound of one task's bytes holds it to one at a time again
    peak = 0
    limits[0] = (MIB, 8)
    assert [r for _, r in Prefetcher(tasks, fetch, max_bytes=0, threads=8, limits=lambda: limits[0])] == list(
        range(40)
    )
    assert peak == 1


def test_a_shard_opened_after_a_tuned_task_grew_fetches_its_parts_at_once() -> None:
    """A tuned task of several parts: a remote shard opened then reads with at least as many GETs at once
    as the task has parts (else a one-GET-at-a-time config fetches them one by one); the dataset's own
    setting where it is higher, or when not tuned."""
    import fastload
    from fastload.train import reading
    from fastload.train.shardread import ShardReaders

    task = [4 * MIB]
    readers = object.__new__(ShardReaders)  # (only the rule: the opening itself is the tuned loader's)
    readers.config = fastload.S3Config(max_concurrency=1, part_size_bytes=4 * MIB)
    readers._parts = lambda: reading._parts_of(lambda: task[0], 4 * MIB)
    assert readers._reader_config() is readers.config  # one part: the dataset's own
    task[0] = 16 * MIB
    config = readers._reader_config()
    assert config is not None and config.max_concurrency == 4 and config.part_size_bytes == 4 * MIB
    task[0] = 17 * MIB
    assert readers._reader_config().max_concurrency == 5  # type: ignore[union-attr]
    readers.config = fastload.S3Config(max_concurrency=8, part_size_bytes=4 * MIB)
    assert readers._reader_config() is readers.config
    readers._parts = None
    assert readers._reader_config() is readers.config
