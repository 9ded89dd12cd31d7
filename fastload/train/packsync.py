"""Equal steps for :class:`fastload.PackedSequences` under data parallelism: the ranks compare how many
blocks they hold whenever one may run out, and settle the end of a pass together (the plan is
:func:`fastload.core.packranks.equal_steps`); the collectives for it (counts, and the blocks ranks hand
each other).

They run on a gloo group (the default group when it is gloo, else one made once over every rank), from
the training process's data iterator: every rank calls them at the same block of the pass, so they never
interleave with DDP's own collectives (which are on the default group and finished within a step).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from fastload.core.packranks import equal_steps
from fastload.train.packstate import Live, Round, joined

_GROUPS: list[tuple[Any, Any]] = []  # (default group, gloo group made for it)


def data_group() -> Any | None:
    """A gloo process group over every rank, or None without an initialised process group of 2+ ranks.
    Collective: every rank calls it at the same point (the first block of a pass)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    world = dist.group.WORLD
    if dist.get_backend() == "gloo":
        return world
    for default, gloo in _GROUPS:
        if default is world:
            return gloo
    gloo = dist.new_group(backend="gloo")
    _GROUPS[:] = [(world, gloo)]
    return gloo


def rank_of(group: Any) -> tuple[int, int]:
    import torch.distributed as dist

    return dist.get_rank(group), dist.get_world_size(group)


def gather_counts(group: Any, avail: int, done: bool) -> list[tuple[int, bool]]:
    """Every rank's ``(blocks in hand, upstream exhausted)``, in rank order."""
    import torch.distributed as dist

    world = dist.get_world_size(group)
    mine = torch.tensor([avail, int(done)], dtype=torch.int64)
    out = [torch.zeros(2, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(out, mine, group=group)
    return [(int(t[0]), bool(t[1])) for t in out]


def gather_objects(group: Any, obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order."""
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def synced(packer: Any, live: Live, it: Iterator[Any], group: Any) -> Iterator[dict[str, Any]]:
    """Blocks with every rank of ``group`` handing out as many (see :mod:`fastload.core.packranks`):
    ranks compare the blocks they hold whenever one of them may run out, and settle the end of the pass
    once every upstream is exhausted."""
    next_sync = live.handed
    while True:
        if not live.final and live.handed >= next_sync:
            next_sync = live.handed + _sync(packer, live, it, group)
        if live.avail():
            yield packer._take(live)
        elif live.owed:
            yield packer._empty(live)
        elif live.final:
            return
        else:  # cannot happen: a sync comes before any rank runs out
            raise RuntimeError("PackedSequences: a rank ran out of blocks between two syncs")


def _sync(packer: Any, live: Live, it: Iterator[Any], group: Any) -> int:
    """Blocks every rank can hand out before the next sync (after settling the end, a large number)."""
    while True:
        while not live.avail() and packer._read_round(live, it):
            pass
        counts = gather_counts(group, live.avail(), live.done)
        if all(done for _, done in counts):
            _settle(packer, live, group, [a for a, _ in counts])
            return 1 << 62
        if any(done and not a for a, done in counts):  # a rank is out: the others read to the end
            while packer._read_round(live, it):
                pass
            continue
        return min(a for a, _ in counts)


def _settle(packer: Any, live: Live, group: Any, avail: list[int]) -> None:
    rank, world = rank_of(group)
    plan = equal_steps(avail, packer.even)
    mine = plan.keep[rank]
    extra = _cut(live, mine)  # blocks after the ones kept: sent to other ranks, or dropped
    moved_in = 0
    if plan.moves:
        sent = gather_objects(group, extra)
        taken = [0] * world
        for src, dst, n in plan.moves:
            if dst == rank:
                tokens, lengths, per_block = sent[src]
                live.rounds.append(_received(packer, tokens, lengths, per_block, taken[src], n))
                moved_in += n
            taken[src] += n
    dropped_tokens = int(extra[0].size) if plan.dropped[rank] else 0
    live.owed, live.final = plan.empty[rank], True
    live.report.update(
        equal_steps=True,
        steps=live.handed + plan.steps,
        blocks_per_rank=[
            live_handed + a for live_handed, a in zip([live.handed] * world, avail, strict=True)
        ],
        empty_blocks=plan.empty[rank],
        blocks_in=moved_in,
        blocks_out=sum(n for src, _, n in plan.moves if src == rank),
        dropped_blocks=plan.dropped[rank],
        dropped_tokens=dropped_tokens,
    )


def _cut(live: Live, keep: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Take the blocks after the first ``keep`` still to come out of ``live``, as pieces."""
    parts = []
    left = keep
    for r in live.rounds:
        n = r.stop - r.next
        if left >= n:
            left -= n
            continue
        first = r.next + left
        parts.append(r.pieces(first, r.stop))
        r.stop, left = first, 0
    while live.rounds and live.rounds[-1].next >= live.rounds[-1].stop:
        live.rounds.pop()
    return joined(parts)


def _received(
    packer: Any, tokens: np.ndarray, lengths: np.ndarray, per_block: np.ndarray, first: int, n: int
) -> Round:
    """Blocks ``first:first + n`` of what another rank sent, as a round of this rank."""
    piece_at = np.concatenate(([0], np.cumsum(per_block)))
    token_at = np.concatenate(([0], np.cumsum(lengths)))
    a, b = int(piece_at[first]), int(piece_at[first + n])
    got: Round = packer._round_of(
        tokens[token_at[a] : token_at[b]], lengths[a:b], per_block[first : first + n]
    )
    return got


__all__ = ["data_group", "gather_counts", "gather_objects", "rank_of", "synced"]
