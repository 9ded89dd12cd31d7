"""The bench plot draws the NVML utilisation timeline above the wait/step timeline."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastload.bench.measure import Run
from fastload.bench.options import BenchOptions
from fastload.bench.runner import BenchReport
from fastload.core.gpuutil import GpuSample, GpuTimeline

matplotlib = pytest.importorskip("matplotlib")


def training_run(gpu: GpuTimeline | None) -> Run:
    run = Run("fastload local", 2, 0, samples=640, batches=10)
    run.waits = [0.5] + [0.02, 0.03] * 5
    run.computes = [0.05] * 11
    run.gpu = gpu
    return run


def report(*runs: Run) -> BenchReport:
    return BenchReport(options=BenchOptions(), workload={}, machine={}, training=list(runs))


def height(path: Path) -> int:
    return int(matplotlib.image.imread(str(path)).shape[0])


def test_utilisation_axis_above_the_timeline(tmp_path: Path) -> None:
    from fastload.bench.plot import write_png

    samples = tuple(GpuSample(0.55 + 0.02 * i, 95.0 if i % 4 else 0.0, 1 << 30) for i in range(40))
    write_png(report(training_run(GpuTimeline(samples=samples, hz=50))), tmp_path / "gpu.png")
    write_png(report(training_run(GpuTimeline(not_measured="NVML: driver not loaded"))), tmp_path / "no.png")
    write_png(report(training_run(None)), tmp_path / "plain.png")
    assert height(tmp_path / "gpu.png") > height(tmp_path / "plain.png") + 50
    assert height(tmp_path / "no.png") > height(tmp_path / "plain.png") + 50


def test_samples_shifted_to_the_timeline_window() -> None:
    import matplotlib.pyplot as plt

    from fastload.bench.plot import _utilisation

    samples = tuple(GpuSample(t, 90.0, 0) for t in (0.1, 0.56, 0.6, 3.0))
    fig, ax = plt.subplots()
    _utilisation(ax, training_run(GpuTimeline(samples=samples, hz=25)), window=1.0)
    xs = list(ax.lines[0].get_xdata())
    assert xs == pytest.approx([0.01, 0.05])  # first batch (0.55 s) not shown; 3.0 past the window
    plt.close(fig)
