"""The order reaching the training loop is a function of (seed, epoch, rank, world size) only: the same for
any ``num_workers``, different for other seeds and epochs, and ``set_epoch`` reaches persistent workers."""

from __future__ import annotations

import os
from typing import Any

import pytest

from .helpers import Packed, batch_keys, flat, keys_of, make_loader


def with_pid(sample: dict[str, Any]) -> dict[str, Any]:
    """``map=``: record which process produced the sample."""
    return {**sample, "pid": os.getpid()}


def epoch_keys(
    packed: Packed, *, batch_size: int = 4, num_workers: int = 0, epoch: int = 0, **kw: Any
) -> list[str]:
    ds, dl = make_loader(packed, batch_size=batch_size, num_workers=num_workers, **kw)
    ds.set_epoch(epoch)
    return keys_of(dl)


@pytest.mark.parametrize("shuffle_buffer", [0, 16])
@pytest.mark.parametrize("batch_size", [4, 5])
def test_order_does_not_depend_on_num_workers(uneven: Packed, batch_size: int, shuffle_buffer: int) -> None:
    runs = {}
    for num_workers in (0, 1, 2, 3):
        _, dl = make_loader(
            uneven, batch_size=batch_size, num_workers=num_workers, seed=21, shuffle_buffer=shuffle_buffer
        )
        runs[num_workers] = batch_keys(dl)
    assert runs[1] == runs[0]
    assert runs[2] == runs[0]
    assert runs[3] == runs[0]
    batches = runs[0]
    assert [len(b) for b in batches[:-1]] == [batch_size] * (len(batches) - 1)
    assert sorted(flat(batches)) == sorted(uneven.keys)
    assert flat(batches) == uneven.rank_keys(
        rank=0, world_size=1, seed=21, epoch=0, even="split", shuffle_buffer=shuffle_buffer
    )
    assert flat(batches) != uneven.keys  # the seed did shuffle (shards, and samples with a buffer)


def test_order_of_one_rank_does_not_depend_on_num_workers(uneven: Packed) -> None:
    kw = {"rank": 1, "world_size": 3, "seed": 4, "shuffle_buffer": 16}
    orders = [epoch_keys(uneven, batch_size=5, num_workers=n, epoch=2, **kw) for n in (0, 2, 3)]
    assert orders[0] == orders[1] == orders[2]
    assert len(orders[0]) == len(uneven.keys) // 3


def test_without_seed_the_order_is_the_index_order(uneven: Packed) -> None:
    assert epoch_keys(uneven, num_workers=2) == uneven.keys
    assert epoch_keys(uneven, epoch=3, shuffle_buffer=16) == uneven.keys


def test_seeds_and_epochs_change_the_order(uneven: Packed) -> None:
    base = epoch_keys(uneven, seed=1, shuffle_buffer=16)
    other_seed = epoch_keys(uneven, seed=2, shuffle_buffer=16)
    other_epoch = epoch_keys(uneven, seed=1, shuffle_buffer=16, epoch=1)
    again = epoch_keys(uneven, seed=1, shuffle_buffer=16, num_workers=2)
    assert again == base  # deterministic
    assert other_seed != base
    assert other_epoch != base
    assert other_epoch != other_seed
    for order in (base, other_seed, other_epoch):
        assert sorted(order) == sorted(uneven.keys)


def test_set_epoch_reaches_persistent_workers(uneven: Packed) -> None:
    kw = {"seed": 9, "shuffle_buffer": 16}
    expected = {e: epoch_keys(uneven, epoch=e, **kw) for e in (0, 1)}
    assert expected[0] != expected[1]

    ds, dl = make_loader(
        uneven,
        batch_size=4,
        num_workers=2,
        loader={"persistent_workers": True, "pin_memory": False},
        map=with_pid,
        **kw,
    )
    seen: dict[int, list[str]] = {}
    pids: dict[int, set[int]] = {}
    for epoch in (0, 1, 0):
        ds.set_epoch(epoch)
        batches = list(dl)
        seen[epoch] = keys_of(batches)
        pids.setdefault(epoch, set()).update(int(p) for b in batches for p in b["pid"])
        assert seen[epoch] == expected[epoch], f"epoch {epoch}"
    # The same two worker processes served every epoch: they saw set_epoch through shared state.
    assert pids[0] == pids[1]
    assert len(pids[0]) == 2 and os.getpid() not in pids[0]
