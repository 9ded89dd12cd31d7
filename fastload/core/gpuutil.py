"""GPU utilisation over a run, as sampled from NVML: the samples, and the pure reading of them.

:class:`GpuTimeline` holds ``(t_s, util_pct, mem_used_bytes)`` samples, or why none were taken
(``not_measured``: no NVML, no driver, no GPU). :func:`read_pattern` decides what the shape says, given the
share of the loop's time spent waiting for data:

- **sawtooth** (loader-bound): at least ``EDGE_SHARE`` of samples at or above ``HIGH_PCT`` and as many at or
  below ``LOW_PCT``, with at least ``MIN_DROPS`` falls from high to low, while the loop waits for at least
  ``WAIT_SHARE`` of its time: the GPU idles whenever the loop waits for a batch;
- **busy**: mean at or above ``BUSY_PCT`` and under ``EDGE_SHARE`` of samples low: the GPU is the limit;
- **underused**: anything else with the loop rarely waiting: the step itself (CPU work in it, a small model,
  synchronisations) leaves the GPU idle, not the loader;
- **uneven**: neither, with the loop waiting: partly loader-bound, the sawtooth blurred.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

HIGH_PCT = 60.0
LOW_PCT = 10.0
BUSY_PCT = 80.0
EDGE_SHARE = 0.15
MIN_DROPS = 2
WAIT_SHARE = 0.10


@dataclass(frozen=True)
class GpuSample:
    """One NVML reading: seconds since the monitor started, utilisation in percent, device memory used."""

    t_s: float
    util_pct: float
    mem_used_bytes: int


@dataclass(frozen=True)
class GpuTimeline:
    """The samples of one run, or ``not_measured`` saying why there are none."""

    samples: tuple[GpuSample, ...] = ()
    device: str | None = None
    mem_total_bytes: int | None = None
    not_measured: str | None = None
    hz: float = 0.0
    errors: int = 0  # readings that failed mid-run (left out)

    @property
    def measured(self) -> bool:
        return self.not_measured is None and bool(self.samples)

    @property
    def utils(self) -> list[float]:
        return [s.util_pct for s in self.samples]

    @property
    def mean_util_pct(self) -> float | None:
        return statistics.fmean(self.utils) if self.samples else None

    @property
    def peak_mem_bytes(self) -> int | None:
        return max(s.mem_used_bytes for s in self.samples) if self.samples else None

    def summary(self) -> str:
        if not self.measured:
            return f"GPU utilisation not measured: {self.not_measured or 'no samples were taken'}"
        peak = (self.peak_mem_bytes or 0) / 2**30
        return (
            f"GPU {self.device or ''} utilisation mean {self.mean_util_pct:.0f}% over {len(self.samples)} "
            f"samples ({self.hz:.0f} Hz); peak memory {peak:.1f} GiB"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "not_measured": self.not_measured,
            "hz": self.hz,
            "mean_util_pct": self.mean_util_pct,
            "peak_mem_bytes": self.peak_mem_bytes,
            "mem_total_bytes": self.mem_total_bytes,
            "errors": self.errors,
            "samples": [[round(s.t_s, 4), s.util_pct, s.mem_used_bytes] for s in self.samples],
        }


@dataclass(frozen=True)
class Pattern:
    """What the utilisation timeline says: ``kind`` (sawtooth, busy, underused, uneven, not-measured) and a
    sentence for the advice."""

    kind: str
    line: str
    figures: dict[str, float] = field(default_factory=dict)


def drops(utils: Sequence[float], *, high: float = HIGH_PCT, low: float = LOW_PCT) -> int:
    """Falls from at or above ``high`` to at or below ``low`` (hysteresis: values between do not count)."""
    count, was_high = 0, False
    for u in utils:
        if u >= high:
            was_high = True
        elif u <= low and was_high:
            count += 1
            was_high = False
    return count


def read_pattern(utils: Sequence[float], wait_share: float, *, not_measured: str | None = None) -> Pattern:
    """The pattern of ``utils`` (percent samples) for a loop that waited ``wait_share`` of its time."""
    if not_measured is not None or not utils:
        why = not_measured or "no samples were taken"
        return Pattern("not-measured", f"GPU utilisation not measured: {why}")
    n = len(utils)
    high = sum(u >= HIGH_PCT for u in utils) / n
    low = sum(u <= LOW_PCT for u in utils) / n
    mean = statistics.fmean(utils)
    falls = drops(utils)
    figures = {"mean_pct": mean, "high_share": high, "low_share": low, "drops": float(falls)}
    waits = f"the loop waits {wait_share * 100:.0f}% of its time"
    if high >= EDGE_SHARE and low >= EDGE_SHARE and falls >= MIN_DROPS and wait_share >= WAIT_SHARE:
        return Pattern(
            "sawtooth",
            f"GPU utilisation saws between high and near zero ({falls} drops, {low * 100:.0f}% of samples "
            f"at <= {LOW_PCT:.0f}%) while {waits}: loader-bound, the GPU idles whenever a batch is late",
            figures,
        )
    if mean >= BUSY_PCT and low < EDGE_SHARE:
        return Pattern(
            "busy", f"GPU busy (mean {mean:.0f}%): the model is the limit, not the loader", figures
        )
    if wait_share < WAIT_SHARE:
        return Pattern(
            "underused",
            f"GPU utilisation mean {mean:.0f}% although {waits}: the step itself leaves the GPU idle "
            "(CPU work or synchronisations in the step, or a model too small for this GPU), not the loader",
            figures,
        )
    return Pattern(
        "uneven",
        f"GPU utilisation mean {mean:.0f}%, uneven, while {waits}: partly loader-bound",
        figures,
    )


__all__ = [
    "BUSY_PCT",
    "EDGE_SHARE",
    "HIGH_PCT",
    "LOW_PCT",
    "MIN_DROPS",
    "WAIT_SHARE",
    "GpuSample",
    "GpuTimeline",
    "Pattern",
    "drops",
    "read_pattern",
]
