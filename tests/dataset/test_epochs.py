"""fastload.DataLoader's epochs: each new pass after a complete one reads the next epoch unless one was set
(a forgotten set_epoch must not silently repeat the same order), set_epoch on the loader or the dataset
wins, a restored position continues its epoch, and setting the epoch just read again warns."""

from __future__ import annotations

import warnings

import pytest

import fastload

from .helpers import Packed


def keys(loader: fastload.DataLoader) -> list[str]:
    return [k for b in loader for k in b["__key__"]]


def test_passes_advance_the_epoch_without_set_epoch(small: Packed) -> None:
    ds = fastload.ShardDataset(small.root, seed=3, shuffle_buffer=16)
    loader = fastload.DataLoader(ds, batch_size=4)
    first, second = keys(loader), keys(loader)
    assert sorted(first) == sorted(second) == sorted(small.keys)
    assert first != second, "a second pass repeated the first epoch's order"
    assert first == small.rank_keys(rank=0, world_size=1, seed=3, epoch=0, shuffle_buffer=16)
    assert second == small.rank_keys(rank=0, world_size=1, seed=3, epoch=1, shuffle_buffer=16)
    assert loader.dataset.epoch == 1


def test_set_epoch_on_the_loader_or_the_dataset_wins(small: Packed) -> None:
    ds = fastload.ShardDataset(small.root, seed=3, shuffle_buffer=16)
    loader = fastload.DataLoader(ds, batch_size=4)
    want = {e: small.rank_keys(rank=0, world_size=1, seed=3, epoch=e, shuffle_buffer=16) for e in (0, 5, 7)}
    loader.set_epoch(5)
    assert keys(loader) == want[5]
    ds.set_epoch(7)  # the DistributedSampler habit: on the dataset
    assert keys(loader) == want[7]
    with pytest.warns(UserWarning, match="repeats its order"):
        loader.set_epoch(7)
    assert keys(loader) == want[7]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader.set_epoch(0)  # another epoch: no warning
    assert keys(loader) == want[0]


def test_a_restored_position_continues_its_epoch_then_advances(small: Packed) -> None:
    ds = fastload.ShardDataset(small.root, seed=3, shuffle_buffer=16)
    loader = fastload.DataLoader(ds, batch_size=4)
    keys(loader)  # epoch 0, complete
    it = iter(loader)  # epoch 1
    head = [k for _ in range(2) for k in next(it)["__key__"]]
    state = loader.state_dict()
    it.close()
    again = fastload.DataLoader(fastload.ShardDataset(small.root, seed=3, shuffle_buffer=16), batch_size=4)
    again.load_state_dict(state)
    rest = keys(again)
    epoch1 = small.rank_keys(rank=0, world_size=1, seed=3, epoch=1, shuffle_buffer=16)
    assert head + rest == epoch1
    assert keys(again) == small.rank_keys(rank=0, world_size=1, seed=3, epoch=2, shuffle_buffer=16)
