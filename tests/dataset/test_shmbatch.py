"""Batches from DataLoader workers through reusable shared-memory slots: the same values as the ordinary
path, slots reused and bounded, nothing left in /dev/shm, stale files of dead processes swept."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest
import torch

import fastload
from fastload.train import shmbatch, shmfiles
from fastload.train.shmbatch import MainSlots, WorkerSlots

from .helpers import Packed

pytestmark = pytest.mark.skipif(not os.path.isdir(shmfiles.SHM_DIR), reason="needs /dev/shm")


def slot_files() -> set[str]:
    return {n for n in os.listdir(shmfiles.SHM_DIR) if n.startswith(shmfiles.PREFIX + "-")}


def left_behind(before: set[str]) -> set[str]:
    """New slot files that nobody holds (a live owner holds its flock): leaks, not another test's loader."""
    return {
        n for n in slot_files() - before if shmfiles.unheld(os.path.join(shmfiles.SHM_DIR, n), older_than=0)
    }


def close_both(worker: WorkerSlots, main: MainSlots) -> None:
    main.close()
    for path, mm in worker.slots:
        mm.close()
        if os.path.exists(path):
            os.unlink(path)


def test_pack_and_unpack_round_trip_in_one_process() -> None:
    worker, main = WorkerSlots(slots=2), MainSlots()
    batch = {
        "__key__": ["a", "b"],
        "jpg": [b"\x00" * 10, b"xyz"],
        "cls": torch.tensor([3, 4]),
        "big": torch.arange(100_000, dtype=torch.float32),  # over the small-tensor limit: a view of the slot
        "empty": torch.empty(0, 3),
    }
    rest, description = worker.pack(batch)
    assert description is not None and set(rest) == {"__key__"}
    out = main.unpack(rest, description)
    assert list(out) == list(batch)
    assert out["jpg"] == batch["jpg"] and out["__key__"] == batch["__key__"]
    assert torch.equal(out["cls"], batch["cls"]) and out["empty"].shape == (0, 3)
    assert torch.equal(out["big"], batch["big"]) and out["big"] is not batch["big"]
    del out  # the views of the slot are gone: the slot is free
    # the slot is free again and reused; a third batch while two are in flight goes the ordinary way
    first_path = description["path"]
    _, d1 = worker.pack(batch)
    _, d2 = worker.pack(batch)
    r3, d3 = worker.pack(batch)
    assert d1 is not None and d1["path"] == first_path
    assert d2 is not None and d2["path"] != first_path
    assert d3 is None and r3 is batch
    close_both(worker, main)


def test_a_list_of_samples_round_trips_through_a_slot() -> None:
    """``collate_fn=list`` batches: each sample's bytes values go through the slot, the rest (and the
    order of every sample's fields) as it was."""
    worker, main = WorkerSlots(slots=1), MainSlots()
    batch = [
        {"__key__": "a", "jpg": b"\xff" * 70_000, "cls": b"3", "__index__": 0},
        {"__key__": "b", "cls": b"", "n": [1, 2], "jpg": b"xyz"},
        {"__key__": "c"},
    ]
    try:
        rest, description = worker.pack(batch)
        assert description is not None and rest[0] == {"__key__": "a", "__index__": 0}
        out = main.unpack(rest, description)
        assert out == batch and [list(x) for x in out] == [list(x) for x in batch]
        assert all(type(v) is bytes for x in out for v in x.values() if isinstance(v, bytes))
        assert worker.pack(batch)[1] is not None  # copied out: the slot is free again
        assert worker.pack([{"k": "no bytes"}]) == ([{"k": "no bytes"}], None)
    finally:
        close_both(worker, main)


def test_non_dict_batches_and_no_bytes_pass_unchanged() -> None:
    worker = WorkerSlots()
    assert worker.pack([1, 2]) == ([1, 2], None)
    assert worker.pack([{"a": b"x"}, 3]) == ([{"a": b"x"}, 3], None)
    assert worker.pack({"k": ["text"]}) == ({"k": ["text"]}, None)


@pytest.mark.parametrize("persistent", [False, True])
def test_loader_batches_equal_in_process_and_leave_no_files(small: Packed, persistent: bool) -> None:
    before = slot_files()

    def batches(workers: int) -> list[dict]:
        ds = fastload.ShardDataset(small.root, decode=False, seed=3)
        kw = {"persistent_workers": persistent} if workers else {}
        loader = fastload.DataLoader(ds, batch_size=4, num_workers=workers, **kw)
        out = list(loader)
        out += list(loader)  # a second epoch reuses (persistent) or recreates the slots
        del loader
        return out

    plain, shared = batches(0), batches(2)
    assert [b["__key__"] for b in shared] == [b["__key__"] for b in plain]
    assert [b["bin"] for b in shared] == [b["bin"] for b in plain]
    ds = fastload.ShardDataset(small.root, decode=False, seed=3)
    as_lists = list(fastload.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=list))
    first_epoch = plain[: len(plain) // 2]
    assert [s["bin"] for b in as_lists for s in b] == [x for b in first_epoch for x in b["bin"]]
    assert all(torch.equal(x["__index__"], y["__index__"]) for x, y in zip(shared, plain, strict=True))
    import gc

    gc.collect()
    deadline = time.monotonic() + 10
    while left_behind(before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left_behind(before), "slot files left in /dev/shm"


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("taken", [1, 2, 5])
def test_an_epoch_left_early_leaves_no_files(uneven: Packed, taken: int, persistent: bool) -> None:
    """A training loop that stops mid-epoch (max steps reached, an exception) closes the loader's iterator
    while its workers have batches in flight: their slot files go with them (persistent workers: when the
    loader goes)."""
    before = slot_files()
    ds = fastload.ShardDataset(uneven.root, decode=False, seed=3)
    loader = fastload.DataLoader(
        ds, batch_size=2, num_workers=3, prefetch_factor=2, persistent_workers=persistent
    )
    iterator = iter(loader)
    for _ in range(taken):
        next(iterator)
    workers = {p.pid for p in multiprocessing.active_children()}
    assert len(workers) == 3
    time.sleep(0.3)  # the workers fill their prefetch: slots made, batches in flight
    iterator.close()
    if persistent:
        assert multiprocessing.active_children(), "persistent workers stay for the next epoch"
        del iterator, loader
    deadline = time.monotonic() + 10  # (until the workers are gone: a live worker's files are held)
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    # (this loader's workers' files only: another test may be killing a job of its own meanwhile)
    theirs = {n for n in left_behind(before) if int(n.split("-")[1]) in workers}
    assert not theirs, "slot files left in /dev/shm by an epoch closed early"


def test_slot_files_of_dead_processes_are_swept(tmp_path: Path) -> None:
    """A slot file nobody holds a lock on and older than the grace period is a dead job's: swept. A file its
    owner holds (locked), or one just made, is kept, whatever process id its name carries."""
    stale = Path(shmfiles.SHM_DIR) / f"{shmfiles.PREFIX}-{os.getpid()}-deadbeef-0"
    stale.write_bytes(b"x")
    old = time.time() - 2 * shmfiles.STALE_SECONDS
    os.utime(stale, (old, old))
    fresh = Path(shmfiles.SHM_DIR) / f"{shmfiles.PREFIX}-1-cafecafe-0"
    fresh.write_bytes(b"x")
    worker = WorkerSlots(slots=1)
    made = worker._free(100)
    assert made is not None
    held = Path(made[0])
    os.utime(held, (old, old))
    try:
        MainSlots().close()
        assert not stale.exists(), "a dead process's slot file was kept"
        assert fresh.exists(), "a slot file just made (its batch maybe in flight) was removed"
        assert held.exists(), "a live worker's (locked) slot file was removed"
    finally:
        for p in (stale, fresh, held):
            if p.exists():
                p.unlink()


def test_a_slot_whose_batch_was_discarded_is_reused() -> None:
    """Batches are taken in order; a busy slot packed before one that was freed held a discarded batch."""
    worker, main = WorkerSlots(slots=2), MainSlots()
    batch = {"jpg": [b"a" * 100]}
    try:
        _, first = worker.pack(batch)  # its batch is discarded (an abandoned iteration): never unpacked
        rest, second = worker.pack(batch)
        assert first is not None and second is not None and first["path"] != second["path"]
        assert worker.pack(batch)[1] is None  # both busy: the ordinary way
        assert main.unpack(rest, second)["jpg"] == batch["jpg"]  # the later one taken: the first is dead
        _, third = worker.pack(batch)
        assert third is not None and third["path"] in (first["path"], second["path"])
        _, fourth = worker.pack(batch)
        assert fourth is not None and {third["path"], fourth["path"]} == {first["path"], second["path"]}
        assert worker.pack(batch)[1] is None  # third and fourth in flight, nothing freed after them
    finally:
        close_both(worker, main)


def test_stacked_tensors_are_views_of_a_leased_slot_until_freed() -> None:
    """Big same-shape tensors are stacked straight into the slot and handed out as views; the slot is not
    reused (not even as 'discarded') while any of them is alive, and is once they are all gone."""
    worker, main = WorkerSlots(slots=2), MainSlots()
    images = [torch.full((3, 40, 40), i, dtype=torch.float32) for i in range(8)]
    samples = [{"__key__": f"k{i}", "img": images[i], "cls": i} for i in range(8)]
    assert shmbatch.stackable(samples) == ["img"]
    assert shmbatch.stackable([{"x": torch.zeros(2)}] * 4) == []  # small: copied, not stacked
    assert shmbatch.stackable([{"x": torch.zeros(9000)}, {"x": torch.zeros(9001)}]) == []
    try:
        rest = {"__key__": [s["__key__"] for s in samples], "img": None, "cls": torch.arange(8)}
        rest, first = worker.pack(rest, {"img": [s["img"] for s in samples]})
        assert first is not None
        out = main.unpack(rest, first)
        assert list(out) == ["__key__", "img", "cls"]
        assert torch.equal(out["img"], torch.stack(images)) and out["img"].dtype == torch.float32
        held = out["img"][3]  # a view keeps the whole slot leased
        del out
        _, second = worker.pack({"b": [b"x"]})
        assert second is not None and second["path"] != first["path"]
        main.unpack({}, second)  # taken after the first: the first would count as discarded if not leased
        _, third = worker.pack({"b": [b"y"]})
        assert third is not None and third["path"] == second["path"]
        assert worker.pack({"b": [b"z"]})[1] is None  # the leased slot is not reused
        assert torch.equal(held, images[3])
        del held
        _, fourth = worker.pack({"b": [b"z"]})
        assert fourth is not None and fourth["path"] == first["path"]
    finally:
        close_both(worker, main)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.bool, torch.int64, torch.complex64])
def test_stacked_tensors_of_any_dtype_round_trip(dtype: torch.dtype) -> None:
    worker, main = WorkerSlots(slots=1), MainSlots()
    values = [(torch.arange(20_000) % (i + 2)).to(dtype) for i in range(5)]
    try:
        rest, description = worker.pack({"k": ["x"] * 5, "t": None}, {"t": values})
        assert description is not None
        out = main.unpack(rest, description)
        assert out["t"].dtype == dtype and torch.equal(out["t"], torch.stack(values))
        del out
    finally:
        close_both(worker, main)


def test_tensor_subclasses_and_grad_are_left_to_the_default_collate() -> None:
    class Image(torch.Tensor):
        pass

    images = [torch.zeros(100, 100).as_subclass(Image) for _ in range(4)]
    assert shmbatch.stackable([{"x": x} for x in images]) == []
    assert shmbatch.stackable([{"x": torch.zeros(100, 100, requires_grad=True)} for _ in range(4)]) == []
    worker = WorkerSlots(slots=1)
    try:  # such tensors collated by someone else stay in the batch, as they are
        batch = {"k": [b"x"], "img": images[0], "w": torch.ones(3, requires_grad=True)}
        rest, description = worker.pack(batch)
        assert description is not None and rest["img"] is batch["img"] and rest["w"] is batch["w"]
    finally:
        close_both(worker, MainSlots())


def test_stacks_go_the_ordinary_way_when_no_slot_is_free() -> None:
    worker = WorkerSlots(slots=0)
    tensors = [torch.full((100, 100), i) for i in range(4)]
    batch, description = worker.pack({"k": ["a"] * 4, "t": None}, {"t": tensors})
    assert description is None and list(batch) == ["k", "t"]
    assert torch.equal(batch["t"], torch.stack(tensors))


def decode_to_tensor(sample: dict) -> dict:
    data = sample["bin"]
    img = torch.tensor(list(data[:64].ljust(64, b"\0")), dtype=torch.uint8).repeat(300, 1)
    return {"__key__": sample["__key__"], "img": img, "n": len(data)}


def test_loader_batches_of_big_tensors_equal_in_process(small: Packed) -> None:
    def batches(workers: int) -> list[dict]:
        ds = fastload.ShardDataset(small.root, decode=False, seed=3, map=decode_to_tensor)
        loader = fastload.DataLoader(ds, batch_size=4, num_workers=workers)
        return list(loader)

    plain, shared = batches(0), batches(2)
    assert [b["__key__"] for b in shared] == [b["__key__"] for b in plain]
    assert all(torch.equal(x["img"], y["img"]) for x, y in zip(shared, plain, strict=True))
    assert all(torch.equal(x["n"], y["n"]) for x, y in zip(shared, plain, strict=True))
    assert shared[0]["img"].shape == (4, 300, 64)
