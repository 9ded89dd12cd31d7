"""The pure reading of a GPU utilisation timeline (fastload.core.gpuutil) and the advice it feeds."""

from __future__ import annotations

from fastload.core.advice import Facts, advise
from fastload.core.gpuutil import GpuSample, GpuTimeline, drops, read_pattern


def sawtooth(periods: int = 10) -> list[float]:
    """High while the step computes, near zero while the loop waits: 6 busy samples, 4 idle, per batch."""
    return ([95.0] * 6 + [2.0] * 4) * periods


def test_sawtooth_while_waiting_is_loader_bound() -> None:
    pattern = read_pattern(sawtooth(), wait_share=0.4)
    assert pattern.kind == "sawtooth"
    assert pattern.figures["drops"] == 10
    assert "loader-bound" in pattern.line


def test_sawtooth_without_waits_is_not_blamed_on_the_loader() -> None:
    assert read_pattern(sawtooth(), wait_share=0.02).kind != "sawtooth"


def test_flat_high_is_busy() -> None:
    pattern = read_pattern([97.0, 99.0, 98.0, 96.0] * 20, wait_share=0.01)
    assert pattern.kind == "busy"


def test_flat_low_without_waits_is_the_step_not_the_loader() -> None:
    pattern = read_pattern([12.0, 20.0, 15.0] * 20, wait_share=0.01)
    assert pattern.kind == "underused"
    assert "not the loader" in pattern.line


def test_not_measured_says_why() -> None:
    pattern = read_pattern([], 0.5, not_measured="pynvml is not installed")
    assert pattern.kind == "not-measured" and "pynvml is not installed" in pattern.line


def test_drops_use_hysteresis() -> None:
    assert drops([90, 50, 90, 50, 5, 50, 5, 90, 0]) == 2  # 50s neither rise nor fall; 5 after 5 is one drop


def test_timeline_summary_and_dict() -> None:
    timeline = GpuTimeline(samples=(GpuSample(0.0, 50.0, 2**30), GpuSample(0.04, 100.0, 3 * 2**30)), hz=25)
    assert timeline.mean_util_pct == 75.0 and timeline.peak_mem_bytes == 3 * 2**30
    assert "mean 75%" in timeline.summary() and timeline.as_dict()["samples"][1] == [0.04, 100.0, 3 * 2**30]
    assert "not measured: no driver" in GpuTimeline(not_measured="no driver").summary()


def facts(**gpu: object) -> Facts:
    return Facts(batch_size=64, num_workers=4, wait_share=0.4, step_s=0.05, cores=8, **gpu)  # type: ignore[arg-type]


def test_advice_reads_the_timeline() -> None:
    lines = advise(facts(gpu_util_pct=tuple(sawtooth()))).lines
    assert any("saws between high and near zero" in line for line in lines)
    lines = advise(facts(gpu_not_measured="NVML: driver not loaded")).lines
    assert any("not measured: NVML: driver not loaded" in line for line in lines)
    assert not any("GPU" in line for line in advise(facts()).lines)  # not asked: not mentioned
