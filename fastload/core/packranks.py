"""Packed blocks across data-parallel ranks: equal steps at the end of a pass, and the rest of a pass dealt
to another number of ranks.

Every rank of a data-parallel job reads as many documents as the others but not as many tokens, so its
packer makes a different number of blocks; DDP needs every rank to take the same number of steps. Once
every rank knows how many blocks it has left (its upstream is exhausted), :func:`equal_steps` says what
each rank does so that they all hand out the same number (``even``):

- ``"balance"`` (default): ranks with more blocks than the mean give their last ones to ranks with fewer;
  what does not divide evenly is made up with at most one empty block per rank (no token lost, at most
  ``world - 1`` empty blocks per pass);
- ``"pad"``: every rank adds empty blocks up to the largest count (no token lost, no traffic; the
  imbalance in empty blocks);
- ``"drop"``: every rank stops at the smallest count (the imbalance in tokens dropped, reported);
- ``"none"``: counts stay uneven (no process group, or not DDP).

Resuming under another world size: the old ranks' buffered pieces are dealt to the new ranks in turn
(:func:`deal`), and the documents of the old ranks' orders are dealt as
:func:`fastload.core.sharding.resumed_rank_order` does from the position of the old rank that had read
the fewest; :func:`resumed_origins` says which old rank and position each new document comes from, so that
those an old rank had already read (they were packed, or are among the buffered pieces) are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

EVEN_BLOCKS = ("balance", "pad", "drop", "none")

Ints = NDArray[np.int64]


def check_even(even: str) -> None:
    if even not in EVEN_BLOCKS:
        raise ValueError(f"even={even!r}; choose one of {', '.join(EVEN_BLOCKS)}")


@dataclass(frozen=True)
class StepPlan:
    """What every rank does with the ``avail[r]`` blocks it has left so that all hand out ``steps``.

    Rank ``r`` hands out its first ``keep[r]`` blocks, then the blocks it receives (``moves`` with
    ``to == r``, in order), then ``empty[r]`` empty blocks; ``moves`` are ``(from, to, blocks)``: the
    sender's blocks after its ``keep``, in order; ``dropped[r]`` blocks of rank ``r`` are left out."""

    steps: int
    keep: list[int]
    empty: list[int]
    moves: list[tuple[int, int, int]]
    dropped: list[int]


def equal_steps(avail: list[int], even: str) -> StepPlan:
    """The plan for ranks holding ``avail[r]`` blocks each (see the module doc). Pure, so every rank
    computes the same plan from the same gathered counts."""
    check_even(even)
    world = len(avail)
    if world == 0 or min(avail) < 0:
        raise ValueError(f"need one count >= 0 per rank, got {avail}")
    zeros = [0] * world
    if even == "none":
        return StepPlan(max(avail), list(avail), zeros, [], zeros)
    if even == "pad":
        top = max(avail)
        return StepPlan(top, list(avail), [top - a for a in avail], [], zeros)
    if even == "drop":
        low = min(avail)
        return StepPlan(low, [low] * world, zeros, [], [a - low for a in avail])
    total = sum(avail)
    base, extra = divmod(total, world)
    # the `extra` ranks holding the most keep one more (fewer moves); ties: the lower rank
    richest = sorted(range(world), key=lambda r: (-avail[r], r))[:extra]
    target = [base + (r in richest) for r in range(world)]
    keep = [min(a, t) for a, t in zip(avail, target, strict=True)]
    surplus = [(r, avail[r] - target[r]) for r in range(world) if avail[r] > target[r]]
    deficit = [(r, target[r] - avail[r]) for r in range(world) if avail[r] < target[r]]
    moves: list[tuple[int, int, int]] = []
    while surplus and deficit:
        (src, give), (dst, need) = surplus[0], deficit[0]
        n = min(give, need)
        moves.append((src, dst, n))
        surplus[0], deficit[0] = (src, give - n), (dst, need - n)
        if give == n:
            surplus.pop(0)
        if need == n:
            deficit.pop(0)
    steps = base + (1 if extra else 0)
    return StepPlan(steps, keep, [steps - t for t in target], moves, zeros)


def deal(count: int, *, rank: int, world: int) -> Ints:
    """Which of ``count`` items (old ranks' buffered pieces, in old-rank order) new rank ``rank`` of
    ``world`` takes: every ``world``-th from ``rank``."""
    if not 0 <= rank < world:
        raise ValueError(f"need 0 <= {rank=} < {world=}")
    return np.arange(rank, count, world, dtype=np.int64)


def resumed_origins(
    k: Ints, *, rank: int, world: int, old_world: int, remaining: int
) -> tuple[Ints, Ints, NDArray[np.bool_]]:
    """``(old rank, position among its remaining samples, valid)`` of item ``k`` of new rank ``rank``'s
    resumed order, when ``old_world`` ranks each had ``remaining // old_world`` samples left (even split,
    drop or pad: :func:`fastload.core.sharding.resumed_rank_order` deals item ``q`` of their interleaving
    to new rank ``q mod world``). ``valid`` is False for items past that interleaving (repeats of
    ``even="pad"``)."""
    q = rank + np.asarray(k, dtype=np.int64) * world
    return q % old_world, q // old_world, q < remaining


__all__ = ["EVEN_BLOCKS", "StepPlan", "check_even", "deal", "equal_steps", "resumed_origins"]
