"""Every ``telemetry_every`` steps of a :class:`~fastload.train.feed.Loader`: one record of the pipeline's
telemetry, compared across ranks and handed to the exporters.

With a process group (``torch.distributed`` initialised, more than one rank) each rank's counters of the
last window go through one all-gather of a small int64 tensor (a :mod:`fastload.core.telemetry` vector,
~4 KiB); every rank then finds the same stragglers (:func:`~fastload.core.telemetry.straggler_causes`)
and a straggler names itself and its cause in the log (logger ``fastload.telemetry``) and in the record.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import torch
import torch.distributed as dist

from fastload.core import telemetry as core
from fastload.errors import ConfigError
from fastload.train.exporters import Exporter, exporters_from

DEFAULT_EVERY = 100
log = logging.getLogger("fastload.telemetry")


def launcher_rank() -> int:
    """This process's rank as its launcher set it (``RANK``; 0 when unset or not a number)."""
    try:
        return max(0, int(os.environ.get("RANK", "0")))
    except ValueError:
        return 0


class Publisher:
    """Publishes a loader's telemetry every ``every`` steps to ``exporters``, comparing ranks on the
    default process group (or ``group``) when there is one."""

    def __init__(self, exporters: list[Exporter], every: int, *, group: Any = None) -> None:
        if every < 1:
            raise ConfigError(f"telemetry_every={every} must be >= 1 (steps between records)")
        self.exporters = exporters
        self.every = every
        self.group = group
        self.stragglers: list[dict[str, Any]] = []  # the last window's
        self.records = 0
        self.spent_s = 0.0  # time in publish(), all-gather and exporters included
        self._before = core.zeros()
        self._at = time.monotonic()
        self._steps = 0
        self._changes = 0  # a tuned loader's changes already recorded

    @classmethod
    def of(cls, loader: Any, telemetry: Any, every: int | None) -> Publisher | None:
        """The publisher a loader's ``telemetry=``/``telemetry_every=`` ask for (None: neither given)."""
        if telemetry is None and every is None:
            return None
        return cls(exporters_from(telemetry), DEFAULT_EVERY if every is None else every)

    def publish(self, loader: Any) -> dict[str, Any]:
        """One record: this rank's summary, the window's rate and wait share, stragglers across ranks."""
        began = time.perf_counter()
        now_vec = loader.telemetry_vector()
        window = [a - b for a, b in zip(now_vec, self._before, strict=True)]
        for name in core.MAXED:
            window[core.counter_cell(name)] = now_vec[core.counter_cell(name)]
        now = time.monotonic()
        elapsed, self._at = now - self._at, now
        steps = loader.stats.batches
        window_steps, self._steps = steps - self._steps, steps
        self._before = now_vec
        rank, world, windows = self._gather(window)
        rows = [core.window_row(w, core.zeros()) for w in windows]
        found = core.straggler_causes(rows)
        waits = [r["wait_s"] for r in rows]
        self.stragglers = [
            {
                "rank": r,
                "cause": cause,
                "wait_s": waits[r],
                "others_median_wait_s": core.others_median(waits, r),
                "step": steps,
            }
            for r, cause in found
        ]
        for s in self.stragglers:
            if s["rank"] == rank:
                log.warning(
                    "fastload telemetry: rank %d is a straggler: it waited %.2fs for data in the last %d "
                    "steps against a median %.2fs on the other %d ranks; cause: %s",
                    rank,
                    s["wait_s"],
                    window_steps,
                    s["others_median_wait_s"],
                    world - 1,
                    s["cause"],
                )
        mine = rows[rank if world > 1 else 0]
        summary = core.summary(window)
        counters = summary["counters"]
        record = {
            "time": time.time(),
            "rank": rank,
            "world": world,
            "step": steps,
            "window_s": elapsed,
            "window_steps": window_steps,
            "samples_per_s": counters["samples"] / elapsed if elapsed > 0 else 0.0,
            "wait_share": summary["wait_share"],
            "slowest_stage": summary["slowest_stage"],
            "s3_errors": counters["s3_retries"] + counters["s3_failures"],
            "s3_throttles": counters["s3_throttles"],
            "wait_s": mine["wait_s"],
            "stragglers": self.stragglers,
            "window": summary,
            "total": core.summary(now_vec),
        }
        tuner = getattr(getattr(loader, "dataloader", loader), "tuner", None)
        if tuner is not None:  # a tuned loader: its settings now and the changes in this window
            record["autotune"] = {
                "settings": tuner.settings.as_dict(),
                "changes": tuner.changes[self._changes :],
            }
            self._changes = len(tuner.changes)
        for exporter in self.exporters:
            exporter.export(record)
        self.records += 1
        self.spent_s += time.perf_counter() - began
        return record

    def _gather(self, window: list[int]) -> tuple[int, int, list[list[int]]]:
        """``(this rank, ranks compared, each rank's window)``. Without a process group nothing is
        compared; the rank is the launcher's (``RANK``, as torchrun sets it), so the ranks of a job that
        never joins one still write a file (segment log) each, not all rank 0's."""
        if not (dist.is_available() and dist.is_initialized()):
            return launcher_rank(), 1, [window]
        world = dist.get_world_size(self.group)
        rank = dist.get_rank(self.group)
        if world == 1:
            return 0, 1, [window]
        device = "cuda" if dist.get_backend(self.group) == "nccl" else "cpu"
        mine = torch.tensor(window, dtype=torch.int64, device=device)
        out = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(out, mine, group=self.group)
        return rank, world, [t.cpu().tolist() for t in out]

    def close(self) -> None:
        for exporter in self.exporters:
            exporter.close()
