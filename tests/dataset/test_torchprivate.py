"""fastload.train.torchprivate against the installed torch: each name torch does not document that fastload
relies on still does what fastload needs (a torch upgrade that changes one fails here, by name)."""

from __future__ import annotations

import multiprocessing
import os
import signal
from typing import Any

import pytest
import torch.utils.data

from fastload.train.torchprivate import is_worker_death, shut_down_workers


class Numbers(torch.utils.data.Dataset[int]):
    def __init__(self, die_at: int | None = None) -> None:
        self.die_at = die_at

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> int:
        if i == self.die_at and torch.utils.data.get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return i


def workers_alive(before: set[int]) -> set[int]:
    return {p.pid for p in multiprocessing.active_children() if p.pid is not None} - before


def test_shutdown_workers_stops_a_multiprocess_iterator_now() -> None:
    before = workers_alive(set())
    loader = torch.utils.data.DataLoader(Numbers(), batch_size=4, num_workers=2, timeout=60)
    it: Any = iter(loader)
    assert next(it).tolist() == [0, 1, 2, 3]
    assert len(workers_alive(before)) == 2
    assert shut_down_workers(it), "torch's multi-process iterator has _shutdown_workers()"
    assert workers_alive(before) == set()
    assert not shut_down_workers(iter(torch.utils.data.DataLoader(Numbers(), batch_size=4)))


def test_a_killed_worker_is_reported_in_words_fastload_recognises() -> None:
    # (dies before sending anything: torch's SIGCHLD handler or its liveness check raises in next())
    loader = torch.utils.data.DataLoader(Numbers(die_at=0), batch_size=4, num_workers=1, timeout=60)
    it = iter(loader)
    with pytest.raises(RuntimeError) as caught:
        next(it)
    del it
    assert is_worker_death(caught.value), f"torch's words changed: {caught.value}"
    assert not is_worker_death(RuntimeError("something else")) and not is_worker_death(ValueError("x"))
