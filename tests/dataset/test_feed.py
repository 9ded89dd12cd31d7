"""``fastload.loader``: defaults, wait accounting, the device prefetcher's look-ahead, and exact resume
through it (the batch held ahead is not counted as delivered)."""

from __future__ import annotations

import time
from collections import namedtuple

import pytest
import torch

import fastload
from fastload.errors import ConfigError
from fastload.train.feed import DevicePrefetcher, Loader, default_workers, to_device

from .helpers import Packed


def keys_of(batches: list[dict]) -> list[str]:
    return [k for b in batches for k in b["__key__"]]


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_delivers_every_sample_once_and_counts_waits(small: Packed, workers: int) -> None:
    loader = fastload.loader(str(small.root), batch_size=4, num_workers=workers, device="cpu")
    assert isinstance(loader, Loader)
    batches = []
    for batch in loader:
        time.sleep(0.01)  # a "training step"
        batches.append(batch)
    assert sorted(keys_of(batches)) == sorted(small.keys)
    stats = loader.stats
    assert stats.batches == len(batches) == len(loader) == 8
    assert stats.step_s >= 0.01 * (len(batches) - 1)
    assert stats.wait_s >= 0 and 0 <= stats.wait_share < 1
    assert stats.first_batch_s is not None and stats.first_batch_s >= 0
    assert len(stats.recent_waits_s) == len(batches)
    assert "batches" in stats.summary() and stats.as_dict()["batches"] == len(batches)


def test_a_slow_loader_shows_as_waiting() -> None:
    class Slow(torch.utils.data.IterableDataset):
        def __iter__(self):
            for i in range(5):
                time.sleep(0.02)
                yield torch.tensor([i])

    loader = fastload.loader(Slow(), batch_size=1, num_workers=0)
    assert [int(b) for b in loader] == [0, 1, 2, 3, 4]
    assert loader.stats.wait_s >= 5 * 0.02
    assert loader.stats.wait_share > 0.5
    with pytest.raises(ConfigError, match="cannot resume"):
        loader.state_dict()


def test_fake_clock_splits_wait_and_step() -> None:
    now = [0.0]

    def clock() -> float:
        return now[0]

    def source():
        for i in range(3):
            now[0] += 2.0  # the loader takes 2 s per batch
            yield i

    loader = Loader(source(), clock=clock)
    for _ in loader:
        now[0] += 1.0  # the step takes 1 s
    assert loader.stats.batches == 3
    assert loader.stats.wait_s == pytest.approx(6.0)
    assert loader.stats.step_s == pytest.approx(3.0)  # the third step ends when the loop asks again
    assert loader.stats.wait_share == pytest.approx(6.0 / 9.0)


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_through_the_look_ahead_loses_and_repeats_nothing(small: Packed, workers: int) -> None:
    def build() -> Loader:
        return fastload.loader(str(small.root), batch_size=3, num_workers=workers, device="cpu", seed=5)

    first = build()
    first.set_epoch(0)
    seen: list[str] = []
    for n, batch in enumerate(first, 1):
        seen += batch["__key__"]
        if n == 4:
            state = first.state_dict()  # the prefetcher already holds batch 5: it must not count
            break
    assert state["delivered"] == 12
    second = build()
    second.load_state_dict(state)
    second.set_epoch(0)
    rest = keys_of(list(second))
    assert len(seen) + len(rest) == len(small.keys)
    assert sorted(seen + rest) == sorted(small.keys)
    whole = build()
    whole.set_epoch(0)
    assert seen + rest == keys_of(list(whole))


def test_device_prefetcher_fetches_one_ahead() -> None:
    pulled: list[int] = []

    def source():
        for i in range(4):
            pulled.append(i)
            yield {"x": torch.tensor([i])}

    it = iter(DevicePrefetcher(source(), "cpu"))
    first = next(it)
    assert int(first["x"]) == 0 and pulled == [0, 1]  # item 1 is on its way while item 0 is in use
    assert [int(b["x"]) for b in it] == [1, 2, 3]


def test_to_device_moves_nested_tensors_and_keeps_the_rest() -> None:
    Pair = namedtuple("Pair", "a b")
    batch = {"t": torch.ones(2), "l": [torch.zeros(1), "s"], "p": Pair(torch.ones(1), 3), "k": ("x", 1)}
    out = to_device(batch, torch.device("cpu"))
    assert isinstance(out["p"], Pair) and out["p"].b == 3
    assert out["l"][1] == "s" and out["k"] == ("x", 1)
    assert torch.equal(out["t"], batch["t"])


def test_defaults_and_bad_arguments(small: Packed) -> None:
    assert default_workers(1) == 0
    assert default_workers(2) == 2
    assert default_workers(4) == 3
    assert default_workers(64) == 8
    ds = fastload.ShardDataset(small.root)
    with pytest.raises(ConfigError, match="seed"):
        fastload.loader(ds, batch_size=2, seed=1)
    with pytest.raises(ConfigError, match="batch_size"):
        fastload.loader(ds, batch_size=0)
    loader = fastload.loader(ds, batch_size=2, num_workers=2)
    dl = loader.dataloader
    assert dl.num_workers == 2 and dl.persistent_workers and dl.prefetch_factor == 4
    assert dl.pin_memory == torch.cuda.is_available()
