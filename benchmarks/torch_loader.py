"""torch's own DataLoader over a ShardDataset, with only the arguments people pass, against
fastload.DataLoader (issue 14's "torch's own DataLoader must be a first-class path").

The data: ``--images`` (10,000) synthetic JPEGs (``fastload.bench.synth``: 96-192 px, about 6 KiB each,
packed into 16 tar shards, cached under ``--cache-dir``) served by the embedded S3 endpoint
(``python -m fastload.testing.s3serve``, a process of its own) with ``--latency-ms`` (20) before each
response and ``--conn-mbps`` (50 MB/s) per connection. Every sample is decoded and resized to ``--px``
(96) square by ``map=`` (``fastload.bench.pipeline.Decode``; ``--raw``: bytes only) and batches use the
default collate. The loaders, each reading the whole epoch once per repetition with fresh workers:

- ``torch``: ``torch.utils.data.DataLoader(ShardDataset(url), batch_size=32, num_workers=2)``;
- ``fastload``: ``fastload.DataLoader(ShardDataset(url), batch_size=32, num_workers=2)``;
- ``torch+bs``: torch's DataLoader over ``ShardDataset(url, batch_size=32)`` (the order independent of
  ``num_workers``);
- ``one-process``: torch's DataLoader over ``ShardDataset(url)`` with ``num_workers=0``;
- ``torch-before`` (``--before``): ``ShardDataset(url, batch_size=1)``, which deals samples to workers one
  by one as every ShardDataset did before: what ``torch`` measured until now.

One untimed pass of each loader first (imports, S3 clients, the page cache of the endpoint). Repetitions
interleave the loaders (the order rotated by one each time); the figures are medians, with the
range over repetitions, and each loader's ratio to ``fastload``.

    python benchmarks/torch_loader.py                       # the issue's setting
    python benchmarks/torch_loader.py --images 2000 --reps 2 --no-before --json /tmp/t.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.utils.data

import fastload
from fastload.bench.options import default_cache_dir
from fastload.bench.pipeline import Decode
from fastload.bench.synth import CLASSES, ensure_synthetic
from fastload.bench.workload import BUCKET, Endpoint


def loaders(
    args: argparse.Namespace, url: str, config: fastload.S3Config
) -> dict[str, Callable[[], Iterable[Any]]]:
    transform = None if args.raw else Decode(args.px, {f"class_{c:02d}": c for c in range(CLASSES)})
    bs, nw = args.batch_size, args.workers

    def dataset(**kw: Any) -> fastload.ShardDataset:
        return fastload.ShardDataset(url, decode=False, map=transform, s3_config=config, **kw)

    out: dict[str, Callable[[], Iterable[Any]]] = {
        "torch": lambda: torch.utils.data.DataLoader(dataset(), batch_size=bs, num_workers=nw),
        "fastload": lambda: fastload.DataLoader(dataset(), batch_size=bs, num_workers=nw),
        "torch+bs": lambda: torch.utils.data.DataLoader(
            dataset(batch_size=bs), batch_size=bs, num_workers=nw
        ),
        "one-process": lambda: torch.utils.data.DataLoader(dataset(), batch_size=bs, num_workers=0),
    }
    if args.before:
        out["torch-before"] = lambda: torch.utils.data.DataLoader(
            dataset(batch_size=1), batch_size=bs, num_workers=nw
        )
    return out


def batch_size_of(batch: Any) -> int:
    keys = batch["__key__"]
    return len(keys)


def measure(make: Callable[[], Iterable[Any]]) -> tuple[float, int]:
    """Seconds to read one epoch (loader built and workers started inside the clock) and samples read."""
    started = time.perf_counter()
    n = sum(batch_size_of(b) for b in make())
    return time.perf_counter() - started, n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=10_000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--px", type=int, default=96)
    p.add_argument("--raw", action="store_true", help="no decoding: bytes only")
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--conn-mbps", type=float, default=50.0)
    p.add_argument("--before", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--cache-dir", default=default_cache_dir())
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    # every fresh ShardDataset read by torch's workers without batch_size= says once that its order depends
    # on num_workers: known here (forked workers inherit the filter)
    warnings.filterwarnings("ignore", message="fastload.ShardDataset is read by")

    data = ensure_synthetic(args.cache_dir, args.images, progress=print)
    endpoint = Endpoint(data.root, latency_s=args.latency_ms / 1000, conn_bytes_per_s=args.conn_mbps * 1e6)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "fastload-bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "fastload-bench")
    try:
        made = loaders(args, f"s3://{BUCKET}/packed", endpoint.config())
        names = list(made)
        runs: dict[str, list[float]] = {n: [] for n in names}
        for name in names:
            measure(made[name])
        for rep in range(args.reps):
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                seconds, n = measure(made[name])
                if n != data.images:
                    raise SystemExit(f"{name} read {n} samples, expected {data.images}")
                runs[name].append(n / seconds)
                print(f"rep {rep + 1}/{args.reps} {name:13s} {n / seconds:8.0f} samples/s", flush=True)
    finally:
        endpoint.close()

    base = statistics.median(runs["fastload"])
    machine = f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}"
    work = "raw" if args.raw else f"decoded to {args.px} px"
    print(
        f"\n{data.images:,} JPEGs over S3 ({args.latency_ms:g} ms, {args.conn_mbps:g} MB/s per connection), "
        f"batch_size={args.batch_size}, num_workers={args.workers}, {work}"
    )
    print(f"machine: {machine}\n")
    print(f"{'loader':13s} {'samples/s':>10s} {'range':>15s} {'vs fastload':>12s}")
    result: dict[str, Any] = {"args": vars(args), "machine": machine, "loaders": {}}
    for name in names:
        med = statistics.median(runs[name])
        print(f"{name:13s} {med:10.0f} {min(runs[name]):7.0f}-{max(runs[name]):<7.0f} {med / base:11.2f}x")
        result["loaders"][name] = {"median": med, "runs": runs[name], "vs_fastload": med / base}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
