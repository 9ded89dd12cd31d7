"""Throttling lowers the process's requests in flight (AIMD) and successes raise it back."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import fastload
from fastload.testing.faultproxy import Fault, FaultProxy, Rule

from .helpers import bounded, sha, url

# A limit of its own: the AIMD gate is per process and per process_max_concurrency value (see conftest).
PMC = 8


def test_storm_lowers_the_concurrency_limit_and_it_recovers(
    proxy: FaultProxy, make_config: Callable[..., fastload.S3Config], objects: dict[str, bytes]
) -> None:
    config = make_config(
        proxy, part_size_bytes=64 << 10, process_max_concurrency=PMC, max_attempts=500, deadline_s=8.0
    )
    data = objects["obj-3m"]
    samples: list[tuple[float, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append((time.monotonic(), fastload.s3_stats()["concurrency_limit"]))
            time.sleep(0.01)

    def read() -> bytes:
        with fastload.open(url("obj-3m"), config=config) as f:
            return f.read()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        storm_s = 2.0  # (1.5 s left a loaded machine time for one halving only)
        # from the first GET (the proxy's clock is this process's monotonic one), however late it comes
        storm = proxy.add(Rule(Fault.slowdown(), method="GET", for_s=storm_s, from_first=True))
        assert sha(bounded(read, 20)) == sha(data)
        assert storm.first_at is not None
        storm_began, storm_ended = storm.first_at, storm.first_at + storm_s
        after_storm = fastload.s3_stats()
        # recovery: many successful requests after the storm
        for _ in range(2):
            assert sha(bounded(read, 20)) == sha(data)
    finally:
        stop.set()
        sampler.join(5)

    final = fastload.s3_stats()
    during = [limit for t, limit in samples if storm_began <= t <= storm_ended and limit]
    assert during, "no samples during the storm"
    lowest = min(during)
    assert after_storm["throttles"] >= 3
    assert lowest <= PMC // 4, samples  # halved at least twice (one halving per 0.5 s of throttling)
    assert final["throttles"] == after_storm["throttles"] == proxy.stats().injected["slowdown"]
    assert final["concurrency_limit"] >= PMC - 1, final  # back up after ~100 successes
    assert final["failures"] == 0
