"""Reading one worker's share of a ``fastload.Mix`` epoch: each source's samples at the worker's positions,
through that source's own prefetching pipeline (:func:`~fastload.train.reading.read_samples`), interleaved
in position order by the schedule. Per sample this adds one ``next()`` on the chosen source's stream."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator

import numpy as np

from fastload.core.mix import Ints, Schedule, worker_mask
from fastload.core.refs import Refs
from fastload.errors import ConfigError
from fastload.train.dataset import ShardDataset
from fastload.train.mixplan import MixPlan
from fastload.train.position import Iteration, SkippedSample
from fastload.train.reading import read_samples
from fastload.train.telemetry import Tally

BLOCK_DRAWS = 1 << 20  # a source's references made (and read by one pipeline) at a time


def interleave(
    schedule: Schedule,
    blocks: Iterator[Ints],
    streams: list[Generator[object, None, None]],
    progress: Iteration,
) -> Generator[object, None, None]:
    """The samples at the positions of ``blocks``, each from the stream of the source chosen there;
    ``progress.consumed`` counts the positions passed."""
    pulls = [stream.__next__ for stream in streams]
    for block in blocks:
        for s in schedule.choices(block).tolist():
            progress.consumed += 1
            yield pulls[s]()


def source_samples(
    d: ShardDataset,
    name: str,
    plan: MixPlan,
    s: int,
    *,
    start: int,
    first: int,
    worker: int,
    workers: int,
    chunk: int,
    next_pass: Callable[[int], Refs],
    report: Callable[[SkippedSample], None] | None = None,
    tally: Tally | None = None,
    tuning: Callable[[], tuple[int, ...] | None] | None = None,
) -> Generator[object, None, None]:
    """Source ``s``'s samples (named ``__source__``) at the positions from ``first`` on that worker
    ``worker`` of ``workers`` reads (chunks of ``chunk`` from ``start`` in turn), in order; SKIPPED marks a
    sample left out on error (named to ``report``). ``next_pass(p)``: the rank's order of the source's pass
    ``p``. ``tally``: given each read task's stage times. ``tuning``: a tuned loader's settings, which every
    source's pipeline follows (:func:`~fastload.train.reading.read_samples`)."""
    sched = plan.schedule
    k = int(sched.counts(first)[s])
    stop = None if plan.end is None else int(sched.counts(plan.end)[s])
    piece, piece_at, passes = plan.firsts[s], int(plan.drawn[s]), plan.passes[s]  # piece_at: its 1st draw
    while stop is None or k < stop:
        if k >= piece_at + len(piece):
            piece_at += len(piece)
            passes += 1
            piece = next_pass(passes)
            if not len(piece):
                raise ConfigError(f"source {name!r} has no samples for this rank in its pass {passes}")
            continue
        upto = piece_at + len(piece) if stop is None else min(stop, piece_at + len(piece))
        ks = np.arange(k, min(upto, k + BLOCK_DRAWS), dtype=np.int64)
        k = int(ks[-1]) + 1
        mine = worker_mask(sched.positions(s, ks), start=start, worker=worker, workers=workers, chunk=chunk)
        progress = Iteration(plan.epoch, start, None, worker, workers, chunk)
        for out in read_samples(
            d.pairs_of(piece.take(ks[mine] - piece_at)),
            d.view,
            decoding=d.decoding,
            prefetch=d.prefetch,
            progress=progress,
            mark_skipped=True,
            report=report,
            tally=tally,
            tuning=tuning,
        ):
            if type(out) is dict:  # (not SKIPPED; a map= may return other types)
                out["__source__"] = name
            yield out


__all__ = ["interleave", "source_samples"]
