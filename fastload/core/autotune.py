"""The rules of a loader that tunes itself, and of ``fastload bench``'s advice: measured figures and the
settings they were measured with in, new settings and the reason for each change out. Pure.

Shared with :mod:`fastload.core.advice` (which re-exports them):

- **Loader-bound** (:func:`loader_bound`): the training loop waits for data at least
  ``LOADER_BOUND_SHARE`` (10%) of its time. Nothing is tuned otherwise: the loader keeps up.
- **Workers** (:func:`covers`, :func:`demand`): a setting covers the step when its workers deliver
  ``HEADROOM`` (20%) more samples/s than the step consumes (``batch_size / step_s``).

The live tuner's rules, applied to one window of measurements (:class:`Window`) while loader-bound:

- **Throttled** (503/SlowDown in the window): halve ``concurrency``; nothing is raised in that window.
- **CPU-bound**: the workers spend at least ``CPU_BOUND_SHARE`` (75%) of their wall time parsing,
  decoding, mapping and collating. Deeper prefetch would not help; at the next epoch boundary
  (:func:`decide_workers`) ``workers`` grows to the fewest that would :func:`covers` the step, by the
  measured rate per worker, within ``Limits.cores`` (one core left for the loop) and memory.
- **I/O-bound** (otherwise: the workers wait for their fetches). The knob that holds fetches back is
  raised, doubling: ``prefetch_bytes`` when it holds fewer than ``concurrency`` read tasks, else
  ``concurrency`` (read tasks fetched at once per worker, up to ``Limits.max_concurrency``), with
  ``prefetch_bytes`` raised to hold them; and ``task_bytes`` while a fetch's first byte is at least
  ``LATENCY_BOUND_SHARE`` (30%) of its time (each request mostly waits: bigger reads amortise that), up to
  ``Limits.max_task_bytes``. After a raise that gained ``FAST_GAIN`` (1.5x) samples/s or more, the next
  one multiplies by 4 instead of 2.
- **No gain, no raise.** A raise is a trial (:class:`Trial`), judged by the window after it, still
  loader-bound, against the window before it: ``MIN_GAIN`` (10%) more samples/s or better, the tuner
  goes on; within 10% either way, it keeps the raise and settles (the caller passes ``explore=False``);
  10% fewer or worse in two windows running, the I/O settings go back to what they were and it settles
  there. Settled, it tries one raise again after ``REPROBE_WINDOWS`` (20) windows. More concurrency than
  a store or a loaded machine can serve costs throughput; this finds where it stops paying.

Memory: every change keeps ``workers x (prefetch_bytes + task_bytes) <= Limits.memory_bytes`` (the bytes
read ahead and the read in use in each worker, :class:`~fastload.train.options.PrefetchConfig`'s bound).
A knob at its limit is left there and the limit named once in :attr:`Decision.held`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from fastload.core import telemetry as counters

LOADER_BOUND_SHARE = 0.10
HEADROOM = 1.2
DOMINANT_SHARE = 0.40
CPU_BOUND_SHARE = 0.75
LATENCY_BOUND_SHARE = 0.30
MIN_GAIN = 0.10
FAST_GAIN = 1.5
REPROBE_WINDOWS = 20
IO_KNOBS = ("prefetch_bytes", "concurrency", "task_bytes")
MIB = 1 << 20
CPU_STAGES = ("parse", "decode", "map", "collate", "handover")


def default_task_bytes(prefetch_bytes: int) -> int:
    """The read task size for ``prefetch_bytes`` read ahead: a quarter of it, between 1 and 16 MiB (16 MiB
    without prefetch: nothing is held ahead, and local shards stream sample by sample)."""
    return 16 * MIB if prefetch_bytes == 0 else max(MIB, min(16 * MIB, prefetch_bytes // 4))


def loader_bound(wait_share: float) -> bool:
    """Whether a loop waiting ``wait_share`` of its time for data is held back by its loader."""
    return wait_share >= LOADER_BOUND_SHARE


def demand(batch_size: int, step_s: float) -> float | None:
    """Samples/s the training step consumes (None when there is no step)."""
    return batch_size / step_s if step_s > 0 else None


def serial_wait_share(rate: float, needed: float) -> float:
    """The share of the loop's time spent loading with 0 workers (loading in series with the step)."""
    return needed / (needed + rate) if rate > 0 else 1.0


def covers(workers: int, rate: float, needed: float) -> bool:
    """Whether ``workers`` measured at ``rate`` would keep a step consuming ``needed`` samples/s fed: with
    ``HEADROOM`` to spare, or at 0 workers a loop waiting under ``LOADER_BOUND_SHARE``."""
    if workers == 0:
        return serial_wait_share(rate, needed) < LOADER_BOUND_SHARE
    return rate >= needed * HEADROOM


def dominant_stage(shares: Mapping[str, float]) -> str | None:
    """The stage holding at least ``DOMINANT_SHARE`` of the time, if one does."""
    if not shares:
        return None
    stage = max(shares, key=lambda s: shares[s])
    return stage if shares[stage] >= DOMINANT_SHARE else None


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What the tuner adjusts. ``prefetch_bytes``: read tasks' bytes fetched ahead of the consumer in each
    worker; ``concurrency``: read tasks fetched at once in each worker (each one or more ranged GETs);
    ``task_bytes``: the size a read task is cut at; ``workers``: DataLoader workers (changed between
    epochs only)."""

    prefetch_bytes: int
    concurrency: int
    task_bytes: int
    workers: int

    def __post_init__(self) -> None:
        if self.prefetch_bytes < 0 or self.concurrency < 1 or self.task_bytes < 1 or self.workers < 0:
            raise ValueError(
                f"{self}: need prefetch_bytes >= 0, concurrency >= 1, task_bytes >= 1, workers >= 0"
            )

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> Settings:
        return cls(**{k: int(state[k]) for k in ("prefetch_bytes", "concurrency", "task_bytes", "workers")})


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Bounds no setting crosses: ``memory_bytes`` for ``workers x (prefetch_bytes + task_bytes)``;
    ``cores`` of this machine (``workers <= cores - 1``, and at least the workers started with);
    ``max_concurrency`` read tasks fetched at once per worker; ``max_task_bytes`` a read task;
    ``leap_task_bytes`` a read task after :mod:`fastload.core.autoleap`'s leap (whose parts are fetched
    at once: None, ``max_task_bytes``)."""

    memory_bytes: int
    cores: int
    max_concurrency: int = 64
    max_task_bytes: int = 64 * MIB
    leap_task_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.memory_bytes < 1 or self.cores < 1 or self.max_concurrency < 1 or self.max_task_bytes < 1:
            raise ValueError(f"{self}: every limit must be >= 1")


@dataclass(frozen=True, kw_only=True)
class Window:
    """What one stretch of a run measured: its wall time; the loop's wait and step; summed over the
    workers and their threads, fetch seconds, calls and bytes and the CPU stages' seconds; the S3
    first-byte median (None: not measured), 503s, and samples delivered."""

    wall_s: float
    wait_s: float
    step_s: float
    fetch_s: float = 0.0
    fetches: int = 0
    fetch_bytes: int = 0
    busy_s: float = 0.0
    first_byte_s: float | None = None
    throttles: int = 0
    samples: int = 0

    @property
    def wait_share(self) -> float:
        total = self.wait_s + self.step_s
        return self.wait_s / total if total > 0 else 0.0

    @property
    def rate(self) -> float:
        """Samples/s delivered."""
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0

    @classmethod
    def of(
        cls, now: Sequence[int], before: Sequence[int], *, wall_s: float, wait_s: float, step_s: float
    ) -> Window:
        """The window between two :mod:`fastload.core.telemetry` vectors, with the loop's own wait and
        step (timed by the caller)."""

        def cell(i: int) -> int:
            return now[i] - before[i]

        def secs(stage: str) -> float:
            return cell(counters.stage_cell(stage) + 2) / 1e9

        fetch = counters.stage_cell("fetch")
        d = [a - b for a, b in zip(now, before, strict=True)]
        first_byte = counters.quantile(d, "first_byte_ns", 0.5)
        return cls(
            wall_s=wall_s,
            wait_s=wait_s,
            step_s=step_s,
            fetch_s=secs("fetch"),
            fetches=cell(fetch),
            fetch_bytes=cell(fetch + 1),
            busy_s=sum(secs(s) for s in CPU_STAGES),
            first_byte_s=None if first_byte is None else first_byte / 1e9,
            throttles=cell(counters.counter_cell("s3_throttles")),
            samples=cell(counters.counter_cell("samples")),
        )


@dataclass(frozen=True)
class Change:
    """One setting changed, from what to what, and why."""

    knob: str
    old: int
    new: int
    reason: str

    def line(self) -> str:
        old, new = _show(self.knob, self.old), _show(self.knob, self.new)
        return f"autotune: {self.knob} {old} -> {new}: {self.reason}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Trial:
    """A raise being tried: the settings before it and the samples/s they delivered. ``kind``: a
    doubling ``"raise"``, or :mod:`fastload.core.autoleap`'s ``"leap"``, ``"hold"`` or ``"trim"`` (whose
    ``rate`` is the best since the leap and ``floor`` the settings leapt from)."""

    before: Settings
    rate: float
    strikes: int = 0  # windows that measured a loss so far (one more is asked for before undoing it)
    kind: str = "raise"
    floor: Settings | None = None


@dataclass(frozen=True)
class Decision:
    """The settings to use next, the changes that lead there (none: keep them), the limits that held
    a knob back (``held``: knob -> which limit), the raise now on trial (pass it to the next
    :func:`decide`) and whether to stop raising (``settle``: the last raise gained nothing)."""

    settings: Settings
    changes: tuple[Change, ...] = ()
    held: tuple[tuple[str, str], ...] = ()
    trial: Trial | None = None
    settle: bool = False


def _show(knob: str, value: int) -> str:
    return f"{value / MIB:g} MiB" if knob.endswith("_bytes") else str(value)


def cpu_share(window: Window, workers: int) -> float:
    """The share of the workers' wall time spent in CPU stages (parse, decode, map, collate, hand-over)."""
    if window.wall_s <= 0:
        return 0.0
    return window.busy_s / (window.wall_s * max(1, workers))


def latency_bound(window: Window) -> bool:
    """Whether a fetch's first byte is at least ``LATENCY_BOUND_SHARE`` of its time (each request mostly
    waits: bigger reads amortise that)."""
    fetch_s = window.fetch_s / window.fetches if window.fetches else 0.0
    first = window.first_byte_s
    return first is not None and fetch_s > 0 and first >= LATENCY_BOUND_SHARE * fetch_s


def _memory_room(settings: Settings, limits: Limits) -> int:
    """The most ``prefetch_bytes`` may be with this ``task_bytes`` and ``workers``."""
    return limits.memory_bytes // max(1, settings.workers) - settings.task_bytes


def decide(
    window: Window, settings: Settings, limits: Limits, *, trial: Trial | None = None, explore: bool = True
) -> Decision:
    """The settings for the next window (see the module docstring for the rules). ``trial``: the last
    decision's; ``explore``: False while settled (nothing is raised)."""
    if window.throttles > 0:
        if settings.concurrency == 1:
            return Decision(settings)
        new = max(1, settings.concurrency // 2)
        why = f"the store throttled ({window.throttles} 503/SlowDown responses in {window.wall_s:.1f}s)"
        return Decision(
            replace(settings, concurrency=new), (Change("concurrency", settings.concurrency, new, why),)
        )
    if window.samples == 0 or not loader_bound(window.wait_share):
        return Decision(settings)
    if trial is not None and window.rate < trial.rate * (1 + MIN_GAIN):
        if window.rate >= trial.rate * (1 - MIN_GAIN):  # neither gain nor loss: keep it, raise no more
            return Decision(settings, settle=True)
        if trial.strikes == 0:  # a loss: measured once more before undoing (one slow window is noise)
            return Decision(settings, trial=replace(trial, strikes=1))
        why = (
            f"the last raise cost throughput ({window.rate:,.0f} samples/s against {trial.rate:,.0f} before)"
        )
        back = replace(settings, **{k: getattr(trial.before, k) for k in IO_KNOBS})
        undone = tuple(
            Change(k, getattr(settings, k), getattr(back, k), why)
            for k in IO_KNOBS
            if getattr(settings, k) != getattr(back, k)
        )
        return Decision(back, undone, settle=True)
    if not explore:
        return Decision(settings)
    busy = cpu_share(window, settings.workers)
    if busy >= CPU_BOUND_SHARE:
        return Decision(settings)  # more workers, at the next epoch boundary (decide_workers)
    waiting = f"the loop waits {window.wait_share:.0%} of its time and the workers are {busy:.0%} busy"
    # the last raise paid well: the next one goes further (as a TCP slow start does)
    step = 4 if trial is not None and window.rate >= FAST_GAIN * trial.rate else 2
    changes: list[Change] = []
    held: list[tuple[str, str]] = []
    now = settings
    if settings.prefetch_bytes >= settings.concurrency * settings.task_bytes:
        if settings.concurrency >= limits.max_concurrency:
            held.append(("concurrency", f"max_concurrency={limits.max_concurrency}"))
        else:
            new = min(limits.max_concurrency, step * settings.concurrency)
            changes.append(
                Change("concurrency", settings.concurrency, new, f"{waiting}: more fetches at once")
            )
            now = replace(now, concurrency=new)
    first_byte = window.first_byte_s
    if first_byte is not None and latency_bound(window) and now.task_bytes < limits.max_task_bytes:
        fetch_s = window.fetch_s / window.fetches
        new = min(limits.max_task_bytes, step * now.task_bytes)
        ahead = max(now.prefetch_bytes, now.concurrency * new)  # what prefetch will hold, at least
        if ahead + new <= limits.memory_bytes // max(1, now.workers):
            why = (
                f"{waiting}; a fetch's first byte ({first_byte * 1e3:.0f} ms) is "
                f"{first_byte / fetch_s:.0%} of its time: bigger reads"
            )
            changes.append(Change("task_bytes", now.task_bytes, new, why))
            now = replace(now, task_bytes=new)
        else:
            held.append(("task_bytes", f"memory_bytes={limits.memory_bytes}"))
    wanted = 2 * now.concurrency * now.task_bytes
    if now.prefetch_bytes < wanted:
        new = min(wanted, _memory_room(now, limits))
        if new > now.prefetch_bytes:
            task = _show("task_bytes", now.task_bytes)
            why = f"{waiting}: room for {now.concurrency} read tasks of {task} ahead"
            changes.append(Change("prefetch_bytes", now.prefetch_bytes, new, why))
            now = replace(now, prefetch_bytes=new)
        if new < wanted:
            held.append(("prefetch_bytes", f"memory_bytes={limits.memory_bytes}"))
    return Decision(now, tuple(changes), tuple(held), Trial(settings, window.rate) if changes else None)


def decide_workers(
    window: Window, settings: Settings, limits: Limits, *, batch_size: int, batches: int
) -> Decision:
    """At an epoch boundary, from the last epoch's ``window`` (``batches`` steps of ``batch_size``): more
    workers when the loop waited for CPU-bound workers: the fewest that would :func:`covers` the step
    at the measured samples/s per worker, within the cores and memory."""
    workers = settings.workers
    if workers < 1 or window.samples == 0 or batches == 0 or not loader_bound(window.wait_share):
        return Decision(settings)
    if cpu_share(window, workers) < CPU_BOUND_SHARE:
        return Decision(settings)
    needed = demand(batch_size, window.step_s / batches)
    rate = window.samples / window.wall_s if window.wall_s > 0 else 0.0
    if needed is None or rate <= 0:
        return Decision(settings)
    want = max(workers + 1, math.ceil(workers * needed * HEADROOM / rate))
    most = min(
        max(workers, limits.cores - 1),
        limits.memory_bytes // max(1, settings.prefetch_bytes + settings.task_bytes),
    )
    new = min(want, most)
    if new <= workers:
        return Decision(
            settings, held=(("workers", f"cores={limits.cores}, memory_bytes={limits.memory_bytes}"),)
        )
    why = (
        f"the loop waited {window.wait_share:.0%} of the epoch for CPU-bound workers "
        f"({cpu_share(window, workers):.0%} busy; {rate:,.0f} samples/s against {needed:,.0f} the step takes)"
    )
    return Decision(replace(settings, workers=new), (Change("workers", workers, new, why),))


__all__ = [
    "CPU_BOUND_SHARE",
    "DOMINANT_SHARE",
    "FAST_GAIN",
    "HEADROOM",
    "LATENCY_BOUND_SHARE",
    "LOADER_BOUND_SHARE",
    "MIN_GAIN",
    "REPROBE_WINDOWS",
    "Change",
    "Decision",
    "Limits",
    "Settings",
    "Trial",
    "Window",
    "covers",
    "cpu_share",
    "decide",
    "decide_workers",
    "default_task_bytes",
    "demand",
    "dominant_stage",
    "latency_bound",
    "loader_bound",
    "serial_wait_share",
]
