"""Who reads which sample, per epoch: shard order, equal per-rank splits, a bounded shuffle, worker chunks.

Everything is a pure function of (sample counts per shard, seed, epoch, rank, world size, worker, number
of workers, chunk size, samples already delivered). The canonical order of a rank is defined without
reference to DataLoader workers. When the batch size is known, workers take turns over *chunks* of that
order (``chunk`` = the batch size), which is exactly how ``DataLoader`` interleaves its workers' batches,
so the order reaching the training loop does not depend on ``num_workers`` (:func:`worker_positions`).
When it is not, each worker takes one contiguous stretch (:func:`worker_span`): long runs of consecutive
samples, read with few requests, in an order that depends on ``num_workers``. Resuming skips the first
``start`` samples of the rank's order, so a job continues with exactly the samples it had not yet received.

Cost: a rank's order is a :class:`~fastload.core.refs.Refs` (spans of shards, no per-sample objects), built
from per-shard counts in O(shards) (+ O(the rank's samples) of numpy work for the sample shuffle, which
reproduces the streaming buffer exactly from the same random stream), so a plan never grows with the
dataset's samples. Resuming under another world size builds only the old ranks the new rank reads from.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from fastload.core.refs import Ints, Refs
from fastload.core.shuffle import buffer_shuffle, buffer_shuffle_array, buffer_shuffle_at

EVEN_POLICIES = ("split", "drop", "pad", "none")
__all__ = [
    "EVEN_POLICIES",
    "EpochLayout",
    "RankPlan",
    "Span",
    "buffer_shuffle",
    "buffer_shuffle_array",
    "epoch_seed",
    "rank_order",
    "rank_plan",
    "resumed_rank_order",
    "shard_order",
    "split_rotation",
    "worker_position_array",
    "worker_positions",
    "worker_span",
]


@dataclass(frozen=True)
class Span:
    """Samples ``[start, stop)`` of shard ``shard`` (positions within the shard, in shard order)."""

    shard: int
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass
class RankPlan:
    """One rank's samples for one epoch, in canonical order, plus what the even policy changed (each a
    sequence of ``(shard, position)`` pairs)."""

    samples: Refs
    dropped: Refs = field(default_factory=Refs.empty)
    repeated: Refs = field(default_factory=Refs.empty)


def epoch_seed(seed: int, epoch: int) -> int:
    """One integer seed per (seed, epoch), stable across Python versions."""
    return (seed * 1_000_003 + epoch * 7_919 + 12_345) % (2**63)


def _shard_order_array(shards: int, *, seed: int | None, epoch: int) -> Ints:
    if seed is None:
        return np.arange(shards, dtype=np.int64)
    # random.Random(epoch_seed(seed, epoch)).shuffle(list(range(shards))): a buffer larger than the input
    # only shuffles it at the end, so this is that shuffle (in C when the accelerator is in use)
    return buffer_shuffle_array(shards, shards + 1, random.Random(epoch_seed(seed, epoch)))


def shard_order(shards: int, *, seed: int | None, epoch: int) -> list[int]:
    """Shard numbers in this epoch's order (index order when ``seed`` is None; else shuffled by
    ``random.Random(epoch_seed(seed, epoch)).shuffle``)."""
    return _shard_order_array(shards, seed=seed, epoch=epoch).tolist()  # type: ignore[no-any-return]


def split_rotation(total: int, *, world_size: int, seed: int | None, epoch: int) -> int:
    """Where ``even="split"`` starts cutting the epoch's sample sequence: with ``seed`` None the sequence
    starts at sample ``epoch * (total mod world_size)`` (modulo ``total``) and wraps around, so the
    ``total mod world_size`` samples cut from its end change every epoch (any ``world_size`` consecutive
    epochs train on every sample; with ``total >= world_size``, any two do). With a seed the shard order
    changes every epoch instead (0)."""
    if seed is not None or total == 0:
        return 0
    return epoch * (total % world_size) % total


class EpochLayout:
    """One epoch's shards in order, shared by every rank's plan (O(shards), computed once per epoch)."""

    def __init__(
        self, counts: Sequence[int] | Ints, *, world_size: int, seed: int | None, epoch: int, even: str
    ) -> None:
        if world_size < 1:
            raise ValueError(f"need {world_size=} >= 1")
        if even not in EVEN_POLICIES:
            raise ValueError(f"{even=}; choose one of {', '.join(EVEN_POLICIES)}")
        c = np.asarray(counts, dtype=np.int64)
        if len(c) and c.min() < 0:
            raise ValueError("sample counts must be >= 0")
        self.counts, self.world, self.even, self.seed, self.epoch = c, world_size, even, seed, epoch
        order = _shard_order_array(len(c), seed=seed, epoch=epoch)
        self.total = int(c.sum())
        if even == "split":
            shards, firsts, lens = order, np.zeros(len(order), dtype=np.int64), c[order]
            turn = split_rotation(self.total, world_size=world_size, seed=seed, epoch=epoch)
            if turn:  # start at sample `turn` of the sequence, wrap around
                begins = np.cumsum(lens) - lens
                k = int(np.searchsorted(begins, turn, side="right")) - 1
                into = turn - int(begins[k])
                shards = np.concatenate([shards[k:], shards[:k], shards[k : k + 1]])
                firsts = np.concatenate([[into], firsts[k + 1 :], firsts[:k], [0]])
                lens = np.concatenate([[lens[k] - into], lens[k + 1 :], lens[:k], [into]])
            self.sequence = Refs(shards, firsts, lens)
            self.per = self.total // world_size
        else:
            self.order = order
            self.sizes = np.bincount(
                np.arange(len(order)) % world_size, weights=c[order], minlength=world_size
            )
            self.sizes = self.sizes.astype(np.int64)

    def length(self, rank: int) -> int:
        """How many samples rank ``rank``'s plan holds."""
        if self.even == "split":
            return self.per
        if self.even == "drop":
            return int(self.sizes.min())
        if self.even == "pad":
            return int(self.sizes.max())
        return int(self.sizes[rank])

    def plan(self, rank: int) -> RankPlan:
        """Rank ``rank``'s plan, before the sample shuffle (see :func:`rank_plan`)."""
        if not 0 <= rank < self.world:
            raise ValueError(f"need 0 <= {rank=} < world_size={self.world}")
        if self.even == "split":
            per, world = self.per, self.world
            dropped = self.sequence[world * per :] if rank == world - 1 else Refs.empty()
            return RankPlan(self.sequence[rank * per : (rank + 1) * per], dropped=dropped)
        mine = self.order[rank :: self.world]
        samples = Refs(mine, np.zeros(len(mine), dtype=np.int64), self.counts[mine])
        if self.even == "drop":
            keep = self.length(rank)
            return RankPlan(samples[:keep], dropped=samples[keep:])
        if self.even == "pad":
            want = self.length(rank)
            if not len(samples) and want:
                raise ValueError(
                    f"rank {rank} has no shard to repeat with even='pad' ({len(self.counts)} shards for "
                    f"{self.world} ranks); use even='split'"
                )
            padded = samples.cycled(want)
            return RankPlan(padded, repeated=padded[len(samples) :])
        return RankPlan(samples)

    def _shuffles(self, shuffle_buffer: int) -> bool:
        return self.seed is not None and shuffle_buffer > 1

    def _rng(self, rank: int) -> random.Random:
        """The random stream of rank ``rank``'s sample shuffle (seeded from (seed, epoch, rank))."""
        return random.Random(epoch_seed(self.seed or 0, self.epoch) ^ (rank * 0x9E3779B97F4A7C15 % 2**63))

    def order_of(self, rank: int, shuffle_buffer: int) -> RankPlan:
        """:meth:`plan` with the sample shuffle (see :func:`rank_order`)."""
        plan = self.plan(rank)
        if self._shuffles(shuffle_buffer):
            perm = buffer_shuffle_array(len(plan.samples), shuffle_buffer, self._rng(rank))
            plan.samples = plan.samples.permuted(perm)
        return plan

    def take(self, rank: int, shuffle_buffer: int, positions: Ints) -> tuple[Ints, Ints]:
        """``order_of(rank, shuffle_buffer).samples.take(positions)`` without building the whole shuffled
        order (:func:`~fastload.core.shuffle.buffer_shuffle_at`)."""
        samples = self.plan(rank).samples
        if self._shuffles(shuffle_buffer):
            positions = buffer_shuffle_at(len(samples), shuffle_buffer, self._rng(rank), positions)
        return samples.take(positions)


def rank_plan(
    counts: Sequence[int] | Ints,
    *,
    rank: int,
    world_size: int,
    seed: int | None,
    epoch: int,
    even: str = "split",
) -> RankPlan:
    """The samples rank ``rank`` of ``world_size`` reads this epoch, before the sample shuffle.

    ``split``: the epoch's sample sequence (shards in epoch order; with ``seed`` None rotated by
    :func:`split_rotation`, so the cut samples change every epoch) is cut into ``world_size`` equal
    contiguous slices at sample granularity; the last ``N mod world_size`` samples are dropped (reported).
    ``drop`` / ``pad`` / ``none``: whole shards go round-robin to ranks; ``drop`` cuts every rank to the
    smallest count, ``pad`` repeats a rank's own samples up to the largest, ``none`` leaves counts uneven
    (fine without DDP; DDP needs equal counts).
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= {rank=} < {world_size=}")
    return EpochLayout(counts, world_size=world_size, seed=seed, epoch=epoch, even=even).plan(rank)


def rank_order(
    counts: Sequence[int] | Ints,
    *,
    rank: int,
    world_size: int,
    seed: int | None,
    epoch: int,
    even: str = "split",
    shuffle_buffer: int = 0,
) -> RankPlan:
    """:func:`rank_plan` with the sample shuffle applied (seeded from (seed, epoch, rank))."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= {rank=} < {world_size=}")
    layout = EpochLayout(counts, world_size=world_size, seed=seed, epoch=epoch, even=even)
    return layout.order_of(rank, shuffle_buffer)


def _check_worker(worker: int, workers: int, total: int, start: int) -> None:
    if workers < 1 or not 0 <= worker < workers:
        raise ValueError(f"need 0 <= {worker=} < {workers=}")
    if not 0 <= start <= total:
        raise ValueError(f"{start=} must be within [0, {total=}]")


def worker_position_array(total: int, *, worker: int, workers: int, chunk: int, start: int = 0) -> Ints:
    """:func:`worker_positions` as a numpy array."""
    if chunk < 1:
        raise ValueError(f"{chunk=} must be >= 1")
    _check_worker(worker, workers, total, start)
    if workers == 1:
        return np.arange(start, total, dtype=np.int64)
    chunk = min(chunk, max(1, total - start))  # a chunk past the end: the same positions, no big temporary
    firsts = np.arange(start + worker * chunk, total, workers * chunk, dtype=np.int64)
    out = (firsts[:, None] + np.arange(chunk, dtype=np.int64)[None, :]).ravel()
    return out[out < total]


def worker_positions(total: int, *, worker: int, workers: int, chunk: int, start: int = 0) -> list[int]:
    """Positions (in the rank's order) that DataLoader worker ``worker`` of ``workers`` yields, in order:
    chunks of ``chunk`` positions starting at ``start`` go to workers in turn."""
    positions = worker_position_array(total, worker=worker, workers=workers, chunk=chunk, start=start)
    return positions.tolist()  # type: ignore[no-any-return]


def worker_span(total: int, *, worker: int, workers: int, start: int = 0) -> tuple[int, int]:
    """``(first, stop)``: the positions of ``[start, total)`` that DataLoader worker ``worker`` of
    ``workers`` reads when the batch size is unknown: ``[start, total)`` cut into ``workers`` contiguous
    stretches whose sizes differ by at most one."""
    _check_worker(worker, workers, total, start)
    n = total - start
    return start + n * worker // workers, start + n * (worker + 1) // workers


def _interleaved(rests: Ints, q: Ints) -> tuple[Ints, Ints]:
    """Item ``q`` of the old ranks' remaining samples interleaved position by position, rank by rank (a
    rank that has run out is skipped) -> ``(old rank, its remaining position)``, for an array ``q``."""
    if len(rests) and rests.min() == rests.max():  # every old rank has as many left (split, drop, pad)
        return q % len(rests), q // len(rests)
    levels = np.unique(rests[rests > 0])  # rows [levels[s-1], levels[s]) have the same ranks left
    lows = np.concatenate([[0], levels[:-1]])
    active = [np.flatnonzero(rests >= top) for top in levels]
    widths = np.asarray([len(a) for a in active], dtype=np.int64)
    firsts = np.concatenate([[0], np.cumsum(widths * (levels - lows))])[:-1]
    table = np.concatenate(active) if active else np.zeros(0, dtype=np.int64)
    at = np.concatenate([[0], np.cumsum(widths)])[:-1]
    s = np.searchsorted(firsts, q, side="right") - 1
    off = q - firsts[s]
    return table[at[s] + off % widths[s]], lows[s] + off // widths[s]


def resumed_rank_order(
    counts: Sequence[int] | Ints,
    *,
    rank: int,
    world_size: int,
    old_world_size: int,
    delivered: int,
    seed: int | None,
    epoch: int,
    even: str = "split",
    shuffle_buffer: int = 0,
) -> RankPlan:
    """The rest of an epoch for rank ``rank`` of a *new* ``world_size``, after ``old_world_size`` ranks had
    each delivered the first ``delivered`` samples of their :func:`rank_order` (synchronous data-parallel
    training keeps ranks in step, so one count describes all of them).

    The old ranks' remaining samples are interleaved (position by position, rank by rank) and dealt to the
    new ranks in turn. ``split``/``drop`` give every new rank the same count and drop (report) the last
    ``remaining mod world_size``; ``pad`` repeats a rank's own samples up to the largest count; ``none``
    leaves counts uneven. Only the old ranks this rank reads from are built.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= {rank=} < {world_size=}")
    if old_world_size < 1 or delivered < 0:
        raise ValueError(f"{old_world_size=} must be >= 1 and {delivered=} >= 0")
    layout = EpochLayout(counts, world_size=old_world_size, seed=seed, epoch=epoch, even=even)
    lengths = np.asarray([layout.length(o) for o in range(old_world_size)], dtype=np.int64)
    short = np.flatnonzero(lengths < delivered)
    if len(short):
        old = int(short[0])
        raise ValueError(f"{delivered=} is more than old rank {old}'s {int(lengths[old])} samples")
    rests = lengths - delivered
    remaining = int(rests.sum())

    def refs(q: Ints) -> Refs:
        olds, at = _interleaved(rests, q)
        shards, pos = np.zeros(len(q), dtype=np.int64), np.zeros(len(q), dtype=np.int64)
        by_old = np.argsort(olds, kind="stable")
        cuts = np.flatnonzero(np.diff(olds[by_old])) + 1
        for picked in np.split(by_old, cuts) if len(q) else []:  # the old ranks read from, one at a time
            old = int(olds[picked[0]])
            shards[picked], pos[picked] = layout.take(old, shuffle_buffer, delivered + at[picked])
        return Refs.from_arrays(shards, pos)

    if even in ("split", "drop"):
        cut = remaining // world_size * world_size
        dropped = refs(np.arange(cut, remaining, dtype=np.int64)) if rank == world_size - 1 else Refs.empty()
        return RankPlan(refs(np.arange(rank, cut, world_size, dtype=np.int64)), dropped=dropped)
    mine = refs(np.arange(rank, remaining, world_size, dtype=np.int64))
    if even == "pad":
        want = -(-remaining // world_size)
        pool = mine if len(mine) or not remaining else refs(np.zeros(1, dtype=np.int64))
        padded = pool.cycled(want) if len(pool) else pool
        return RankPlan(padded, repeated=padded[len(mine) :])
    return RankPlan(mine)
