"""Who reads which sample, per epoch: shard order, equal per-rank splits, a bounded shuffle, worker chunks.

Everything is a pure function of (sample counts per shard, seed, epoch, rank, world size, worker, number
of workers, chunk size, samples already delivered). The canonical order of a rank is defined without
reference to DataLoader workers. When the batch size is known, workers take turns over *chunks* of that
order (``chunk`` = the batch size), which is exactly how ``DataLoader`` interleaves its workers' batches,
so the order reaching the training loop does not depend on ``num_workers`` (:func:`worker_positions`).
When it is not, each worker takes one contiguous stretch (:func:`worker_span`): long runs of consecutive
samples, read with few requests, in an order that depends on ``num_workers``. Resuming skips the first
``start`` samples of the rank's order, so a job continues with exactly the samples it had not yet received.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

EVEN_POLICIES = ("split", "drop", "pad", "none")


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
    """One rank's samples for one epoch, in canonical order, plus what the even policy changed."""

    samples: list[tuple[int, int]]
    dropped: list[tuple[int, int]] = field(default_factory=list)
    repeated: list[tuple[int, int]] = field(default_factory=list)


def epoch_seed(seed: int, epoch: int) -> int:
    """One integer seed per (seed, epoch), stable across Python versions."""
    return (seed * 1_000_003 + epoch * 7_919 + 12_345) % (2**63)


def shard_order(shards: int, *, seed: int | None, epoch: int) -> list[int]:
    """Shard numbers in this epoch's order (index order when ``seed`` is None)."""
    order = list(range(shards))
    if seed is not None:
        random.Random(epoch_seed(seed, epoch)).shuffle(order)
    return order


def _expand(spans: Sequence[Span]) -> list[tuple[int, int]]:
    return [(s.shard, i) for s in spans for i in range(s.start, s.stop)]


def rank_plan(
    counts: Sequence[int],
    *,
    rank: int,
    world_size: int,
    seed: int | None,
    epoch: int,
    even: str = "split",
) -> RankPlan:
    """The samples rank ``rank`` of ``world_size`` reads this epoch, before the sample shuffle.

    ``split``: the epoch's sample sequence (shards in epoch order) is cut into ``world_size`` equal
    contiguous slices at sample granularity; the last ``N mod world_size`` samples are dropped (reported).
    ``drop`` / ``pad`` / ``none``: whole shards go round-robin to ranks; ``drop`` cuts every rank to the
    smallest count, ``pad`` repeats a rank's own samples up to the largest, ``none`` leaves counts uneven
    (fine without DDP; DDP needs equal counts).
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= {rank=} < {world_size=}")
    if even not in EVEN_POLICIES:
        raise ValueError(f"{even=}; choose one of {', '.join(EVEN_POLICIES)}")
    if any(c < 0 for c in counts):
        raise ValueError("sample counts must be >= 0")
    order = shard_order(len(counts), seed=seed, epoch=epoch)
    if even == "split":
        total = sum(counts)
        per = total // world_size
        lo, hi = rank * per, (rank + 1) * per
        mine: list[Span] = []
        dropped: list[Span] = []
        pos = 0
        for shard in order:
            a, b = pos, pos + counts[shard]
            if min(b, hi) > max(a, lo):
                mine.append(Span(shard, max(a, lo) - a, min(b, hi) - a))
            if rank == world_size - 1 and b > world_size * per:
                dropped.append(Span(shard, max(a, world_size * per) - a, counts[shard]))
            pos = b
        return RankPlan(_expand(mine), dropped=_expand(dropped))
    per_rank: list[list[Span]] = [[] for _ in range(world_size)]
    for k, shard in enumerate(order):
        per_rank[k % world_size].append(Span(shard, 0, counts[shard]))
    sizes = [sum(len(s) for s in spans) for spans in per_rank]
    samples = _expand(per_rank[rank])
    if even == "drop":
        keep = min(sizes)
        return RankPlan(samples[:keep], dropped=samples[keep:])
    if even == "pad":
        want = max(sizes)
        if not samples:
            if want:
                raise ValueError(
                    f"rank {rank} has no shard to repeat with even='pad' ({len(counts)} shards for "
                    f"{world_size} ranks); use even='split'"
                )
            return RankPlan([])
        extra = [samples[i % len(samples)] for i in range(want - len(samples))]
        return RankPlan(samples + extra, repeated=extra)
    return RankPlan(samples)


def buffer_shuffle(n: int, buffer: int, rng: random.Random) -> list[int]:
    """A permutation of ``range(n)`` as a streaming shuffle buffer of ``buffer`` items would produce it:
    each output is drawn at random from the next ``buffer`` pending inputs (``buffer`` <= 1: identity)."""
    if buffer <= 1:
        return list(range(n))
    pending: list[int] = []
    out: list[int] = []
    for i in range(n):
        pending.append(i)
        if len(pending) >= buffer:
            j = rng.randrange(len(pending))
            pending[j], pending[-1] = pending[-1], pending[j]
            out.append(pending.pop())
    rng.shuffle(pending)
    out.extend(pending)
    return out


def rank_order(
    counts: Sequence[int],
    *,
    rank: int,
    world_size: int,
    seed: int | None,
    epoch: int,
    even: str = "split",
    shuffle_buffer: int = 0,
) -> RankPlan:
    """:func:`rank_plan` with the sample shuffle applied (seeded from (seed, epoch, rank))."""
    plan = rank_plan(counts, rank=rank, world_size=world_size, seed=seed, epoch=epoch, even=even)
    if seed is not None and shuffle_buffer > 1:
        rng = random.Random(epoch_seed(seed, epoch) ^ (rank * 0x9E3779B97F4A7C15 % 2**63))
        perm = buffer_shuffle(len(plan.samples), shuffle_buffer, rng)
        plan.samples = [plan.samples[i] for i in perm]
    return plan


def worker_positions(total: int, *, worker: int, workers: int, chunk: int, start: int = 0) -> list[int]:
    """Positions (in the rank's order) that DataLoader worker ``worker`` of ``workers`` yields, in order:
    chunks of ``chunk`` positions starting at ``start`` go to workers in turn."""
    if workers < 1 or not 0 <= worker < workers:
        raise ValueError(f"need 0 <= {worker=} < {workers=}")
    if chunk < 1:
        raise ValueError(f"{chunk=} must be >= 1")
    if not 0 <= start <= total:
        raise ValueError(f"{start=} must be within [0, {total=}]")
    if workers == 1:  # (the common in-process case, without a loop per chunk)
        return list(range(start, total))
    out: list[int] = []
    first = start + worker * chunk
    for a in range(first, total, workers * chunk):
        out.extend(range(a, min(a + chunk, total)))
    return out


def worker_span(total: int, *, worker: int, workers: int, start: int = 0) -> tuple[int, int]:
    """``(first, stop)``: the positions of ``[start, total)`` that DataLoader worker ``worker`` of
    ``workers`` reads when the batch size is unknown: ``[start, total)`` cut into ``workers`` contiguous
    stretches whose sizes differ by at most one."""
    if workers < 1 or not 0 <= worker < workers:
        raise ValueError(f"need 0 <= {worker=} < {workers=}")
    if not 0 <= start <= total:
        raise ValueError(f"{start=} must be within [0, {total=}]")
    n = total - start
    return start + n * worker // workers, start + n * (worker + 1) // workers


def resumed_rank_order(
    counts: Sequence[int],
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
    leaves counts uneven.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= {rank=} < {world_size=}")
    if old_world_size < 1 or delivered < 0:
        raise ValueError(f"{old_world_size=} must be >= 1 and {delivered=} >= 0")
    rests = []
    for old in range(old_world_size):
        plan = rank_order(
            counts,
            rank=old,
            world_size=old_world_size,
            seed=seed,
            epoch=epoch,
            even=even,
            shuffle_buffer=shuffle_buffer,
        )
        if delivered > len(plan.samples):
            raise ValueError(f"{delivered=} is more than old rank {old}'s {len(plan.samples)} samples")
        rests.append(plan.samples[delivered:])
    longest = max((len(r) for r in rests), default=0)
    remaining = [r[i] for i in range(longest) for r in rests if i < len(r)]
    if even in ("split", "drop"):
        per = len(remaining) // world_size
        cut = per * world_size
        dropped = remaining[cut:] if rank == world_size - 1 else []
        return RankPlan(remaining[:cut][rank::world_size], dropped=dropped)
    mine = remaining[rank::world_size]
    if even == "pad":
        want = -(-len(remaining) // world_size)
        pool = mine or remaining[:1]
        extra = [pool[i % len(pool)] for i in range(want - len(mine))] if pool else []
        return RankPlan(mine + extra, repeated=extra)
    return RankPlan(mine)
