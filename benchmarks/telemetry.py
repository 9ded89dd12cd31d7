"""What loader telemetry costs, and whether its S3 counts are exact (issue 33).

1. **Cost.** A local dataset of ``--samples`` (20,000) small samples (a 256-byte ``.bin`` and a ``.cls``,
   packed into 8 tar shards) read by ``fastload.DataLoader(batch_size=64, num_workers=2)``, decoded with
   the default collate: small samples make the per-task and per-batch bookkeeping as large a share of the
   work as it gets. Variants, interleaved (the order rotated each repetition), each a fresh loader over
   one epoch: ``off`` (``dataset.set_telemetry(False)``: no stage timing), ``on`` (the default);
   ``loader`` and ``loader+export``: the same wrapped in ``fastload.Loader`` (which times the loop and
   keeps the state of each batch), the latter with ``telemetry=DIR, telemetry_every=20`` (a JSON line
   every 20 steps, the publisher's own time reported as ``publish_share``). Figures: median samples/s
   with the range; ``on`` against ``off``, ``loader+export`` against ``loader``.
2. **Bookkeeping alone.** The same calls a batch of 64 samples from one read task makes (per sample: the
   clock reads around decode and the yield, for one sample in 8; per task: fetch, parse and decode
   stages and a flush into the shared block; per batch: collate and hand-over in the worker, hand-over
   and wait/step in the loop), timed in a tight loop: microseconds per batch, against the microseconds
   per batch of ``off`` (a bound on the share, which the noisy end-to-end ratio on a loaded machine
   cannot give).
3. **Exact counts.** The same dataset served by the embedded S3 endpoint (``fastload.testing.s3serve``),
   read by two DataLoader workers: the GETs and body bytes the loader's report counts equal the server's
   own counts over the epoch.

    python benchmarks/telemetry.py                  # ~1 minute on 2 loaded cores
    python benchmarks/telemetry.py --samples 5000 --reps 3 --json /tmp/tel.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import fastload
from fastload.testing.s3serve import S3Server


def make_dataset(base: Path, samples: int) -> Path:
    src, dst = base / "src", base / "ds"
    for i in range(samples):
        folder = src / f"{i // 1000:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:06d}.bin").write_bytes(os.urandom(256))
        (folder / f"{i:06d}.cls").write_bytes(str(i % 10).encode())
    fastload.pack(src, dst, shard_size_bytes=max(64 << 10, samples * 1536 // 8), progress=False)
    return dst


VARIANTS = ["off", "on", "loader", "loader+export"]
BASELINE = {"off": "off", "on": "off", "loader": "loader", "loader+export": "loader"}


def epoch(root: Path, variant: str, out: Path, shares: list[float]) -> float:
    ds = fastload.ShardDataset(root)
    ds.set_telemetry(variant != "off")
    dl = fastload.DataLoader(ds, batch_size=64, num_workers=2)
    loop: Any = dl
    if variant.startswith("loader"):
        export = variant == "loader+export"
        loop = fastload.Loader(
            dl, telemetry=out / "telemetry" if export else None, telemetry_every=20 if export else None
        )
    started = time.perf_counter()
    n = sum(len(b["__key__"]) for b in loop)
    elapsed = time.perf_counter() - started
    publisher = getattr(loop, "publisher", None)
    if publisher is not None:
        shares.append(publisher.spent_s / elapsed)
    return n / elapsed


def cost(root: Path, reps: int, out: Path) -> dict[str, Any]:
    shares: list[float] = []
    for v in VARIANTS:  # untimed: imports, page cache
        epoch(root, v, out, [])
    rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for rep in range(reps):
        k = rep % len(VARIANTS)
        for v in VARIANTS[k:] + VARIANTS[:k]:
            rates[v].append(epoch(root, v, out, shares))
    result: dict[str, Any] = {
        v: {
            "median_samples_per_s": round(statistics.median(r)),
            "range": [round(min(r)), round(max(r))],
            "ratio": round(statistics.median(r) / statistics.median(rates[BASELINE[v]]), 4),
            "against": BASELINE[v],
        }
        for v, r in rates.items()
    }
    result["publish_share"] = round(statistics.median(shares), 5)
    per_batch = bookkeeping_us_per_batch()
    off_us = 64e6 / result["off"]["median_samples_per_s"]
    result["bookkeeping_us_per_batch"] = round(per_batch, 1)
    result["off_us_per_batch"] = round(off_us, 1)
    # the workers' share runs on 2 processes in parallel, the loop's on one: the bound takes it all as serial
    result["bookkeeping_share_bound"] = round(per_batch / off_us, 4)
    return result


def bookkeeping_us_per_batch(batch: int = 64, rounds: int = 2000) -> float:
    from fastload.train.reading import SAMPLE_EVERY
    from fastload.train.telemetry import SharedCounters, Tally, clock_ns

    block = SharedCounters()
    worker, loop = Tally(block), Tally()
    times = [0, 0]
    timed = 0
    started = time.perf_counter()
    for _ in range(rounds):
        for count in range(batch):  # read_samples and finish, per sample (one in SAMPLE_EVERY timed)
            timing = count % SAMPLE_EVERY == 0
            timed += timing
            if timing:
                t0 = clock_ns()
                times[0] += clock_ns() - t0
                left = clock_ns()
                times[1] += clock_ns() - left
        worker.stage("fetch", 1000, 1 << 20)
        worker.observe("fetch_ns", 1000)
        worker.count("largest_task_bytes", 1 << 20)
        worker.stage("parse", 1000, batch)
        worker.stage("decode", times[0], batch)
        worker.count("samples", batch)
        worker.flush()
        worker.stage("collate", 1000, batch)  # ChunkCollate
        worker.stage("handover", 1000)
        worker.flush()
        loop.stage("handover", 1000)  # DataLoader and Loader
        loop.count("batches")
        loop.stage("wait", 1000)
        loop.observe("wait_ns", 1000)
        loop.stage("step", 1000)
    return (time.perf_counter() - started) / rounds * 1e6


def exact(root: Path) -> dict[str, Any]:
    for name, value in (("AWS_ACCESS_KEY_ID", "bench"), ("AWS_SECRET_ACCESS_KEY", "bench")):
        os.environ.setdefault(name, value)  # (the embedded endpoint accepts any; workers inherit them)
    with S3Server(os.fspath(root.parent), bucket="tel") as server:
        config = fastload.S3Config(endpoint_url=server.endpoint_url, addressing_style="path")
        ds = fastload.ShardDataset(f"s3://tel/{root.name}", s3_config=config)
        dl = fastload.DataLoader(ds, batch_size=64, num_workers=2)
        before = server.stats()
        n = sum(len(b["__key__"]) for b in dl)
        after = server.stats()
        report = dl.report()
    gets = after.requests.get("GET", 0) - before.requests.get("GET", 0)
    body = after.body_bytes - before.body_bytes
    counters = report["counters"]
    return {
        "samples": n,
        "server_gets": gets,
        "server_body_bytes": body,
        "loader_s3_requests": counters["s3_requests"],
        "loader_s3_bytes": counters["s3_bytes"],
        "equal": gets == counters["s3_requests"] and body == counters["s3_bytes"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fastload-telemetry-") as tmp:
        base = Path(tmp)
        root = make_dataset(base, args.samples)
        load = os.getloadavg()
        result = {
            "load_avg_before": [round(x, 2) for x in load],
            "cost": cost(root, args.reps, base),
            "exact": exact(root),
            "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
