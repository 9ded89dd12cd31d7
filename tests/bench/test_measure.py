"""The consumer's figures: the per-worker production rate on made-up arrivals; consume() on a fake loader."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from fastload.bench.measure import Arrival, Run, consume, production_rate


def test_main_process_rate_is_samples_over_time_in_next() -> None:
    # asked at k*0.1, made and delivered 0.08 s later: 10 samples per 0.08 s of producing
    arrivals = [Arrival(k * 0.1, k * 0.1 + 0.08, k * 0.1 + 0.08, -1, 10, 1000) for k in range(5)]
    samples, nbytes, batches = production_rate(arrivals) or (0, 0, 0)
    assert samples == pytest.approx(10 / 0.08) and nbytes == pytest.approx(1000 / 0.08)
    assert batches == pytest.approx(1 / 0.08)


def test_workers_in_lockstep_bursts_are_measured_over_whole_periods() -> None:
    # two workers each make a batch of 10 every second, both at the same instants
    arrivals = []
    for k in range(1, 4):
        for w in (0, 1):
            arrivals.append(Arrival(0.0, k + 0.01 * w, k + 0.001 * w, w, 10, 10))
    samples, _, _ = production_rate(arrivals) or (0, 0, 0)
    assert samples == pytest.approx(20, rel=0.01)  # a window from the first delivery would count ~30-40/s


def test_time_a_worker_spent_blocked_on_a_full_prefetch_queue_is_not_counted() -> None:
    # worker 1 makes batches at 0.1 and 0.2, then must wait until its first batch is delivered (at 3.0,
    # after worker 0's slow first batch) before starting the third, made at 3.1
    arrivals = [
        Arrival(0, 3.0, 3.0, 0, 10, 10),
        Arrival(0, 3.0, 0.1, 1, 10, 10),
        Arrival(0, 3.1, 3.1, 0, 10, 10),
        Arrival(0, 3.1, 0.2, 1, 10, 10),
        Arrival(0, 3.2, 3.2, 0, 10, 10),
        Arrival(0, 3.2, 3.1, 1, 10, 10),
    ]
    samples, _, _ = production_rate(arrivals) or (0, 0, 0)
    assert samples == pytest.approx(100 + 100, rel=0.01)  # each worker: a batch of 10 per 0.1 s busy


def test_no_rate_without_two_batches_from_one_worker() -> None:
    assert production_rate([]) is None
    assert production_rate([Arrival(0, 1, 1, 0, 10, 10), Arrival(0, 1, 1, 1, 10, 10)]) is None


def _batches(n: int, size: int, pause_s: float) -> Iterator[dict[str, Any]]:
    for k in range(n):
        time.sleep(pause_s)
        yield {
            "size": size,
            "nbytes": size * 100,
            "__key__": [f"{k}-{i}" for i in range(size)],
            "made": time.monotonic(),
        }


def test_consume_a_whole_epoch_with_a_step() -> None:
    steps: list[int] = []
    run = consume(
        _batches(6, 4, 0.01),
        Run("fake", 0, 0),
        budget_s=10,
        step=lambda b: steps.append(b["size"]),
        keep_keys=True,
    )
    assert run.complete and run.batches == 6 and run.samples == 24 and run.unique_keys == 24
    assert steps == [4] * 6 and len(run.waits) == len(run.computes) == 6
    assert 0 <= run.wait_share <= 1 and run.samples_per_s > 0 and run.first_batch_s >= 0.01
    figures = run.figures()
    assert len(figures["timeline"]) == 6 and figures["bytes"] == 2400


def test_consume_stops_after_the_budget() -> None:
    run = consume(_batches(1000, 2, 0.005), Run("fake", 0, 0), budget_s=0.05)
    assert not run.complete and 2 <= run.batches < 1000
    assert run.samples_per_s == pytest.approx(2 / 0.005, rel=0.5)
