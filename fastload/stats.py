"""Counters users (and ``fastload bench``) can read."""

from __future__ import annotations

from typing import Any

from fastload.s3 import runtime


def s3_stats(*, reset: bool = False) -> dict[str, Any]:
    """This process's S3 counters: requests, bytes, retries by cause, throttles, the current concurrency
    limit and requests in flight, first-byte latency percentiles (ms), and ``hedges`` (second GETs sent for
    lagging requests: sent, won, failed, wasted_bytes, cut, and those suppressed by throttling or the
    budget). ``reset`` zeroes them after.

    In a training process these include the S3 requests of its :class:`fastload.DataLoader` workers: each
    worker sends what it counted with every batch, and it is added here when the batch arrives (so a
    worker's requests for batches not yet delivered show up with them; read-ahead a worker does after its
    last batch of an epoch cut short arrives with its next batch, if any). A plain ``torch`` DataLoader's
    workers keep theirs to themselves."""
    stats = runtime.current().stats
    snap = stats.snapshot()
    if reset:
        stats.reset()
    return snap
