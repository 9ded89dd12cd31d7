"""The bench plot (issue 28 item 19): a colour per line, the one-num_workers points (prefetch off, cache
cold and warm) visible and apart, and the run's one-line conclusion as the title. A report is built from
figures (no run), then drawn."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastload.bench.measure import Run
from fastload.bench.options import BenchOptions
from fastload.bench.plot import figure, write_png
from fastload.bench.report import conclusion
from fastload.bench.runner import BenchReport

pytest.importorskip("matplotlib")

SWEEPS = {  # variant -> rates at num_workers 0, 1, 2
    "per-file local": (900.0, 1500.0, 2100.0),
    "fastload local": (1000.0, 1700.0, 2300.0),
    "per-file s3": (40.0, 80.0, 150.0),
    "fastload s3": (800.0, 1400.0, 2000.0),
}
POINTS = {
    "fastload s3 prefetch off": 1300.0,
    "fastload s3 cache cold": 1350.0,
    "fastload s3 cache warm": 1420.0,
}


def measured(variant: str, workers: int, rate: float) -> Run:
    run = Run(variant, workers, 0, samples=int(rate), batches=10, nbytes=int(rate) * 1000, wall_s=1.0)
    run.rate = (rate, rate * 1000, 10.0)
    return run


def trained(variant: str, wait_s: float) -> Run:
    run = Run(variant, 1, 0, samples=320, batches=10, nbytes=320_000, wall_s=1.0, first_batch_s=0.1)
    run.waits, run.computes = [0.1] + [wait_s] * 9, [0.025] * 10
    return run


def report() -> BenchReport:
    out = BenchReport(options=BenchOptions(workers=(0, 1, 2), num_workers=1), workload={}, machine={})
    for name in [*SWEEPS, *POINTS]:
        tool, where = name.split(" ")[:2]
        out.variants.append(
            {"name": name, "tool": tool, "where": where, "sweep": name in SWEEPS, "note": None}
        )
    for name, rates in SWEEPS.items():
        out.runs += [measured(name, w, r) for w, r in enumerate(rates)]
    out.runs += [measured(name, 1, r) for name, r in POINTS.items()]
    out.training = [trained("per-file s3", 0.2), trained("fastload s3", 0.003)]
    return out


def test_every_line_has_its_own_colour_the_points_show_and_the_conclusion_is_the_title(
    tmp_path: Path,
) -> None:
    import matplotlib.colors
    import matplotlib.pyplot as plt

    run = report()
    fig = figure(run)
    try:
        ax = fig.axes[0]
        series = {}
        for container in ax.containers:  # one errorbar per variant: (line, caps, bars)
            line = container.lines[0]
            series[container.get_label()] = line
        assert set(series) == set(SWEEPS) | set(POINTS)
        colours = {name: matplotlib.colors.to_hex(line.get_color()) for name, line in series.items()}
        assert len(set(colours.values())) == len(colours), colours
        xs = {name: float(series[name].get_xdata()[0]) for name in POINTS}
        assert len(set(xs.values())) == len(POINTS) and all(abs(x - 1) < 0.5 for x in xs.values()), xs
        for name in POINTS:  # drawn above the lines, big enough to see
            assert series[name].get_zorder() > series["fastload s3"].get_zorder()
            assert series[name].get_markersize() >= 8
        title = fig._suptitle.get_text().replace("\n", " ")
        assert title == conclusion(run)
        assert "fastload reads 13.3x the samples/s of one GET per file over S3" in title
        assert "the training loop waits for data 11% with fastload s3, 89% with per-file s3" in title
    finally:
        plt.close(fig)
    png = tmp_path / "bench.png"
    write_png(run, png)
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
