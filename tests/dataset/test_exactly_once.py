"""Every sample exactly once per epoch across ranks and DataLoader workers, for each even policy.

Ranks are simulated with explicit ``rank=`` / ``world_size=``; workers are real processes.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch.utils.data

import fastload
from fastload import formats
from fastload.formats import entries
from fastload.packing.upgrade import upgrade_index

from .helpers import WORKER_TIMEOUT_S, Packed, batch_keys, flat, make_loader

BATCH = 4
FULL_ENTRY = formats.full_entry


def run_rank(
    packed: Packed,
    *,
    rank: int,
    world: int,
    num_workers: int,
    epoch: int = 0,
    torch_loader: bool = False,
    **kw: Any,
) -> tuple[list[list[str]], dict[str, Any]]:
    """One rank's epoch ``epoch``: its batches' keys and its ``epoch_report()``."""
    if torch_loader:
        # The plain torch DataLoader: the dataset must be told the batch size itself.
        ds = fastload.ShardDataset(packed.root, rank=rank, world_size=world, batch_size=BATCH, **kw)
        options = {"timeout": WORKER_TIMEOUT_S} if num_workers else {}
        dl = torch.utils.data.DataLoader(ds, batch_size=BATCH, num_workers=num_workers, **options)
    else:
        ds, dl = make_loader(
            packed, batch_size=BATCH, num_workers=num_workers, rank=rank, world_size=world, **kw
        )
    ds.set_epoch(epoch)
    return batch_keys(dl), ds.epoch_report()


def check_dropped_names(packed: Packed, dropped: list[tuple[str, str]]) -> None:
    for shard, key in dropped:
        assert packed.where(key)[0] == shard


@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_split_every_sample_once(uneven: Packed, world: int, num_workers: int) -> None:
    seed, epoch = 7, world
    per_rank, dropped = [], []
    for rank in range(world):
        batches, report = run_rank(
            uneven, rank=rank, world=world, num_workers=num_workers, epoch=epoch, seed=seed, shuffle_buffer=8
        )
        per_rank.append(batches)
        dropped += [tuple(x) for x in report["dropped"]]
        assert not report["repeated"]
        # Each rank reads exactly its canonical slice, in order.
        assert flat(batches) == uneven.rank_keys(
            rank=rank, world_size=world, seed=seed, epoch=epoch, even="split", shuffle_buffer=8
        )
    delivered = [k for batches in per_rank for k in flat(batches)]
    assert len(delivered) == len(set(delivered)), "a sample was delivered twice"
    assert sorted(delivered + [k for _, k in dropped]) == sorted(uneven.keys)
    assert not set(delivered) & {k for _, k in dropped}
    assert len(dropped) == len(uneven.keys) % world < world
    check_dropped_names(uneven, dropped)
    # DDP needs the same number of steps on every rank.
    assert len({len(b) for b in per_rank}) == 1
    assert len({len(flat(b)) for b in per_rank}) == 1


@pytest.mark.parametrize(("world", "num_workers"), [(2, 0), (3, 2), (2, 3)])
def test_drop_equal_counts_and_reports_the_rest(uneven: Packed, world: int, num_workers: int) -> None:
    per_rank, dropped = [], []
    for rank in range(world):
        batches, report = run_rank(
            uneven, rank=rank, world=world, num_workers=num_workers, torch_loader=True, seed=3, even="drop"
        )
        per_rank.append(flat(batches))
        dropped += [tuple(x) for x in report["dropped"]]
        assert report["samples"] == len(per_rank[-1])
    delivered = [k for keys in per_rank for k in keys]
    assert len({len(keys) for keys in per_rank}) == 1
    assert len(delivered) == len(set(delivered))
    assert Counter(delivered + [k for _, k in dropped]) == Counter(uneven.keys)
    check_dropped_names(uneven, dropped)
    # Whole shards go to ranks: a rank's samples (delivered and dropped) come from its own shards only.
    shards_of = [{uneven.where(k)[0] for k in keys} for keys in per_rank]
    for a in range(world):
        for b in range(a + 1, world):
            assert not shards_of[a] & shards_of[b]


@pytest.mark.parametrize(("world", "num_workers"), [(2, 1), (3, 3)])
def test_pad_equal_counts_repeats_only_what_it_reports(uneven: Packed, world: int, num_workers: int) -> None:
    per_rank, repeated = [], []
    for rank in range(world):
        batches, report = run_rank(
            uneven, rank=rank, world=world, num_workers=num_workers, torch_loader=True, seed=3, even="pad"
        )
        per_rank.append(flat(batches))
        repeated += [k for _, k in report["repeated"]]
        assert not report["dropped"]
    delivered = [k for keys in per_rank for k in keys]
    assert len({len(keys) for keys in per_rank}) == 1
    assert set(delivered) == set(uneven.keys)  # nothing lost
    assert Counter(delivered) == Counter(uneven.keys) + Counter(repeated)  # only reported repeats
    assert repeated, "these shard sizes cannot be equal without padding"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_none_is_a_partition_with_uneven_counts(uneven: Packed, num_workers: int) -> None:
    per_rank = []
    for rank in range(2):
        batches, report = run_rank(uneven, rank=rank, world=2, num_workers=num_workers, seed=1, even="none")
        per_rank.append(flat(batches))
        assert not report["dropped"] and not report["repeated"]
    assert Counter(per_rank[0] + per_rank[1]) == Counter(uneven.keys)
    assert len(per_rank[0]) != len(per_rank[1])  # shards of 40 and 1 samples cannot balance here


def test_pad_without_a_shard_to_repeat_is_refused(small: Packed) -> None:
    # 5 shards for 6 ranks: rank 5 has nothing of its own to repeat.
    ds = fastload.ShardDataset(small.root, rank=5, world_size=6, even="pad")
    with pytest.raises(ValueError, match="split"):
        list(ds)


def test_split_without_a_seed_trains_every_sample_within_world_size_epochs(uneven: Packed) -> None:
    # 95 samples over 3 ranks: 2 are cut each epoch; the cut moves on, so 3 epochs train on all of them
    world, trained, cuts = 3, set(), []
    for epoch in range(world):
        cut = []
        for rank in range(world):
            batches, report = run_rank(uneven, rank=rank, world=world, num_workers=0, epoch=epoch)
            trained |= set(flat(batches))
            cut += [tuple(x) for x in report["dropped"]]
            assert report["cut_from"] == epoch * (len(uneven.keys) % world)
        assert len(cut) == len(uneven.keys) % world
        check_dropped_names(uneven, cut)
        cuts.append({k for _, k in cut})
    assert trained == set(uneven.keys)
    assert not cuts[0] & cuts[1] and not cuts[1] & cuts[2]


@pytest.mark.parametrize(("even", "world"), [("split", 2), ("drop", 3), ("pad", 3)])
def test_epoch_report_of_an_index_v2_names_the_same_samples(
    uneven: Packed, tmp_path: Path, even: str, world: int
) -> None:
    """v2 manifest entries carry no keys: the report reads the sample tables of the shards it names only."""
    v2 = tmp_path / "v2"
    shutil.copytree(uneven.root, v2)
    upgrade_index(v2)
    assert "keys" not in json.loads((v2 / "index.json").read_bytes())["shards"][0]
    named_anywhere: set[str] = set()
    for rank in range(world):
        kw: dict[str, Any] = {"rank": rank, "world_size": world, "seed": 5, "even": even}
        old, new = fastload.ShardDataset(uneven.root, **kw), fastload.ShardDataset(v2, **kw)
        for ds in (old, new):
            ds.set_epoch(2)
        assert new.plan().samples == old.plan().samples and len(new) == len(old)
        fetched: list[str] = []

        def counting(root: str, entry: Any, fetched: list[str] = fetched, **options: Any) -> Any:
            fetched.append(entry.name)
            return FULL_ENTRY(root, entry, **options)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(entries, "full_entry", counting)  # (DatasetEntries.entry, the one caller)
            report = new.epoch_report()
        assert report == old.epoch_report()
        named = {s for s, _ in report["dropped"] + report["repeated"]}
        assert set(fetched) == named and len(fetched) == len(named)  # each named shard's table once
        named_anywhere |= named
    assert named_anywhere, f"even={even!r} over {world} ranks should cut or repeat something here"
