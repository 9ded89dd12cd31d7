"""fastload.core.telemetry: the vector layout merges by addition (maxima by max), quantiles of the sketch
stay within a bucket of the true ones, summaries name the slowest stage, and straggler causes."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from fastload.core import telemetry as t


def vector(stages: dict[str, tuple[int, int, int]] | None = None, **counters: int) -> list[int]:
    v = t.zeros()
    for name, cells in (stages or {}).items():
        i = t.stage_cell(name)
        v[i : i + 3] = cells
    for name, n in counters.items():
        v[t.counter_cell(name)] = n
    return v


def observe(v: list[int], sketch: str, values: list[int]) -> list[int]:
    for x in values:
        v[t.sketch_base(sketch) + t.bucket(x)] += 1
    return v


def test_merge_adds_cells_and_takes_the_maximum_of_maxima() -> None:
    a = vector({"fetch": (2, 100, 5)}, samples=3, largest_task_bytes=7)
    b = vector({"fetch": (1, 50, 4)}, samples=4, largest_task_bytes=5)
    merged = t.merge(list(a), b)
    assert merged[t.stage_cell("fetch") : t.stage_cell("fetch") + 3] == [3, 150, 9]
    assert merged[t.counter_cell("samples")] == 7
    assert merged[t.counter_cell("largest_task_bytes")] == 7


@settings(deadline=None)  # (a loaded machine)
@given(st.lists(st.integers(min_value=1, max_value=10**11), min_size=1, max_size=300), st.floats(0, 1))
def test_quantiles_are_within_one_bucket_of_the_true_ones(values: list[int], q: float) -> None:
    v = observe(t.zeros(), "fetch_ns", values)
    got = t.quantile(v, "fetch_ns", q)
    true = sorted(values)[math.floor(q * (len(values) - 1))]
    assert got is not None
    assert abs(math.log2(got) - math.log2(max(true, 1))) <= 1 / t.PER_OCTAVE + 1e-9


def test_summary_names_the_slowest_data_stage_and_the_wait_share() -> None:
    v = vector(
        {"fetch": (1, 10, 3_000_000_000), "decode": (5, 5, 1_000_000_000), "wait": (4, 4, 1_000_000_000)}
    )
    v[t.stage_cell("step") + 2] = 3_000_000_000
    s = t.summary(observe(v, "wait_ns", [1_000_000] * 10))
    assert s["slowest_stage"] == "fetch"
    assert s["stages"]["fetch"]["share"] == 0.75
    assert s["wait_share"] == 0.25
    assert 0.9 < s["latency"]["wait"]["p50_ms"] < 1.1
    assert s["latency"]["first_byte"]["p50_ms"] is None


def row(wait: float, **more: float) -> dict[str, float]:
    return {"wait_s": wait, "step_s": 10.0, **more}


def test_no_straggler_when_waits_are_alike_or_tiny() -> None:
    assert t.straggler_causes([row(1.0), row(1.2), row(0.9)]) == []
    assert t.straggler_causes([row(0.0), row(0.01)]) == []  # far above in ratio, not in seconds
    assert t.straggler_causes([row(5.0)]) == []


def test_each_cause_is_named() -> None:
    base = {"first_byte_p50_ms": 20.0, "decode_s": 1.0, "fetch_s": 1.0, "largest_task_bytes": 16 << 20}
    cases = {
        "throttling": {"throttles": 12},
        "slow store": {"first_byte_p50_ms": 200.0},
        "decode-bound": {"decode_s": 8.0},
        "a large shard": {"largest_task_bytes": 512 << 20},
        "slow fetches": {"fetch_s": 9.0},
        "no stage measured slower": {},
    }
    for want, changed in cases.items():
        rows = [row(0.5, **base), row(5.0, **{**base, **changed}), row(0.4, **base)]
        found = t.straggler_causes(rows)
        assert [r for r, _ in found] == [1], want
        assert want in found[0][1], (want, found)


def test_window_row_takes_the_difference() -> None:
    before = vector({"wait": (1, 1, 1_000_000_000)}, s3_throttles=2)
    now = vector({"wait": (5, 5, 4_000_000_000), "decode": (1, 1, 500_000_000)}, s3_throttles=7)
    r = t.window_row(observe(now, "first_byte_ns", [30_000_000] * 3), before)
    assert r["wait_s"] == 3.0 and r["throttles"] == 5 and r["decode_s"] == 0.5
    assert 25 < r["first_byte_p50_ms"] < 35
