"""The restore checks ShardDataset and Mix share (train/position.PositionMethods): a worker's state
restored outside its DataLoader, a worker's state restored into another worker slot, and a worker restore
that continues where the checkpoint's worker had got."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch.utils.data

import fastload
from fastload.errors import ConfigError

from .helpers import Packed, pack_files


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    files = {f"r/{i:03d}.txt": f"r{i}".encode() for i in range(20)}
    return pack_files(tmp_path_factory.mktemp("restore"), files, max_samples=5)


def make(kind: str, packed: Packed, batch_size: int = 4) -> Any:
    ds = fastload.ShardDataset(packed.root, seed=3)
    if kind == "dataset":
        return ds.in_chunks(batch_size)
    return fastload.Mix({"a": ds}, batch_size=batch_size).in_chunks(batch_size)


def as_worker(monkeypatch: pytest.MonkeyPatch, worker: int, workers: int) -> None:
    """What torch's get_worker_info says inside DataLoader worker ``worker`` of ``workers``."""
    info = SimpleNamespace(id=worker, num_workers=workers)
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: info)


@pytest.mark.parametrize("kind", ["dataset", "mix"])
def test_a_worker_state_outside_its_dataloader_is_refused(
    kind: str, packed: Packed, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = make(kind, packed)
    as_worker(monkeypatch, 1, 2)
    state = source.state_dict()  # taken in worker 1 of 2
    assert state["worker"]["id"] == 1
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="describes DataLoader worker 1 of 2"):
        make(kind, packed).load_state_dict(state)


@pytest.mark.parametrize("kind", ["dataset", "mix"])
def test_a_worker_state_into_another_slot_is_refused(
    kind: str, packed: Packed, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_worker(monkeypatch, 1, 2)
    state = make(kind, packed).state_dict()
    as_worker(monkeypatch, 0, 3)
    with pytest.raises(ConfigError, match="worker 1 of 2 read chunks of 4; this is worker 0 of 3"):
        make(kind, packed).load_state_dict(state)
    as_worker(monkeypatch, 1, 2)
    with pytest.raises(ConfigError, match="batch_size=8; resume with the same num_workers"):
        make(kind, packed, batch_size=8).load_state_dict(state)


@pytest.mark.parametrize("kind", ["dataset", "mix"])
def test_a_worker_restore_sets_only_this_copys_next_pass(
    kind: str, packed: Packed, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_worker(monkeypatch, 1, 2)
    state = {**make(kind, packed).state_dict(), "epoch": 2}
    state["worker"] = {**state["worker"], "consumed": 3}
    target = make(kind, packed)
    target.load_state_dict(state)
    assert target._pending is not None
    assert (target._pending.epoch, target._pending.worker, target._pending.consumed) == (2, 1, 3)
    assert target.epoch == 0  # the shared position is the training process's
