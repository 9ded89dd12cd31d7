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

``--cloud``: ``gs://`` and ``az://`` against fastload's S3 instead. ``ds`` is served by s3serve (unpaced),
by the GCS emulator and by Azurite (``tests/servers``, in memory), each behind a ``latency_proxy.py``
process of its own with ``--latency-ms`` and ``--conn-mbps`` (the same proxy for all three), or directly
with ``--direct`` (each server alone: its own ceiling). Per repetition, order rotated: one
``ShardDataset`` pass of each store (MB/s, CPU s/GiB), then for each a cold ``MapDataset`` (a fresh
runtime) reading ``--map-reads`` (300) random samples from 8 threads (reads/s with opening, median read).
Needs ``gcp-storage-emulator`` and ``azurite-blob`` (``.ci/install-s3-servers``). ``--origin s3serve``:
gs:// and az:// are served by the same s3serve as S3 (it answers their read APIs too:
``fastload.testing.storedialects``), so the three differ only in protocol and client: the fair test of the
targets, which the emulators (slower than S3 behind the proxy) cannot give.

    python benchmarks/stores.py --append benchmarks/RESULTS.md
    python benchmarks/stores.py --samples 600 --reps 1        # a quick look
    python benchmarks/stores.py --cloud --reps 3              # gs:// and az:// vs S3, through the proxy
    python benchmarks/stores.py --cloud --direct --reps 3     # the same, each server alone
    python benchmarks/stores.py --cloud --origin s3serve      # one server speaking all three APIs
"""

from __future__ import annotations

import argparse
import contextlib
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
CLOUD = ["s3", "gs", "az"]  # --cloud: one pass each, then MapDataset random reads ("map-s3"...)
SOURCE = {"s3": "s3://bench/ds", "gs": "gs://bench/ds", "az": "az://bench/ds"}


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
        source = {**SOURCE, "https": f"{base}/bench/ds", "wds-fastload": pattern}[reader]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # (wds-fastload: "indexed in memory")
            ds = fastload.ShardDataset(source, decode=False, s3_config=config)
        for sample in ds:
            payload += len(sample["bin"]) + len(sample["cls"])
            count += 1
    wall, cpu = time.monotonic() - wall, _cpu() - cpu
    gib = payload / (1 << 30)
    return {"reader": reader, "samples": count, "mb_s": payload / wall / 1e6, "cpu_s_gib": cpu / gib}


def map_pass(store: str, reads: int, config: fastload.S3Config, seed: int) -> dict[str, Any]:
    """``MapDataset(SOURCE[store])`` opened cold (a fresh runtime: index and shard tables fetched) and
    ``reads`` random samples read by index from 8 threads: samples/s and the median read's ms."""
    from concurrent.futures import ThreadPoolExecutor

    from fastload.s3 import runtime

    runtime.reset()
    wall = time.monotonic()
    ds = fastload.MapDataset(SOURCE[store], decode=False, s3_config=config)
    picks = random.Random(seed).sample(range(len(ds)), min(reads, len(ds)))

    def read(i: int) -> float:
        t = time.monotonic()
        sample = ds[i]
        assert len(sample["bin"]) > 0
        return time.monotonic() - t

    with ThreadPoolExecutor(8) as pool:
        each = list(pool.map(read, picks))
    wall = time.monotonic() - wall
    return {"reader": f"map-{store}", "reads_s": len(picks) / wall, "ms": statistics.median(each) * 1e3}


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


def _serve(cmd: list[str]) -> tuple[subprocess.Popen[str], str]:
    """A server process that prints ``{"endpoint_url": ...}`` as its first line: it and its URL."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())["endpoint_url"]


def serve_cloud(work: Path, args: argparse.Namespace, stack: contextlib.ExitStack) -> fastload.S3Config:
    """``ds`` in fastload's S3 server (unpaced), the GCS emulator and Azurite (``--origin s3serve``: the
    S3 server for all three), each behind a ``latency_proxy`` process of its own (none with
    ``--direct``); the environment names them."""
    from fastload.s3.azstore import _DEV_ACCOUNT, _DEV_KEY

    def proc(cmd: list[str]) -> str:
        server, url = _serve(cmd)
        stack.callback(lambda: (server.terminate(), server.wait(10)))
        return url

    s3 = proc([sys.executable, "-m", "fastload.testing.s3serve", str(work / "bucket"), "--bucket", "bench"])
    ends = {"s3": s3, "gs": s3, "az": s3}
    if args.origin == "emulators":
        from tests.servers.azurite import Azurite
        from tests.servers.gcs import GcsEmulator

        gcs = stack.enter_context(GcsEmulator())
        azure = stack.enter_context(Azurite())
        os.environ["AZURE_STORAGE_CONNECTION_STRING"] = azure.connection_string
        gcs.make_bucket("bench")
        azure.make_container("bench")
        for path in sorted((work / "bucket" / "ds").iterdir()):
            gcs.put("bench", f"ds/{path.name}", path.read_bytes())
            azure.put("bench", f"ds/{path.name}", path.read_bytes())
        ends.update(gs=gcs.url, az=azure.endpoint.rsplit("/", 1)[0])
    if not args.direct:
        pace = ["--latency-ms", str(args.latency_ms), "--conn-mbps", str(args.conn_mbps)]
        proxy = [sys.executable, str(ROOT / "benchmarks" / "latency_proxy.py"), *pace, "--upstream"]
        ends = {store: proc([*proxy, url]) for store, url in ends.items()}
    os.environ["STORAGE_EMULATOR_HOST"] = ends["gs"]
    os.environ["AZURE_STORAGE_CONNECTION_STRING"] = (
        f"AccountName={_DEV_ACCOUNT};AccountKey={_DEV_KEY};BlobEndpoint={ends['az']}/{_DEV_ACCOUNT};"
    )
    return fastload.S3Config(endpoint_url=ends["s3"], region="us-east-1", addressing_style="path")


def cloud_report(runs: list[dict[str, Any]], args: argparse.Namespace, load: tuple[float, float]) -> str:
    def med(reader: str, key: str) -> float:
        return statistics.median(x[key] for x in runs if x["reader"] == reader)

    pace = f"{args.latency_ms:g} ms first byte, {args.conn_mbps:g} MB/s per connection"
    how = "each server directly" if args.direct else f"each behind latency_proxy: {pace}"
    emulators = args.origin == "emulators"
    how += ", gs and az from the GCS emulator and Azurite" if emulators else ", all three from s3serve"
    lines = [
        f"`python benchmarks/stores.py {' '.join(sys.argv[1:])}` ({args.samples} samples x {args.sample_kib} "
        f"KiB, {how}, {args.reps} reps, {args.map_reads} random reads; {platform.machine()}, "
        f"{os.cpu_count()} CPUs, load {load[0]:.1f} -> {load[1]:.1f})",
        "",
        "| store | MB/s (median) | range | CPU s/GiB | MapDataset reads/s | median read ms |",
        "|---|---|---|---|---|---|",
    ]
    for store in CLOUD:
        rates = [x["mb_s"] for x in runs if x["reader"] == store]
        lines.append(
            f"| {store} | {med(store, 'mb_s'):.0f} | {min(rates):.0f}-{max(rates):.0f} | "
            f"{med(store, 'cpu_s_gib'):.2f} | {med(f'map-{store}', 'reads_s'):.0f} | "
            f"{med(f'map-{store}', 'ms'):.1f} |"
        )
    lines.append("")
    lines.append(
        "; ".join(
            f"{store}/s3 throughput {med(store, 'mb_s') / med('s3', 'mb_s'):.2f}x, CPU per GiB "
            f"{med(store, 'cpu_s_gib') / med('s3', 'cpu_s_gib'):.2f}x, random reads "
            f"{med(f'map-{store}', 'reads_s') / med('map-s3', 'reads_s'):.2f}x"
            for store in CLOUD[1:]
        )
        + " (targets: >= 0.9x, <= 1.2x)"
    )
    return "\n".join(lines)


def cloud_main(args: argparse.Namespace, work: Path) -> str:
    """gs:// and az:// against fastload's S3 (``--cloud``): the table, after every run was printed."""
    with contextlib.ExitStack() as stack:
        make_data(work, args.samples, args.sample_kib)
        config = serve_cloud(work, args, stack)
        for store in CLOUD:  # untimed: clients, connection pools and imports warm
            print("warm-up", json.dumps(one_pass(store, "", 0, config)), flush=True)
        load_start = os.getloadavg()[0]
        runs = []
        for rep in range(args.reps):
            order = CLOUD[rep % 3 :] + CLOUD[: rep % 3]
            for run in [one_pass(s, "", 0, config) for s in order] + [
                map_pass(s, args.map_reads, config, rep) for s in order
            ]:
                runs.append({**run, "rep": rep})
                print(json.dumps(run), flush=True)
        return cloud_report(runs, args, (load_start, os.getloadavg()[0]))


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--samples", type=int, default=2400)
    parser.add_argument("--sample-kib", type=int, default=48)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--conn-mbps", type=float, default=50.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--append", type=Path, default=None)
    parser.add_argument("--cloud", action="store_true", help="gs:// and az:// against S3 instead")
    parser.add_argument("--direct", action="store_true", help="--cloud without the proxies")
    parser.add_argument("--map-reads", type=int, default=300)
    parser.add_argument(
        "--origin",
        choices=("emulators", "s3serve"),
        default="emulators",
        help="--cloud: gs:// and az:// from their emulators, or from s3serve (one server for all three)",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fastload-stores-"))
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1")
    if args.cloud:
        try:
            text = cloud_main(args, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(text)
        if args.append is not None:
            with open(args.append, "a") as f:
                f.write("\n" + text + "\n")
        return 0
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
