"""Does a loader that tunes itself find a good configuration, and how soon (issue 33)?

A dataset of ``--samples`` (6,000) samples of ``--sample-kib`` (256 KiB) random bytes, written into 64 MiB
tar shards (``--data DIR`` keeps it for the next run), served by the embedded S3 endpoint
(``fastload.testing.s3serve``, in this process) with ``--latency-ms`` (20 ms) before each response's first
byte. ``fastload.DataLoader(batch_size=16,
num_workers=2, decode=False)``, the loop doing nothing but counting (the loader alone: what it can
deliver).

1. **Grid.** An epoch with each of a small grid of hand-set configurations (prefetch bytes x read tasks
   fetched at once: ``prefetch_threads``, S3 ``max_concurrency`` the same), untuned: samples/s over the
   epoch after its first 20% (the stretch the target judges: an epoch's end, where the workers run out of
   shards one after the other, is slower than its middle), and the best. The poorest is timed over its
   first ``--grid-samples`` (2,000) only.
2. **Autotune.** One epoch started with the poorest of them (prefetch 1 MiB, one fetch at a time, S3
   ``max_concurrency=1``) and ``autotune=True`` (its defaults: a decision every 0.5 s). Each batch's
   arrival time is kept; the rate over a trailing window of 5% of the epoch's samples says when the tuned
   loader first reaches 0.9x the best grid rate (as a share of the epoch); the rate over the rest of the
   epoch after 20% of it, against the best, is the target's figure (>= 0.9x). The changes the tuner made
   are printed with the time and share of the epoch at which it made them. A second epoch of the same
   loader (persistent workers, the settings found) gives the tuned rate without the search.
3. **From the defaults.** One tuned epoch started at 64 MiB / 8 (about the defaults): its rate after its
   first 20% against the same configuration untuned, and against the best (should autotune be the
   default?).

Rates are counted from the first batch on (the workers' start is left out of every figure). Repeated
``--reps`` times (grid and autotune interleaved); figures are medians with their range.

    python benchmarks/autotune.py --data /tmp/autotune-data     # ~90 s on 2 loaded cores; ~60 s again
    python benchmarks/autotune.py --samples 3000 --reps 1 --json /tmp/autotune.json
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import fastload
from fastload.testing.s3serve import S3Server

MIB = 1 << 20
GRID = [  # (prefetch bytes, fetches at once): the first is the poor start
    (1 * MIB, 1),
    (16 * MIB, 4),
    (64 * MIB, 8),
    (256 * MIB, 32),
]
WORKERS = 2
BATCH = 16


def make_dataset(root: Path, samples: int, kib: int) -> Path:
    """The dataset at ``root``, written unless it is there with this many samples of this size."""
    index = root / "index.json"
    if index.exists() and fastload.ShardDataset(root).index.samples == samples:
        first = next(iter(fastload.ShardDataset(root, decode=False)))
        if len(first["bin"]) == kib << 10:
            return root
    with fastload.ShardWriter(root, shard_size_bytes=64 * MIB, keys="ordered") as writer:
        for i in range(samples):
            writer.write({"__key__": f"{i:06d}", "bin": os.urandom(kib << 10)})
    return root


def epoch(
    endpoint: str, prefetch: int, fetches: int, autotune: bool, limit: int | None = None, second: bool = True
) -> tuple[float, list[float], Any, float | None]:
    """Samples/s over one epoch (its first ``limit`` samples), each sample's arrival (seconds from the
    start), the tuner's report; with ``autotune`` also the samples/s of a second epoch (the same loader
    and workers, started with the settings the first one found) after its first 20%."""
    config = fastload.S3Config(endpoint_url=endpoint, max_concurrency=fetches)
    ds = fastload.ShardDataset(
        "s3://bench/", s3_config=config, decode=False, prefetch_bytes=prefetch, prefetch_threads=fetches
    )
    dl = fastload.DataLoader(
        ds, batch_size=BATCH, num_workers=WORKERS, collate_fn=len, autotune=autotune, persistent_workers=True
    )
    arrivals: list[float] = []
    started = time.perf_counter()
    for n in dl:
        now = time.perf_counter() - started
        arrivals.extend([now] * n)
        if limit is not None and len(arrivals) >= limit:
            break
    tuned = dl.report()["autotune"] if autotune else None
    again_rate = None
    if autotune and second:
        again: list[float] = []
        started = time.perf_counter()
        for n in dl:
            again.extend([time.perf_counter() - started] * n)
        again_rate = rate_after(again, 0.2)
    return rate_after(arrivals, 0.0), arrivals, tuned, again_rate


def reached(arrivals: list[float], target: float, window_share: float = 0.05) -> float | None:
    """The share of the epoch's samples after which the rate over the trailing ``window_share`` of them
    first reaches ``target`` samples/s (None: never)."""
    n = len(arrivals)
    w = max(2, int(n * window_share))
    for end in range(w, n, max(1, w // 10)):
        span = arrivals[end - 1] - arrivals[end - w]
        if span > 0 and (w - 1) / span >= target:
            return end / n
    return None


def rate_after(arrivals: list[float], share: float) -> float:
    """Samples/s from the first batch after ``share`` of the samples to the last (so the workers' start,
    before the first batch, counts in no figure)."""
    n = len(arrivals)
    t0 = arrivals[int(n * share)]
    done = bisect.bisect_right(arrivals, t0)  # samples that had arrived by then (their batch included)
    span = arrivals[-1] - t0
    return (n - done) / span if span > 0 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=6000)
    parser.add_argument("--grid-samples", type=int, default=2000, help="samples timed per grid epoch")
    parser.add_argument("--sample-kib", type=int, default=256)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--data", type=Path, help="keep the dataset here (made if absent) for the next run")
    args = parser.parse_args()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(name, "bench")  # (the embedded endpoint accepts any; workers inherit them)
    grid: dict[str, list[float]] = {f"{p // MIB}MiB/{c}": [] for p, c in GRID}
    tuned_rates: list[float] = []
    reach: list[float | None] = []
    after: list[float] = []
    settled: list[float] = []
    from_default: list[float] = []
    changes: list[Any] = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="fastload-autotune-") as tmp:
        root = make_dataset(args.data or Path(tmp) / "ds", args.samples, args.sample_kib)
        with S3Server(os.fspath(root), bucket="bench", latency_s=args.latency_ms / 1e3) as server:
            epoch(server.endpoint_url, *GRID[1], False)  # untuned warm-up: imports, the page cache
            for _ in range(args.reps):
                for i, ((p, c), name) in enumerate(zip(GRID, grid, strict=True)):
                    if i == 0:  # the poor start: too slow for a whole epoch, its first samples are enough
                        grid[name].append(epoch(server.endpoint_url, p, c, False, args.grid_samples)[0])
                    else:  # the stretch the target judges: after the first 20% of a whole epoch
                        grid[name].append(rate_after(epoch(server.endpoint_url, p, c, False)[1], 0.2))
                best = max(statistics.median(v) for v in grid.values())
                rate, arrivals, report, second = epoch(server.endpoint_url, *GRID[0], True)
                tuned_rates.append(rate)
                assert second is not None
                settled.append(second / best)
                reach.append(reached(arrivals, 0.9 * best))
                after.append(rate_after(arrivals, 0.2) / best)
                # the defaults' question: tuned from about the defaults (64 MiB / 8), against them untuned
                tuned_default = epoch(server.endpoint_url, *GRID[2], True, second=False)[1]
                from_default.append(rate_after(tuned_default, 0.2))
                total = arrivals[-1]
                changes.append(
                    [
                        {**c, "epoch_share": round(sum(a <= c["at_s"] for a in arrivals) / len(arrivals), 3)}
                        for c in report["changes"]
                    ]
                    + [{"final": report["settings"], "epoch_s": round(total, 2)}]
                )
    best_name = max(grid, key=lambda k: statistics.median(grid[k]))
    best = statistics.median(grid[best_name])
    result = {
        "machine": {"cores": os.cpu_count(), "load_avg_before": [round(x, 2) for x in load_before]},
        "dataset": {"samples": args.samples, "sample_kib": args.sample_kib, "latency_ms": args.latency_ms},
        "grid_samples_per_s": {
            k: {"median": round(statistics.median(v)), "range": [round(min(v)), round(max(v))]}
            for k, v in grid.items()
        },
        "best": best_name,
        "autotune_epoch_samples_per_s": {
            "median": round(statistics.median(tuned_rates)),
            "range": [round(min(tuned_rates)), round(max(tuned_rates))],
        },
        "reached_0.9x_best_at_epoch_share": reach,
        "rate_after_20pct_vs_best": [round(x, 3) for x in after],
        "second_epoch_after_20pct_vs_best": [round(x, 3) for x in settled],
        "tuned_from_64MiB/8_after_20pct_vs_untuned": round(
            statistics.median(from_default) / statistics.median(grid["64MiB/8"]), 3
        ),
        "tuned_from_64MiB/8_after_20pct_vs_best": round(statistics.median(from_default) / best, 3),
        "changes": changes,
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
