"""Random access benchmark (issue 21): single samples read by index over S3 with 8 threads.

Readers, each ``ds[i]`` called from ``--threads`` (8) threads over the same ``--reads`` random indices
(seeded, without repeats) of a dataset of ``--samples`` samples (``bin``: ``--min-kib``..``--max-kib``
random bytes, ``cls``: an int), each format's shards/chunks of ``--shard-mib`` (16) MiB:

- ``fastload``: ``fastload.MapDataset(url, decode=False)[i]``: one ranged GET of the sample (its shard's
  table fetched on first use of the shard);
- ``fastload-cache``: the same with ``cache_dir=`` (a local folder): the whole shard downloaded on its
  first use (parallel ranged GETs, CRC32C checked), later samples read from disk, as MosaicML's reader does;
- ``litdata``: ``litdata.StreamingDataset(url)[i]`` (its default on-demand path: two ranged GETs per item,
  the item's offsets then its bytes). ``bin`` is written as a numpy uint8 array: written as ``bytes``,
  litdata 0.2.76's ``optimize`` stores Arrow IPC chunks whose on-demand path returns empty bytes (seen here);
- ``mosaic``: MosaicML streaming ``StreamingDataset(remote=url, local=tmp)[i]``: the whole shard downloaded
  on first access, then read locally. Importing ``streaming`` needs torchvision only for its vision
  datasets (not used): a stub module stands in for it (the torchvision wheel on PyPI needs CUDA's torch).

The origin is a Ceph RGW on 127.0.0.1 (``tests/servers/rgw.py``) behind ``benchmarks/latency_proxy.py``
(``--latency-ms`` 20 before each response head, bodies paced to ``--conn-mbps`` 50 MB/s per connection: S3's
first-byte latency and per-connection bandwidth); ``--latency-ms 0 --conn-mbps 0`` reads RGW directly. Every
run is a child process with empty caches (a cold start: construction and every read are timed); the readers
are interleaved, the order rotated by one each repetition, figures are medians. After the clock stops each
sample's bytes are compared with what was written.

    python benchmarks/random_access.py                       # the issue's configuration
    python benchmarks/random_access.py --samples 2000 --reads 200 --reps 1 --no-results   # a quick look
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.machinery
import importlib.util
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
READERS = ("fastload", "fastload-cache", "litdata", "mosaic")
FORMAT_OF = {"fastload": "fastload", "fastload-cache": "fastload", "litdata": "litdata", "mosaic": "mosaic"}
BUCKET = "bench"
REGION = "us-east-1"
MIB = 1 << 20


def sample_bytes(seed: int, i: int, min_kib: int, max_kib: int) -> bytes:
    rng = random.Random(seed * 1_000_003 + i)
    return rng.randbytes(rng.randrange(min_kib << 10, (max_kib << 10) + 1))


def indices(args: argparse.Namespace) -> list[int]:
    return random.Random(args.seed).sample(range(args.samples), args.reads)


# -- the data ----------------------------------------------------------------------------------------------


def _lit_item(arg: tuple[int, int, int, int]) -> dict[str, Any]:
    import numpy as np

    seed, i, lo, hi = arg
    return {"bin": np.frombuffer(sample_bytes(seed, i, lo, hi), np.uint8), "cls": i % 10}


def stub_torchvision() -> None:
    """MosaicML streaming imports torchvision for its vision datasets only (see the module docstring)."""
    if importlib.util.find_spec("torchvision") is not None:
        return
    names = (
        "torchvision",
        "torchvision.datasets",
        "torchvision.transforms",
        "torchvision.transforms.functional",
    )
    mods = {}
    for name in names:
        mods[name] = types.ModuleType(name)
        mods[name].__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules[name] = mods[name]
    mods["torchvision.datasets"].VisionDataset = type("VisionDataset", (), {})  # type: ignore[attr-defined]
    mods["torchvision.transforms.functional"].to_tensor = lambda x: x  # type: ignore[attr-defined]


def make_data(args: argparse.Namespace, work: Path) -> dict[str, Path]:
    """The same samples in the three formats, under ``work``."""
    import fastload

    src, out = work / "src", {r: work / r for r in set(FORMAT_OF.values())}
    lo, hi = args.min_kib, args.max_kib
    for i in range(args.samples):
        folder = src / f"{i // 1000:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:07d}.bin").write_bytes(sample_bytes(args.seed, i, lo, hi))
        (folder / f"{i:07d}.cls").write_bytes(b"%d" % (i % 10))
    fastload.pack(src, out["fastload"], progress=False, shard_size_bytes=args.shard_mib * MIB)
    shutil.rmtree(src)
    import litdata

    litdata.optimize(
        fn=_lit_item,
        inputs=[(args.seed, i, lo, hi) for i in range(args.samples)],
        output_dir=str(out["litdata"]),
        chunk_bytes=args.shard_mib * MIB,
        num_workers=1,
        reorder_files=False,
        keep_data_ordered=True,
        verbose=False,
    )
    stub_torchvision()
    from streaming import MDSWriter

    with MDSWriter(
        out=str(out["mosaic"]), columns={"bin": "bytes", "cls": "int"}, size_limit=args.shard_mib * MIB
    ) as w:
        for i in range(args.samples):
            w.write({"bin": sample_bytes(args.seed, i, lo, hi), "cls": i % 10})
    return out


# -- one run (a child process) -----------------------------------------------------------------------------


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Open the reader's dataset and read the indices with the threads; the bytes are checked after."""
    reader, url, cache = spec["reader"], spec["url"], spec["cache"]
    if reader.startswith("fastload"):  # (imports before the clock: torch and the SDKs take seconds here)
        from fastload.train.mapview import MapDataset

        began = time.perf_counter()
        ds: Any = MapDataset(url, decode=False, cache_dir=cache if reader == "fastload-cache" else None)

        def get(i: int) -> bytes:
            return ds[i]["bin"]  # type: ignore[no-any-return]
    elif reader == "litdata":
        from litdata import StreamingDataset

        began = time.perf_counter()
        ds = StreamingDataset(url, cache_dir=cache, storage_options={"endpoint_url": spec["endpoint_url"]})

        def get(i: int) -> bytes:
            return ds[i]["bin"].tobytes()  # type: ignore[no-any-return]
    else:
        stub_torchvision()
        from streaming import StreamingDataset as MDS

        began = time.perf_counter()
        ds = MDS(remote=url, local=cache, shuffle=False, batch_size=1)

        def get(i: int) -> bytes:
            return ds[i]["bin"]  # type: ignore[no-any-return]

    opened = time.perf_counter()
    latencies: list[float] = []

    def timed(i: int) -> bytes:
        t = time.perf_counter()
        data = get(i)
        latencies.append(time.perf_counter() - t)
        return data

    with ThreadPoolExecutor(spec["threads"]) as pool:
        got = list(pool.map(timed, spec["indices"]))
    done = time.perf_counter()
    cpu = time.process_time()
    lo, hi = spec["min_kib"], spec["max_kib"]
    bad = [
        i
        for i, data in zip(spec["indices"], got, strict=True)
        if data != sample_bytes(spec["seed"], i, lo, hi)
    ]
    if bad:
        raise SystemExit(f"{reader}: {len(bad)} samples differ from what was written, e.g. index {bad[0]}")
    cached = sum(p.stat().st_size for p in Path(cache).rglob("*") if p.is_file())
    lat = sorted(latencies)
    return {
        "open_s": opened - began,
        "read_s": done - opened,
        "total_s": done - began,
        "samples_s": len(got) / (done - began),
        "read_samples_s": len(got) / (done - opened),
        "p50_ms": 1000 * lat[len(lat) // 2],
        "p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))],
        "cpu_s": cpu,
        "cache_bytes": cached,
        "bytes": sum(map(len, got)),
    }


# -- the parent --------------------------------------------------------------------------------------------


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def origin(args: argparse.Namespace, data_bytes: int) -> Iterator[tuple[Any, str]]:
    """RGW, and the latency proxy in front of it unless both caps are 0: ``(rgw, endpoint for readers)``."""
    rgw_module = _load("fastload_bench_rgw", ROOT / "tests" / "servers" / "rgw.py")
    rgw = rgw_module.RadosGateway(memstore_bytes=3 * data_bytes + (1 << 30), timeout_s=150)
    rgw.start()
    proxy = None
    try:
        endpoint = rgw.endpoint_url
        if args.latency_ms or args.conn_mbps:
            argv = [sys.executable, str(ROOT / "benchmarks" / "latency_proxy.py"), "--upstream", endpoint]
            argv += ["--latency-ms", str(args.latency_ms), "--conn-mbps", str(args.conn_mbps)]
            proxy = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
            assert proxy.stdout is not None
            endpoint = json.loads(proxy.stdout.readline())["endpoint_url"]
        yield rgw, endpoint
    finally:
        if proxy is not None:
            proxy.terminate()
            proxy.wait(timeout=10)
        rgw.stop()


def upload(client: Any, folder: Path, prefix: str) -> None:
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        client.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(folder).as_posix()}")


def machine() -> str:
    model = platform.processor()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
    return f"{model}, {len(os.sched_getaffinity(0))} usable of {os.cpu_count()} cores, {platform.platform()}"


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in ("torch", "litdata", "mosaicml-streaming", "boto3"):
        with contextlib.suppress(PackageNotFoundError):
            out.append(f"{name} {version(name)}")
    return ", ".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/random_access.py", description=__doc__.split("\n")[0]
    )
    add = parser.add_argument
    add("--samples", type=int, default=10_000)
    add("--reads", type=int, default=1_000, help="random indices read per run (default 1000)")
    add("--min-kib", type=int, default=8)
    add("--max-kib", type=int, default=24)
    add("--shard-mib", type=int, default=16)
    add("--threads", type=int, default=8)
    add("--reps", type=int, default=3)
    add("--seed", type=int, default=20240611)
    add("--latency-ms", type=float, default=20.0)
    add("--conn-mbps", type=float, default=50.0)
    add("--readers", default=",".join(READERS))
    add("--json", help="write every run here")
    add("--no-results", action="store_true", help="do not append to benchmarks/RESULTS.md")
    add("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        result = child(json.loads(Path(args.child).read_text()))
        Path(args.child).with_suffix(".out").write_text(json.dumps(result))
        return 0
    readers = [r for r in args.readers.split(",") if r]
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="fastload-random-access-"))
    try:
        began = time.perf_counter()
        folders = make_data(args, work)
        data_bytes = sum(p.stat().st_size for p in work.rglob("*") if p.is_file())
        print(
            f"data: {data_bytes / MIB:,.0f} MiB in 3 formats in {time.perf_counter() - began:.0f} s",
            flush=True,
        )
        with origin(args, data_bytes) as (rgw, endpoint):
            client = rgw.client()
            client.create_bucket(Bucket=BUCKET)
            for name, folder in folders.items():
                upload(client, folder, name)
            env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
            env.update(
                AWS_ACCESS_KEY_ID=rgw.access_key,
                AWS_SECRET_ACCESS_KEY=rgw.secret_key,
                AWS_REGION=REGION,
                AWS_DEFAULT_REGION=REGION,
                AWS_ENDPOINT_URL=endpoint,
                S3_ENDPOINT_URL=endpoint,
                AWS_EC2_METADATA_DISABLED="true",
                AWS_CONFIG_FILE=str(work / "none"),
                AWS_SHARED_CREDENTIALS_FILE=str(work / "none"),
                PYTHONPATH=str(ROOT),
            )
            runs: dict[str, list[dict[str, Any]]] = {r: [] for r in readers}
            failures: dict[str, str] = {}
            chosen = indices(args)
            for rep in range(args.reps):
                order = readers[rep % len(readers) :] + readers[: rep % len(readers)]
                for reader in order:
                    if reader in failures:
                        continue
                    spec_path = work / f"spec-{reader}-{rep}.json"
                    cache = work / f"cache-{reader}-{rep}"
                    cache.mkdir()
                    spec = {
                        "reader": reader,
                        "url": f"s3://{BUCKET}/{FORMAT_OF[reader]}",
                        "cache": str(cache),
                        "threads": args.threads,
                        "indices": chosen,
                        "seed": args.seed,
                        "min_kib": args.min_kib,
                        "max_kib": args.max_kib,
                        "endpoint_url": endpoint,
                    }
                    spec_path.write_text(json.dumps(spec))
                    proc = subprocess.run(
                        [sys.executable, __file__, "--child", str(spec_path)],
                        env=env,
                        capture_output=True,
                        text=True,
                        timeout=900,
                    )
                    shutil.rmtree(cache, ignore_errors=True)
                    if proc.returncode != 0:
                        failures[reader] = (proc.stderr.strip().splitlines() or ["?"])[-1]
                        print(f"{reader}: failed: {failures[reader]}", flush=True)
                        continue
                    run = json.loads(spec_path.with_suffix(".out").read_text())
                    runs[reader].append(run)
                    print(
                        f"rep {rep} {reader:9s} {run['samples_s']:8.1f} samples/s  "
                        f"open {run['open_s']:.2f} s  "
                        f"p50 {run['p50_ms']:.1f} ms  p99 {run['p99_ms']:.1f} ms  "
                        f"cache {run['cache_bytes'] / MIB:.0f} MiB",
                        flush=True,
                    )
        load_after = os.getloadavg()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = summarise(args, runs, failures, load_before, load_after)
    print(report)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "runs": runs, "failures": failures}, indent=1)
        )
    if not args.no_results:
        with open(ROOT / "benchmarks" / "RESULTS.md", "a") as f:
            f.write("\n" + report)
    return 0


def summarise(
    args: argparse.Namespace,
    runs: dict[str, list[dict[str, Any]]],
    failures: dict[str, str],
    load_before: tuple[float, ...],
    load_after: tuple[float, ...],
) -> str:
    med = {r: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for r, rs in runs.items() if rs}
    origin_text = (
        f"RGW behind latency_proxy ({args.latency_ms:g} ms first byte, {args.conn_mbps:g} MB/s a connection)"
        if args.latency_ms or args.conn_mbps
        else "RGW direct"
    )
    lines = [
        "## Random access over S3 (`benchmarks/random_access.py`, issue 21)",
        "",
        f"    python benchmarks/random_access.py {' '.join(sys.argv[1:])}".rstrip(),
        "",
        f"{args.reads:,} random indices of {args.samples:,} samples ({args.min_kib}-{args.max_kib} KiB), "
        f"{args.shard_mib} MiB shards, `ds[i]` from {args.threads} threads, a cold start per run "
        f"(construction included), {args.reps} interleaved repetitions, medians. Origin: {origin_text}. "
        f"Machine: {machine()}; {versions()}. Load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after.",
        "",
        "| reader | samples/s | reads only, samples/s | open s | p50 ms | p99 ms | local cache MiB | CPU s "
        "| fastload / reader | fastload-cache / reader |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def ratio(base: str, m: dict[str, float]) -> str:
        return f"{med[base]['samples_s'] / m['samples_s']:.2f}x" if base in med else "n/a"

    for r, m in med.items():
        lines.append(
            f"| {r} | {m['samples_s']:,.1f} | {m['read_samples_s']:,.1f} | {m['open_s']:.2f} | "
            f"{m['p50_ms']:.1f} | {m['p99_ms']:.1f} | "
            f"{m['cache_bytes'] / MIB:,.0f} | {m['cpu_s']:.1f} | {ratio('fastload', m)} | "
            f"{ratio('fastload-cache', m)} |"
        )
    for r, why in failures.items():
        lines.append(f"| {r} | not measured: {why} | | | | | | | | |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
