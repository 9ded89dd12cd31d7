"""The consumer: iterate a loader like a training loop, timing the wait in ``next()`` and the step after it.

Throughput is the loader's steady production rate. Every batch carries the ``time.monotonic()`` at which
its collate finished (``made``; the clock is system-wide, so worker processes share it). The steady
window opens when the first batch reaches the consumer (worker start-up and the first batch's latency lie
before it) and counts only batches *made* inside it: batches that workers made and buffered while the
first one was awaited would otherwise arrive at once and inflate the rate. A measurement ends when the
window has lasted ``budget_s`` and holds ``min_batches``, or the epoch ends (then the window closes at the
last batch's delivery). The first batch's latency is reported on its own.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

Step = Callable[[dict[str, Any]], None]


@dataclass
class Run:
    """One measurement of one variant at one ``num_workers``; times in seconds."""

    variant: str
    workers: int
    rep: int
    samples: int = 0
    batches: int = 0
    nbytes: int = 0
    first_batch_s: float = 0.0
    steady_s: float = 0.0
    steady_samples: int = 0
    steady_batches: int = 0
    steady_bytes: int = 0
    wait_s: float = 0.0
    compute_s: float = 0.0
    wall_s: float = 0.0
    complete: bool = False
    unique_keys: int | None = None
    error: str | None = None
    waits: list[float] = field(default_factory=list)
    computes: list[float] = field(default_factory=list)

    def _steady(self) -> bool:
        return self.steady_s > 0 and self.steady_batches >= 1

    @property
    def samples_per_s(self) -> float:
        if self._steady():
            return self.steady_samples / self.steady_s
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def batches_per_s(self) -> float:
        if self._steady():
            return self.steady_batches / self.steady_s
        return self.batches / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        if self._steady():
            return self.steady_bytes / self.steady_s / 1e6
        return self.nbytes / self.wall_s / 1e6 if self.wall_s > 0 else 0.0

    @property
    def wait_share(self) -> float:
        """Share of the training loop's wall time spent waiting in ``next()``, first step excluded."""
        waits, computes = self.waits[1:], self.computes[1:]
        total = sum(waits) + sum(computes)
        return sum(waits) / total if total > 0 else 0.0

    def figures(self) -> dict[str, Any]:
        """Every figure as plain JSON values (the per-step timeline only when recorded)."""
        out: dict[str, Any] = {
            "variant": self.variant,
            "workers": self.workers,
            "rep": self.rep,
            "samples": self.samples,
            "batches": self.batches,
            "bytes": self.nbytes,
            "first_batch_s": round(self.first_batch_s, 6),
            "steady_s": round(self.steady_s, 6),
            "steady_samples": self.steady_samples,
            "samples_per_s": round(self.samples_per_s, 3),
            "batches_per_s": round(self.batches_per_s, 3),
            "mb_per_s": round(self.mb_per_s, 4),
            "wall_s": round(self.wall_s, 6),
            "complete": self.complete,
            "unique_keys": self.unique_keys,
            "error": self.error,
        }
        if self.computes:
            out["wait_share"] = round(self.wait_share, 4)
            out["wait_s"] = round(self.wait_s, 6)
            out["compute_s"] = round(self.compute_s, 6)
            out["timeline"] = [
                [round(w, 6), round(c, 6)] for w, c in zip(self.waits, self.computes, strict=True)
            ]
        return out


def _close(it: Any) -> None:
    close = getattr(it, "close", None)  # a generator (fastload.DataLoader): closing ends the inner iterator
    if close is not None:
        close()
    shutdown = getattr(it, "_shutdown_workers", None)  # torch's multi-process iterator
    if shutdown is not None:
        shutdown()


def consume(
    loader: Iterable[dict[str, Any]],
    run: Run,
    *,
    budget_s: float,
    min_batches: int = 2,
    step: Step | None = None,
    keep_keys: bool = False,
    max_s: float | None = None,
) -> Run:
    """Iterate ``loader`` into ``run`` (see the module docstring); ``step(batch)`` after each batch is timed
    as compute. ``keep_keys`` counts distinct ``__key__`` values (for complete epochs). ``max_s`` stops a
    very slow loader once its window holds one batch."""
    keys: set[str] | None = set() if keep_keys else None
    clock = time.monotonic
    began = clock()
    it = iter(loader)
    opened: float | None = None
    last = began
    try:
        while True:
            t0 = clock()
            try:
                batch = next(it)
            except StopIteration:
                run.complete = True
                break
            t1 = clock()
            size, nbytes = int(batch["size"]), int(batch["nbytes"])
            made = float(batch.get("made", t1))
            if keys is not None:
                keys.update(batch["__key__"])
            if step is not None:
                step(batch)
            t2 = clock()
            last = t1
            run.batches += 1
            run.samples += size
            run.nbytes += nbytes
            if step is not None:
                run.waits.append(t1 - t0)
                run.computes.append(t2 - t1)
                run.wait_s += t1 - t0
                run.compute_s += t2 - t1
            if opened is None:
                opened = t1
                run.first_batch_s = t1 - began
            elif made > opened:
                run.steady_batches += 1
                run.steady_samples += size
                run.steady_bytes += nbytes
                run.steady_s = max(run.steady_s, made - opened)
            if run.steady_batches >= min_batches and run.steady_s >= budget_s:
                break
            if max_s is not None and t2 - began >= max_s and run.steady_batches >= 1:
                break
    finally:
        run.wall_s = clock() - began
        _close(it)
        del it
        gc.collect()
    if run.complete and opened is not None and run.steady_batches:
        run.steady_s = max(run.steady_s, last - opened)
    if keys is not None:
        run.unique_keys = len(keys)
    return run
