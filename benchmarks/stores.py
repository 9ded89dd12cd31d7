"""Web stores benchmark (issue 32): one packed dataset read over https against fastload's own S3, and
index-less WebDataset tars as a brace pattern read by fastload and by webdataset, from the same server.

The origin is ``fastload.testing.s3serve`` in a process of its own, serving one folder as bucket ``bench``
with ``--latency-ms`` (20) before each response head and each body paced to ``--conn-mbps`` (50) MB/s per
connection (S3's first-byte latency and per-connection bandwidth). The server answers path-style S3 and,
for the same bytes, plain HTTP GETs with Range and ETag (``http://HOST/bench/KEY``), so ``s3`` and
``https`` differ only in the transport (SigV4 or none): same server, same connections, same dataset.

``--samples`` (2,400) random samples of ``--sample-kib`` (48) KiB are packed (16 MiB shards) into ``ds``
(with index.json) and the same tars copied into ``wds`` (no index). Readers, one full pass each in this
process (no DataLoader workers: the machine is small), order rotated every repetition:

- ``s3``: ``ShardDataset("s3://bench/ds", decode=False)``;
- ``https``: ``ShardDataset("http://HOST/bench/ds", decode=False)``;
- ``wds-fastload``: ``ShardDataset("http://HOST/bench/wds/shard-{000000..N}.tar", decode=False)``,
  indexed in memory when opened (timed: a pass includes it);
- ``wds-webdataset``: ``webdataset.WebDataset(same pattern, shardshuffle=False)`` (its ``curl`` pipe).

Figures: MB/s of sample payload per pass (opening included), CPU seconds of this process per GiB
(``time.process_time``: every thread, plus finished children: webdataset's ``curl``; the server's CPU is
its own process's), after one untimed warm-up pass of each reader, medians over ``--reps`` (3),
and the ratios the issue sets: https/s3 >= 0.9 (CPU within 1.2x), wds-fastload/wds-webdataset >= 1.
``--append FILE`` adds the table, command, machine and load to FILE (``benchmarks/RESULTS.md``).

    python benchmarks/stores.py --append benchmarks/RESULTS.md
    python benchmarks/stores.py --samples 600 --reps 1        # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import fastload  # noqa: E402

READERS = ["s3", "https", "wds-fastload", "wds-webdataset"]


def make_data(work: Path, samples: int, sample_kib: int) -> tuple[int, int]:
    """``work/bucket/ds`` (packed) and ``work/bucket/wds`` (its tars, no index): (shards, payload bytes)."""
    src = work / "src"
    rng = random.Random(32)
    for i in range(samples):
        folder = src / f"p{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:06d}.bin").write_bytes(rng.randbytes(sample_kib << 10))
        (folder / f"{i:06d}.cls").write_bytes(str(i % 10).encode())
    ds = work / "bucket" / "ds"
    report = fastload.pack(str(src), str(ds), shard_size_bytes=16 << 20)
    shutil.rmtree(src)
    (work / "bucket" / "wds").mkdir()
    tars = sorted(ds.glob("*.tar"))
    for tar in tars:
        os.link(tar, work / "bucket" / "wds" / tar.name)
    return len(tars), report.index.payload_bytes


def _cpu() -> float:
    """CPU seconds of this process (every thread) and of its finished children (webdataset's curl)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def one_pass(reader: str, base: str, shards: int, config: fastload.S3Config) -> dict[str, Any]:
    pattern = f"{base}/bench/wds/shard-{{000000..{shards - 1:06d}}}.tar"
    wall, cpu = time.monotonic(), _cpu()
    payload = count = 0
    if reader == "wds-webdataset":
        import webdataset

        for sample in webdataset.WebDataset(pattern, shardshuffle=False):
            payload += len(sample["bin"]) + len(sample["cls"])
            count += 1
    else:
        source = {"s3": "s3://bench/ds", "https": f"{base}/bench/ds", "wds-fastload": pattern}[reader]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # (wds-fastload: "indexed in memory")
            ds = fastload.ShardDataset(source, decode=False, s3_config=config)
        for sample in ds:
            payload += len(sample["bin"]) + len(sample["cls"])
            count += 1
    wall, cpu = time.monotonic() - wall, _cpu() - cpu
    gib = payload / (1 << 30)
    return {"reader": reader, "samples": count, "mb_s": payload / wall / 1e6, "cpu_s_gib": cpu / gib}


def report(runs: list[dict[str, Any]], args: argparse.Namespace, load: tuple[float, float]) -> str:
    med = {
        r: {k: statistics.median(x[k] for x in runs if x["reader"] == r) for k in ("mb_s", "cpu_s_gib")}
        for r in READERS
    }
    rates = {r: [x["mb_s"] for x in runs if x["reader"] == r] for r in READERS}
    lines = [
        f"`python benchmarks/stores.py {' '.join(sys.argv[1:])}` ({args.samples} samples x {args.sample_kib} "
        f"KiB, {args.latency_ms:g} ms first byte, {args.conn_mbps:g} MB/s per connection, {args.reps} reps; "
        f"{platform.machine()}, {os.cpu_count()} CPUs, load {load[0]:.1f} -> {load[1]:.1f})",
        "",
        "| reader | MB/s (median) | range | CPU s/GiB |",
        "|---|---|---|---|",
    ]
    for r in READERS:
        lines.append(
            f"| {r} | {med[r]['mb_s']:.0f} | {min(rates[r]):.0f}-{max(rates[r]):.0f} | "
            f"{med[r]['cpu_s_gib']:.2f} |"
        )
    lines += [
        "",
        f"https / s3 throughput {med['https']['mb_s'] / med['s3']['mb_s']:.2f}x (target >= 0.9), CPU per GiB "
        f"{med['https']['cpu_s_gib'] / med['s3']['cpu_s_gib']:.2f}x (target <= 1.2); wds-fastload / "
        f"wds-webdataset {med['wds-fastload']['mb_s'] / med['wds-webdataset']['mb_s']:.2f}x (target >= 1)",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--samples", type=int, default=2400)
    parser.add_argument("--sample-kib", type=int, default=48)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--conn-mbps", type=float, default=50.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--append", type=Path, default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fastload-stores-"))
    server = None
    try:
        shards, _ = make_data(work, args.samples, args.sample_kib)
        server = subprocess.Popen(
            [sys.executable, "-m", "fastload.testing.s3serve", str(work / "bucket"), "--bucket", "bench",
             "--latency-ms", str(args.latency_ms), "--conn-mbps", str(args.conn_mbps)],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        assert server.stdout is not None
        base = json.loads(server.stdout.readline())["endpoint_url"]
        os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1")
        config = fastload.S3Config(endpoint_url=base, region="us-east-1", addressing_style="path")
        for reader in READERS:  # untimed: clients, connection pools and imports warm
            print("warm-up", json.dumps(one_pass(reader, base, shards, config)), flush=True)
        load_start = os.getloadavg()[0]
        runs = []
        for rep in range(args.reps):
            k = rep % len(READERS)
            for reader in READERS[k:] + READERS[:k]:
                run = one_pass(reader, base, shards, config)
                run["rep"] = rep
                runs.append(run)
                print(json.dumps(run), flush=True)
        text = report(runs, args, (load_start, os.getloadavg()[0]))
        print(text)
        if args.append is not None:
            with open(args.append, "a") as f:
                f.write("\n" + text + "\n")
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
