"""torch's own DataLoader over a ShardDataset with only the arguments people pass to it (``batch_size``,
``num_workers``): every sample exactly once, in an order known in advance, with few long reads, and a
warning (once) where that order depends on ``num_workers``; torchdata's ``StatefulDataLoader`` resuming
through the dataset's ``state_dict()``; ``fastload.DataLoader`` leaving the dataset it wraps as it was."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch.utils.data

import fastload
from fastload.core.sharding import worker_span
from fastload.errors import ConfigError
from fastload.testing.faultproxy import FaultProxy
from fastload.train.chunks import Chunk

from .helpers import WORKER_TIMEOUT_S, Packed, batch_keys, flat, keys_of, run_python, take

SCRIPTS = Path(__file__).resolve().parent / "scripts"
KW: dict[str, Any] = {"seed": 5, "shuffle_buffer": 8}
IGNORE_ORDER_WARNING = pytest.mark.filterwarnings("ignore:fastload.ShardDataset is read by")


def torch_loader(dataset: Any, batch_size: int, num_workers: int, **options: Any) -> Any:
    if num_workers:
        options.setdefault("timeout", WORKER_TIMEOUT_S)
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, **options)


def stretches_in_turn(order: list[str], batch_size: int, workers: int) -> list[list[str]]:
    """The batches torch's DataLoader delivers when worker w reads the w-th contiguous stretch of ``order``:
    one batch from each worker in turn, skipping workers that have run out."""
    per_worker = []
    for w in range(workers):
        first, stop = worker_span(len(order), worker=w, workers=max(workers, 1))
        mine = order[first:stop]
        per_worker.append([mine[i : i + batch_size] for i in range(0, len(mine), batch_size)])
    out = []
    for i in range(max(len(b) for b in per_worker)):
        out += [b[i] for b in per_worker if i < len(b)]
    return out


@IGNORE_ORDER_WARNING
@pytest.mark.parametrize("batch_size", [4, 5])
@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
def test_every_sample_once_in_the_order_of_worker_stretches(
    uneven: Packed, num_workers: int, batch_size: int
) -> None:
    ds = fastload.ShardDataset(uneven.root, **KW)
    batches = batch_keys(torch_loader(ds, batch_size, num_workers))
    order = uneven.rank_keys(rank=0, world_size=1, epoch=0, **KW)
    assert Counter(flat(batches)) == Counter(uneven.keys)
    assert batches == stretches_in_turn(order, batch_size, max(num_workers, 1))
    if num_workers <= 1:
        assert flat(batches) == order  # one worker or none: the rank's order itself


@IGNORE_ORDER_WARNING
def test_persistent_workers_two_epochs_and_ranks(uneven: Packed) -> None:
    for rank in range(2):
        ds = fastload.ShardDataset(uneven.root, rank=rank, world_size=2, **KW)
        dl = torch_loader(ds, 4, 3, persistent_workers=True)
        for epoch in (0, 1):
            ds.set_epoch(epoch)
            order = uneven.rank_keys(rank=rank, world_size=2, epoch=epoch, **KW)
            assert batch_keys(dl) == stretches_in_turn(order, 4, 3), f"rank {rank}, epoch {epoch}"


def test_the_order_warning_comes_once_and_only_when_the_order_depends_on_workers(uneven: Packed) -> None:
    done = run_python(SCRIPTS / "torch_loader_warning.py", uneven.root)
    assert done.returncode == 0, done.stderr[-3000:]
    parts = dict(p.split("\n", 1) for p in done.stderr.split("== case ")[1:])
    counts = {case: text.count("fastload.ShardDataset is read by") for case, text in parts.items()}
    assert counts == {
        "no batch_size, 2 workers, 2 epochs": 1,
        "no batch_size, 1 worker": 0,
        "no batch_size, in process": 0,
        "batch_size=4, 2 workers": 0,
        "fastload.DataLoader, 2 workers": 0,
    }
    assert "depends on num_workers" in parts["no batch_size, 2 workers, 2 epochs"]
    assert "batch_size=B" in parts["no batch_size, 2 workers, 2 epochs"]


@IGNORE_ORDER_WARNING
@pytest.mark.usefixtures("s3_env")
@pytest.mark.parametrize("dataset_batch_size", [None, 4])
def test_workers_read_long_runs_over_s3(
    uneven: Packed, uploaded: str, moto_url: str, dataset_batch_size: int | None
) -> None:
    """Without batch_size= each worker reads its stretch with one ranged GET per shard it touches; with it,
    one per chunk of 4 samples (not one per sample, as when workers took turns sample by sample)."""
    with FaultProxy(moto_url) as proxy:
        # no hedges: they are extra GETs by design when a loaded machine answers late (seen in a whole-suite
        # run: 59 GETs, most of them 16 KiB pieces of split hedges); this counts the reads planned
        config = fastload.S3Config(endpoint_url=proxy.endpoint_url, addressing_style="path", hedge=0)
        ds = fastload.ShardDataset(uploaded, decode=False, s3_config=config, batch_size=dataset_batch_size)
        keys = keys_of(torch_loader(ds, 4, 2, collate_fn=list))
        gets = [r for r in proxy.requests() if r.method == "GET" and r.target.split("?")[0].endswith(".tar")]
    assert Counter(keys) == Counter(uneven.keys)
    shards = len(uneven.counts)
    if dataset_batch_size is None:
        assert len(gets) <= shards + 1, [r.range for r in gets]  # 2 stretches: one shard cut in two
    else:
        assert len(gets) <= len(uneven.keys) // 4 + shards + 1, [r.range for r in gets]


# --- the Stateful protocol ------------------------------------------------------------------------------


def test_in_process_state_dict_round_trip(uneven: Packed) -> None:
    full = [s["__key__"] for s in fastload.ShardDataset(uneven.root, decode=False, **KW)]
    ds = fastload.ShardDataset(uneven.root, decode=False, **KW)
    it = iter(ds)
    head = [s["__key__"] for s in take(it, 23)]
    state = json.loads(json.dumps(ds.state_dict()))
    assert (state["epoch"], state["delivered"]) == (0, 23)
    again = fastload.ShardDataset(uneven.root, decode=False, **KW)
    again.load_state_dict(state)
    assert head + [s["__key__"] for s in again] == full
    assert again.start == 0 and again.state_dict()["delivered"] == 0  # a complete pass rewinds


def test_a_worker_state_is_refused_outside_its_worker(uneven: Packed) -> None:
    ds = fastload.ShardDataset(uneven.root)
    worker_state = {**ds.state_dict(), "worker": {"id": 1, "count": 2, "chunk": None, "consumed": 3}}
    with pytest.raises(ConfigError, match="worker 1 of 2"):
        ds.load_state_dict(worker_state)
    with pytest.raises(ConfigError, match="worker's state"):
        fastload.DataLoader(ds, batch_size=4).load_state_dict(worker_state)


class RecordKeys:
    """``map=``: append each sample's key to a file (from any process) before passing the sample on."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(sample["__key__"] + "\n")
        return sample


@IGNORE_ORDER_WARNING
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")  # torchdata 0.11 on torch 2.13
@pytest.mark.parametrize(("num_workers", "dataset_batch_size"), [(0, None), (2, None), (2, 4), (3, 4)])
def test_stateful_dataloader_resumes_through_the_dataset_state(
    uneven: Packed, tmp_path: Path, num_workers: int, dataset_batch_size: int | None
) -> None:
    """torchdata's StatefulDataLoader calls the dataset's state_dict in each worker and load_state_dict on
    restore: the resumed run reads only the samples not yet delivered (no fast-forward re-reading them)."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def make(record: Path | None = None) -> Any:
        ds = fastload.ShardDataset(
            uneven.root,
            decode=False,
            batch_size=dataset_batch_size,
            map=RecordKeys(record) if record else None,
            **KW,
        )
        options = {"timeout": WORKER_TIMEOUT_S} if num_workers else {}
        return stateful.StatefulDataLoader(
            ds, batch_size=4, num_workers=num_workers, collate_fn=list, **options
        )

    full = keys_of(make())
    for k in (1, 5, 11):
        loader = make()
        it = iter(loader)
        head = keys_of(take(it, k))
        state = loader.state_dict()
        del it
        record = tmp_path / f"read-after-{k}.txt"
        resumed = make(record)
        resumed.load_state_dict(state)
        rest = keys_of(resumed)
        assert head + rest == full, f"stopped after {k} batches"
        read = record.read_text().split()
        assert Counter(read) == Counter(rest), "the resumed run read samples already delivered"


# --- fastload.DataLoader leaves the dataset alone -----------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_dataset_iterates_the_same_after_being_wrapped(uneven: Packed, num_workers: int) -> None:
    ds = fastload.ShardDataset(uneven.root, decode=False, **KW)
    before = list(ds)
    loader = fastload.DataLoader(
        ds, batch_size=4, num_workers=num_workers, timeout=WORKER_TIMEOUT_S if num_workers else 0
    )
    assert keys_of(loader) == [s["__key__"] for s in before]
    ds.set_epoch(0)  # (a plain pass after a complete one reads the next epoch: ask for epoch 0 again)
    after = list(ds)
    assert not any(isinstance(s, Chunk) for s in after)
    assert after == before
    assert ds.batch_size is None
    ds.set_epoch(1)  # the loader's handle shares the dataset's epoch and position
    assert loader.dataset.epoch == 1
    assert keys_of(loader) == uneven.rank_keys(rank=0, world_size=1, epoch=1, **KW)


def test_the_loader_state_restores_into_the_dataset_it_was_given(uneven: Packed) -> None:
    ds = fastload.ShardDataset(uneven.root, **KW)
    loader = fastload.DataLoader(ds, batch_size=4)
    ds.set_epoch(2)
    it = iter(loader)
    take(it, 3)
    state = loader.state_dict()
    it.close()
    assert (state["epoch"], state["delivered"], state["batch_size"]) == (2, 12, 4)
    fresh = fastload.ShardDataset(uneven.root, **KW)
    fastload.DataLoader(fresh, batch_size=4).load_state_dict(state)
    assert (fresh.epoch, fresh.start, len(fresh)) == (2, 12, len(uneven.keys) - 12)


@IGNORE_ORDER_WARNING
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
def test_a_forked_worker_does_not_report_the_training_process_pass(uneven: Packed) -> None:
    """A worker forked after the training process began a pass of its own over the same dataset starts
    from its own beginning, and says so in its state (a checkpoint taken before it delivered anything)."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def loader(ds: fastload.ShardDataset) -> Any:
        return stateful.StatefulDataLoader(
            ds, batch_size=4, num_workers=2, collate_fn=list, timeout=WORKER_TIMEOUT_S
        )

    full = keys_of(loader(fastload.ShardDataset(uneven.root, decode=False, **KW)))
    ds = fastload.ShardDataset(uneven.root, decode=False, **KW)
    take(iter(ds), 30)  # a pass in this process, left unfinished
    first = loader(ds)
    it = iter(first)
    head = keys_of(take(it, 0))  # the workers' states are their initial ones, taken before any batch
    state = first.state_dict()
    del it
    again = loader(fastload.ShardDataset(uneven.root, decode=False, **KW))
    again.load_state_dict(state)
    assert head + keys_of(again) == full
