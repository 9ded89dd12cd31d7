"""The consumer: iterate a loader like a training loop, timing the wait in ``next()`` and the step after it.

Throughput is the loader's production rate, measured per producer. Every batch carries the
``time.monotonic()`` at which its collate finished (``made``; the clock is system-wide, so DataLoader
worker processes share it) and which worker made it. For each worker, the time it spent on batch k is
``made[k] - start[k]`` where ``start[k]`` is when it could begin: after its previous batch, and once one
of its ``PREFETCH`` slots was free (batch ``k - PREFETCH`` delivered; in the main process, once ``next()``
was called). The rate is the sum over workers of (samples after each worker's first batch) / (that busy
time). Worker start-up and the first batch's latency are thus left out (the latter is reported on its
own), batches buffered while the first was awaited do not inflate the figure, and workers that produce in
lockstep bursts are measured over whole periods.

A measurement ends when every worker seen has made two batches and ``budget_s`` has passed since the first
batch arrived, or the epoch ends, or ``max_s`` has passed (then the rate is samples / wall time if no
worker made two batches).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from fastload.core.gpuutil import GpuTimeline
from fastload.train.torchprivate import shut_down_workers

Step = Callable[[dict[str, Any]], None]
PREFETCH = 2
"""Batches a DataLoader worker may hold ahead of delivery (torch's default ``prefetch_factor``)."""


@dataclass(frozen=True)
class Arrival:
    """One batch as the consumer saw it: when it asked, when it got it, who made it and when."""

    asked: float
    delivered: float
    made: float
    worker: int
    size: int
    nbytes: int


def production_rate(arrivals: list[Arrival]) -> tuple[float, float, float] | None:
    """``(samples/s, bytes/s, batches/s)`` summed over workers (see the module docstring), or None when no
    worker made two batches."""
    by_worker: dict[int, list[Arrival]] = {}
    for a in arrivals:
        by_worker.setdefault(a.worker, []).append(a)
    samples = nbytes = batches = 0.0
    measured = False
    for worker, seq in by_worker.items():
        busy = 0.0
        s = b = n = 0
        for k in range(1, len(seq)):
            if worker < 0:
                start = max(seq[k - 1].made, seq[k].asked)
            else:
                freed = seq[k - PREFETCH].delivered if k >= PREFETCH else float("-inf")
                start = max(seq[k - 1].made, freed)
            busy += max(0.0, seq[k].made - start)
            s, b, n = s + seq[k].size, b + seq[k].nbytes, n + 1
        if n and busy > 0:
            samples, nbytes, batches = samples + s / busy, nbytes + b / busy, batches + n / busy
            measured = True
    return (samples, nbytes, batches) if measured else None


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
    wait_s: float = 0.0
    compute_s: float = 0.0
    wall_s: float = 0.0
    complete: bool = False
    unique_keys: int | None = None
    error: str | None = None
    rate: tuple[float, float, float] | None = None
    first_size: int = 0
    first_nbytes: int = 0
    loader_stats: dict[str, Any] | None = None
    bad_samples: int = 0  # did not decode: named (the first few in ``bad``), left out of the figures
    bad: list[str] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    computes: list[float] = field(default_factory=list)
    gpu: GpuTimeline | None = None  # NVML utilisation during the training loop (bench --model)

    def _per_s(self, total: float, first: float, index: int) -> float:
        """Loader alone: the production rate (``rate[index]``). With a step: per second of the loop after its
        first step (as ``wait_share``), or of wall time when there was only one step."""
        if not self.computes:
            if self.rate is not None:
                return self.rate[index]
            return total / self.wall_s if self.wall_s > 0 else 0.0
        loop_s = sum(self.waits[1:]) + sum(self.computes[1:])
        if loop_s > 0:
            return (total - first) / loop_s
        return total / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def samples_per_s(self) -> float:
        return self._per_s(self.samples, self.first_size, 0)

    @property
    def mb_per_s(self) -> float:
        return self._per_s(self.nbytes, self.first_nbytes, 1) / 1e6

    @property
    def batches_per_s(self) -> float:
        return self._per_s(self.batches, 1, 2)

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
            "samples_per_s": round(self.samples_per_s, 3),
            "batches_per_s": round(self.batches_per_s, 3),
            "mb_per_s": round(self.mb_per_s, 4),
            "wall_s": round(self.wall_s, 6),
            "complete": self.complete,
            "unique_keys": self.unique_keys,
            "bad_samples": self.bad_samples,
            "bad": self.bad,
            "error": self.error,
        }
        if self.computes:
            out["wait_share"] = round(self.wait_share, 4)
            out["wait_s"] = round(self.wait_s, 6)
            out["compute_s"] = round(self.compute_s, 6)
            if self.loader_stats is not None:
                out["loader_stats"] = self.loader_stats
            out["timeline"] = [
                [round(w, 6), round(c, 6)] for w, c in zip(self.waits, self.computes, strict=True)
            ]
        if self.gpu is not None:
            out["gpu"] = self.gpu.as_dict()
        return out


def _close(it: Any) -> None:
    close = getattr(it, "close", None)  # a generator (fastload.DataLoader): closing ends the inner iterator
    if close is not None:
        close()
    shut_down_workers(it)  # torch's multi-process iterator


def consume(
    loader: Iterable[dict[str, Any]],
    run: Run,
    *,
    budget_s: float,
    step: Step | None = None,
    keep_keys: bool = False,
    max_s: float | None = None,
) -> Run:
    """Iterate ``loader`` into ``run`` (see the module docstring); ``step(batch)`` after each batch is timed
    as compute. ``keep_keys`` counts distinct ``__key__`` values (for complete epochs)."""
    keys: set[str] | None = set() if keep_keys else None
    clock = time.monotonic
    began = clock()
    arrivals: list[Arrival] = []
    made_by: dict[int, int] = {}
    it = iter(loader)
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
            worker = int(batch.get("worker", -1))
            arrivals.append(Arrival(t0, t1, float(batch.get("made", t1)), worker, size, nbytes))
            made_by[worker] = made_by.get(worker, 0) + 1
            bad = batch.get("bad") or []
            run.bad_samples += len(bad)
            run.bad.extend(bad[: max(0, 3 - len(run.bad))])
            if keys is not None:
                keys.update(batch["__key__"])
            if step is not None:
                step(batch)
            t2 = clock()
            run.batches += 1
            run.samples += size
            run.nbytes += nbytes
            if step is not None:
                run.waits.append(t1 - t0)
                run.computes.append(t2 - t1)
                run.wait_s += t1 - t0
                run.compute_s += t2 - t1
            if run.batches == 1:
                run.first_batch_s = t1 - began
                run.first_size, run.first_nbytes = size, nbytes
            if min(made_by.values()) >= 2 and t2 - (began + run.first_batch_s) >= budget_s:
                break
            if max_s is not None and t2 - began >= max_s:
                break
    finally:
        run.wall_s = clock() - began
        _close(it)
    run.rate = production_rate(arrivals)
    if keys is not None:
        run.unique_keys = len(keys)
    return run
