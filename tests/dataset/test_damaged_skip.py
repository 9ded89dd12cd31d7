"""``on_error="skip"`` and damaged samples: a sample whose bytes fail their CRC32C (a real flipped byte in a
shard) is left out like one that fails to decode: counted and named (shard, key, byte offset) in
``epoch_report()`` and ``skipped_samples``, warned once per shard, a batch of skipped samples still a step
(equal steps on every rank); the same for ``MapDataset`` batches (``ds[i]`` of it raises, having nothing to
return). The default still raises."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch.utils.data

import fastload
from fastload.errors import SampleChecksumError, VerifyError
from fastload.formats import native

from .helpers import WORKER_TIMEOUT_S, keys_of, make_loader, pack_files, small_files, take
from .test_v2 import data_byte, flip, to_v2

IGNORE_CRC_WARNING = pytest.mark.filterwarnings("ignore:.*fails its CRC32C:UserWarning")
REASON = "its bytes fail their CRC32C (damaged shard)"


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """30 samples in tar shards of 7 (an index v2: each sample's CRC32C recorded)."""
    packed = pack_files(tmp_path_factory.mktemp("clean"), small_files(), max_samples=7)
    return to_v2(packed, tmp_path_factory.mktemp("v2") / "ds")


@pytest.fixture(scope="module")
def damaged(clean: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any]]:
    """``clean`` with one data byte flipped in samples 3 and 5 of shard 1 and sample 0 of shard 3:
    ``(root, [(shard, key, offset), ...])`` of the damaged samples, in index order."""
    root = tmp_path_factory.mktemp("damaged") / "ds"
    shutil.copytree(clean, root)
    bad = []
    for shard, sample in ((1, 3), (1, 5), (3, 0)):
        name, key, offset, at = data_byte(root, shard, sample)
        flip(root / name, at)
        bad.append((name, key, offset))
    return root, bad


def all_keys(root: Path) -> list[str]:
    return [s["__key__"] for s in fastload.ShardDataset(root, decode=False)]


def named(bad: list[Any]) -> list[tuple[str, str, int, str]]:
    return [(*b, REASON) for b in bad]


@pytest.mark.parametrize("kw", [{"prefetch_bytes": 0}, {"prefetch_bytes": 1 << 20}, {"python": True}])
def test_skip_leaves_out_damaged_samples_counted_named_and_warned_once_per_shard(
    clean: Path, damaged: tuple[Path, list[Any]], kw: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, bad = damaged
    if kw.pop("python", False):  # the Python readers, as without the C module
        monkeypatch.setattr(native, "layout_run", None)
    ds = fastload.ShardDataset(root, on_error="skip", **kw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        keys = [s["__key__"] for s in ds]
    assert keys == [k for k in all_keys(clean) if k not in {b[1] for b in bad}]
    assert ds.skipped == 3
    assert ds.skipped_samples == named(bad)
    report = ds.epoch_report()
    assert report["skipped_on_error"] == 3 and report["skipped_samples"] == named(bad)
    messages = [str(w.message) for w in caught if "CRC32C" in str(w.message)]
    assert len(messages) == 2, messages  # once per shard
    assert (
        f"sample {bad[0][1]!r} at byte offset {bad[0][2]}" in messages[0] and "fastload verify" in messages[0]
    )
    assert messages[1].startswith(bad[2][0])
    ds.set_epoch(1)  # a new epoch counts afresh
    assert ds.skipped == 0 and ds.skipped_samples == []


def test_the_default_still_raises_naming_the_sample(damaged: tuple[Path, list[Any]]) -> None:
    root, bad = damaged
    with pytest.raises(SampleChecksumError) as info:
        list(fastload.ShardDataset(root))
    assert isinstance(info.value, VerifyError)
    assert (info.value.shard, info.value.key, info.value.offset) == bad[0]
    assert "on_error='skip'" in str(info.value)


@IGNORE_CRC_WARNING
@pytest.mark.parametrize("workers", [0, 2])
def test_fastload_dataloader_skips_them_with_equal_steps(
    clean: Path, damaged: tuple[Path, list[Any]], workers: int
) -> None:
    """batch_size=1: each damaged sample's batch is all skipped, and is a step all the same (the batch
    before it again), so the loader takes one step per sample of the rank, as every rank does."""
    root, bad = damaged
    ds, dl = make_loader(str(root), batch_size=1, num_workers=workers, decode=False, on_error="skip", seed=3)
    with pytest.warns(UserWarning, match="every sample of a batch was skipped"):
        batches = [list(b["__key__"]) for b in dl]
    clean_keys = [list(b["__key__"]) for b in make_loader(str(clean), batch_size=1, decode=False, seed=3)[1]]
    assert len(batches) == len(clean_keys) == 30
    assert dl.repeated_batches == 3
    kept = [b for b, c in zip(batches, clean_keys, strict=True) if b == c]
    assert len(kept) == 27 and {k for b in kept for k in b} == set(all_keys(clean)) - {b[1] for b in bad}
    assert ds.skipped == 3 and sorted(ds.skipped_samples) == sorted(named(bad))


@IGNORE_CRC_WARNING
def test_resume_over_damaged_samples_is_exact(damaged: tuple[Path, list[Any]]) -> None:
    root, _ = damaged
    kw = {"decode": False, "on_error": "skip", "seed": 1, "shuffle_buffer": 4}
    full = keys_of(make_loader(str(root), batch_size=4, **kw)[1])
    _, dl = make_loader(str(root), batch_size=4, num_workers=2, **kw)
    iterator = iter(dl)
    before = keys_of(take(iterator, 3))
    state = dl.state_dict()
    del iterator
    _, dl = make_loader(str(root), batch_size=4, num_workers=2, **kw)
    dl.load_state_dict(state)
    assert before + keys_of(dl) == full and len(full) == 27


@IGNORE_CRC_WARNING
@pytest.mark.filterwarnings("ignore:fastload.ShardDataset is read by")
def test_torch_dataloader_workers_count_and_name_them(damaged: tuple[Path, list[Any]]) -> None:
    root, bad = damaged
    ds = fastload.ShardDataset(root, decode=False, on_error="skip")
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, timeout=WORKER_TIMEOUT_S)
    keys = [s["__key__"] for s in dl]
    assert len(keys) == 27 and not {b[1] for b in bad} & set(keys)
    assert ds.skipped == 3 and sorted(ds.skipped_samples) == sorted(named(bad))


def test_map_dataset_batches_leave_them_out(clean: Path, damaged: tuple[Path, list[Any]]) -> None:
    root, bad = damaged
    ds = fastload.MapDataset(root, decode=False, on_error="skip")
    every = [s["__key__"] for s in fastload.MapDataset(clean, decode=False)[:]]
    with pytest.warns(UserWarning, match="fails its CRC32C") as caught:
        got = [s["__key__"] for s in ds.__getitems__(list(range(len(ds))))]
    assert len([w for w in caught if "CRC32C" in str(w.message)]) == 2  # once per shard
    assert got == [k for k in every if k not in {b[1] for b in bad}]
    assert ds.skipped == 3 and ds.skipped_samples == named(bad)
    # read again: counted again, named once (a random-access dataset may read one sample many times)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and warned about once per shard, not once per read
        ds.__getitems__(list(range(len(ds))))
    assert ds.skipped == 6 and ds.skipped_samples == named(bad) and ds.skipped_unnamed == 0
    # a batch of neighbours read along with a damaged sample nobody asked for: read around it
    first = every.index(bad[0][1])
    assert [s["__key__"] for s in ds.__getitems__([first - 1, first + 1])] == every[first - 1 : first + 2 : 2]
    assert [s["__key__"] for s in fastload.MapDataset(root, decode=False)[[first - 1, first + 1]]] == [
        every[first - 1],
        every[first + 1],
    ]
    # ds[i] alone has nothing to return: it raises (and the default raises for a batch too)
    with pytest.raises(SampleChecksumError) as info:
        ds[first]
    assert (info.value.shard, info.value.key, info.value.offset) == bad[0]
    with pytest.raises(SampleChecksumError):
        fastload.MapDataset(root, decode=False)[first - 1 : first + 1]


@IGNORE_CRC_WARNING
def test_map_dataset_names_a_bounded_number_of_skipped_samples(
    damaged: tuple[Path, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    import fastload.train.mapview as mapview

    monkeypatch.setattr(mapview, "NAMED", 2)
    root, bad = damaged
    ds = fastload.MapDataset(root, decode=False, on_error="skip")
    ds.__getitems__(list(range(len(ds))))
    assert ds.skipped == 3 and ds.skipped_samples == named(bad)[:2] and ds.skipped_unnamed == 1


@IGNORE_CRC_WARNING
def test_map_dataset_with_torch_dataloader_workers(damaged: tuple[Path, list[Any]], clean: Path) -> None:
    root, bad = damaged
    ds = fastload.MapDataset(root, decode=False, on_error="skip")
    dl = torch.utils.data.DataLoader(
        ds, batch_size=4, num_workers=2, collate_fn=list, timeout=WORKER_TIMEOUT_S
    )
    keys = [s["__key__"] for batch in dl for s in batch]
    assert keys == [k for k in all_keys(clean) if k not in {b[1] for b in bad}]
