"""The collectives :class:`fastload.PackedSequences` needs for equal steps under data parallelism: how many
blocks each rank has left, and the blocks ranks hand each other (see :mod:`fastload.core.packranks`).

They run on a gloo group (the default group when it is gloo, else one made once over every rank), from
the training process's data iterator: every rank calls them at the same block of the pass, so they never
interleave with DDP's own collectives (which are on the default group and finished within a step).
"""

from __future__ import annotations

from typing import Any

import torch

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


__all__ = ["data_group", "gather_counts", "gather_objects", "rank_of"]
