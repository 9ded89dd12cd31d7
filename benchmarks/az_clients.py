"""Which client reads ``az://`` (issue 32): one blob read whole in ranged GETs of ``--part-mib`` (8) MiB,
``--threads`` (4) at a time, from Azurite (npm ``azurite``, in memory, its own process), by each candidate:

- ``fastload``: ``fastload.open("az://...").read()`` (its own transport, ``s3.azstore``: Get Blob with
  Range and If-Match, Shared Key signed, over its pooled HTTP/1.1; the range contract, retries, counters);
- ``sdk``: ``azure-storage-blob``'s ``BlobClient.download_blob(offset=, length=).readall()`` in a thread
  pool (one client, its own retry policy);
- ``obstore``: ``obstore.get_range`` per range in a thread pool, on an ``AzureStore`` in emulator mode
  (Rust object_store, the GIL released while it waits; ``get_ranges`` would merge adjacent ranges into
  one GET).

Each client is made once per origin and kept (connections reused, as in training), and fills one
preallocated buffer (``readinto``; obstore's buffers copied in): each copies the bytes once out of its
own parts. Figures: MB/s and CPU seconds of this process per GiB (``time.process_time``: every thread;
Azurite's CPU is its own process's), medians over ``--reps`` (3) after a warm-up read each, clients
interleaved (the order rotated every repetition). Azurite is one Node.js process: it caps throughput for every
client alike, so CPU per GiB is the figure that separates them.

``--faults``: each client reads the blob through ``fastload.testing.faultproxy`` in front of Azurite,
once per fault: two 503s, a connection reset 1 MiB into a body, a body cut short (a clean FIN), a 206
whose bytes are not the ones asked for (the request's Range shifted by 4 KiB, the answer's Content-Range
telling the truth); every client is authorised by a blob SAS there (a Shared Key signs the Range, so the
proxy could not rewrite it); the table says whether the bytes came back right, wrong, or as which error.
Needs ``pip install azure-storage-blob obstore`` and ``azurite-blob`` (``.ci/install-s3-servers``).

    python benchmarks/az_clients.py --mib 64 --reps 3
    python benchmarks/az_clients.py --mib 16 --faults
"""

from __future__ import annotations

import argparse
import datetime
import functools
import hashlib
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import fastload  # noqa: E402
from fastload.s3.azstore import _DEV_ACCOUNT, _DEV_KEY  # noqa: E402
from fastload.testing.faultproxy import Fault, FaultProxy, RequestInfo, Rule  # noqa: E402
from tests.servers.azurite import Azurite  # noqa: E402

CONTAINER, BLOB = "bench", "data/object.bin"
SAS: list[str] = []  # --faults: every client authorised by this SAS token (a Shared Key signs the Range)
Reader = Callable[[str, int, int, int], bytearray]  # (origin http://127.0.0.1:PORT, size, part, threads)


def _ranges(size: int, part: int) -> list[tuple[int, int]]:
    return [(s, min(s + part, size)) for s in range(0, size, part)]


class _Sink:
    """A writable stream into ``out`` from ``at`` on (what the SDK's ``readinto`` writes to)."""

    def __init__(self, out: bytearray, at: int) -> None:
        self.view, self.at = memoryview(out), at

    def write(self, data: bytes) -> int:
        self.view[self.at : self.at + len(data)] = data
        self.at += len(data)
        return len(data)


def read_fastload(origin: str, size: int, part: int, threads: int) -> bytearray:
    auth = f"SharedAccessSignature={SAS[0]}" if SAS else f"AccountKey={_DEV_KEY}"
    os.environ["AZURE_STORAGE_CONNECTION_STRING"] = (
        f"AccountName={_DEV_ACCOUNT};{auth};BlobEndpoint={origin}/{_DEV_ACCOUNT};"
    )
    out = bytearray(size)
    with fastload.open(f"az://{CONTAINER}/{BLOB}", part_size_bytes=part, max_concurrency=threads) as f:
        f.readinto(out)
    return out


@functools.cache
def _sdk_blob(origin: str, sas: str | None) -> Any:
    from azure.storage.blob import BlobClient

    key = sas or {"account_name": _DEV_ACCOUNT, "account_key": _DEV_KEY}
    return BlobClient(f"{origin}/{_DEV_ACCOUNT}", CONTAINER, BLOB, credential=key)


@functools.cache
def _obstore(origin: str, sas: str | None) -> Any:
    from obstore.store import AzureStore

    os.environ["AZURITE_BLOB_STORAGE_URL"] = origin
    config = {"sas_key": sas} if sas else {}
    return AzureStore(CONTAINER, use_emulator=True, client_options={"allow_http": True}, **config)  # type: ignore[arg-type]


def read_sdk(origin: str, size: int, part: int, threads: int) -> bytearray:
    blob = _sdk_blob(origin, SAS[0] if SAS else None)
    out = bytearray(size)

    def get(span: tuple[int, int]) -> None:
        blob.download_blob(offset=span[0], length=span[1] - span[0]).readinto(_Sink(out, span[0]))

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(get, _ranges(size, part)))
    return out


def read_obstore(origin: str, size: int, part: int, threads: int) -> bytearray:
    import obstore

    store = _obstore(origin, SAS[0] if SAS else None)
    out = bytearray(size)

    def get(span: tuple[int, int]) -> None:  # (get_ranges merges adjacent ranges into one GET)
        out[span[0] : span[1]] = memoryview(obstore.get_range(store, BLOB, start=span[0], end=span[1]))

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(get, _ranges(size, part)))
    return out


READERS: dict[str, Reader] = {"fastload": read_fastload, "sdk": read_sdk, "obstore": read_obstore}


def _ranged(request: RequestInfo) -> bool:
    """A ranged GET (the SDK sends its range as ``x-ms-range``, the others as ``Range``)."""
    return request.range is not None or request.header("x-ms-range") is not None


_ONE_GET = {"method": "GET", "where": _ranged, "times": 1}
FAULTS = {
    "2x 503": Rule(Fault.slowdown(), method="GET", times=2),
    "reset after 1 MiB": Rule(Fault.reset_mid_body(after_bytes=1 << 20), **_ONE_GET),  # type: ignore[arg-type]
    "body cut short": Rule(Fault.truncate_body(after_bytes=1 << 20), **_ONE_GET),  # type: ignore[arg-type]
    "Range shifted 4 KiB": Rule(Fault.shift_range(shift_bytes=4096), **_ONE_GET),  # type: ignore[arg-type]
}


def measure(args: argparse.Namespace, origin: str, data: bytes, names: list[str]) -> list[str]:
    part = args.part_mib << 20
    walls: dict[str, list[float]] = {n: [] for n in names}
    cpus: dict[str, list[float]] = {n: [] for n in names}
    for name in names:  # warm-up, and the bytes are right
        assert READERS[name](origin, len(data), part, args.threads) == data, name
    for rep in range(args.reps):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            w0, c0 = time.perf_counter(), time.process_time()
            got = READERS[name](origin, len(data), part, args.threads)
            walls[name].append(time.perf_counter() - w0)
            cpus[name].append(time.process_time() - c0)
            assert got == data, name
    rows = ["| client | MB/s (median) | range | CPU s/GiB |", "|---|---|---|---|"]
    for name in names:
        rates = [len(data) / w / 1e6 for w in walls[name]]
        cpu = statistics.median(cpus[name]) / (len(data) / (1 << 30))
        spread = f"{min(rates):.0f}-{max(rates):.0f}"
        rows.append(f"| {name} | {statistics.median(rates):.0f} | {spread} | {cpu:.2f} |")
    return rows


def faults(args: argparse.Namespace, origin: str, data: bytes, names: list[str]) -> list[str]:
    part = args.part_mib << 20
    rows = ["| fault | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    want = hashlib.sha256(data).hexdigest()
    from azure.storage.blob import BlobSasPermissions, generate_blob_sas

    expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
    SAS.append(generate_blob_sas(_DEV_ACCOUNT, CONTAINER, BLOB, account_key=_DEV_KEY,
                                 permission=BlobSasPermissions(read=True), expiry=expiry))  # fmt: skip
    for label, rule in FAULTS.items():
        cells = []
        for name in names:
            with FaultProxy(origin) as proxy:
                proxy.add(rule)
                t0 = time.perf_counter()
                try:
                    got = READERS[name](proxy.endpoint_url.rstrip("/"), len(data), part, args.threads)
                    verdict = "right bytes" if hashlib.sha256(got).hexdigest() == want else "**wrong bytes**"
                except Exception as exc:  # what each client raises is the finding
                    verdict = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
                hit = sum(proxy.stats().injected.values())
            cells.append(f"{verdict} ({time.perf_counter() - t0:.1f} s, {hit} injected)")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--part-mib", type=int, default=8)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--readers", default=",".join(READERS))
    parser.add_argument("--faults", action="store_true", help="each client through the fault proxy")
    args = parser.parse_args()
    names = args.readers.split(",")
    data = os.urandom(args.mib << 20)
    with Azurite() as azurite:
        os.environ["AZURE_STORAGE_CONNECTION_STRING"] = azurite.connection_string
        azurite.make_container(CONTAINER)
        azurite.put(CONTAINER, BLOB, data)
        origin = azurite.endpoint.rsplit("/", 1)[0]
        load = os.getloadavg()[0]
        rows = (faults if args.faults else measure)(args, origin, data, names)
    shape = f"{args.mib} MiB, {args.part_mib} MiB ranges, {args.threads} threads, {args.reps} reps"
    print(f"`python benchmarks/az_clients.py {' '.join(sys.argv[1:])}` ({shape}; {os.cpu_count()} CPUs, "
          f"load {load:.1f} -> {os.getloadavg()[0]:.1f})\n")  # fmt: skip
    print("\n".join(rows))


if __name__ == "__main__":
    main()
