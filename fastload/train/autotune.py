"""``fastload.DataLoader(autotune=True)``: the loop's side of a loader that tunes itself.

Every ``interval_s`` the :class:`Tuner` measures one window (the loop's wait and step, timed here; the
workers' stage counters, from the telemetry block) and applies :func:`fastload.core.autoleap.decide` (its
first raise a leap to the limits, trimmed back; then :func:`fastload.core.autotune.decide`'s rules): the
new prefetch depth, fetches at once and read task size go into the dataset's shared-memory block
(:attr:`~fastload.train.telemetry.SharedCounters.tuned`), which every worker reads before each read task.
At the end of each epoch :func:`~fastload.core.autotune.decide_workers` may ask for more workers, which the
DataLoader starts with the next epoch. Every change is logged (logger ``fastload.autotune``, one line:
knob, from, to, why) and kept in :attr:`Tuner.changes` (``loader.report()["autotune"]``, the telemetry
records). The settings only decide how far ahead and in what pieces bytes are read, never which samples
or in what order, so order, exactly-once delivery and resume are those of an untuned loader.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from fastload.config import S3Config
from fastload.core import autoleap
from fastload.core import autotune as rules
from fastload.errors import ConfigError
from fastload.storage.access import is_remote
from fastload.train.options import PrefetchConfig
from fastload.train.telemetry import SharedCounters

log = logging.getLogger("fastload.autotune")
MEMORY_SHARE = 0.25  # of the memory available when tuning starts, by default
MAX_CHANGES = 1000  # kept in Tuner.changes (the oldest dropped)
SETTLE_SHARE = 0.5  # of interval_s: after a change, left out of the window that judges it
MAX_PARTS = 16  # ranged GETs of one leapt read task at once, at most (what caps its size)


@dataclass(frozen=True, kw_only=True)
class AutotuneConfig:
    """Bounds and pace of ``autotune=``. ``memory_bytes``: what read-ahead may hold over all workers,
    ``workers x (prefetch_bytes + task_bytes)`` (None: a quarter of the memory available when the loader
    is built, and never less than the settings it starts with); ``interval_s``: seconds per measured
    window; ``max_concurrency``: read tasks fetched at once per worker; ``max_task_bytes``: a read task;
    ``workers``: also tune ``num_workers`` between epochs (never above the cores less one)."""

    memory_bytes: int | None = None
    interval_s: float = 0.5
    max_concurrency: int = 64
    max_task_bytes: int = 64 << 20
    workers: bool = True

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ConfigError(f"interval_s={self.interval_s} must be > 0 (0.5 s is the default)")
        if self.memory_bytes is not None and self.memory_bytes < 1 << 20:
            raise ConfigError(
                f"memory_bytes={self.memory_bytes} must be >= 1 MiB (or None: from the machine)"
            )
        if self.max_concurrency < 1 or self.max_task_bytes < 1 << 20:
            raise ConfigError(
                f"max_concurrency={self.max_concurrency} must be >= 1 and max_task_bytes="
                f"{self.max_task_bytes} >= 1 MiB"
            )


def config_of(autotune: bool | AutotuneConfig | None) -> AutotuneConfig | None:
    """The config ``autotune=`` asks for (None: off)."""
    if autotune is None or autotune is False:
        return None
    if autotune is True:
        return AutotuneConfig()
    if isinstance(autotune, AutotuneConfig):
        return autotune
    raise ConfigError(f"autotune={autotune!r}: pass True, False or a fastload.AutotuneConfig")


def machine() -> tuple[int, int]:
    """``(cores usable by this process, bytes of memory available now)``."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        available = 4 << 30
    return cores, available


def starting(prefetch: Sequence[PrefetchConfig], workers: int) -> rules.Settings:
    """The settings the datasets' options amount to (a Mix's sources: the most any of them reads ahead,
    which the tuned settings then give each)."""
    max_bytes = max(p.max_bytes or 0 for p in prefetch)
    return rules.Settings(
        prefetch_bytes=max_bytes,
        concurrency=max(min(p.threads, p.runs) for p in prefetch),
        task_bytes=rules.default_task_bytes(max_bytes),
        workers=workers,
    )


def round_bytes(sources: Sequence[Any], *, parts: int | None = None) -> int | None:
    """What one round of a read task's concurrent GETs covers for the remote datasets among ``sources``
    (the least of them; None: all local): ``part_size_bytes`` times the configured ``max_concurrency``,
    or times ``parts`` if more (a leap's tasks: their parts are fetched at once, a shard opened after the
    change reading with as many GETs at once as a task has parts)."""
    rounds = []
    for d in sources:
        if is_remote(d.root):
            config = d.s3_config or S3Config()
            rounds.append(config.part_size_bytes * max(config.max_concurrency, parts or 0))
    return min(rounds) if rounds else None


class Tuner:
    """Measures windows of a loop and tunes ``cells`` (the dataset's block) by the shared rules."""

    def __init__(
        self,
        config: AutotuneConfig,
        settings: rules.Settings,
        cells: SharedCounters,
        vector: Callable[[], list[int]],
        *,
        batch_size: int,
        round_bytes: int | None = None,
        leap_round_bytes: int | None = None,
        streams: int = 1,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """``round_bytes``: what one round of a read's concurrent GETs covers (``part_size_bytes x
        max_concurrency`` of a remote dataset's S3 config): a bigger task would pay the first byte again,
        so it caps the task size too; ``leap_round_bytes``: the same for the first raise, a leap, whose
        tasks' parts are fetched at once (:func:`round_bytes` with ``MAX_PARTS``). ``streams``: read
        pipelines in each worker that follow the settings
        (a Mix's sources): the memory bound is shared between them."""
        cores, available = machine()
        most_task = config.max_task_bytes if round_bytes is None else min(config.max_task_bytes, round_bytes)
        use = max(1, settings.workers) * (settings.prefetch_bytes + settings.task_bytes)
        memory = config.memory_bytes if config.memory_bytes is not None else int(MEMORY_SHARE * available)
        self.streams = max(1, streams)
        self.limits = rules.Limits(
            memory_bytes=max(memory // self.streams, use),
            cores=cores,
            max_concurrency=max(config.max_concurrency, settings.concurrency),
            max_task_bytes=max(most_task, settings.task_bytes),
            leap_task_bytes=None
            if leap_round_bytes is None
            else min(config.max_task_bytes, leap_round_bytes),
        )
        self.config = config
        self.settings = settings
        self.changes: list[dict[str, Any]] = []
        self.held: dict[str, str] = {}
        self._cells = cells
        self._vector = vector
        self._batch_size = batch_size
        self._clock = clock
        self._began = clock()
        self._wait = self._step = 0.0
        self._batches = 0
        self._window = self._epoch = self._mark()
        self._trial: rules.Trial | None = None  # the last raise, judged by the next window
        self._settled: int | None = None  # windows since a raise gained nothing
        self._settle_until: float | None = None  # after a change: the next window starts then
        self._leap = True  # no raise made yet: the first may leap (fastload.core.autoleap)
        self.write()

    def _mark(self) -> tuple[float, list[int], float, float, int]:
        """Where a window starts: time, counters, the loop's wait and step so far, batches."""
        return self._clock(), self._vector(), self._wait, self._step, self._batches

    def write(self) -> None:
        """The settings into the cells the workers read."""
        s = self.settings
        cells = self._cells.tuned
        cells[0], cells[2], cells[3] = s.prefetch_bytes, s.task_bytes, self.limits.max_concurrency
        cells[1] = s.concurrency  # (last: the cells count as tuned once it is set)

    def release(self) -> None:
        """The loader is done: the dataset's workers read its own options again (unless another tuner
        wrote the cells since)."""
        cells = self._cells.tuned
        s = self.settings
        if tuple(cells) == (s.prefetch_bytes, s.concurrency, s.task_bytes, self.limits.max_concurrency):
            cells[1] = 0  # (the cells count as tuned while it is set)
            cells[0] = cells[2] = cells[3] = 0

    def restore(self, state: dict[str, Any]) -> None:
        """Continue with the settings of a checkpoint (``state_dict()["tuned"]``), within this machine's
        limits (workers only where they are tuned)."""
        saved = rules.Settings.from_dict(state)
        lim = self.limits
        workers = self.settings.workers
        if self.config.workers and workers > 0:
            workers = max(1, min(saved.workers, max(workers, lim.cores - 1)))
        task = min(saved.task_bytes, max(lim.max_task_bytes, lim.leap_task_bytes or 0))
        self.settings = rules.Settings(
            prefetch_bytes=max(0, min(saved.prefetch_bytes, lim.memory_bytes // max(1, workers) - task)),
            concurrency=min(saved.concurrency, lim.max_concurrency),
            task_bytes=task,
            workers=workers,
        )
        self._leap = False  # (the checkpoint's settings were tuned already)
        self.write()

    def begin(self) -> None:
        """A pass starts: its epoch's window starts here."""
        self._wait = self._step = 0.0
        self._batches = 0
        self._window = self._epoch = self._mark()
        self._trial = self._settle_until = None  # (a new pass's first window pays for its start)

    def timed(self, batches: Iterable[Any]) -> Generator[Any, None, None]:
        """``batches``, timing the loop's wait for each and its time away, deciding every ``interval_s``."""
        clock = self._clock
        it = iter(batches)
        while True:
            asked = clock()
            try:
                item = next(it)
            except StopIteration:
                return
            got = clock()
            self._wait += got - asked
            self._batches += 1
            if self._batches == 1:  # the windows start at the first batch, not at the workers' start
                self._window = self._epoch = self._mark()
            yield item
            back = clock()
            self._step += back - got
            if self._settle_until is not None:
                if back >= self._settle_until:  # (reads planned before the change are through)
                    self._window, self._settle_until = self._mark(), None
            elif back - self._window[0] >= self.config.interval_s:
                self._decide(back)

    def _window_since(self, mark: tuple[float, list[int], float, float, int], now: float) -> rules.Window:
        at, before, wait, step, _ = mark
        return rules.Window.of(
            self._vector(), before, wall_s=now - at, wait_s=self._wait - wait, step_s=self._step - step
        )

    def _decide(self, now: float) -> None:
        settled = self._settled
        explore = settled is None or settled >= rules.REPROBE_WINDOWS
        window = self._window_since(self._window, now)
        decision = autoleap.decide(
            window, self.settings, self.limits, trial=self._trial, explore=explore, leap=self._leap
        )
        if decision.changes:
            self._leap = False  # (the first raise only: a leap, or the doubling rule where none fits)
        if decision.settle:
            self._settled = 0
        elif self._trial is not None and window.samples:  # the raise paid: explore on
            self._settled = None
        elif settled is not None:
            self._settled = settled + 1
        self._trial = decision.trial
        self._apply(decision, now, window.rate)
        self._window = self._mark()
        if decision.changes:  # the next window measures the new settings, not the switch to them
            self._settle_until = now + SETTLE_SHARE * self.config.interval_s

    def end_epoch(self) -> None:
        """A complete pass: more workers for the next one, if its measurements ask for them."""
        if not self.config.workers:
            return
        now = self._clock()
        window = self._window_since(self._epoch, now)
        batches = self._batches - self._epoch[4]
        decision = rules.decide_workers(
            window, self.settings, self.limits, batch_size=self._batch_size, batches=batches
        )
        self._apply(decision, now, window.rate)

    def _apply(self, decision: rules.Decision, now: float, rate: float) -> None:
        for knob, limit in decision.held:
            if self.held.get(knob) != limit:
                log.info("autotune: %s stays at its limit (%s)", knob, limit)
            self.held[knob] = limit
        if not decision.changes:
            return
        self.settings = decision.settings
        self.write()
        for change in decision.changes:
            log.info(change.line())
            at = {"at_s": round(now - self._began, 3), "samples_per_s": round(rate, 1)}
            self.changes.append({**change.as_dict(), **at})
        del self.changes[:-MAX_CHANGES]

    def report(self) -> dict[str, Any]:
        """The settings now, every change so far (knob, old, new, reason, seconds since the loader was
        built, samples/s of the window measured before it) and the limits that hold a knob back."""
        return {
            "settings": self.settings.as_dict(),
            "changes": list(self.changes),
            "held": dict(self.held),
            "limits": {
                "memory_bytes": self.limits.memory_bytes,  # (each stream's: the bound over streams)
                "streams": self.streams,
                "cores": self.limits.cores,
                "max_concurrency": self.limits.max_concurrency,
                "max_task_bytes": self.limits.max_task_bytes,
                "leap_task_bytes": self.limits.leap_task_bytes,
            },
        }


__all__ = ["AutotuneConfig", "Tuner", "config_of", "machine", "round_bytes", "starting"]
