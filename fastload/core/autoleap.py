"""The live tuner's first raise from a poor start: a leap, then trims. Pure; the entry is
:func:`decide`, which wraps :func:`fastload.core.autotune.decide` (throttling, doubling raises, the workers
rule are all its).

Doubling from a poor start takes one judged window per doubling: 1 -> 32 fetches at once is five windows,
most of a short epoch spent slow. So the first raise of an I/O-bound loop (the loop waits, the workers
idle: :func:`fastload.core.autotune.decide` would raise) that fetches fewer than ``LEAP_BELOW`` (4) tasks
at once is a **leap**: ``concurrency`` times ``LEAP`` (16, at most ``Limits.max_concurrency``),
``task_bytes`` 16x while a fetch's first byte is at least ``LATENCY_BOUND_SHARE`` of its time (up to
``Limits.leap_task_bytes``: the workers fetch a leapt task's parts at once), and ``prefetch_bytes`` to
hold twice the tasks fetched at once, all within the memory limit (``concurrency`` lowered to fit it).

Only from a poor start: a loader at about the defaults doubles as before (a leap from there overshot).
And not straight to the limits: every byte fetched at once beyond what covers the store's latency delays
the first task's arrival (the fetches share the bandwidth); a leap to 64 fetches took a third of a short
epoch to fill (benchmarks/RESULTS.md). The window after the leap judges it:

- it lost less than ``MIN_GAIN`` (10%) samples/s, or gained: kept, and held while each window still
  gains 10% on the one before (the read-ahead is still filling: trims judged against a rising rate would
  pass wrongly), then **trimmed** back (a leap that gained nothing is so trimmed down to near where it
  started, a window at a time, giving the memory back while the rate holds): each trim halves
  ``concurrency`` (and the prefetch holding it) while the rate stays within ``TRIM_LOSS`` (5%) of the best
  window since the leap, never below twice the concurrency leapt from. A trim that costs more is undone
  at once (back to the settings before it) and the tuner settles: the least read-ahead that keeps the best
  rate, found in a few windows at nearly the best rate rather than many below it;
- it lost 10% or more, in two windows running: every I/O setting goes back to before the leap and the
  tuner settles.

Later raises (a settled tuner's reprobes) double as before. Throttling (503s) halves ``concurrency`` in
the middle of a leap or trim as at any time, and ends it.
"""

from __future__ import annotations

from dataclasses import replace

from fastload.core.autotune import (
    CPU_BOUND_SHARE,
    IO_KNOBS,
    MIN_GAIN,
    Change,
    Decision,
    Limits,
    Settings,
    Trial,
    Window,
    cpu_share,
    latency_bound,
    loader_bound,
)
from fastload.core.autotune import decide as decide_step

TRIM_LOSS = 0.05
LEAP = 16  # the leap multiplies concurrency by this much, at most
LEAP_BELOW = 4  # a leap only from fewer fetches at once than this (a poor start; else doubling)
LEAP_TASK_STEP = 16


def decide(
    window: Window,
    settings: Settings,
    limits: Limits,
    *,
    trial: Trial | None = None,
    explore: bool = True,
    leap: bool = False,
) -> Decision:
    """The settings for the next window: a leap's or a trim's verdict when one is on trial, a leap when
    ``leap`` (no raise made yet) and the loop is I/O-bound, else :func:`fastload.core.autotune.decide`."""
    if window.throttles == 0 and window.samples > 0 and trial is not None:
        if trial.kind == "leap":
            return _judge_leap(window, settings, trial)
        if trial.kind == "hold":
            if window.rate >= trial.rate * (1 + MIN_GAIN):  # still rising (filling): held on
                return Decision(settings, trial=replace(trial, rate=window.rate))
            return _trim(settings, trial.floor or trial.before, max(trial.rate, window.rate))
        if trial.kind == "trim":
            return _judge_trim(window, settings, trial)
    if trial is not None and trial.kind != "raise":
        trial = None  # (throttled, or nothing delivered: the search ends where it is)
    if leap and explore and trial is None and window.throttles == 0 and window.samples > 0:
        jump = _leap(window, settings, limits)
        if jump is not None:
            return jump
    return decide_step(window, settings, limits, trial=trial, explore=explore)


def _leap(window: Window, settings: Settings, limits: Limits) -> Decision | None:
    """The leap from ``settings`` (None: the loop does not wait, the workers are busy, or the limits
    leave no room above where it is)."""
    if settings.concurrency >= LEAP_BELOW or not loader_bound(window.wait_share):
        return None
    if cpu_share(window, settings.workers) >= CPU_BOUND_SHARE:
        return None
    task = settings.task_bytes
    if latency_bound(window):
        task = min(limits.leap_task_bytes or limits.max_task_bytes, max(task, LEAP_TASK_STEP * task))
    room = limits.memory_bytes // max(1, settings.workers)  # per worker: prefetch + one task in use
    concurrency = min(limits.max_concurrency, LEAP * settings.concurrency, (room - task) // (2 * task))
    if concurrency <= settings.concurrency:  # the memory would not hold more: the doubling rule says so
        return None
    leapt = replace(
        settings,
        concurrency=concurrency,
        task_bytes=task,
        prefetch_bytes=min(max(settings.prefetch_bytes, 2 * concurrency * task), room - task),
    )
    why = (
        f"the loop waits {window.wait_share:.0%} of its time and the workers are "
        f"{cpu_share(window, settings.workers):.0%} busy: a leap, then trimmed back"
    )
    return Decision(leapt, _changes(settings, leapt, why), trial=Trial(settings, window.rate, kind="leap"))


def _judge_leap(window: Window, settings: Settings, trial: Trial) -> Decision:
    if window.rate >= trial.rate * (1 - MIN_GAIN):  # kept: held while it still rises, then trimmed
        return Decision(settings, trial=Trial(settings, window.rate, kind="hold", floor=trial.before))
    if trial.strikes == 0:  # one window may be noise (or the reads from before it): measured again
        return Decision(settings, trial=replace(trial, strikes=1))
    why = f"the leap cost throughput ({window.rate:,.0f} samples/s against {trial.rate:,.0f} before)"
    back = replace(settings, **{k: getattr(trial.before, k) for k in IO_KNOBS})
    return Decision(back, _changes(settings, back, why), settle=True)


def _judge_trim(window: Window, settings: Settings, trial: Trial) -> Decision:
    best = max(trial.rate, window.rate)
    if window.rate >= trial.rate * (1 - TRIM_LOSS):
        return _trim(settings, trial.floor or trial.before, best)
    why = f"the trim cost throughput ({window.rate:,.0f} samples/s against {trial.rate:,.0f} before it)"
    back = replace(settings, **{k: getattr(trial.before, k) for k in IO_KNOBS})
    return Decision(back, _changes(settings, back, why), settle=True)


def _trim(settings: Settings, floor: Settings, best: float) -> Decision:
    """Half the concurrency (and the prefetch holding it) of ``settings``, on trial against ``best``;
    settled where a half would go below twice ``floor``'s concurrency."""
    half = settings.concurrency // 2
    if half < 2 * floor.concurrency:
        return Decision(settings, settle=True)
    trimmed = replace(
        settings,
        concurrency=half,
        prefetch_bytes=min(
            settings.prefetch_bytes, max(floor.prefetch_bytes, 2 * half * settings.task_bytes)
        ),
    )
    why = f"trimmed back while the rate holds ({best:,.0f} samples/s, the best since the leap)"
    return Decision(
        trimmed, _changes(settings, trimmed, why), trial=Trial(settings, best, kind="trim", floor=floor)
    )


def _changes(old: Settings, new: Settings, why: str) -> tuple[Change, ...]:
    return tuple(
        Change(k, getattr(old, k), getattr(new, k), why)
        for k in IO_KNOBS
        if getattr(old, k) != getattr(new, k)
    )


__all__ = ["LEAP", "LEAP_BELOW", "LEAP_TASK_STEP", "TRIM_LOSS", "decide"]
