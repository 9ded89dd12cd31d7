"""Epochs without ``fastload.DataLoader``: torch's own DataLoader (and plain iteration) calls ``iter()`` on
the dataset each epoch, and a forgotten ``set_epoch`` must not repeat the same shuffled order silently.
Where fastload sees a new pass (in-process iteration after a complete pass, persistent workers) it reads the
next epoch; ``set_epoch`` and restores still win; a pass cut short continues its epoch; a state saved after a
complete pass resumes at the next epoch; fresh workers each epoch (which cannot see it) warn, once, naming
``set_epoch``."""

from __future__ import annotations

from typing import Any

import pytest
import torch.utils.data

import fastload

from .helpers import WORKER_TIMEOUT_S, Packed

KW: dict[str, Any] = {"seed": 3, "shuffle_buffer": 16, "decode": False}


def order(small: Packed, epoch: int) -> list[str]:
    return small.rank_keys(rank=0, world_size=1, seed=3, epoch=epoch, shuffle_buffer=16)


def keys(iterable: Any) -> list[str]:
    out: list[str] = []
    for item in iterable:
        out += list(item["__key__"]) if isinstance(item["__key__"], list) else [item["__key__"]]
    return out


def test_plain_iteration_reads_the_next_epoch_after_a_complete_pass(small: Packed) -> None:
    ds = fastload.ShardDataset(small.root, **KW)
    assert keys(ds) == order(small, 0)
    assert keys(ds) == order(small, 1) and ds.epoch == 1
    ds.set_epoch(5)  # set_epoch wins, as before
    assert keys(ds) == order(small, 5)
    assert keys(ds) == order(small, 6)
    ds.set_epoch(6)  # set explicitly: read again, as asked
    assert keys(ds) == order(small, 6)


def test_a_pass_cut_short_continues_its_epoch(small: Packed) -> None:
    ds = fastload.ShardDataset(small.root, **KW)
    it = iter(ds)
    next(it)
    it.close()
    assert keys(ds) == order(small, 0)  # (from its start, as a plain iteration always did)
    assert keys(ds) == order(small, 1)


@pytest.mark.parametrize("workers", [0])
def test_torch_dataloader_in_process(small: Packed, workers: int) -> None:
    ds = fastload.ShardDataset(small.root, **KW)
    dl = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=workers)
    assert keys(dl) == order(small, 0)
    assert keys(dl) == order(small, 1)


def test_a_state_saved_after_a_complete_pass_resumes_at_the_next_epoch(small: Packed) -> None:
    ds = fastload.ShardDataset(small.root, **KW)
    keys(ds)
    state = ds.state_dict()
    assert (state["epoch"], state["delivered"]) == (1, 0)
    again = fastload.ShardDataset(small.root, **KW)
    again.load_state_dict(state)
    assert keys(again) == order(small, 1)
    # mid-pass, exactly where it stood (and the epoch after it next)
    it = iter(again)
    head = [next(it)["__key__"] for _ in range(7)]
    state = again.state_dict()
    it.close()
    third = fastload.ShardDataset(small.root, **KW)
    third.load_state_dict(state)
    assert head + keys(third) == order(small, 2)
    assert keys(third) == order(small, 3)


@pytest.mark.filterwarnings("error:fastload. a new DataLoader iteration")
def test_persistent_workers_advance_each_epoch(small: Packed) -> None:
    ds = fastload.ShardDataset(small.root, batch_size=4, **KW)
    dl = torch.utils.data.DataLoader(
        ds, batch_size=4, num_workers=2, persistent_workers=True, timeout=WORKER_TIMEOUT_S
    )
    epochs = [keys(dl) for _ in range(3)]
    assert epochs[0] == order(small, 0)
    assert epochs[1] == order(small, 1) and epochs[2] == order(small, 2)
    assert ds.epoch == 2
    ds.set_epoch(0)  # set_epoch still wins with persistent workers
    assert keys(dl) == order(small, 0)
    assert keys(dl) == order(small, 1)


@pytest.mark.filterwarnings("error:fastload. a new DataLoader iteration")
def test_fresh_workers_with_set_epoch_read_each_epoch_without_a_warning(small: Packed) -> None:
    ds = fastload.ShardDataset(small.root, batch_size=4, **KW)
    dl = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, timeout=WORKER_TIMEOUT_S)
    for epoch in range(2):
        ds.set_epoch(epoch)
        assert keys(dl) == order(small, epoch)


@pytest.mark.filterwarnings("error:fastload. a new DataLoader iteration")
def test_fresh_workers_without_set_epoch_warn_naming_it(small: Packed) -> None:
    """(The warning is given in a worker, where this suite's filter makes it an error that torch raises
    again in the training process.)"""
    ds = fastload.ShardDataset(small.root, batch_size=4, **KW)
    dl = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, timeout=WORKER_TIMEOUT_S)
    assert keys(dl) == order(small, 0)
    with pytest.raises(UserWarning, match=r"reads epoch 0 again.*set_epoch\(epoch\)"):
        keys(dl)


def test_a_mix_read_in_process_advances_too(small: Packed) -> None:
    def mix() -> fastload.Mix:
        return fastload.Mix(
            {"a": fastload.ShardDataset(small.root, **KW), "b": fastload.ShardDataset(small.root, **KW)}
        )

    m = mix()
    first, second = keys(m), keys(m)
    other = mix()
    other.set_epoch(1)
    assert second == keys(other) and first != second
