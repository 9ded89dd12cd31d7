"""Batches from DataLoader workers through reusable shared-memory slots: the same values as the ordinary
path, slots reused and bounded, nothing left in /dev/shm, stale files of dead processes swept."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import fastload
from fastload.io import shmbatch
from fastload.io.shmbatch import MainSlots, WorkerSlots

from .helpers import Packed

pytestmark = pytest.mark.skipif(not os.path.isdir(shmbatch.SHM_DIR), reason="needs /dev/shm")


def slot_files() -> set[str]:
    return {n for n in os.listdir(shmbatch.SHM_DIR) if n.startswith(shmbatch.PREFIX + "-")}


def test_pack_and_unpack_round_trip_in_one_process() -> None:
    worker, main = WorkerSlots(slots=2), MainSlots()
    batch = {
        "__key__": ["a", "b"],
        "jpg": [b"\x00" * 10, b"xyz"],
        "cls": torch.tensor([3, 4]),
        "big": torch.zeros(100_000),  # over the small-tensor limit: stays in the batch
        "empty": torch.empty(0, 3),
    }
    rest, description = worker.pack(batch)
    assert description is not None and set(rest) == {"__key__", "big"}
    out = main.unpack(rest, description)
    assert list(out) == list(batch)
    assert out["jpg"] == batch["jpg"] and out["__key__"] == batch["__key__"]
    assert torch.equal(out["cls"], batch["cls"]) and out["empty"].shape == (0, 3)
    assert out["big"] is batch["big"]
    # the slot is free again and reused; a third batch while two are in flight goes the ordinary way
    first_path = description["path"]
    _, d1 = worker.pack(batch)
    _, d2 = worker.pack(batch)
    r3, d3 = worker.pack(batch)
    assert d1 is not None and d1["path"] == first_path
    assert d2 is not None and d2["path"] != first_path
    assert d3 is None and r3 is batch
    main.close()
    for _, mm in worker.slots:
        mm.close()
    for path, _ in worker.slots:
        if os.path.exists(path):
            os.unlink(path)


def test_non_dict_batches_and_no_bytes_pass_unchanged() -> None:
    worker = WorkerSlots()
    assert worker.pack([1, 2]) == ([1, 2], None)
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
    assert all(torch.equal(x["__index__"], y["__index__"]) for x, y in zip(shared, plain, strict=True))
    import gc

    gc.collect()
    deadline = time.monotonic() + 10
    while slot_files() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not slot_files() - before, "slot files left in /dev/shm"


def test_slot_files_of_dead_processes_are_swept(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead = int(proc.stdout)
    stale = Path(shmbatch.SHM_DIR) / f"{shmbatch.PREFIX}-{dead}-0"
    stale.write_bytes(b"x")
    mine = Path(shmbatch.SHM_DIR) / f"{shmbatch.PREFIX}-{os.getpid()}-999999"
    mine.write_bytes(b"x")
    try:
        MainSlots().close()
        assert not stale.exists(), "a dead process's slot file was kept"
        assert mine.exists(), "a live process's slot file was removed"
    finally:
        for p in (stale, mine):
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
        main.close()
        for path, mm in worker.slots:
            mm.close()
            if os.path.exists(path):
                os.unlink(path)
