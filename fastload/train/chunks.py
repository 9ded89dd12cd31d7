"""How ``fastload.DataLoader`` moves batches: a worker groups its samples into chunks of one batch each
(skips and errors carried as values), collates each chunk in the worker and sends the batch's bulk
through shared-memory slots (:mod:`fastload.train.shmbatch`)."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils.data

from fastload.errors import FastloadError
from fastload.s3 import runtime
from fastload.train.reading import SKIPPED
from fastload.train.shmbatch import stackable, worker_slots
from fastload.train.telemetry import SharedCounters, Tally, clock_ns


class Chunk:
    """One chunk of a worker's share: the samples that decoded, how many were skipped, or the error that
    ended the worker's share (carried as a value so it reaches the training process with its type)."""

    __slots__ = ("error", "samples", "skipped")

    def __init__(self, samples: list[Any], skipped: int, error: FastloadError | None = None) -> None:
        self.samples, self.skipped, self.error = samples, skipped, error


def chunks_of(samples: Iterator[Any], count: int, size: int, *, worker: int | None) -> Iterator[Chunk]:
    """``count`` samples (skipped ones as :data:`~fastload.train.reading.SKIPPED`) as chunks of ``size``:
    one per chunk of the rank's order however many survive decoding, so the DataLoader's turn-taking over
    workers stays aligned with the canonical order. In a worker (``worker`` not None) an error ends the
    share as a chunk carrying it."""
    for first in range(0, count, size):
        chunk: list[Any] = []
        skipped = 0
        try:
            for _ in range(min(size, count - first)):
                out = next(samples)
                if out is SKIPPED:
                    skipped += 1
                else:
                    chunk.append(out)
        except FastloadError as exc:
            if worker is None:
                raise
            add_note = getattr(exc, "add_note", None)  # Python >= 3.11
            if add_note is not None:
                add_note(f"(raised in DataLoader worker {worker}:\n{traceback.format_exc()})")
            close = getattr(samples, "close", None)
            if close is not None:
                close()
            yield Chunk([], 0, exc)
            return
        yield Chunk(chunk, skipped)


class ChunkCollate:
    """Collates one chunk in the worker: ``(batch, chunk size, skips, error, slot, s3)``; batch is None if
    all were skipped (or an error ended the worker's share). In a DataLoader worker the batch's bytes lists
    and small tensors travel through reusable shared memory (:mod:`fastload.train.shmbatch`); ``slot``
    describes where; ``s3`` is what the worker's S3 counters counted since its last batch
    (:meth:`~fastload.s3.stats.S3Stats.delta`, None in the training process or when nothing was), which the
    loader adds to the training process's ``fastload.s3_stats()``. The collate and hand-over times go to
    ``into`` (the dataset's telemetry block)."""

    def __init__(self, collate: Callable[[list[Any]], Any], into: SharedCounters | None = None) -> None:
        self.collate = collate
        self.into = into
        self._tally: Tally | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_tally": None}  # (a lock: each process makes its own)

    def __call__(
        self, chunk: Chunk
    ) -> tuple[Any, int, int, FastloadError | None, dict[str, Any] | None, dict[str, Any] | None]:
        size = len(chunk.samples) + chunk.skipped
        samples = chunk.samples
        in_worker = torch.utils.data.get_worker_info() is not None
        stacks: dict[str, list[Any]] = {}
        if in_worker and samples and self.collate is torch.utils.data.default_collate:
            # big same-shape tensors (decoded images) are stacked straight into a shared-memory slot
            stacks = {k: [s[k] for s in samples] for k in stackable(samples)}
            if stacks:
                samples = [{k: v for k, v in s.items() if k not in stacks} for s in samples]
        started = clock_ns()
        batch = self.collate(samples) if samples else None
        collated_at = clock_ns()
        if stacks:  # the fields in their order; the stacked ones filled in by pack
            collated: Any = batch
            batch = {k: None if k in stacks else collated[k] for k in chunk.samples[0]}
        slot = None
        if batch is not None and in_worker:
            batch, slot = worker_slots().pack(batch, stacks)
        s3 = runtime.current().stats.delta() if in_worker else None
        if self.into is not None and self.into.on:
            tally = self._tally
            if tally is None:
                tally = self._tally = Tally(self.into)
            if batch is not None:
                tally.stage("collate", collated_at - started, len(samples))
                if slot is not None:
                    tally.stage("handover", clock_ns() - collated_at)
            tally.flush()
        return batch, size, chunk.skipped, chunk.error, slot, s3
