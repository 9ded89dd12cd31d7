"""S3 counters sent between processes: a worker's ``delta()`` since its last batch, ``merge``d by the
training process (issue 28 item 17)."""

from __future__ import annotations

from fastload.core.retry import Fault
from fastload.s3.stats import S3Stats


def test_deltas_add_up_to_the_workers_counters_exactly_once() -> None:
    worker, loop = S3Stats(), S3Stats()
    assert worker.delta() is None  # nothing counted: nothing sent
    worker.request_done(0.010, 100)
    worker.request_failed(Fault.THROTTLE, retried=True)
    worker.hedge_event(sent=1, won=1)
    loop.merge(worker.delta() or {})
    assert worker.delta() is None  # each count is sent once
    worker.request_done(0.030, 50)
    worker.request_failed(Fault.UNREACHABLE, retried=False)
    loop.merge(worker.delta() or {})
    loop.request_done(0.020, 7)  # the loop's own
    got, want = loop.snapshot(), worker.snapshot()
    assert got["requests"] == want["requests"] + 1 == 5
    assert got["bytes"] == want["bytes"] + 7 == 157
    assert got["retries"] == want["retries"] == {"throttle": 1}
    assert (got["failures"], got["throttles"]) == (1, 1)
    assert got["hedges"]["sent"] == got["hedges"]["won"] == 1
    assert got["first_byte_latency"]["p50_ms"] == 20.0  # the three latencies, pooled
