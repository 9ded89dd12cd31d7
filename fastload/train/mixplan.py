"""A rank's plan of one ``fastload.Mix`` epoch: the schedule, where each source stands at the plan's base
(the epoch's start, or the position a checkpoint of another world size was taken at), and where the epoch
ends. A source's pass ``p`` in mixture epoch ``E`` is its own rank order (:mod:`fastload.core.sharding`) of
epoch ``E * 2**32 + p``; after a change of world size the rest of the pass a source was in is dealt to the
new ranks with :func:`~fastload.core.sharding.resumed_rank_order`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fastload.core.mix import PASS_STRIDE, Ints, Schedule, epoch_end
from fastload.core.refs import Refs
from fastload.core.sharding import EpochLayout, rank_order, resumed_rank_order
from fastload.errors import ConfigError
from fastload.train.dataset import ShardDataset


@dataclass(frozen=True)
class Source:
    """A source as plans see it: its name, per-shard sample counts and order settings."""

    name: str
    counts: Ints
    seed: int | None
    even: str
    shuffle_buffer: int

    @classmethod
    def of(cls, name: str, d: ShardDataset) -> Source:
        return cls(name, d.shard_counts(), d.seed, d.even, d.shuffle_buffer)  # (filters= applied)

    def order(self, epoch: int, p: int, rank: int, world: int) -> Refs:
        """This rank's samples of pass ``p`` in mixture epoch ``epoch``, in order."""
        kw: dict[str, Any] = {"seed": self.seed, "even": self.even, "shuffle_buffer": self.shuffle_buffer}
        return rank_order(
            self.counts, rank=rank, world_size=world, epoch=epoch * PASS_STRIDE + p, **kw
        ).samples

    def length(self, epoch: int, p: int, rank: int, world: int) -> int:
        """How many samples :meth:`order` holds (O(shards), no order built)."""
        e = epoch * PASS_STRIDE + p
        n = EpochLayout(self.counts, world_size=world, seed=self.seed, epoch=e, even=self.even).length(rank)
        if n == 0:
            raise ConfigError(f"source {self.name!r} has no samples for rank {rank} of {world}")
        return n


@dataclass
class MixPlan:
    """One rank's mixture epoch from position ``base`` on: the schedule, draws per source before ``base``,
    each source's first piece (the rest of the pass it is in at ``base``), which pass that is, and where
    the epoch ends (None: endless)."""

    epoch: int
    schedule: Schedule
    base: int
    drawn: Ints
    firsts: list[Refs]
    passes: list[int]
    end: int | None


def plan_epoch(
    sources: list[Source],
    schedule: Schedule,
    *,
    epoch: int,
    rank: int,
    world: int,
    stop: str,
    resumed: tuple[int, int] | None,
) -> MixPlan:
    """The plan of mixture epoch ``epoch`` for rank ``rank`` of ``world``; ``resumed``: (old world size,
    position) of a checkpoint taken under another world size this epoch."""
    n = len(sources)
    base, drawn = 0, np.zeros(n, dtype=np.int64)
    passes = [0] * n
    if resumed is None:
        firsts = [src.order(epoch, 0, rank, world) for src in sources]
        pick = min if stop == "first_exhausted" else max  # every rank ends the epoch at the same step
        left = [pick(src.length(epoch, 0, r, world) for r in range(world)) for src in sources]
    else:
        old_world, base = resumed
        drawn = schedule.counts(base)
        firsts = []
        for s, src in enumerate(sources):
            at = int(drawn[s])
            while at >= (size := src.length(epoch, passes[s], 0, old_world)):
                at -= size
                passes[s] += 1
            kw: dict[str, Any] = {"seed": src.seed, "even": src.even, "shuffle_buffer": src.shuffle_buffer}
            rest = resumed_rank_order(
                src.counts, rank=rank, world_size=world, old_world_size=old_world, delivered=at,
                epoch=epoch * PASS_STRIDE + passes[s], **kw,
            )  # fmt: skip
            firsts.append(rest.samples)
        cycled = stop == "all_exhausted"  # a source past its first pass has been exhausted already
        left = [0 if p and cycled else len(f) for f, p in zip(firsts, passes, strict=True)]
    try:
        end = epoch_end(schedule, left, [int(x) for x in drawn], stop)
    except ValueError as exc:
        raise ConfigError(f"stop='all_exhausted' can never end: {exc} (its weight becomes 0)") from None
    return MixPlan(epoch, schedule, base, drawn, firsts, passes, None if end is None else max(end, base))


__all__ = ["MixPlan", "Source", "plan_epoch"]
