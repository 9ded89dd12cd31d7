"""Mixture benchmark: a 3-source ``fastload.Mix`` over S3 against one dataset of the same samples.

The origin is a real Ceph RADOS Gateway on 127.0.0.1 (``tests/servers/rgw.py``, objects in memstore) behind
``benchmarks/latency_proxy.py`` (``--latency-ms`` 20 before each response head, each body paced to
``--conn-mbps`` 50 MB/s: S3's first-byte latency and per-connection bandwidth), as ``s3_read.py`` sets it up.

``--samples`` (6,000) random samples of ``--sample-kib`` (64) KiB are packed twice with ``fastload.pack``
(8 MiB shards) and uploaded: once as one dataset (``single``), once split 50/30/20% into three datasets.
Readers, each a full epoch through ``fastload.DataLoader`` (``--batch`` 32, ``--workers`` 2,
``decode=False``, ``collate_fn=list``), in one process, the order rotated every repetition:

- ``single``: ``ShardDataset`` of the one dataset (8 prefetch threads, ``--prefetch-mib`` ahead per worker:
  fastload's 64 by default; with a dataset of 384 MiB a smaller budget shows the long-epoch regime);
- ``mix``: ``Mix`` of the three, weights 0.5/0.3/0.2 (as their sizes), ``stop="first_exhausted"``, each
  source with the same settings (so 3x the prefetch threads and bytes of ``single``: what a user gets);
- ``mix-split``: the same with each source given a third of them (3 threads, a third of the bytes), the
  same budget as ``single``.

Figures are samples/s per epoch (time to the first batch included), medians over ``--reps`` (5), the
ratio of each mix to ``single`` per repetition (median), the time to the first batch (a mix starts its
sources as each is first drawn, while the first ones already fill their prefetch: a fixed cost per epoch),
and the rate after the first batch. The issue's target: ``mix`` >= 0.9x ``single``. ``--append FILE`` adds
the table with the command, machine and load to FILE (``benchmarks/RESULTS.md``).

    python benchmarks/mix.py --append benchmarks/RESULTS.md
    python benchmarks/mix.py --prefetch-mib 16 --append benchmarks/RESULTS.md
    python benchmarks/mix.py --samples 600 --reps 2           # a quick look
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import fastload  # noqa: E402

BUCKET, REGION, SEED = "bench-mix", "us-east-1", 20261201
SHARES = {"web": 0.5, "code": 0.3, "books": 0.2}
READERS = ("single", "mix", "mix-split")


def load_rgw() -> Any:
    spec = importlib.util.spec_from_file_location("fastload_bench_rgw", ROOT / "tests" / "servers" / "rgw.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def make_data(work: Path, samples: int, sample_bytes: int) -> dict[str, Path]:
    """The samples as files, packed as one dataset and as three (50/30/20%)."""
    rng = np.random.default_rng(SEED)
    cuts = np.cumsum([0] + [round(samples * s) for s in SHARES.values()])
    cuts[-1] = samples
    roots = {}
    for name, lo, hi in zip(SHARES, cuts[:-1], cuts[1:], strict=True):
        src = work / f"src-{name}"
        src.mkdir(parents=True)
        for i in range(int(lo), int(hi)):
            (src / f"{i:06d}.bin").write_bytes(rng.bytes(sample_bytes))
        roots[name] = work / name
        fastload.pack(src, roots[name], progress=False, shard_size_bytes=8 << 20)
    everything = work / "src-all"
    everything.mkdir()
    for name in SHARES:
        for f in (work / f"src-{name}").iterdir():
            os.link(f, everything / f.name)
    roots["single"] = work / "single"
    fastload.pack(everything, roots["single"], progress=False, shard_size_bytes=8 << 20)
    return roots


def epoch(reader: str, urls: dict[str, str], config: fastload.S3Config, args: argparse.Namespace) -> dict:
    budget = (args.prefetch_mib or 64) << 20
    opts: dict[str, Any] = {"decode": False, "seed": 1, "s3_config": config}
    if args.prefetch_mib:
        opts["prefetch_bytes"] = budget
    if reader == "single":
        dataset: Any = fastload.ShardDataset(urls["single"], **opts)
    else:
        if reader == "mix-split":
            opts.update(prefetch_threads=3, prefetch_bytes=budget // 3)
        sources = {name: fastload.ShardDataset(urls[name], **opts) for name in SHARES}
        dataset = fastload.Mix(sources, SHARES, seed=2)
    loader = fastload.DataLoader(
        dataset, batch_size=args.batch, num_workers=args.workers, collate_fn=list, timeout=120
    )
    began = time.perf_counter()
    batches = iter(loader)
    count = len(next(batches))
    first = time.perf_counter() - began
    count += sum(len(batch) for batch in batches)
    seconds = time.perf_counter() - began
    return {
        "reader": reader,
        "samples": count,
        "seconds": seconds,
        "first_batch_s": first,
        "samples_per_s": count / seconds,
        "after_first_per_s": (count - args.batch) / (seconds - first),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=6000)
    parser.add_argument("--sample-kib", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--conn-mbps", type=float, default=50.0)
    parser.add_argument("--prefetch-mib", type=int, default=None, help="prefetch_bytes (default: fastload's)")
    parser.add_argument("--append", type=Path, default=None)
    args = parser.parse_args()
    load_start = os.getloadavg()
    rgw_module = load_rgw()
    with (
        tempfile.TemporaryDirectory(prefix="fastload-bench-mix-") as tmp,
        rgw_module.RadosGateway(memstore_bytes=max(1 << 30, 3 * args.samples * args.sample_kib << 10)) as rgw,
    ):
        work = Path(tmp)
        roots = make_data(work, args.samples, args.sample_kib << 10)
        os.environ.update(
            AWS_ACCESS_KEY_ID=rgw.access_key, AWS_SECRET_ACCESS_KEY=rgw.secret_key, AWS_REGION=REGION,
            AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=str(work / "none"),
            AWS_SHARED_CREDENTIALS_FILE=str(work / "none"),
        )  # fmt: skip
        rgw.client().create_bucket(Bucket=BUCKET)
        direct = fastload.S3Config(endpoint_url=rgw.endpoint_url, region=REGION, addressing_style="path")
        urls = {}
        for name, root in roots.items():
            urls[name] = f"s3://{BUCKET}/{name}"
            fastload.copy(f"{root}/", f"{urls[name]}/", recursive=True, config=direct)
        proxy = subprocess.Popen(
            [sys.executable, str(ROOT / "benchmarks" / "latency_proxy.py"), "--upstream", rgw.endpoint_url,
             "--latency-ms", str(args.latency_ms), "--conn-mbps", str(args.conn_mbps)],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        try:
            assert proxy.stdout is not None
            endpoint = json.loads(proxy.stdout.readline())["endpoint_url"]
            config = fastload.S3Config(endpoint_url=endpoint, region=REGION, addressing_style="path")
            for reader in READERS:  # untimed: the counts, and every connection pool warm
                got = epoch(reader, urls, config, args)["samples"]
                print(f"warm-up {reader}: {got} samples", flush=True)
            runs = []
            for rep in range(args.reps):
                order = READERS[rep % 3 :] + READERS[: rep % 3]
                for reader in order:
                    run = epoch(reader, urls, config, args)
                    run["rep"] = rep
                    runs.append(run)
                    print(json.dumps(run), flush=True)
        finally:
            proxy.terminate()
            proxy.wait(timeout=10)
    load_end = os.getloadavg()
    print(report(runs, args, load_start, load_end))
    if args.append:
        with open(args.append, "a", encoding="utf-8") as out:
            out.write("\n" + report(runs, args, load_start, load_end) + "\n")


def report(runs: list[dict], args: argparse.Namespace, load_start: Any, load_end: Any) -> str:
    by = {r: [x for x in runs if x["reader"] == r] for r in READERS}
    single = {x["rep"]: x["samples_per_s"] for x in by["single"]}
    steady = {x["rep"]: x["after_first_per_s"] for x in by["single"]}
    lines = [
        "## Mixtures over S3: a 3-source `fastload.Mix` against one dataset of the same samples (issue 21)",
        "",
        "    " + " ".join(["python benchmarks/mix.py", *sys.argv[1:]]),
        "",
        f"Machine: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, Python "
        f"{platform.python_version()}; load average {load_start[0]:.1f} at start, {load_end[0]:.1f} at end. "
        f"RGW (memstore) behind latency_proxy ({args.latency_ms:g} ms first byte, {args.conn_mbps:g} MB/s "
        f"per connection); {args.samples} samples of {args.sample_kib} KiB; fastload.DataLoader batch "
        f"{args.batch}, {args.workers} workers; prefetch_bytes {args.prefetch_mib or 64} MiB per worker "
        f"and source; {args.reps} interleaved repetitions; medians.",
        "",
        "| reader | samples/epoch | samples/s, median (min-max) | ratio to single (median of reps) | first "
        "batch s | samples/s after the first batch | ratio to single |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for reader, rs in by.items():
        rates = [x["samples_per_s"] for x in rs]
        ratios = [x["samples_per_s"] / single[x["rep"]] for x in rs]
        after = [x["after_first_per_s"] for x in rs]
        after_ratios = [x["after_first_per_s"] / steady[x["rep"]] for x in rs]
        lines.append(
            f"| {reader} | {rs[0]['samples']} | {statistics.median(rates):,.0f} ({min(rates):,.0f}-"
            f"{max(rates):,.0f}) | {statistics.median(ratios):.2f} | "
            f"{statistics.median(x['first_batch_s'] for x in rs):.2f} | {statistics.median(after):,.0f} | "
            f"{statistics.median(after_ratios):.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
