"""Per-stage loader telemetry as one flat vector of integers: what each stage cost, plain counters, and
latency sketches, laid out so that adding two vectors merges them.

One layout serves every transport: a worker adds into a shared-memory block of it, a batch can carry one,
a rank all-gathers one as a tensor, and a JSON line stores one's summary. Times are integer nanoseconds.

- a **stage** (``STAGES``) has three cells: calls, items (samples, bytes, tasks: what the stage counts) and
  nanoseconds spent;
- a **counter** (``COUNTERS``) is one cell;
- a **sketch** (``SKETCHES``) is a log-bucket histogram of ``BUCKETS`` cells, ``PER_OCTAVE`` buckets per
  doubling (a quantile is within ~9% of the true one), from 1 ns to ~2^40 ns (18 minutes).

Pure: the clock readings come from the caller (:mod:`fastload.train.telemetry`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

STAGES = (
    "plan",  # the rank's order and this worker's share of it (per pass)
    "fetch",  # a read task's bytes from the store or cache (prefetch threads; items: bytes)
    "parse",  # samples out of fetched bytes, CRC32C checks included (items: samples)
    "decode",  # decode_sample (items: samples)
    "map",  # the map= function (items: samples)
    "collate",  # a chunk collated in the worker (items: batches)
    "handover",  # a batch into shared memory (worker) and out of it (loop's process)
    "h2d",  # host-to-device copy issued by the device prefetcher (host time: the copy is asynchronous)
    "wait",  # the loop waiting in next(loader) (items: batches)
    "step",  # the loop's own time between batches
)
COUNTERS = (
    "samples",
    "batches",
    "cache_hits",
    "cache_misses",
    "s3_requests",
    "s3_bytes",
    "s3_retries",
    "s3_throttles",
    "s3_failures",
    "s3_hedges",
    "largest_task_bytes",  # a maximum, not a sum: merged by max
)
MAXED = frozenset({"largest_task_bytes"})
SKETCHES = ("fetch_ns", "first_byte_ns", "wait_ns")
PER_OCTAVE = 4
BUCKETS = 40 * PER_OCTAVE

STAGE_BASE = 0
COUNTER_BASE = 3 * len(STAGES)
SKETCH_BASE = COUNTER_BASE + len(COUNTERS)
SIZE = SKETCH_BASE + BUCKETS * len(SKETCHES)


def stage_cell(stage: str) -> int:
    """Index of ``stage``'s calls cell (items and nanoseconds follow)."""
    return STAGE_BASE + 3 * STAGES.index(stage)


def counter_cell(name: str) -> int:
    return COUNTER_BASE + COUNTERS.index(name)


def sketch_base(name: str) -> int:
    return SKETCH_BASE + BUCKETS * SKETCHES.index(name)


def bucket(ns: int) -> int:
    """The sketch bucket of a value in nanoseconds (values below 1 ns count as 1 ns)."""
    if ns <= 1:
        return 0
    return min(BUCKETS - 1, int(math.log2(ns) * PER_OCTAVE))


def bucket_value(b: int) -> float:
    """The value a bucket stands for: the geometric middle of its range."""
    return float(2 ** ((b + 0.5) / PER_OCTAVE))


def zeros() -> list[int]:
    return [0] * SIZE


def merge(into: list[int], other: Sequence[int]) -> list[int]:
    """``into`` plus ``other`` cell by cell (maxima by max), in place; returned for chaining."""
    if len(other) != SIZE:
        raise ValueError(f"a telemetry vector has {SIZE} cells, got {len(other)}")
    for i, v in enumerate(other):
        if v:
            into[i] += v
    for name in MAXED:
        i = counter_cell(name)
        into[i] = max(into[i] - other[i], other[i])  # undo the sum for this cell
    return into


def quantile(vector: Sequence[int], sketch: str, q: float) -> float | None:
    """The ``q`` quantile (0..1) of a sketch, in its unit (ns), or None when it holds nothing."""
    base = sketch_base(sketch)
    cells = vector[base : base + BUCKETS]
    total = sum(cells)
    if total == 0:
        return None
    rank = q * (total - 1)
    seen = 0
    for b, n in enumerate(cells):
        seen += n
        if seen > rank:
            return bucket_value(b)
    return bucket_value(BUCKETS - 1)  # pragma: no cover (rank < total)


def summary(vector: Sequence[int]) -> dict[str, Any]:
    """A plain dict of a vector: per stage calls, items, seconds and share of the stages' time; counters;
    p50/p90/p99 of each sketch in milliseconds; ``slowest_stage`` of the data stages (wait, step and h2d
    are the loop's own). A worker stage's seconds add up over workers and threads, so stages can sum to
    more than the wall time."""
    stages: dict[str, dict[str, float]] = {}
    for stage in STAGES:
        i = stage_cell(stage)
        stages[stage] = {"calls": vector[i], "items": vector[i + 1], "s": vector[i + 2] / 1e9}
    data = [s for s in STAGES if s not in ("wait", "step", "h2d")]
    busy = sum(stages[s]["s"] for s in data)
    for s in data:
        stages[s]["share"] = stages[s]["s"] / busy if busy > 0 else 0.0
    slowest = max(data, key=lambda s: stages[s]["s"]) if busy > 0 else None
    counters = {name: vector[counter_cell(name)] for name in COUNTERS}
    sketches: dict[str, dict[str, float | None]] = {}
    for name in SKETCHES:
        out: dict[str, float | None] = {}
        for p in (50, 90, 99):
            v = quantile(vector, name, p / 100)
            out[f"p{p}_ms"] = None if v is None else round(v / 1e6, 3)
        sketches[name.removesuffix("_ns")] = out
    wait, step = stages["wait"]["s"], stages["step"]["s"]
    return {
        "stages": stages,
        "counters": counters,
        "latency": sketches,
        "slowest_stage": slowest,
        "wait_share": wait / (wait + step) if wait + step > 0 else 0.0,
    }


# -- across ranks ----------------------------------------------------------------------------------------


def straggler_causes(
    ranks: Sequence[Mapping[str, float]], *, factor: float = 2.0, min_wait_s: float = 0.05
) -> list[tuple[int, str]]:
    """The ranks whose data wait is far above the other ranks' median (``> factor`` times it and more
    than ``min_wait_s`` above it), each with its likely cause, from one row per rank of the same window:
    ``wait_s``, ``step_s``, ``first_byte_p50_ms``, ``throttles``, ``decode_s`` (decode and map),
    ``fetch_s``, ``largest_task_bytes`` (any may be missing). The cause compares the rank with the median
    of the others: throttling (503s) first, then a slow store (first byte), then decoding, then a large
    read, else its fetches."""
    if len(ranks) < 2:
        return []
    waits = [float(r.get("wait_s", 0.0)) for r in ranks]
    found: list[tuple[int, str]] = []
    for rank, row in enumerate(ranks):
        wait = waits[rank]
        middle = others_median(waits, rank)
        if wait <= factor * middle or wait - middle < min_wait_s:
            continue
        others = [r for i, r in enumerate(ranks) if i != rank]
        found.append((rank, _cause(row, others, factor)))
    return found


def others_median(values: Sequence[float], rank: int) -> float:
    """The median of ``values`` without ``rank``'s (with two ranks: the other one's)."""
    return _median([v for i, v in enumerate(values) if i != rank])


def _cause(row: Mapping[str, float], others: Sequence[Mapping[str, float]], factor: float) -> str:
    def typical(key: str) -> float:
        return _median([float(r.get(key, 0.0)) for r in others])

    def above(key: str) -> bool:
        mine = float(row.get(key, 0.0))
        return mine > 0 and mine > factor * typical(key)

    if above("throttles"):
        return f"throttling: {int(row.get('throttles', 0))} S3 503/SlowDown responses in the window"
    if above("first_byte_p50_ms"):
        return (
            f"slow store: first byte p50 {row.get('first_byte_p50_ms', 0):.1f} ms against "
            f"{typical('first_byte_p50_ms'):.1f} ms on other ranks (its host or prefix)"
        )
    if above("decode_s"):
        return (
            f"decode-bound: {row.get('decode_s', 0):.2f}s decoding and mapping against "
            f"{typical('decode_s'):.2f}s on other ranks"
        )
    if above("largest_task_bytes"):
        return f"a large shard: a {int(row.get('largest_task_bytes', 0)) >> 20} MiB read"
    if above("fetch_s"):
        return f"slow fetches: {row.get('fetch_s', 0):.2f}s fetching against {typical('fetch_s'):.2f}s"
    return "waits longer for data than other ranks, with no stage measured slower (CPU contention?)"


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return 0.0
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def window_row(now: Sequence[int], before: Sequence[int]) -> dict[str, float]:
    """One rank's row for :func:`straggler_causes` from its vector now and at the window's start."""
    d = [a - b for a, b in zip(now, before, strict=True)]
    for name in MAXED:
        d[counter_cell(name)] = now[counter_cell(name)]

    def secs(stage: str) -> float:
        return d[stage_cell(stage) + 2] / 1e9

    fb = quantile(d, "first_byte_ns", 0.5)
    return {
        "wait_s": secs("wait"),
        "step_s": secs("step"),
        "fetch_s": secs("fetch"),
        "decode_s": secs("decode") + secs("map"),
        "throttles": float(d[counter_cell("s3_throttles")]),
        "first_byte_p50_ms": 0.0 if fb is None else fb / 1e6,
        "largest_task_bytes": float(d[counter_cell("largest_task_bytes")]),
    }
