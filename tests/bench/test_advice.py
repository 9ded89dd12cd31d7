"""The advice rules (fastload.core.advice): given stage timings and sweeps, the right plain-words advice."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastload.core.advice import (
    HEADROOM,
    LOADER_BOUND_SHARE,
    Facts,
    StageTimes,
    advise,
    covers,
    demand,
    fastest_workers,
    loop_rate,
    suggest_workers,
)


def facts(**overrides: object) -> Facts:
    base: dict[str, object] = {
        "batch_size": 32,
        "num_workers": 2,
        "wait_share": 0.62,
        "step_s": 0.025,  # consumes 1,280 samples/s
        "cores": 8,
        "throughput_by_workers": {0: 300.0, 2: 600.0, 4: 1100.0, 6: 1700.0, 8: 1750.0},
    }
    base.update(overrides)
    return Facts(**base)  # type: ignore[arg-type]


def test_loader_bound_names_the_share_and_the_workers_that_cover_the_step() -> None:
    advice = advise(facts())
    assert advice.verdict == "loader-bound"
    assert advice.lines[0].startswith("loader-bound: 62% of the step waits for data")
    # 1,280 samples/s x 1.2 headroom = 1,536: 6 workers (1,700) is the fewest that covers it
    assert advice.suggested_workers == 6
    assert "raise num_workers to 6" in advice.text()


def test_compute_bound_says_the_loader_keeps_up_and_suggests_nothing_more() -> None:
    advice = advise(facts(wait_share=0.03, throughput_by_workers={0: 2000.0, 2: 4000.0}))
    assert advice.verdict == "compute-bound"
    assert "keeps up" in advice.lines[0] and "3%" in advice.lines[0]
    assert not any("raise num_workers" in line for line in advice.lines)


def test_compute_bound_with_too_many_workers_suggests_fewer() -> None:
    sweep = {0: 1000.0, 2: 4000.0, 4: 4050.0, 8: 3900.0}
    advice = advise(facts(wait_share=0.01, num_workers=8, throughput_by_workers=sweep))
    assert advice.suggested_workers == 2  # 1,280 samples/s x 1.2 = 1,536: 0 workers do not cover it, 2 do
    assert any(line.startswith("num_workers=2 already covers the step") for line in advice.lines)


def test_no_setting_is_enough_says_more_workers_will_not_do() -> None:
    advice = advise(facts(throughput_by_workers={0: 40.0, 2: 80.0, 4: 81.0}, cores=2))
    assert advice.suggested_workers == 2  # the fewest within 5% of the best
    assert any("more workers alone will not fix it on 2 cores" in line for line in advice.lines)


def test_the_boundary_share_is_loader_bound() -> None:
    assert advise(facts(wait_share=LOADER_BOUND_SHARE)).verdict == "loader-bound"
    assert advise(facts(wait_share=LOADER_BOUND_SHARE - 1e-9)).verdict == "compute-bound"


def test_loader_alone_run_has_its_own_verdict() -> None:
    advice = advise(facts(step_s=0.0, wait_share=1.0, num_workers=8))
    assert advice.verdict == "loader-alone"
    assert any(line.startswith("num_workers=6 is as fast as any setting") for line in advice.lines)
    assert advice.suggested_workers == 6  # the fewest within 5% of the best (1,700 vs 1,750)


def test_pack_advice_quotes_count_size_and_measured_ratio() -> None:
    advice = advise(facts(files=180_000, file_bytes_mean=40 * 1024, packed_vs_per_file=9.2))
    assert "these 180,000 files average 40 KiB: pack them (fastload pack) — expected 9.2x" in advice.text()


def test_packing_that_would_not_help_is_said_plainly() -> None:
    advice = advise(facts(files=3000, file_bytes_mean=8000, packed_vs_per_file=1.05))
    line = next(line for line in advice.lines if "these 3,000 files" in line)
    assert "would gain little" in line and "1.1x" in line


@pytest.mark.parametrize(
    ("stages", "per_file", "remote", "expected"),
    [
        (StageTimes(fetch_s=1e-5, parse_s=0, decode_s=9e-4, collate_s=1e-5), True, False, "decode takes"),
        (StageTimes(fetch_s=0.03, parse_s=0, decode_s=1e-3, collate_s=1e-5), True, True, "pack the files"),
        (StageTimes(fetch_s=3e-3, parse_s=1e-5, decode_s=1e-3, collate_s=1e-5), False, True, "cache_dir="),
        (StageTimes(fetch_s=1e-5, parse_s=0, decode_s=1e-4, collate_s=5e-4), False, False, "collate takes"),
        (
            StageTimes(fetch_s=1e-5, parse_s=0, decode_s=1e-4, collate_s=1e-5, to_device_s=4e-4),
            False,
            False,
            "pin_memory=True",
        ),
    ],
)
def test_the_dominant_stage_gets_its_fix(
    stages: StageTimes, per_file: bool, remote: bool, expected: str
) -> None:
    advice = advise(facts(stages=stages, remote=remote, files=10 if per_file else None))
    assert any(expected in line for line in advice.lines), advice.lines


def test_no_stage_line_when_none_dominates_or_when_compute_bound() -> None:
    even = StageTimes(fetch_s=1.0, parse_s=1.0, decode_s=1.0, collate_s=1.0)
    assert not any("takes" in line for line in advise(facts(stages=even)).lines)
    skewed = StageTimes(fetch_s=0, parse_s=0, decode_s=1.0, collate_s=0)
    assert not any("takes" in line for line in advise(facts(stages=skewed, wait_share=0.0)).lines)


def test_prefetch_and_cache_gains_and_losses() -> None:
    text = advise(facts(prefetch_gain=3.0, cache_gain=0.5)).text()
    assert "shard prefetch measured 3.0x faster" in text
    assert "a warm local shard cache measured slower here (0.5x)" in text
    quiet = advise(facts(prefetch_gain=1.05, cache_gain=1.0)).text()
    assert "prefetch" not in quiet and "cache" not in quiet


@pytest.mark.parametrize(
    "bad",
    [
        {"wait_share": 1.5},
        {"wait_share": -0.1},
        {"step_s": -1.0},
        {"batch_size": 0},
        {"cores": 0},
        {"throughput_by_workers": {0: -1.0}},
    ],
)
def test_impossible_figures_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        facts(**bad)


def test_negative_stage_time_is_refused() -> None:
    with pytest.raises(ValueError, match="decode_s"):
        StageTimes(fetch_s=0, parse_s=0, decode_s=-1, collate_s=0)


def test_demand_and_fastest() -> None:
    assert demand(32, 0.025) == pytest.approx(1280)
    assert demand(32, 0) is None
    assert fastest_workers({}) is None
    assert fastest_workers({0: 100.0, 2: 196.0, 4: 200.0}) == 2


@given(
    st.dictionaries(st.integers(0, 64), st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=8),
    st.one_of(st.none(), st.floats(0.001, 1e6, allow_nan=False)),
)
def test_suggestion_is_a_measured_setting_and_covers_the_demand_when_it_says_so(
    sweep: dict[int, float], needed: float | None
) -> None:
    workers, enough = suggest_workers(sweep, needed)
    assert workers in sweep
    if needed is not None and enough:
        assert covers(workers, sweep[workers], needed)
        assert sweep[workers] >= needed * HEADROOM
        assert all(w >= workers for w, t in sweep.items() if covers(w, t, needed))
    if needed is not None and not enough:
        assert not any(covers(w, t, needed) for w, t in sweep.items())


@given(
    st.dictionaries(st.integers(0, 16), st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=8),
    st.floats(0.001, 1e6, allow_nan=False),
    st.integers(0, 16),
)
def test_a_loader_bound_loop_is_never_told_to_use_fewer_workers(
    sweep: dict[int, float], needed: float, running: int
) -> None:
    """Issue 28 item 18: not fewer than it ran with (it waited with them), nor than the best measured."""
    workers, _ = suggest_workers(sweep, needed, running=running, loader_bound=True)
    assert workers is not None and (workers in sweep or workers == running)
    assert workers >= running
    assert workers >= (fastest_workers({w: loop_rate(w, t, needed) for w, t in sweep.items()}) or 0)
    loop = facts(num_workers=running, wait_share=0.5, step_s=32 / needed, throughput_by_workers=sweep)
    advice = advise(loop)
    assert "already covers" not in advice.text() and "for nothing" not in advice.text()


def test_zero_workers_are_judged_by_what_the_loop_sees_not_the_loader_alone() -> None:
    """Issue 28 item 18, as the issue measured it: loader-bound at 2 workers (21% waiting), and the loader
    alone at 0 workers faster than the step consumes. With 0 workers loading runs in series with the step,
    so it does not cover the step; the advice said "num_workers=0 already covers the step ... 2 costs
    memory and CPU for nothing" under a loader-bound verdict."""
    sweep = {0: 2000.0, 2: 1900.0}  # the step consumes 1,280 samples/s
    advice = advise(facts(num_workers=2, wait_share=0.21, throughput_by_workers=sweep))
    text = advice.text()
    assert advice.verdict == "loader-bound"
    assert advice.suggested_workers == 2
    assert "already covers" not in text and "for nothing" not in text and "num_workers=0" not in text, text
    assert "yet the loop waited for data with 2" in text and "--workers 2,4" in text, text
    # with 0 workers the loop would wait 1280 / (1280 + 2000) = 39% of its time: not a cover
    assert loop_rate(0, 2000.0, 1280.0) == pytest.approx(1 / (1 / 2000 + 1 / 1280))
    assert not covers(0, 2000.0, 1280.0)
    # more workers measured: the fewest above 2 that cover the step
    advice = advise(facts(num_workers=2, wait_share=0.21, throughput_by_workers={**sweep, 4: 3000.0}))
    assert advice.suggested_workers == 4 and "raise num_workers to 4" in advice.text()


def test_a_compute_bound_loop_may_drop_to_zero_workers_only_when_the_loop_would_not_wait() -> None:
    fast = advise(facts(num_workers=2, wait_share=0.02, throughput_by_workers={0: 20_000.0, 2: 30_000.0}))
    assert fast.suggested_workers == 0  # 1,280 / 21,280: the loop would wait 6%
    assert any(
        line.startswith("num_workers=0 already covers the step") and "wait 6%" in line for line in fast.lines
    )
    slow = advise(facts(num_workers=2, wait_share=0.02, throughput_by_workers={0: 2000.0, 2: 3000.0}))
    assert slow.suggested_workers == 2 and "num_workers=0" not in slow.text()
