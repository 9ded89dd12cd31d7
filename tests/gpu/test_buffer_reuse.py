"""No batch buffer is reused while its (asynchronous) copy to the device may still read it.

On a GPU a ``non_blocking`` copy reads host memory some time after ``.to()`` returns. Here the copy is a
fake that keeps only the source's address (as a DMA engine does, no reference) and reads it when the step
uses the batch. The batches come out of real shared-memory slots (one slot, so a freed slot is reused at
once by the next batch): if the prefetcher let go of a batch's host tensors before the step used the
device copy, the next batch would be written into the same slot and the step would see its bytes.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from typing import Any

import torch

from fastload.train.feed import DevicePrefetcher
from fastload.train.shmbatch import MainSlots, WorkerSlots

ROWS, COLS = 256, 1024  # 256 KiB: above SMALL_TENSOR_BYTES, so handed out as a view of the slot


class LateCopy:
    """A copy in flight: the source's address and size; the bytes are read only at :meth:`result`."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.address, self.nbytes, self.shape = tensor.data_ptr(), tensor.numel(), tensor.shape

    def result(self) -> torch.Tensor:
        data = ctypes.string_at(self.address, self.nbytes)
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(self.shape)


def late_copy(item: dict[str, Any], device: torch.device, non_blocking: bool) -> dict[str, Any]:
    return {k: LateCopy(v) if isinstance(v, torch.Tensor) else v for k, v in item.items()}


def through_one_slot(count: int, main: MainSlots) -> Iterator[dict[str, Any]]:
    worker = WorkerSlots(slots=1)
    for i in range(count):
        rest, description = worker.pack({"x": torch.full((ROWS, COLS), i, dtype=torch.uint8), "i": i})
        yield main.unpack(rest, description) if description is not None else rest


def test_the_step_sees_its_own_batch_not_the_next() -> None:
    main = MainSlots()
    try:
        seen = []
        for batch in DevicePrefetcher(through_one_slot(5, main), "cpu", copy=late_copy):
            x = batch["x"].result()  # the step uses the batch: only now does the copy complete
            seen.append((batch["i"], int(x.min()), int(x.max())))
        assert seen == [(i, i, i) for i in range(5)]
    finally:
        main.close()


def test_the_fake_would_catch_a_buffer_released_early() -> None:
    """The same source and copy, but the host batch dropped right after the copy is issued: the slot is
    reused and the step reads the next batch's bytes (so the test above can fail)."""
    main = MainSlots()
    try:
        source = through_one_slot(3, main)
        first = late_copy(next(source), torch.device("cpu"), True)  # the host batch is dropped here
        second = next(source)  # packed into the freed slot
        assert int(first["x"].result().max()) == second["i"] == 1
    finally:
        main.close()
