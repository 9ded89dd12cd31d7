"""The live tuner's first search from above (fastload.core.autoleap): a leap to the limits, trimmed back
while the rate holds, undone when it gains nothing; within the memory limit whatever happens."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fastload.core import autoleap
from fastload.core.autotune import Decision, Limits, Settings, Trial, Window

MIB = 1 << 20
LIMITS = Limits(memory_bytes=4 << 30, cores=8, leap_task_bytes=4 * MIB)  # 2 GiB a worker
POOR = Settings(prefetch_bytes=MIB, concurrency=1, task_bytes=MIB, workers=2)


def io_bound(**kw: float) -> Window:
    """A window where the loop waits and the workers idle, waiting for 20 ms first bytes."""
    base = dict(wall_s=1.0, wait_s=0.9, step_s=0.1, fetch_s=1.0, fetches=40, fetch_bytes=40 * MIB)
    base |= dict(busy_s=0.1, first_byte_s=0.02, samples=200)
    return Window(**(base | kw))  # type: ignore[arg-type]


def leapt() -> Decision:
    return autoleap.decide(io_bound(), POOR, LIMITS, leap=True)


def test_the_first_raise_of_an_io_bound_loop_leaps() -> None:
    d = leapt()
    assert d.settings == Settings(
        prefetch_bytes=2 * 16 * 4 * MIB,  # twice the 16 tasks of 4 MiB fetched at once
        concurrency=16,  # LEAP times what it was
        task_bytes=4 * MIB,  # bigger: the first byte is half of each fetch's time (leap_task_bytes)
        workers=2,
    )
    # leap_task_bytes (what a task's parts fetched at once cover) or else max_task_bytes caps the task
    wide = Limits(memory_bytes=4 << 30, cores=8)
    assert autoleap.decide(io_bound(), POOR, wide, leap=True).settings.task_bytes == 16 * MIB  # 16x
    narrow = Limits(memory_bytes=4 << 30, cores=8, max_task_bytes=8 * MIB)
    assert autoleap.decide(io_bound(), POOR, narrow, leap=True).settings.task_bytes == 8 * MIB
    # never above max_concurrency
    from3 = Settings(prefetch_bytes=3 * MIB, concurrency=3, task_bytes=MIB, workers=2)
    assert autoleap.decide(io_bound(), from3, LIMITS, leap=True).settings.concurrency == 48
    assert (
        autoleap.decide(
            io_bound(),
            from3,
            Limits(memory_bytes=4 << 30, cores=8, max_concurrency=32, leap_task_bytes=4 * MIB),
            leap=True,
        ).settings.concurrency
        == 32
    )
    # a loader fetching 4 or more at once (about the defaults) doubles: no leap
    from4 = Settings(prefetch_bytes=4 * MIB, concurrency=4, task_bytes=MIB, workers=2)
    d4 = autoleap.decide(io_bound(), from4, LIMITS, leap=True)
    assert d4.settings.concurrency == 8 and d4.trial is not None and d4.trial.kind == "raise"
    assert d.trial == Trial(POOR, 200.0, kind="leap") and not d.settle
    assert {c.knob for c in d.changes} == {"prefetch_bytes", "concurrency", "task_bytes"}
    assert all("a leap, then trimmed back" in c.reason and "waits 90%" in c.reason for c in d.changes)
    # without leap= (a tuner that raised before, or restored from a checkpoint): the doubling rule
    assert autoleap.decide(io_bound(), POOR, LIMITS).settings.concurrency == 2


def test_the_leap_stays_within_memory_and_gives_way_to_doubling_where_none_fits() -> None:
    tight = Limits(
        memory_bytes=2 * 68 * MIB, cores=8, leap_task_bytes=4 * MIB
    )  # 68 MiB a worker: twice 8 tasks of 4 MiB, and one
    d = autoleap.decide(io_bound(), POOR, tight, leap=True)
    got = d.settings
    assert (got.concurrency, got.task_bytes, got.prefetch_bytes) == (8, 4 * MIB, 64 * MIB)
    assert d.settings.workers * (d.settings.prefetch_bytes + d.settings.task_bytes) <= tight.memory_bytes
    tiny = Limits(
        memory_bytes=2 * 9 * MIB, cores=8, leap_task_bytes=4 * MIB
    )  # room for one 4 MiB task twice: no leap above 1
    d = autoleap.decide(io_bound(), POOR, tiny, leap=True)
    assert d.trial is not None and d.trial.kind == "raise" and d.settings.concurrency == 2


def test_a_deep_prefetch_kept_through_the_leap_leaves_room_for_the_bigger_task() -> None:
    deep = Settings(prefetch_bytes=256 * MIB, concurrency=1, task_bytes=MIB, workers=1)
    limits = Limits(memory_bytes=257 * MIB, cores=8, leap_task_bytes=4 * MIB)  # what it starts with
    d = autoleap.decide(io_bound(), deep, limits, leap=True)
    assert d.settings.task_bytes == 4 * MIB and d.settings.concurrency == 16
    assert d.settings.prefetch_bytes + d.settings.task_bytes <= limits.memory_bytes


def test_no_leap_unless_the_loop_waits_for_idle_workers() -> None:
    assert autoleap.decide(io_bound(wait_s=0.05, step_s=0.95), POOR, LIMITS, leap=True).changes == ()
    assert autoleap.decide(io_bound(busy_s=1.8), POOR, LIMITS, leap=True).changes == ()  # CPU-bound
    throttled = autoleap.decide(
        io_bound(throttles=2), Settings(**{**POOR.as_dict(), "concurrency": 8}), LIMITS, leap=True
    )
    assert [(c.knob, c.old, c.new) for c in throttled.changes] == [("concurrency", 8, 4)]


def test_a_leap_that_pays_is_trimmed_back_while_the_rate_holds_then_settles() -> None:
    first = leapt()
    # it paid (1,200 samples/s against 200): kept, and held while the rate still rises (filling)
    held = autoleap.decide(io_bound(samples=1200), first.settings, LIMITS, trial=first.trial)
    assert held.changes == () and held.trial == Trial(first.settings, 1200.0, kind="hold", floor=POOR)
    rising = autoleap.decide(io_bound(samples=1900), first.settings, LIMITS, trial=held.trial)
    assert rising.changes == () and rising.trial == Trial(first.settings, 1900.0, kind="hold", floor=POOR)
    # 2,000: within 10% of the last window: it has stopped rising; trimmed, the best 2,000
    d = autoleap.decide(io_bound(samples=2000), first.settings, LIMITS, trial=rising.trial)
    assert d.settings.concurrency == 8 and d.settings.prefetch_bytes == 2 * 8 * 4 * MIB
    assert d.trial == Trial(first.settings, 2000.0, kind="trim", floor=POOR) and not d.settle
    assert all("trimmed back" in c.reason for c in d.changes)
    # 1,960 samples/s: within 5% of the best: trimmed again, judged against the best (2,000)
    d2 = autoleap.decide(io_bound(samples=1960), d.settings, LIMITS, trial=d.trial)
    assert d2.settings.concurrency == 4 and d2.trial is not None and d2.trial.rate == 2000.0
    # 1,800: the trim cost 10%: back to 8 at once, settled there
    d3 = autoleap.decide(io_bound(samples=1800), d2.settings, LIMITS, trial=d2.trial)
    assert d3.settle and d3.trial is None and d3.settings == d.settings
    assert [(c.knob, c.old, c.new) for c in d3.changes] == [
        ("prefetch_bytes", 2 * 4 * 4 * MIB, 2 * 8 * 4 * MIB),
        ("concurrency", 4, 8),
    ]
    assert "trim cost throughput (1,800 samples/s against 2,000" in d3.changes[0].reason


def test_trims_stop_at_twice_the_concurrency_leapt_from() -> None:
    first = leapt()
    s, trial = first.settings, first.trial
    seen = [autoleap.decide(io_bound(samples=2000), s, LIMITS, trial=trial).settings.concurrency]  # held
    trial = autoleap.decide(io_bound(samples=2000), s, LIMITS, trial=trial).trial
    for _ in range(10):
        d = autoleap.decide(io_bound(samples=2000), s, LIMITS, trial=trial)
        s, trial = d.settings, d.trial
        seen.append(s.concurrency)
        if d.settle:
            break
    assert seen == [16, 8, 4, 2, 2] and trial is None
    assert s.prefetch_bytes == 2 * 2 * 4 * MIB


def test_a_leap_that_costs_twice_is_undone_one_that_gains_nothing_is_trimmed() -> None:
    first = leapt()
    once = autoleap.decide(io_bound(samples=170), first.settings, LIMITS, trial=first.trial)
    assert once.changes == () and once.trial == Trial(POOR, 200.0, strikes=1, kind="leap")
    d = autoleap.decide(io_bound(samples=170), first.settings, LIMITS, trial=once.trial)
    assert d.settle and d.settings == POOR
    assert all("leap cost throughput (170 samples/s against 200 before)" in c.reason for c in d.changes)
    # a noisy window then a gain: the leap is kept (held, then trimmed)
    kept = autoleap.decide(io_bound(samples=900), first.settings, LIMITS, trial=once.trial)
    assert kept.trial is not None and kept.trial.kind == "hold" and kept.settings == first.settings
    # neither gain nor loss (205 against 200): kept, and trimmed while the rate holds (the memory back)
    flat = autoleap.decide(io_bound(samples=205), first.settings, LIMITS, trial=first.trial)
    assert flat.trial is not None and flat.trial.kind == "hold"
    trimmed = autoleap.decide(io_bound(samples=200), first.settings, LIMITS, trial=flat.trial)
    assert trimmed.settings.concurrency == 8 and trimmed.trial is not None and trimmed.trial.kind == "trim"


def test_throttling_in_the_middle_of_a_trim_halves_concurrency_and_ends_the_search() -> None:
    first = leapt()
    held = autoleap.decide(io_bound(samples=2000), first.settings, LIMITS, trial=first.trial)
    d = autoleap.decide(io_bound(samples=2000), first.settings, LIMITS, trial=held.trial)
    t = autoleap.decide(io_bound(throttles=1), d.settings, LIMITS, trial=d.trial)
    assert [(c.knob, c.old, c.new) for c in t.changes] == [("concurrency", 8, 4)] and t.trial is None


@settings(max_examples=200, deadline=None)
@given(
    prefetch=st.integers(0, 512 * MIB),
    concurrency=st.integers(1, 64),
    task=st.integers(MIB, 64 * MIB),
    workers=st.integers(0, 16),
    memory_mib=st.integers(1, 8192),
    rates=st.lists(st.integers(0, 5000), min_size=1, max_size=10),
    throttles=st.lists(st.integers(0, 1), min_size=10, max_size=10),
    first_byte=st.one_of(st.none(), st.floats(0, 0.5)),
)
def test_the_search_never_leaves_the_limits(
    prefetch: int,
    concurrency: int,
    task: int,
    workers: int,
    memory_mib: int,
    rates: list[int],
    throttles: list[int],
    first_byte: float | None,
) -> None:
    limits = Limits(memory_bytes=memory_mib * MIB, cores=8, max_concurrency=64, max_task_bytes=64 * MIB)
    s = Settings(prefetch_bytes=prefetch, concurrency=concurrency, task_bytes=task, workers=workers)
    if max(1, workers) * (s.prefetch_bytes + s.task_bytes) > limits.memory_bytes:
        return
    trial, leap = None, True
    for rate, throttled in zip(rates, throttles, strict=False):
        w = io_bound(samples=rate, throttles=throttled, first_byte_s=first_byte)
        d = autoleap.decide(w, s, limits, trial=trial, leap=leap)
        if not d.changes:
            assert d.settings == s
        leap = leap and not d.changes
        s, trial = d.settings, d.trial
        assert max(1, s.workers) * (s.prefetch_bytes + s.task_bytes) <= limits.memory_bytes
        assert 1 <= s.concurrency <= limits.max_concurrency and s.task_bytes <= limits.max_task_bytes
