"""Which client reads ``gs://`` (issue 32): one object read whole in ranged GETs of ``--part-mib`` (8) MiB,
``--threads`` (4) at a time, from a GCS emulator (``gcp-storage-emulator`` on 127.0.0.1, in a process of
its own), by each candidate:

- ``fastload``: ``fastload.open("gs://...").read()`` (its own transport, ``s3.gcsstore``: the JSON API over
  its pooled HTTP/1.1, the range contract, retries, counters);
- ``sdk``: ``google-cloud-storage``'s ``Blob.download_as_bytes(start=, end=)`` in a thread pool;
- ``obstore``: ``obstore.get_ranges`` (Rust object_store, the GIL released while it waits).

Figures: MB/s and CPU seconds of this process per GiB (``time.process_time``: every thread; the emulator's
CPU is its own process's), medians over ``--reps`` (3) after a warm-up read each. The emulator is Python
(``http.server``): it caps throughput for every client alike, so CPU per GiB is the figure that separates
them. Needs ``pip install google-cloud-storage obstore gcp-storage-emulator``.

    python benchmarks/gcs_clients.py --mib 64 --reps 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import fastload  # noqa: E402
from tests.servers.gcs import GcsEmulator  # noqa: E402

BUCKET, NAME = "bench", "data/object.bin"


def read_fastload(size: int, part: int, threads: int) -> bytes:
    with fastload.open(f"gs://{BUCKET}/{NAME}", part_size_bytes=part, max_concurrency=threads) as f:
        return f.read()


def read_sdk(size: int, part: int, threads: int) -> bytes:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    blob = storage.Client(project="bench", credentials=AnonymousCredentials()).bucket(BUCKET).blob(NAME)
    starts = range(0, size, part)
    with ThreadPoolExecutor(threads) as pool:
        parts = pool.map(lambda s: blob.download_as_bytes(start=s, end=min(s + part, size) - 1), starts)
        return b"".join(parts)


def read_obstore(size: int, part: int, threads: int) -> bytes:
    import obstore
    from obstore.store import GCSStore

    store = GCSStore(
        BUCKET,
        base_url=os.environ["STORAGE_EMULATOR_HOST"],
        skip_signature=True,
        client_options={"allow_http": True},
    )
    starts = list(range(0, size, part))
    ends = [min(s + part, size) for s in starts]
    return b"".join(bytes(b) for b in obstore.get_ranges(store, NAME, starts=starts, ends=ends, coalesce=0))


READERS: dict[str, Any] = {"fastload": read_fastload, "sdk": read_sdk, "obstore": read_obstore}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--part-mib", type=int, default=8)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--readers", default=",".join(READERS))
    args = parser.parse_args()
    data = os.urandom(args.mib << 20)
    with GcsEmulator() as emu:
        os.environ["STORAGE_EMULATOR_HOST"] = emu.url
        emu.make_bucket(BUCKET)
        emu.put(BUCKET, NAME, data)
        part = args.part_mib << 20
        rows = []
        for name in args.readers.split(","):
            read = READERS[name]
            assert read(len(data), part, args.threads) == data, name  # warm-up, and the bytes are right
            walls, cpus = [], []
            for _ in range(args.reps):
                w0, c0 = time.perf_counter(), time.process_time()
                got = read(len(data), part, args.threads)
                walls.append(time.perf_counter() - w0)
                cpus.append(time.process_time() - c0)
                assert len(got) == len(data)
            wall, cpu = statistics.median(walls), statistics.median(cpus)
            rows.append((name, len(data) / wall / 1e6, cpu / (len(data) / (1 << 30))))
    shape = f"{args.mib} MiB, {args.part_mib} MiB ranges, {args.threads} threads"
    print(f"| client | MB/s | CPU s/GiB |  ({shape})")
    print("|---|---|---|")
    for name, mbps, cpu in rows:
        print(f"| {name} | {mbps:.0f} | {cpu:.2f} |")


if __name__ == "__main__":
    main()
