"""The picture of a run (matplotlib, Agg): throughput against ``num_workers`` for each variant, and the
training loop's timeline of waiting for data against computing, step by step (the sawtooth made visible),
with the GPU's utilisation (NVML, ``bench --model``) above it on the same time axis."""

from __future__ import annotations

import os
from typing import Any

from fastload.bench.measure import Run
from fastload.bench.runner import BenchReport
from fastload.errors import ConfigError

WAIT_COLOUR, COMPUTE_COLOUR, GPU_COLOUR = "#d62728", "#1f77b4", "#2ca02c"
# one colour per variant, in table order (none of them the timeline's red or blue)
VARIANT_COLOURS = [
    "#2ca02c",
    "#7f7f7f",
    "#9467bd",
    "#ff7f0e",
    "#17becf",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#000000",
    "#aec7e8",
]
POINT_MARKERS = ["D", "^", "v", "P", "X", "*"]  # variants measured at one num_workers
POINT_SPREAD = 0.12  # points at the same num_workers are set apart by this much, so none hides another
TIMELINE_S = 2.0


def write_png(report: BenchReport, path: str | os.PathLike[str]) -> None:
    """Write the plot to ``path`` (a PNG of about 40-80 KB)."""
    fig = figure(report)
    import matplotlib.pyplot as plt

    fig.savefig(os.fspath(path), format="png", bbox_inches="tight")
    plt.close(fig)


def figure(report: BenchReport) -> Any:
    """The matplotlib figure of a run: the sweep (a line per variant, each its own colour; variants measured
    at one num_workers as large points, set apart so none hides another), the training loop's timelines,
    and the run's one-line conclusion as its title."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'fastload[bench]'") from None
    from fastload.bench.report import conclusion

    gpu = any(r.gpu is not None for r in report.training)
    per_run = 2 if gpu else 1  # the utilisation axis above each timeline
    rows = max(1, len(report.training)) * per_run
    fig = plt.figure(figsize=(11, 4.2 + (1.6 if gpu else 0.0)), dpi=90)
    grid = fig.add_gridspec(
        rows,
        2,
        width_ratios=[1.0, 1.25],
        height_ratios=[1.4, 1.0] * (rows // 2) if gpu else None,
        wspace=0.28,
        hspace=0.55,
    )
    fig.suptitle(_wrapped(conclusion(report)), fontsize=10, x=0.02, ha="left", y=1.0, va="bottom")
    ax = fig.add_subplot(grid[:, 0])
    ticks: set[int] = set()
    singles = [v for v in report.variants if not v["sweep"]]
    for i, v in enumerate(report.variants):  # sweeps as lines; those measured at one num_workers as points
        by = report.by_workers(v["name"])
        if not by:
            continue
        ticks.update(by)
        colour = VARIANT_COLOURS[i % len(VARIANT_COLOURS)]
        xs = [float(w) for w in by]
        rates = [sorted(r.samples_per_s for r in by[w]) for w in by]
        mid = [r[len(r) // 2] for r in rates]
        low = [m - r[0] for m, r in zip(mid, rates, strict=True)]
        high = [r[-1] - m for m, r in zip(mid, rates, strict=True)]
        if v["sweep"]:
            style: dict[str, Any] = {"fmt": "o-" if v["where"] == "local" else "s--", "ms": 4, "zorder": 2}
        else:
            k = singles.index(v)
            xs = [x + POINT_SPREAD * (k - (len(singles) - 1) / 2) for x in xs]
            marker = POINT_MARKERS[k % len(POINT_MARKERS)]
            style = {"fmt": marker, "ms": 9, "mec": "black", "mew": 0.8, "zorder": 4}
        ax.errorbar(xs, mid, yerr=[low, high], color=colour, capsize=3, label=v["name"], lw=1.6, **style)
    ax.set_yscale("log")
    ax.set_xticks(sorted(ticks))  # whole workers, not fractions
    ax.set_xlabel("num_workers")
    ax.set_ylabel("samples/s (median, min-max)")
    ax.set_title("loader alone: throughput vs num_workers", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    if ax.has_data():  # below the axes, never over the lines
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    longest = max((sum(r.waits[1:]) + sum(r.computes[1:]) for r in report.training), default=0.0)
    window = min(TIMELINE_S, longest) if longest > 0 else TIMELINE_S
    for i, run in enumerate(report.training):
        tl = fig.add_subplot(grid[i * per_run + per_run - 1, 1])
        if gpu:
            _utilisation(fig.add_subplot(grid[i * per_run, 1], sharex=tl), run, window)
        t = 0.0
        waits, computes = [], []
        # from the end of the first batch: worker start-up is not part of the sawtooth
        for w, c in list(zip(run.waits, run.computes, strict=True))[1:]:
            if t > window:
                break
            waits.append((t, w))
            computes.append((t + w, c))
            t += w + c
        tl.broken_barh(waits, (0, 1), facecolors=WAIT_COLOUR)
        tl.broken_barh(computes, (0, 1), facecolors=COMPUTE_COLOUR)
        tl.set_xlim(0, window)
        tl.set_yticks([])
        share = f"{run.wait_share * 100:.0f}% waiting" if run.computes else ""
        tl.set_title(
            f"{run.variant}, num_workers={run.workers}: {share} "
            f"(first batch after {run.first_batch_s:.2f} s, not shown)",
            fontsize=9,
            loc="left",
        )
        if i == len(report.training) - 1:
            tl.set_xlabel("seconds of the training loop (red: waiting for data, blue: step)")
    return fig


def _wrapped(text: str, width: int = 130) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


def _utilisation(ax: Any, run: Run, window: float) -> None:
    """NVML utilisation (percent) over the same window as the run's timeline (which starts after the first
    batch and step), or why it was not measured."""
    ax.set_ylim(0, 105)
    ax.set_yticks([0, 50, 100])
    ax.tick_params(labelbottom=False, labelsize=7)
    ax.set_ylabel("GPU %", fontsize=8)
    timeline = run.gpu
    if timeline is None or not timeline.measured:
        why = timeline.not_measured if timeline is not None else "not sampled"
        ax.text(0.01, 0.5, f"GPU utilisation not measured: {why}", transform=ax.transAxes, fontsize=8)
        return
    shift = (run.waits[0] + run.computes[0]) if run.waits and run.computes else 0.0
    points = [(s.t_s - shift, s.util_pct) for s in timeline.samples if 0 <= s.t_s - shift <= window]
    if points:
        ax.step([p[0] for p in points], [p[1] for p in points], where="post", color=GPU_COLOUR, lw=1.2)
    ax.set_title(f"{run.variant}: {timeline.summary()}", fontsize=8, loc="left")
    ax.grid(True, alpha=0.3)
