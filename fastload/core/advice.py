"""Plain-words advice from measured loader figures: is the training loop waiting for data, and what would fix
it. Pure: figures in, sentences out (``fastload bench`` measures; this decides what to say).

The thresholds and the loader-bound, dominant-stage and workers-cover rules are
:mod:`fastload.core.autotune`'s, which the live tuner (``autotune=True``) applies to the same kind of
figures while a loop runs: the advice and the tuner cannot disagree on them. The rules, in order:

- **Verdict.** ``loader-bound`` when at least ``LOADER_BOUND_SHARE`` (10%) of wall time waits for data,
  otherwise ``compute-bound`` (the loader keeps up).
- **num_workers.** The step consumes ``batch_size / step_s`` samples/s. The sweep measures the loader
  alone; what the *loop* would see differs at 0 workers, where loading runs in series with the step
  (:func:`loop_rate`: the loop waits ``demand / (demand + rate)`` of its time however fast the loader is).
  A setting covers the step when its workers deliver ``HEADROOM`` (20%) more than it consumes, or, at 0
  workers, when the loop would wait under ``LOADER_BOUND_SHARE``. The suggestion is the fewest measured
  workers that cover it; if none does, the fastest setting (fewest workers within 5% of the best loop
  rate), and the advice says that more workers alone will not do. A loop measured loader-bound is never
  told to use fewer workers than it ran with or than the fastest setting measured (it waits with them
  already); fewer workers are suggested only to a compute-bound loop. Without a step time (loader alone)
  it is the fastest setting.
- **Stages.** The stage with the largest share of per-sample time gets a sentence when it holds at least
  ``DOMINANT_SHARE`` (40%) of it: what helps for decode, fetch, collate or host-to-device copies.
- **Packing.** For data stored as one object per sample: with the measured packed/per-file ratio above
  ``PACK_WORTH`` (1.2x) "these N files average X KiB: pack them — expected Yx"; below it, that packing
  would gain little here.
- **GPU utilisation.** With an NVML timeline (``gpu_util_pct``), :func:`fastload.core.gpuutil.read_pattern`
  says whether it saws between high and near zero while the loop waits (loader-bound), stays high (the
  model is the limit) or stays low without waits (the step, not the loader); without one, why it was not
  measured (``gpu_not_measured``).
- **Prefetch and cache.** A measured gain of ``PACK_WORTH`` or more from shard prefetch or a warm local
  cache is worth a sentence, as is a loss (both read what the benchmark saw, nothing is assumed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fastload.core.autotune import (
    DOMINANT_SHARE,
    HEADROOM,
    LOADER_BOUND_SHARE,
    covers,
    demand,
    dominant_stage,
    loader_bound,
    serial_wait_share,
)
from fastload.core.gpuutil import read_pattern

NEAR_BEST = 0.95
PACK_WORTH = 1.2

STAGES = ("fetch", "parse", "decode", "collate", "to_device")


@dataclass(frozen=True, kw_only=True)
class StageTimes:
    """Seconds per sample spent in each loader stage, each timed on its own over the same samples.
    ``to_device_s`` is None without an accelerator."""

    fetch_s: float
    parse_s: float
    decode_s: float
    collate_s: float
    to_device_s: float | None = None

    def __post_init__(self) -> None:
        for name in STAGES:
            value = self.seconds(name)
            if value is not None and value < 0:
                raise ValueError(f"{name}_s={value} is negative; stage times are durations")

    def seconds(self, stage: str) -> float | None:
        value: float | None = getattr(self, f"{stage}_s")
        return value

    @property
    def total_s(self) -> float:
        return sum(self.seconds(s) or 0.0 for s in STAGES)

    def shares(self) -> dict[str, float]:
        """Each measured stage's share of the per-sample total (empty when the total is zero)."""
        total = self.total_s
        if total <= 0:
            return {}
        return {s: (self.seconds(s) or 0.0) / total for s in STAGES if self.seconds(s) is not None}


@dataclass(frozen=True, kw_only=True)
class Facts:
    """What was measured about one loader configuration.

    ``throughput_by_workers`` is samples/s of the loader alone (no training step) by ``num_workers``.
    ``wait_share`` is the share of the training loop's wall time spent in ``next(loader)`` at
    ``num_workers``; ``step_s`` is the median compute time per step (0 when the loader ran alone).
    ``files``/``file_bytes_mean`` describe data stored as one object per sample (None when packed);
    ``packed_vs_per_file`` is the measured throughput ratio packed / per-file on this data.
    ``prefetch_gain`` is throughput with shard prefetch / without; ``cache_gain`` warm / cold local cache.
    ``gpu_util_pct`` is NVML's utilisation sampled during the training loop; ``gpu_not_measured`` why it
    could not be (both None: not asked for).
    """

    batch_size: int
    num_workers: int
    wait_share: float
    step_s: float
    cores: int
    throughput_by_workers: Mapping[int, float] = field(default_factory=dict)
    stages: StageTimes | None = None
    remote: bool = False
    files: int | None = None
    file_bytes_mean: float | None = None
    packed_vs_per_file: float | None = None
    prefetch_gain: float | None = None
    cache_gain: float | None = None
    gpu_util_pct: tuple[float, ...] | None = None
    gpu_not_measured: str | None = None

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.num_workers < 0 or self.cores < 1:
            raise ValueError(
                f"batch_size={self.batch_size}, num_workers={self.num_workers}, cores={self.cores}: "
                "need batch_size >= 1, num_workers >= 0, cores >= 1"
            )
        if not 0.0 <= self.wait_share <= 1.0:
            raise ValueError(f"wait_share={self.wait_share} must be between 0 and 1")
        if self.step_s < 0:
            raise ValueError(f"step_s={self.step_s} must be >= 0")
        bad = {w: t for w, t in self.throughput_by_workers.items() if w < 0 or t < 0}
        if bad:
            raise ValueError(f"throughput_by_workers has negative entries {bad}")


@dataclass(frozen=True)
class Advice:
    """The verdict, the suggested ``num_workers`` (None when nothing was swept) and the sentences."""

    verdict: str
    wait_share: float
    suggested_workers: int | None
    lines: tuple[str, ...]

    def text(self) -> str:
        return "\n".join(self.lines)


def fastest_workers(throughput_by_workers: Mapping[int, float]) -> int | None:
    """The fewest workers within ``NEAR_BEST`` of the best measured throughput."""
    if not throughput_by_workers:
        return None
    best = max(throughput_by_workers.values())
    return min(w for w, t in throughput_by_workers.items() if t >= NEAR_BEST * best)


def loop_rate(workers: int, rate: float, needed: float | None) -> float:
    """Samples/s the training loop would get from a loader measured alone at ``rate`` with ``workers``: with
    workers the loader runs beside the step (the slower of the two); with none, each sample's loading runs
    in series with the step. ``needed``: what the step consumes (None: no step, the loader's own rate)."""
    if needed is None:
        return rate
    if workers == 0:
        return 1.0 / (1.0 / rate + 1.0 / needed) if rate > 0 else 0.0
    return min(rate, needed)


def suggest_workers(
    throughput_by_workers: Mapping[int, float],
    needed: float | None,
    *,
    running: int | None = None,
    loader_bound: bool = False,
) -> tuple[int | None, bool]:
    """``(num_workers, enough)``: the fewest measured workers covering ``needed`` samples/s (:func:`covers`),
    or the fastest setting by :func:`loop_rate` with ``enough=False`` when none does (``enough=True`` when
    ``needed`` is None: the fastest is all there is to ask). ``loader_bound``: the loop, run with
    ``running`` workers, was measured waiting for data; then no fewer workers than ``running`` or than the
    fastest setting are suggested (``running`` itself, unmeasured, when nothing at or above it was)."""
    if not throughput_by_workers:
        return None, False
    if needed is None:
        return fastest_workers(throughput_by_workers), True
    rates = {w: loop_rate(w, t, needed) for w, t in throughput_by_workers.items()}
    best = fastest_workers(rates)
    assert best is not None
    if loader_bound and running is not None:  # it waited with `running` workers: measured, not guessed
        floor = max(best, running)
        above = {w: r for w, r in rates.items() if w >= floor}
        covering = [w for w in above if w > running and covers(w, throughput_by_workers[w], needed)]
        if covering:
            return min(covering), True
        if not above:  # nothing measured at or above what it ran with: keep that
            return running, False
        return fastest_workers(above), False
    covering = [w for w, t in throughput_by_workers.items() if covers(w, t, needed)]
    if covering:
        return min(covering), True
    return best, False


def _pct(share: float) -> str:
    return f"{share * 100:.0f}%"


def _rate(samples_per_s: float) -> str:
    return f"{samples_per_s:,.0f} samples/s"


def _kib(n: float) -> str:
    return f"{n / 1024:,.0f} KiB" if n >= 1024 else f"{n:,.0f} bytes"


def _ratio(x: float) -> str:
    return f"{x:.1f}x" if x < 10 else f"{x:.0f}x"


def _workers_line(facts: Facts, needed: float | None, loader_bound: bool) -> tuple[int | None, str | None]:
    sweep = facts.throughput_by_workers
    running = facts.num_workers
    suggested, enough = suggest_workers(sweep, needed, running=running, loader_bound=loader_bound)
    if suggested is None:
        return None, None
    if suggested not in sweep:
        return suggested, (
            f"the loop waited for data with num_workers={running}, more than any setting measured: "
            f"measure more workers (--workers {running},{2 * max(running, 1)})"
        )
    best_rate = sweep[suggested]
    if needed is not None and not enough:
        if suggested > 0 and best_rate >= needed * HEADROOM:  # alone it keeps up; in the loop it did not
            untried = max(sweep) <= running  # nothing above `running` was measured
            measure = f"measure more workers (--workers {running},{2 * max(running, 1)}), " if untried else ""
            return suggested, (
                f"the loader alone delivers {_rate(best_rate)} at num_workers={suggested}, more than the "
                f"step consumes ({_rate(needed)}), yet the loop waited for data with {running}: the workers "
                f"and the step share {facts.cores} cores; {measure}give the loader more CPU, or make each "
                "sample cheaper to load (see below)"
            )
        return suggested, (
            f"even the fastest setting measured (num_workers={suggested}: {_rate(best_rate)}) is below what "
            f"the step consumes ({_rate(needed)}); more workers alone will not fix it on {facts.cores} "
            "cores: make each sample cheaper to load (see below) or give the loader more CPU"
        )
    if suggested > running:
        return suggested, f"raise num_workers to {suggested} ({_rate(best_rate)} measured)"
    if suggested < running:
        if needed is not None and suggested == 0:
            what = (
                f"already covers the step (the loader alone: {_rate(best_rate)}; loading in series with "
                f"the step, the loop would wait {_pct(serial_wait_share(best_rate, needed))})"
            )
        elif needed is not None:
            what = f"already covers the step ({_rate(best_rate)} measured, the step consumes {_rate(needed)})"
        else:
            what = f"is as fast as any setting measured ({_rate(best_rate)})"
        return (
            suggested,
            f"num_workers={suggested} {what}; {facts.num_workers} costs memory and CPU for nothing",
        )
    return suggested, None


def _stage_line(stages: StageTimes, *, remote: bool, per_file: bool) -> str | None:
    shares = stages.shares()
    stage = dominant_stage(shares)
    if stage is None:
        return None
    share = shares[stage]
    micros = (stages.seconds(stage) or 0.0) * 1e6
    what = f"{stage.replace('_', '-')} takes {_pct(share)} of the loader's time per sample ({micros:,.0f} µs)"
    fixes = {
        "decode": "more workers, smaller stored images, or decoding on the GPU (nvJPEG, DALI) help; packing "
        "does not",
        "fetch": (
            "pack the files into shards (few large reads instead of one request per file)"
            if per_file
            else "prefetch further ahead (more prefetch_bytes, or autotune=True to let the loader find it), "
            "or keep a local shard cache (cache_dir=)"
            if remote
            else "move the shards to faster local storage"
        ),
        "parse": "use fewer, larger fields per sample",
        "collate": "return tensors (not Python lists) from the dataset, or collate in the workers",
        "to_device": "use pin_memory=True and .to(device, non_blocking=True) on a side stream",
    }
    return f"{what}: {fixes[stage]}"


def _pack_line(facts: Facts) -> str | None:
    if facts.files is None or facts.packed_vs_per_file is None:
        return None
    files = f"these {facts.files:,} files"
    size = f" average {_kib(facts.file_bytes_mean)}" if facts.file_bytes_mean is not None else ""
    ratio = facts.packed_vs_per_file
    if ratio >= PACK_WORTH:
        return f"{files}{size}: pack them (fastload pack) — expected {_ratio(ratio)} (measured on this data)"
    return (
        f"{files}{size}: packing them would gain little here ({_ratio(ratio)} measured); "
        "the time goes elsewhere"
    )


def _gain_line(what: str, gain: float | None, fix: str) -> str | None:
    if gain is None:
        return None
    if gain >= PACK_WORTH:
        return f"{what} measured {_ratio(gain)} faster: {fix}"
    if gain <= 1 / PACK_WORTH:
        return f"{what} measured slower here ({_ratio(gain)}): leave it off for this data"
    return None


def advise(facts: Facts) -> Advice:
    """The verdict and the sentences for ``facts``; see the module docstring for the rules."""
    needed = demand(facts.batch_size, facts.step_s)
    lines: list[str] = []
    if facts.step_s <= 0:
        verdict = "loader-alone"
        lines.append("no training step was simulated: these are the loader's own limits")
    elif loader_bound(facts.wait_share):
        verdict = "loader-bound"
        lines.append(
            f"loader-bound: {_pct(facts.wait_share)} of the step waits for data "
            f"(the step consumes {_rate(needed or 0.0)})"
        )
    else:
        verdict = "compute-bound"
        lines.append(
            f"compute-bound: the loader keeps up; {_pct(facts.wait_share)} of wall time waits for data"
        )
    if facts.gpu_util_pct is not None or facts.gpu_not_measured is not None:
        pattern = read_pattern(
            facts.gpu_util_pct or (), facts.wait_share, not_measured=facts.gpu_not_measured
        )
        lines.append(pattern.line)
    suggested, workers_line = _workers_line(facts, needed, verdict == "loader-bound")
    fewer = suggested is not None and suggested < facts.num_workers
    if workers_line and (verdict != "compute-bound" or fewer):
        lines.append(workers_line)
    if verdict != "compute-bound" and facts.stages is not None:
        stage_line = _stage_line(facts.stages, remote=facts.remote, per_file=facts.files is not None)
        if stage_line:
            lines.append(stage_line)
    for line in (
        _pack_line(facts),
        _gain_line("shard prefetch", facts.prefetch_gain, "keep it on (prefetch_bytes > 0, the default)"),
        _gain_line("a warm local shard cache", facts.cache_gain, "set cache_dir= for runs of several epochs"),
    ):
        if line:
            lines.append(line)
    return Advice(verdict, facts.wait_share, suggested, tuple(lines))


__all__ = [
    "DOMINANT_SHARE",
    "HEADROOM",
    "LOADER_BOUND_SHARE",
    "PACK_WORTH",
    "STAGES",
    "Advice",
    "Facts",
    "StageTimes",
    "advise",
    "covers",
    "demand",
    "fastest_workers",
    "loop_rate",
    "serial_wait_share",
    "suggest_workers",
]
