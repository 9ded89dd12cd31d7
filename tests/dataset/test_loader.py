"""DataLoader settings users pick: spawned workers, pin_memory=False, persistent workers over epochs."""

from __future__ import annotations

from collections import Counter

import torch.utils.data

import fastload

from .helpers import WORKER_TIMEOUT_S, Packed, keys_of, make_loader


def reference(packed: Packed, epoch: int, **kw: object) -> list[str]:
    ds, dl = make_loader(packed, batch_size=4, **kw)
    ds.set_epoch(epoch)
    return keys_of(dl)


def test_spawned_persistent_workers_follow_set_epoch(small: Packed) -> None:
    kw = {"seed": 2, "shuffle_buffer": 4}
    ds, dl = make_loader(
        small,
        batch_size=4,
        num_workers=2,
        loader={"multiprocessing_context": "spawn", "persistent_workers": True, "pin_memory": False},
        **kw,
    )
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        assert keys_of(dl) == reference(small, epoch, **kw), f"epoch {epoch}"
    assert reference(small, 0, **kw) != reference(small, 1, **kw)


def test_plain_torch_loader_with_persistent_workers_two_epochs(uneven: Packed) -> None:
    ds = fastload.ShardDataset(uneven.root, seed=8, shuffle_buffer=16, batch_size=5)
    dl = torch.utils.data.DataLoader(
        ds, batch_size=5, num_workers=3, persistent_workers=True, pin_memory=False, timeout=WORKER_TIMEOUT_S
    )
    orders = []
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        batches = list(dl)
        orders.append(keys_of(batches))
        assert Counter(orders[-1]) == Counter(uneven.keys)  # every sample exactly once
        assert all(len(b["__key__"]) == 5 for b in batches)  # 95 samples: no short batch
        assert orders[-1] == reference(uneven, epoch, seed=8, shuffle_buffer=16)
    assert orders[0] != orders[1]


def test_breaking_off_an_epoch_with_persistent_workers(uneven: Packed) -> None:
    # A loop that stops early (evaluation, time limit) and starts the next epoch gets the whole next epoch.
    ds, dl = make_loader(uneven, batch_size=4, num_workers=2, loader={"persistent_workers": True}, seed=6)
    ds.set_epoch(0)
    for i, _ in enumerate(dl):
        if i == 3:
            break
    ds.set_epoch(1)
    assert keys_of(dl) == reference(uneven, 1, seed=6)
