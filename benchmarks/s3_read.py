"""S3 read benchmark: ``fastload.open`` against boto3, s3transfer, s3torchconnector and the origin's ceiling.

The origin is a real Ceph RADOS Gateway on 127.0.0.1 (``tests/servers/rgw.py``, objects in memstore) behind
``benchmarks/latency_proxy.py``, which adds ``--latency-ms`` (20) before each response head, S3's first-byte
latency, and paces each response body to ``--conn-mbps`` (50 MB/s = 50e6 bytes/s), S3's per-connection
bandwidth. The proxy runs in a process of its own. Everything stays on loopback; the script starts and stops
RGW and the proxies itself.

Workload 1, large objects: ``--total-mib`` (1024) made of ``--object-mib`` (256) objects of random bytes,
each read whole, in key order, by

- ``fastload``: ``fastload.open(url).read(8 MiB)`` until EOF, default part size and concurrency;
- ``get_object``: boto3 ``get_object`` per object, its body read in 8 MiB chunks (one GET per object);
- ``download_fileobj``: boto3 ``download_fileobj`` (s3transfer, ``max_concurrency=10``) into a discarding,
  seekable file object, as ``/dev/null`` is (a non-seekable one makes s3transfer reorder parts in memory,
  measured 20-25% slower here);
- ``s3torchconnector``: AWS's ``S3Reader`` (``S3Client.get_object``, the client its datasets use) read in
  8 MiB chunks, ``S3ClientConfig(force_path_style=True)`` otherwise default;
- ``ceiling``: the physical reference: ``--ceiling-concurrency`` (32) threads with raw ``http.client``
  connections doing signed (botocore SigV4) ranged GETs of 8 MiB parts over all objects at once, no retry,
  no validation beyond status and length, bodies read into a reused buffer;
- ``ceiling-direct``: the same straight at RGW, without the proxy (context: what the box can do).

Workload 2, small objects: ``--small-count`` (20,000) objects of 80-120 KiB fetched with one GET each
(boto3, a thread pool of 16) against the same bytes packed into tar shards (``fastload.pack`` locally,
uploaded with ``fastload.copy``) read two ways: shard by shard with ``fastload.open`` and ``tarfile``
streaming (``packed``), and with ``fastload.ShardDataset`` over the uploaded folder (``packed-dataset``:
ranged reads of runs of samples planned from ``index.json``, prefetched across shards, as a training job
reads). The 20x target is measured on ``packed-dataset``.

Every run is a child process (so ``time.process_time()`` covers exactly one reader, all its threads, CRT
threads included; the proxy and RGW are charged separately from ``/proc``). Clients are created and one
HEAD is sent before the clock starts. A first, untimed pass checks every reader's bytes with SHA-256 per
object; every timed run checks each object's byte count. Repetitions interleave the readers, the order
rotated by one each repetition; figures are medians.

    python benchmarks/s3_read.py                                          # the issue's configuration
    python benchmarks/s3_read.py --total-mib 256 --object-mib 64 --small-count 2000 --json /tmp/r.json
    python benchmarks/s3_read.py --probe only                             # only the proxy ceilings

Workload 3, tail latency (``--tail``, run alone; issue 17): ``--tail-small`` (200) objects of
``--tail-small-kib`` (100) read whole by 16 threads, then ``--tail-large`` (8) objects of ``--tail-large-mib``
(64) one after another, every object timed (per-object latency p50/p99/max) and checked (SHA-256 after its
clock stops), through ``FaultProxy`` (``latency_proxy.py --faultproxy --stall``) in front of the capped
proxy, in four scenarios: ``clean`` (no rule), ``paused`` (5% of GETs: the body pauses ``--tail-pause-s``
(12) s after 16 KiB, then the connection closes), ``stopped`` (2%: the body stops for good) and
``first-byte`` (5%: no response head for the pause). Readers: ``fastload`` (defaults: hedging on),
``fastload-nohedge`` (``S3Config(hedge=0)``: the retry path alone), ``download_fileobj`` (s3transfer,
``read_timeout=10`` like fastload's), ``s3torchconnector`` (when importable; a directory holding it can
be named by ``FASTLOAD_BENCH_S3TC_PATH``) and, on request, ``fastload-before`` (fastload from the checkout
``--fastload-before`` names: before/after, interleaved). A run still going after ``--tail-timeout-s``
counts as failed.
Each run gets a fresh proxy seeded by the repetition: every reader meets the same sequence of fault draws::

    python benchmarks/s3_read.py --tail --reps 2 --json /tmp/tail.json
    python benchmarks/s3_read.py --tail --tail-readers fastload,fastload-before --fastload-before ../main

Before the readers, ``--probe`` (on by default) measures what the proxies can forward: the ceiling reader at
1-64 connections straight at RGW, through ``latency_proxy`` without caps (splice and copy modes), through
``fastload.testing.faultproxy.FaultProxy`` without rules, and through the capped proxy.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import http.client
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

ROOT = Path(__file__).resolve().parent.parent
MIB = 1 << 20
GIB = 1 << 30
SEED = 20240611
BUCKET = "bench"
REGION = "us-east-1"
SMALL_MIN_BYTES, SMALL_MAX_BYTES = 80 << 10, 120 << 10
SMALL_THREADS = 16
PART_BYTES = 8 << 20
READERS = ("fastload", "get_object", "download_fileobj", "s3torchconnector", "ceiling", "ceiling-direct")
SMALL_READERS = ("per-object", "packed", "packed-dataset")
LABELS = {
    "fastload": "fastload.open",
    "fastload-before": "fastload.open, --fastload-before checkout",
    "get_object": "boto3 get_object",
    "download_fileobj": "boto3 download_fileobj",
    "s3torchconnector": "s3torchconnector S3Reader",
    "ceiling": "ceiling (raw ranged GETs)",
    "ceiling-direct": "ceiling, no proxy (RGW)",
    "per-object": "boto3 GET per object, 16 threads",
    "packed": "fastload.open over tar shards",
    "packed-dataset": "fastload.ShardDataset over the shards",
}
# (name, reader, peer, minimum ratio of the medians' MiB/s, strict: the ratio must exceed the minimum)
TARGETS = (
    ("fastload >= 0.8x ceiling", "fastload", "ceiling", 0.8, False),
    ("fastload >= 1.3x download_fileobj", "fastload", "download_fileobj", 1.3, False),
    ("fastload >= 3x get_object", "fastload", "get_object", 3.0, False),
    ("fastload ahead of s3torchconnector", "fastload", "s3torchconnector", 1.0, True),
)
# the packed data read the way a training job reads it (ShardDataset: planned ranged reads, prefetched
# across shards); the "packed" row (one tarfile stream per shard) is shown for reference
SMALL_TARGET = ("packed >= 20x per-object (samples/s)", 20.0)
SMALL_SUBJECT = "packed-dataset"
CHILD_TIMEOUT_S = 1800
T = TypeVar("T")


# ---------------------------------------------------------------------------------------------- pure core


def rotated(items: Sequence[T], rep: int) -> list[T]:
    """The run order of repetition ``rep``: ``items`` rotated left by ``rep``."""
    k = rep % len(items) if items else 0
    return [*items[k:], *items[:k]]


def part_ranges(size: int, part_bytes: int) -> list[tuple[int, int]]:
    """``[start, end)`` byte ranges of ``part_bytes`` covering ``size`` bytes exactly once."""
    return [(start, min(start + part_bytes, size)) for start in range(0, size, part_bytes)]


def small_sizes(count: int, seed: int = SEED) -> list[int]:
    """Sizes of the small objects: uniform in [80 KiB, 120 KiB], fixed seed."""
    import numpy as np

    rng = np.random.default_rng(seed + 1)
    return [int(s) for s in rng.integers(SMALL_MIN_BYTES, SMALL_MAX_BYTES, size=count, endpoint=True)]


def small_relpath(i: int) -> str:
    """Relative path (and pack key + field) of small object ``i``: 1,000 per folder."""
    return f"{i // 1000:03d}/{i:07d}.bin"


@dataclass
class Run:
    """One reader's run in one repetition (rep -1 is the SHA-256 verification pass)."""

    rep: int
    position: int
    reader: str
    seconds: float
    bytes: int
    objects: int
    cpu_s: float  # the reader's process, all threads (time.process_time)
    proxy_cpu_s: float | None
    origin_cpu_s: float | None  # ceph-mon + ceph-osd + radosgw
    machine_busy_cpu_s: float | None  # every CPU of the machine, busy time (/proc/stat)
    load_1min: float
    verified: str  # "sha256" or "sizes"

    @property
    def mib_s(self) -> float:
        return self.bytes / MIB / self.seconds

    @property
    def other_cpu_s(self) -> float | None:
        if self.machine_busy_cpu_s is None or self.proxy_cpu_s is None or self.origin_cpu_s is None:
            return None
        return max(0.0, self.machine_busy_cpu_s - self.cpu_s - self.proxy_cpu_s - self.origin_cpu_s)


def summarize(runs: Sequence[Run], readers: Sequence[str]) -> dict[str, Any]:
    """Per reader: median throughput (bytes / median seconds), spread, CPU per GiB, paired ratios."""
    timed = [r for r in runs if r.rep >= 0]
    by = {name: sorted((r for r in timed if r.reader == name), key=lambda r: r.rep) for name in readers}
    by = {name: rs for name, rs in by.items() if rs}
    out: dict[str, Any] = {}
    for name, rs in by.items():
        gib = rs[0].bytes / GIB
        median_s = statistics.median(r.seconds for r in rs)
        row: dict[str, Any] = {
            "label": LABELS[name],
            "reps": len(rs),
            "seconds": [r.seconds for r in rs],
            "mib_s_per_rep": [r.mib_s for r in rs],
            "median_s": median_s,
            "mib_s": rs[0].bytes / MIB / median_s,
            "min_mib_s": min(r.mib_s for r in rs),
            "max_mib_s": max(r.mib_s for r in rs),
            "bytes": rs[0].bytes,
            "objects": rs[0].objects,
            "samples_per_s": rs[0].objects / median_s,
            "cpu_s_per_gib": statistics.median(r.cpu_s for r in rs) / gib,
        }
        for field in ("proxy_cpu_s", "origin_cpu_s", "other_cpu_s"):
            values = [getattr(r, field) for r in rs]
            row[f"{field}_per_gib"] = (
                statistics.median(values) / gib if all(v is not None for v in values) else None
            )
        row["load_1min"] = [r.load_1min for r in rs]
        out[name] = row
    for name, row in out.items():
        row["x"] = {}
        for peer, prow in out.items():
            if peer == name:
                continue
            paired = [a.mib_s / b.mib_s for a in by[name] for b in by[peer] if a.rep == b.rep and b.mib_s > 0]
            row["x"][peer] = {
                "of_medians": row["mib_s"] / prow["mib_s"],
                "per_rep": paired,
            }
    return out


def check_targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Pass/fail of each target of the issue; a reader that did not run gives ``met: None``."""
    results = []
    for name, reader, peer, minimum, strict in TARGETS:
        if reader in summary and peer in summary:
            got = summary[reader]["x"][peer]["of_medians"]
            met: bool | None = got > minimum if strict else got >= minimum
        else:
            got, met = None, None
        results.append({"target": name, "minimum": minimum, "strict": strict, "measured": got, "met": met})
    return results


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return (
            "| "
            + " | ".join(
                str(c).ljust(w) if i == 0 else str(c).rjust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )
            + " |"
        )

    sep = "|" + "|".join("-" * (w + 1) + ("-" if i == 0 else ":") for i, w in enumerate(widths)) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in rows)])


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def format_large(summary: dict[str, Any]) -> str:
    ceiling = "ceiling" if "ceiling" in summary else None
    header = (
        "reader",
        "MiB/s (median)",
        "min-max",
        "x ceiling",
        "x ceiling per rep",
        "CPU s/GiB",
        "proxy CPU s/GiB",
        "RGW CPU s/GiB",
        "other CPU s/GiB",
    )
    rows = []
    for name, row in summary.items():
        x = row["x"].get(ceiling) if ceiling else None
        per_rep = x["per_rep"] if x else []
        rows.append(
            (
                row["label"],
                f"{row['mib_s']:.0f}",
                f"{row['min_mib_s']:.0f}-{row['max_mib_s']:.0f}",
                "1.00" if name == ceiling else _fmt(x["of_medians"] if x else None),
                f"{min(per_rep):.2f}-{max(per_rep):.2f}" if per_rep else "-",
                _fmt(row["cpu_s_per_gib"]),
                _fmt(row["proxy_cpu_s_per_gib"]),
                _fmt(row["origin_cpu_s_per_gib"]),
                _fmt(row["other_cpu_s_per_gib"]),
            )
        )
    return markdown_table(header, rows)


def format_ratios(summary: dict[str, Any], subject: str = "fastload") -> str:
    if subject not in summary:
        return f"({subject} did not run)"
    rows = []
    for peer, x in summary[subject]["x"].items():
        per_rep = x["per_rep"]
        rows.append(
            (
                f"{LABELS[subject]} / {LABELS[peer]}",
                f"{x['of_medians']:.2f}",
                f"{min(per_rep):.2f}-{max(per_rep):.2f}" if per_rep else "-",
            )
        )
    return markdown_table(("throughput ratio", "of medians", "paired per rep"), rows)


def format_small(summary: dict[str, Any]) -> str:
    header = ("reader", "samples/s (median)", "MiB/s", "min-max samples/s", "CPU s/GiB", "proxy CPU s/GiB")
    rows = []
    for row in summary.values():
        n, per = row["objects"], [row["objects"] / s for s in row["seconds"]]
        rows.append(
            (
                row["label"],
                f"{n / row['median_s']:,.0f}",
                f"{row['mib_s']:.0f}",
                f"{min(per):,.0f}-{max(per):,.0f}",
                _fmt(row["cpu_s_per_gib"]),
                _fmt(row["proxy_cpu_s_per_gib"]),
            )
        )
    return markdown_table(header, rows)


def format_targets(targets: Sequence[dict[str, Any]]) -> str:
    lines = []
    for t in targets:
        verdict = {True: "PASS", False: "FAIL", None: "n/a (reader did not run)"}[t["met"]]
        lines.append(f"- {t['target']}: measured {_fmt(t['measured'])}x -> {verdict}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------- readers (child side)


@dataclass
class Tally:
    bytes: int = 0
    objects: int = 0


class _Check:
    """Per-object check: SHA-256 and size (verify) or size only."""

    def __init__(self, verify: bool) -> None:
        self.verify = verify

    def start(self) -> Any:
        return hashlib.sha256() if self.verify else None

    def finish(self, key: str, got: int, hasher: Any, size: int, sha: str) -> None:
        if got != size:
            raise RuntimeError(f"{key}: read {got} bytes, the object has {size}")
        if hasher is not None and hasher.hexdigest() != sha:
            raise RuntimeError(f"{key}: SHA-256 {hasher.hexdigest()} differs from the uploaded {sha}")


def _boto_client(spec: dict[str, Any], **config: Any) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=spec["endpoint_url"],
        region_name=REGION,
        config=Config(s3={"addressing_style": "path"}, **config),
    )


def _stream_objects(
    spec: dict[str, Any], open_stream: Callable[[str], Any], read: Callable[[Any, int], bytes]
) -> Tally:
    check, tally, chunk = _Check(spec["verify"]), Tally(), spec["chunk_bytes"]
    for key, size, sha in spec["objects"]:
        hasher, got = check.start(), 0
        stream = open_stream(key)
        try:
            while data := read(stream, chunk):
                got += len(data)
                if hasher is not None:
                    hasher.update(data)
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        check.finish(key, got, hasher, size, sha)
        tally.bytes += got
        tally.objects += 1
    return tally


def prepare_fastload(spec: dict[str, Any]) -> Callable[[], Tally]:
    import fastload

    config = fastload.S3Config(endpoint_url=spec["endpoint_url"], region=REGION, addressing_style="path")
    first = spec["objects"][0][0]
    with fastload.open(f"s3://{BUCKET}/{first}", config=config) as f:  # creates the client, one HEAD
        f.size  # type: ignore[attr-defined]  # noqa: B018

    def run() -> Tally:
        return _stream_objects(
            spec, lambda key: fastload.open(f"s3://{BUCKET}/{key}", config=config), lambda f, n: f.read(n)
        )

    return run


def prepare_get_object(spec: dict[str, Any]) -> Callable[[], Tally]:
    client = _boto_client(spec)
    client.head_object(Bucket=BUCKET, Key=spec["objects"][0][0])

    def run() -> Tally:
        return _stream_objects(
            spec,
            lambda key: client.get_object(Bucket=BUCKET, Key=key)["Body"],
            lambda body, n: body.read(n),
        )

    return run


class _Sink:
    """A discarding, seekable file object (as ``open("/dev/null", "wb")`` is): it counts what it is given
    and, when asked to, keeps the object's bytes at their offsets for the SHA-256 check."""

    def __init__(self, size: int, keep: bool) -> None:
        self.buf = bytearray(size) if keep else None
        self.pos = 0
        self.bytes = 0

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: len(self.buf or b"")}[whence]
        self.pos = base + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def write(self, data: bytes) -> int:
        n = len(data)
        if self.buf is not None:
            self.buf[self.pos : self.pos + n] = data
        self.pos += n
        self.bytes += n
        return n


def prepare_download_fileobj(spec: dict[str, Any]) -> Callable[[], Tally]:
    from boto3.s3.transfer import TransferConfig

    client = _boto_client(spec)
    client.head_object(Bucket=BUCKET, Key=spec["objects"][0][0])
    transfer = TransferConfig(max_concurrency=10)

    def run() -> Tally:
        check, tally = _Check(spec["verify"]), Tally()
        for key, size, sha in spec["objects"]:
            sink = _Sink(size, keep=spec["verify"])
            client.download_fileobj(BUCKET, key, sink, Config=transfer)
            hasher = check.start()
            if hasher is not None:
                hasher.update(sink.buf)
            check.finish(key, sink.bytes, hasher, size, sha)
            tally.bytes += sink.bytes
            tally.objects += 1
        return tally

    return run


def prepare_s3torchconnector(spec: dict[str, Any]) -> Callable[[], Tally]:
    from s3torchconnector import S3ClientConfig
    from s3torchconnector._s3client import S3Client

    client = S3Client(
        REGION, endpoint=spec["endpoint_url"], s3client_config=S3ClientConfig(force_path_style=True)
    )
    client.head_object(BUCKET, spec["objects"][0][0])

    def run() -> Tally:
        return _stream_objects(spec, lambda key: client.get_object(BUCKET, key), lambda r, n: r.read(n))

    return run


class _Signer:
    """SigV4 headers from botocore for one request; nothing else of botocore is used."""

    def __init__(self, endpoint_url: str) -> None:
        import botocore.session
        from botocore.auth import S3SigV4Auth

        credentials = botocore.session.get_session().get_credentials()
        if credentials is None:
            raise RuntimeError("no AWS credentials in the environment")
        self._auth = S3SigV4Auth(credentials.get_frozen_credentials(), "s3", REGION)
        self._endpoint = endpoint_url.rstrip("/")

    def headers(self, method: str, path: str, extra: dict[str, str]) -> dict[str, str]:
        from botocore.awsrequest import AWSRequest

        request = AWSRequest(method=method, url=self._endpoint + path, headers=dict(extra))
        self._auth.add_auth(request)
        return dict(request.headers.items())


def prepare_ceiling(spec: dict[str, Any]) -> Callable[[], Tally]:
    parts = urlsplit(spec["endpoint_url"])
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    signer = _Signer(spec["endpoint_url"])
    concurrency, part_bytes = spec["concurrency"], spec["part_bytes"]
    local = threading.local()

    def connection() -> http.client.HTTPConnection:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = http.client.HTTPConnection(host, port, timeout=120)
            local.scratch = memoryview(bytearray(part_bytes))
        return conn

    def path_of(key: str) -> str:
        return f"/{BUCKET}/{quote(key)}"

    def get(key: str, start: int, end: int, out: memoryview | None) -> int:
        conn = connection()
        path = path_of(key)
        conn.request("GET", path, headers=signer.headers("GET", path, {"Range": f"bytes={start}-{end - 1}"}))
        resp = conn.getresponse()
        if resp.status != 206:
            body = resp.read()
            raise RuntimeError(f"GET {key} bytes {start}-{end - 1}: HTTP {resp.status} {body[:200]!r}")
        target = out if out is not None else local.scratch
        want, got = end - start, 0
        while got < want:
            n = resp.readinto(target[got:want])
            if not n:
                break
            got += n
        if got != want or resp.read(1):
            raise RuntimeError(f"GET {key} bytes {start}-{end - 1}: body of {got} bytes")
        return got

    first = spec["objects"][0][0]
    conn = connection()  # one signed HEAD before the clock starts, as for the other readers
    conn.request("HEAD", path_of(first), headers=signer.headers("HEAD", path_of(first), {}))
    resp = conn.getresponse()
    resp.read()
    if resp.status != 200:
        raise RuntimeError(f"HEAD {first}: HTTP {resp.status}")

    def run() -> Tally:
        tally = Tally()
        with ThreadPoolExecutor(concurrency, thread_name_prefix="ceiling") as pool:
            if spec["verify"]:  # one object at a time, assembled, hashed
                check = _Check(True)
                for key, size, sha in spec["objects"]:
                    buf = bytearray(size)
                    fill = functools.partial(_fill_part, get, key, memoryview(buf))
                    got = sum(pool.map(fill, part_ranges(size, part_bytes)))
                    hasher = check.start()
                    hasher.update(buf)
                    check.finish(key, got, hasher, size, sha)
                    tally.bytes += got
                    tally.objects += 1
                return tally
            jobs = [(key, s, e) for key, size, _ in spec["objects"] for s, e in part_ranges(size, part_bytes)]
            per_key: dict[str, int] = {}
            for (key, _, _), got in zip(
                jobs, pool.map(lambda j: get(j[0], j[1], j[2], None), jobs), strict=True
            ):
                per_key[key] = per_key.get(key, 0) + got
        check = _Check(False)
        for key, size, sha in spec["objects"]:
            check.finish(key, per_key.get(key, 0), None, size, sha)
            tally.bytes += per_key[key]
            tally.objects += 1
        return tally

    return run


def _fill_part(get: Callable[..., int], key: str, view: memoryview, r: tuple[int, int]) -> int:
    return int(get(key, r[0], r[1], view[r[0] : r[1]]))


def prepare_per_object(spec: dict[str, Any]) -> Callable[[], Tally]:
    client = _boto_client(spec, max_pool_connections=SMALL_THREADS)
    client.head_object(Bucket=BUCKET, Key=spec["objects"][0][0])
    check = _Check(spec["verify"])

    def fetch(obj: list[Any]) -> int:
        key, size, sha = obj
        data = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        hasher = check.start()
        if hasher is not None:
            hasher.update(data)
        check.finish(key, len(data), hasher, size, sha)
        return len(data)

    def run() -> Tally:
        with ThreadPoolExecutor(SMALL_THREADS) as pool:
            sizes = list(pool.map(fetch, spec["objects"]))
        return Tally(bytes=sum(sizes), objects=len(sizes))

    return run


class _Delivered:
    """What a packed reader delivered of the small objects: each checked (size, SHA-256 when verifying),
    and at the end every object exactly once."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.expected = {key: (size, sha) for key, size, sha in spec["objects"]}
        self.prefix = spec["small_prefix"]
        self.check = _Check(spec["verify"])
        self.tally, self.seen = Tally(), set[str]()

    def add(self, name: str, data: bytes) -> None:
        key = self.prefix + name
        size, sha = self.expected[key]
        hasher = self.check.start()
        if hasher is not None:
            hasher.update(data)
        self.check.finish(key, len(data), hasher, size, sha)
        self.seen.add(key)
        self.tally.bytes += len(data)
        self.tally.objects += 1

    def done(self, what: str) -> Tally:
        if len(self.seen) != len(self.expected) or self.tally.objects != len(self.expected):
            held, distinct = self.tally.objects, len(self.seen)
            raise RuntimeError(f"{what} held {held} samples ({distinct} distinct) of {len(self.expected)}")
        return self.tally


def prepare_packed(spec: dict[str, Any]) -> Callable[[], Tally]:
    import fastload

    config = fastload.S3Config(endpoint_url=spec["endpoint_url"], region=REGION, addressing_style="path")
    with fastload.open(f"s3://{BUCKET}/{spec['shards'][0]}", config=config) as f:
        f.size  # type: ignore[attr-defined]  # noqa: B018

    def run() -> Tally:
        delivered = _Delivered(spec)
        for shard in spec["shards"]:
            with (
                fastload.open(f"s3://{BUCKET}/{shard}", config=config) as f,
                tarfile.open(fileobj=f, mode="r|") as archive,
            ):
                for member in archive:
                    if not member.isfile():
                        continue
                    handle = archive.extractfile(member)
                    assert handle is not None
                    delivered.add(member.name, handle.read())
        return delivered.done("packed shards")

    return run


def prepare_packed_dataset(spec: dict[str, Any]) -> Callable[[], Tally]:
    import fastload

    config = fastload.S3Config(endpoint_url=spec["endpoint_url"], region=REGION, addressing_style="path")
    source = f"s3://{BUCKET}/{spec['shards'][0].rsplit('/', 1)[0]}"
    dataset = fastload.ShardDataset(source, decode=False, s3_config=config)  # index.json read here

    def run() -> Tally:
        delivered = _Delivered(spec)
        for sample in dataset:
            for field, data in sample.items():
                if not field.startswith("__"):
                    delivered.add(f"{sample['__key__']}.{field}", data)
        return delivered.done("the dataset")

    return run


PREPARE: dict[str, Callable[[dict[str, Any]], Callable[[], Tally]]] = {
    "fastload": prepare_fastload,
    "fastload-before": prepare_fastload,
    "get_object": prepare_get_object,
    "download_fileobj": prepare_download_fileobj,
    "s3torchconnector": prepare_s3torchconnector,
    "ceiling": prepare_ceiling,
    "ceiling-direct": prepare_ceiling,
    "per-object": prepare_per_object,
    "packed": prepare_packed,
    "packed-dataset": prepare_packed_dataset,
}


def _proc_cpu_s(pids: Sequence[int]) -> float | None:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        total += int(fields[11]) + int(fields[12])  # utime, stime of every thread
    return total / ticks


def _machine_busy_s() -> float | None:
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return None
    # user, nice, system, irq, softirq: not idle, iowait or steal (another VM's time)
    busy = values[0] + values[1] + values[2] + sum(values[5:7])
    return busy / os.sysconf("SC_CLK_TCK")


def _delta(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


def run_child(spec_path: str) -> int:
    """Run one reader once as described by the JSON spec; write the result JSON next to it."""
    spec = json.loads(Path(spec_path).read_text())
    if spec.get("workload") == "tail":
        Path(spec["result_path"]).write_text(json.dumps(run_tail_child(spec)))
        return 0
    run = PREPARE[spec["reader"]](spec)
    proxy_pids, origin_pids = spec["proxy_pids"], spec["origin_pids"]
    load = os.getloadavg()[0]
    proxy0, origin0, busy0 = _proc_cpu_s(proxy_pids), _proc_cpu_s(origin_pids), _machine_busy_s()
    cpu0, t0 = time.process_time(), time.perf_counter()
    tally = run()
    seconds, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    proxy1, origin1, busy1 = _proc_cpu_s(proxy_pids), _proc_cpu_s(origin_pids), _machine_busy_s()
    result = {
        "seconds": seconds,
        "cpu_s": cpu_s,
        "bytes": tally.bytes,
        "objects": tally.objects,
        "proxy_cpu_s": _delta(proxy0, proxy1) if proxy_pids else 0.0,
        "origin_cpu_s": _delta(origin0, origin1),
        "machine_busy_cpu_s": _delta(busy0, busy1),
        "load_1min": load,
    }
    Path(spec["result_path"]).write_text(json.dumps(result))
    return 0


# ------------------------------------------------------------------------------------ parent: the world


def _load_rgw_module() -> Any:
    spec = importlib.util.spec_from_file_location("fastload_bench_rgw", ROOT / "tests" / "servers" / "rgw.py")
    if spec is None or spec.loader is None:
        raise RuntimeError("cannot load tests/servers/rgw.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _pids_with_arg(needle: str) -> list[int]:
    """PIDs of processes whose command line contains ``needle`` (the RGW scratch folder)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if needle.encode() in f.read():
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


class ProxyProcess:
    """``benchmarks/latency_proxy.py`` (or fastload's FaultProxy) in a child process."""

    def __init__(self, upstream: str, *args: str) -> None:
        self.argv = [
            sys.executable,
            str(Path(__file__).with_name("latency_proxy.py")),
            "--upstream",
            upstream,
            *args,
        ]
        self.proc: subprocess.Popen[str] | None = None
        self.endpoint_url = ""
        self.pid = 0

    def start(self) -> ProxyProcess:
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"proxy {self.argv} exited with {self.proc.wait()}")
        info = json.loads(line)
        self.endpoint_url, self.pid = info["endpoint_url"], info["pid"]
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


@dataclass
class World:
    rgw: Any
    workdir: Path
    env: dict[str, str]
    origin_pids: list[int]
    proxies: dict[str, ProxyProcess]


def child_env(access_key: str, secret_key: str, workdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_ACCESS_KEY_ID=access_key,
        AWS_SECRET_ACCESS_KEY=secret_key,
        AWS_REGION=REGION,
        AWS_DEFAULT_REGION=REGION,
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=str(workdir / "no-aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(workdir / "no-aws-credentials"),
    )
    return env


def run_reader(world: World, reader: str, spec: dict[str, Any], *, rep: int, position: int) -> Run:
    """One reader, once, in a child process; raises with the child's stderr if it fails."""
    with tempfile.TemporaryDirectory(dir=world.workdir) as tmp:
        spec = {
            **spec,
            "reader": reader,
            "result_path": str(Path(tmp) / "result.json"),
            "origin_pids": world.origin_pids,
        }
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--child", str(spec_path)],
            env=reader_env(world, reader, spec),
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
            cwd=str(ROOT),
        )
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
            raise RuntimeError(f"{reader} failed (exit {done.returncode}):\n{tail}")
        result = json.loads(Path(spec["result_path"]).read_text())
    return Run(
        rep=rep,
        position=position,
        reader=reader,
        seconds=result["seconds"],
        bytes=result["bytes"],
        objects=result["objects"],
        cpu_s=result["cpu_s"],
        proxy_cpu_s=result["proxy_cpu_s"],
        origin_cpu_s=result["origin_cpu_s"],
        machine_busy_cpu_s=result["machine_busy_cpu_s"],
        load_1min=result["load_1min"],
        verified="sha256" if spec["verify"] else "sizes",
    )


def reader_env(world: World, reader: str, spec: dict[str, Any]) -> dict[str, str]:
    """The child's environment: ``spec["pythonpath"]`` first on PYTHONPATH (``--fastload-before``), and for
    s3torchconnector the folder ``FASTLOAD_BENCH_S3TC_PATH`` names, if set."""
    env = dict(world.env)
    paths = [spec["pythonpath"]] if spec.get("pythonpath") else []
    paths += [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []
    if reader == "s3torchconnector" and os.environ.get("FASTLOAD_BENCH_S3TC_PATH"):
        paths.append(os.environ["FASTLOAD_BENCH_S3TC_PATH"])
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def upload_client(world: World, **config: Any) -> Any:
    # botocore's default aws-chunked checksum trailers are not for every S3-compatible store
    return world.rgw.client(
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        **config,
    )


def make_large(world: World, total_bytes: int, object_bytes: int) -> tuple[list[list[Any]], float]:
    """Upload the large objects (random bytes, fixed seed) straight to RGW; ``[key, size, sha256]``."""
    import numpy as np

    client = upload_client(world)
    objects, began = [], time.perf_counter()
    for i, start in enumerate(range(0, total_bytes, object_bytes)):
        size = min(object_bytes, total_bytes - start)
        data = np.random.default_rng(SEED + 100 + i).bytes(size)
        key = f"large/object-{i:04d}.bin"
        client.put_object(Bucket=BUCKET, Key=key, Body=data)
        objects.append([key, size, hashlib.sha256(data).hexdigest()])
        del data
    return objects, time.perf_counter() - began


def make_small(world: World, count: int) -> dict[str, Any]:
    """Write the small objects locally, PUT each to RGW (timed), pack them, upload the shards."""
    import numpy as np

    import fastload

    src, packed = world.workdir / "small-src", world.workdir / "small-packed"
    sizes = small_sizes(count)
    pool = np.random.default_rng(SEED + 2).bytes(64 * MIB)
    offsets = np.random.default_rng(SEED + 3).integers(0, len(pool) - SMALL_MAX_BYTES, size=count)
    objects = []
    for i, size in enumerate(sizes):
        rel = small_relpath(i)
        data = pool[int(offsets[i]) : int(offsets[i]) + size]
        path = src / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        objects.append([f"small/{rel}", size, hashlib.sha256(data).hexdigest()])
    client = upload_client(world, max_pool_connections=SMALL_THREADS)

    def put(obj: list[Any]) -> None:
        key = obj[0]
        client.put_object(Bucket=BUCKET, Key=key, Body=(src / key[len("small/") :]).read_bytes())

    began = time.perf_counter()
    with ThreadPoolExecutor(SMALL_THREADS) as ex:
        list(ex.map(put, objects))
    put_s = time.perf_counter() - began
    began = time.perf_counter()
    report = fastload.pack(str(src), str(packed), progress=False)
    pack_s = time.perf_counter() - began
    config = fastload.S3Config(endpoint_url=world.rgw.endpoint_url, region=REGION, addressing_style="path")
    began = time.perf_counter()
    fastload.copy(str(packed) + "/", f"s3://{BUCKET}/packed/", recursive=True, config=config)
    copy_s = time.perf_counter() - began
    shards = sorted(p.name for p in packed.iterdir() if p.suffix == ".tar")
    shutil.rmtree(src)
    return {
        "objects": objects,
        "shards": [f"packed/{name}" for name in shards],
        "shard_bytes": sum((packed / n).stat().st_size for n in shards),
        "payload_bytes": sum(sizes),
        "put_s": put_s,
        "puts_per_s": count / put_s,
        "pack_s": pack_s,
        "copy_s": copy_s,
        "pack_summary": report.summary(),
    }


# ----------------------------------------------------------------------------------- machine, arguments


def _first_line(cmd: Sequence[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0] if out else ""


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "os": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "load_avg_at_start": os.getloadavg(),
    }
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            models = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        info["cpu_model"] = models[0] if models else platform.processor()
        with open("/proc/meminfo") as f:
            mem = {ln.split(":")[0]: int(ln.split()[1]) * 1024 for ln in f}
        info["ram_bytes"] = mem["MemTotal"]
    info["packages"] = {}
    for name in (
        "fastload",
        "boto3",
        "botocore",
        "s3transfer",
        "s3torchconnector",
        "s3torchconnectorclient",
        "torch",
    ):
        try:
            info["packages"][name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            info["packages"][name] = None
    info["ceph"] = _first_line(["radosgw", "--version"])
    commit = _first_line(["git", "-C", str(ROOT), "rev-parse", "HEAD"])
    if commit:
        dirty = _first_line(["git", "-C", str(ROOT), "status", "--porcelain", "--", "fastload"])
        info["fastload_git"] = {"commit": commit, "uncommitted_changes_in_fastload": bool(dirty)}
    return info


def describe(info: dict[str, Any]) -> str:
    cpu = f"{info.get('cpu_model')}, {info['cpus_usable']} usable of {info['cpu_count']} cores"
    if info.get("ram_bytes"):
        cpu += f", {info['ram_bytes'] / GIB:.0f} GiB RAM"
    packages = ", ".join(f"{k} {v}" for k, v in info["packages"].items())
    git = info.get("fastload_git")
    where = ""
    if git:
        where = f"fastload git {git['commit'][:10]}"
        if git["uncommitted_changes_in_fastload"]:
            where += " + uncommitted changes"
    return "; ".join(x for x in (cpu, info["os"], info["python"], packages, str(info["ceph"]), where) if x)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/s3_read.py",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--total-mib", type=int, default=1024, help="large-object data read by each reader (default 1024)")
    add("--object-mib", type=int, default=256, help="size of each large object (default 256)")
    add("--reps", type=int, default=3, help="timed repetitions, each running every reader once (default 3)")
    add("--latency-ms", type=float, default=20.0, help="added by the proxy before each response (default 20)")
    add("--conn-mbps", type=float, default=50.0, help="per-response cap in MB/s, 1e6 bytes (default 50)")
    add("--chunk-mib", type=int, default=8, help="read() size of the streaming readers (default 8)")
    add("--ceiling-concurrency", type=int, default=32, help="connections of the ceiling reader (default 32)")
    add("--small-count", type=int, default=20_000, help="small objects (default 20,000; 0 skips workload 2)")
    add("--readers", default=",".join(READERS), help=f"comma-separated subset of {','.join(READERS)}")
    add("--no-verify-pass", action="store_true", help="skip the SHA-256 pass (timed runs still check sizes)")
    add("--probe", choices=("yes", "no", "only"), default="yes", help="measure the proxies' ceilings")
    add("--probe-mib", type=int, default=512, help="data read per probe run (default 512)")
    add("--probe-reps", type=int, default=3, help="probe repetitions, medians reported (default 3)")
    add("--probe-concurrency", default="1,4,16,32,64", help="connection counts of the probe")
    add("--memstore-gib", type=float, default=None, help="RGW memstore size (default: 2x the data + 1 GiB)")
    add("--json", metavar="FILE", help="write every figure and the machine description to FILE")
    add("--fastload-before", metavar="PATH", help="also run fastload from this checkout (before/after)")
    add("--tail", action="store_true", help="only the tail-latency workload (stalls; see the docstring)")
    add("--tail-small", type=int, default=200, help="tail: small objects (default 200)")
    add("--tail-small-kib", type=int, default=100, help="tail: size of each small object (default 100)")
    add("--tail-large", type=int, default=8, help="tail: large objects (default 8)")
    add("--tail-large-mib", type=int, default=64, help="tail: size of each large object (default 64)")
    add("--tail-pause-s", type=float, default=12.0, help="tail: how long a paused body stalls (default 12)")
    add("--tail-readers", default=",".join(TAIL_READERS), help=f"tail: subset of {','.join(TAIL_READERS)}")
    add("--tail-scenarios", default=",".join(TAIL_SCENARIOS), help=f"tail: of {','.join(TAIL_SCENARIOS)}")
    add("--tail-timeout-s", type=float, default=180.0, help="tail: a run still going then counts as failed")
    add("--child", metavar="SPEC", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.total_mib < 1 or args.object_mib < 1 or args.reps < 1 or args.chunk_mib < 1:
        parser.error("--total-mib, --object-mib, --reps and --chunk-mib must be >= 1")
    unknown = set(args.readers.split(",")) - set(READERS)
    if unknown:
        parser.error(f"unknown readers {sorted(unknown)}; choose from {', '.join(READERS)}")
    return args


# ------------------------------------------------------------------------------------------- the phases


def probe_proxies(world: World, objects: list[list[Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Ceiling reader at several connection counts: direct, through each proxy uncapped, and capped."""
    budget, chosen = args.probe_mib * MIB, []
    for key, size, sha in objects:
        if budget <= 0:
            break
        chosen.append([key, size, sha])
        budget -= size
    counts = [int(c) for c in args.probe_concurrency.split(",")]
    targets = [
        ("direct RGW", None),
        ("latency_proxy, no caps (splice)", "lean"),
        ("latency_proxy, no caps (copy)", "lean-copy"),
        ("FaultProxy, no rules", "fault"),
        (f"latency_proxy, {args.latency_ms:g} ms + {args.conn_mbps:g} MB/s", "capped"),
    ]
    configs = [(label, name, n) for label, name in targets for n in counts]
    runs: dict[tuple[str, int], list[Run]] = {(label, n): [] for label, _, n in configs}
    errors: dict[tuple[str, int], str] = {}
    for rep in range(args.probe_reps):  # interleaved like the readers: every config once per repetition
        for label, proxy_name, n in rotated(configs, rep):
            if (label, n) in errors:
                continue
            proxy = world.proxies[proxy_name] if proxy_name else None
            spec = {
                "endpoint_url": proxy.endpoint_url if proxy else world.rgw.endpoint_url,
                "objects": chosen,
                "verify": False,
                "chunk_bytes": args.chunk_mib * MIB,
                "concurrency": n,
                "part_bytes": PART_BYTES,
                "proxy_pids": [proxy.pid] if proxy else [],
            }
            try:
                run = run_reader(world, "ceiling", spec, rep=rep, position=0)
            except RuntimeError as exc:
                print(f"  probe {label} x{n}: FAILED {exc}", flush=True)
                errors[(label, n)] = str(exc)
                continue
            runs[(label, n)].append(run)
            print(
                f"  probe rep {rep} {label:38s} x{n:<3d} {run.mib_s:7.0f} MiB/s  proxy CPU "
                f"{(run.proxy_cpu_s or 0.0) / (run.bytes / GIB):.2f} s/GiB  load {run.load_1min:.1f}",
                flush=True,
            )
    results: list[dict[str, Any]] = []
    for label, _, n in configs:
        rs = runs[(label, n)]
        if not rs:
            results.append({"target": label, "connections": n, "error": errors.get((label, n), "no run")})
            continue
        gib = rs[0].bytes / GIB
        med = functools.partial(_median_per_gib, gib=gib)
        results.append(
            {
                "target": label,
                "connections": n,
                "mib_s": rs[0].bytes / MIB / statistics.median(r.seconds for r in rs),
                "mib_s_per_rep": [r.mib_s for r in rs],
                "client_cpu_s_per_gib": med([r.cpu_s for r in rs]),
                "proxy_cpu_s_per_gib": med([r.proxy_cpu_s or 0.0 for r in rs]),
                "origin_cpu_s_per_gib": med([r.origin_cpu_s for r in rs]),
                "other_cpu_s_per_gib": med([r.other_cpu_s for r in rs]),
                "load_1min": [r.load_1min for r in rs],
            }
        )
    return results


def _median_per_gib(values: Sequence[float | None], *, gib: float) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) / gib if known and len(known) == len(values) else None


def format_probe(rows: list[dict[str, Any]]) -> str:
    counts = sorted({r["connections"] for r in rows})
    targets = list(dict.fromkeys(r["target"] for r in rows))
    table = []
    for target in targets:
        cells = [target]
        for n in counts:
            row = next((r for r in rows if r["target"] == target and r["connections"] == n), None)
            if row is None or "error" in row:
                cells.append("failed")
            else:
                cells.append(f"{row['mib_s']:.0f} ({row['proxy_cpu_s_per_gib']:.2f})")
        table.append(cells)
    return markdown_table(["MiB/s (proxy CPU s/GiB) at N connections", *(f"N={n}" for n in counts)], table)


def interleave(
    world: World,
    readers: list[str],
    specs: dict[str, dict[str, Any]],
    reps: int,
    verify_pass: bool,
    failures: dict[str, str],
) -> list[Run]:
    """A SHA-256 pass (rep -1) that drops readers that cannot run, then ``reps`` rotated repetitions."""
    runs: list[Run] = []
    if verify_pass:
        for position, reader in enumerate(list(readers)):
            try:
                run = run_reader(world, reader, {**specs[reader], "verify": True}, rep=-1, position=position)
            except RuntimeError as exc:
                failures[reader] = str(exc)
                readers.remove(reader)
                print(f"  verify {reader}: FAILED, left out\n{_indent(str(exc))}", flush=True)
                continue
            runs.append(run)
            print(f"  verify {reader:18s} sha256 ok  {run.mib_s:7.0f} MiB/s", flush=True)
    for rep in range(reps):
        for position, reader in enumerate(rotated(readers, rep)):
            run = run_reader(world, reader, {**specs[reader], "verify": False}, rep=rep, position=position)
            runs.append(run)
            print(
                f"  rep {rep} #{position} {reader:18s} {run.seconds:7.2f} s {run.mib_s:7.0f} MiB/s "
                f"{run.objects / run.seconds:9.0f} obj/s  CPU {run.cpu_s:6.2f} s  load {run.load_1min:.1f}",
                flush=True,
            )
    return runs


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


@contextlib.contextmanager
def world_up(args: argparse.Namespace, data_bytes: int) -> Iterator[World]:
    rgw_module = _load_rgw_module()
    memstore = int(args.memstore_gib * GIB) if args.memstore_gib else 2 * data_bytes + GIB
    workdir = Path(tempfile.mkdtemp(prefix="fastload-s3-read-"))
    rgw = rgw_module.RadosGateway(memstore_bytes=memstore, timeout_s=150)
    proxies: dict[str, ProxyProcess] = {}
    saved_env: dict[str, str] | None = None
    try:
        began = time.perf_counter()
        rgw.start()
        print(
            f"RGW up at {rgw.endpoint_url} in {time.perf_counter() - began:.0f} s "
            f"(memstore {memstore / GIB:.1f} GiB)",
            flush=True,
        )
        direct = rgw.endpoint_url
        proxies["capped"] = ProxyProcess(
            direct, "--latency-ms", str(args.latency_ms), "--conn-mbps", str(args.conn_mbps)
        ).start()
        if args.probe != "no":
            proxies["lean"] = ProxyProcess(direct).start()
            proxies["lean-copy"] = ProxyProcess(direct, "--copy").start()
            proxies["fault"] = ProxyProcess(direct, "--faultproxy").start()
        assert rgw.root is not None
        env = child_env(rgw.access_key, rgw.secret_key, workdir)
        # this process uploads with fastload.copy, which takes credentials from the environment
        saved_env = dict(os.environ)
        os.environ.clear()
        os.environ.update(env)
        world = World(
            rgw=rgw,
            workdir=workdir,
            env=env,
            origin_pids=_pids_with_arg(str(rgw.root)),
            proxies=proxies,
        )
        upload_client(world).create_bucket(Bucket=BUCKET)
        yield world
    finally:
        if saved_env is not None:
            os.environ.clear()
            os.environ.update(saved_env)
        for proxy in proxies.values():
            proxy.stop()
        rgw.stop()
        shutil.rmtree(workdir, ignore_errors=True)


# ------------------------------------------------------------------- tail latency under stalls (issue 17)

TAIL_READERS = ("fastload", "fastload-nohedge", "download_fileobj", "s3torchconnector")
TAIL_LABELS = {
    "fastload": "fastload.open (hedging, default)",
    "fastload-nohedge": "fastload.open, S3Config(hedge=0)",
    "fastload-before": "fastload.open, --fastload-before checkout",
    "download_fileobj": "boto3 download_fileobj (s3transfer)",
    "s3torchconnector": "s3torchconnector S3Client.get_object",
}
# scenario -> FaultProxy --stall rules (KIND:FRACTION:SECONDS; PAUSE is --tail-pause-s)
TAIL_SCENARIOS = {
    "clean": (),
    "paused": ("body:0.05:PAUSE",),
    "stopped": ("body:0.02:forever",),
    "first-byte": ("first-byte:0.05:PAUSE",),
}
TAIL_SMALL_THREADS = 16


def latency_summary(seconds: Sequence[float]) -> dict[str, float | None]:
    """p50, p99 (nearest rank) and max of per-object latencies, in seconds."""
    if not seconds:
        return {"p50": None, "p99": None, "max": None}
    ordered = sorted(seconds)

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, math.ceil(len(ordered) * q) - 1))]

    return {"p50": rank(0.50), "p99": rank(0.99), "max": ordered[-1]}


def _tail_fetcher(spec: dict[str, Any]) -> Callable[[str, int], bytes]:
    """``fetch(key, size) -> bytes`` for the spec's reader (peers time out a silent connection after
    ``read_timeout_s`` like fastload, 10 s by default)."""
    reader, endpoint = spec["reader"], spec["endpoint_url"]
    if reader.startswith("fastload"):
        import fastload

        config = fastload.S3Config(
            endpoint_url=endpoint,
            region=REGION,
            addressing_style="path",
            hedge=0.0 if "nohedge" in reader else 0.05,
        )

        def fetch_fastload(key: str, size: int) -> bytes:
            with fastload.open(f"s3://{BUCKET}/{key}", config=config) as f:
                return f.read()

        return fetch_fastload
    if reader == "download_fileobj":
        from boto3.s3.transfer import TransferConfig

        client = _boto_client(spec, read_timeout=spec["read_timeout_s"], max_pool_connections=32)
        transfer = TransferConfig(max_concurrency=10)

        def fetch_s3transfer(key: str, size: int) -> bytes:
            sink = _Sink(size, keep=True)
            client.download_fileobj(BUCKET, key, sink, Config=transfer)
            return bytes(sink.buf or b"")

        return fetch_s3transfer
    from s3torchconnector import S3ClientConfig
    from s3torchconnector._s3client import S3Client

    s3tc = S3Client(REGION, endpoint=endpoint, s3client_config=S3ClientConfig(force_path_style=True))
    return lambda key, size: s3tc.get_object(BUCKET, key).read()


def run_tail_child(spec: dict[str, Any]) -> dict[str, Any]:
    """After one untimed GET (client set up), small objects read whole by 16 threads, then large objects one
    after another, each timed; bytes are checked (SHA-256) after the clock stops for each object."""
    fetch = _tail_fetcher(spec)

    def one(obj: list[Any]) -> float:
        key, size, sha = obj
        began = time.perf_counter()
        data = fetch(key, size)
        took = time.perf_counter() - began
        if len(data) != size or hashlib.sha256(data).hexdigest() != sha:
            raise RuntimeError(f"{spec['reader']}: {key} came back wrong ({len(data)} of {size} bytes)")
        return took

    result: dict[str, Any] = {}
    one(spec["small"][0])  # untimed: the client, its connection and credentials (as the other workloads)
    began = time.perf_counter()
    with ThreadPoolExecutor(TAIL_SMALL_THREADS) as pool:
        small = list(pool.map(one, spec["small"]))
    result["small"] = {"seconds": time.perf_counter() - began, "latency_s": small}
    began = time.perf_counter()
    large = [one(obj) for obj in spec["large"]]
    result["large"] = {"seconds": time.perf_counter() - began, "latency_s": large}
    if spec["reader"].startswith("fastload"):
        import fastload

        result["s3_stats"] = fastload.s3_stats()
    return result


def run_tail(world: World, args: argparse.Namespace, small: list[Any], large: list[Any]) -> dict[str, Any]:
    """Every (scenario, reader) pair, ``--reps`` times, readers rotated; a fresh FaultProxy (seeded by the
    repetition) in front of the capped proxy for each run, so every reader meets the same fault schedule."""
    readers = [r for r in args.tail_readers.split(",") if r]
    scenarios = [s for s in args.tail_scenarios.split(",") if s]
    if "fastload-before" in readers and not args.fastload_before:
        raise SystemExit("--tail-readers fastload-before needs --fastload-before PATH")
    capped = world.proxies["capped"]
    runs: list[dict[str, Any]] = []
    for rep in range(args.reps):
        for scenario in scenarios:
            stalls = [rule.replace("PAUSE", f"{args.tail_pause_s:g}") for rule in TAIL_SCENARIOS[scenario]]
            for reader in rotated(readers, rep):
                argv = ["--faultproxy", "--seed", str(SEED + rep)]
                for rule in stalls:
                    argv += ["--stall", rule]
                fault = ProxyProcess(capped.endpoint_url, *argv).start()
                spec = {
                    "workload": "tail",
                    "reader": reader,
                    "endpoint_url": fault.endpoint_url,
                    "small": small,
                    "large": large,
                    "read_timeout_s": 10.0,
                }
                if reader == "fastload-before":  # the same reader from another checkout (before/after)
                    spec["pythonpath"] = str(Path(args.fastload_before).resolve())
                try:
                    out = _tail_child(world, spec, args.tail_timeout_s)
                finally:
                    fault.stop()
                out |= {"rep": rep, "scenario": scenario, "reader": reader}
                runs.append(out)
                print(f"  rep {rep} {scenario:10s} {reader:16s} {_tail_line(out)}", flush=True)
    return {"runs": runs, "summary": summarize_tail(runs), "readers": readers, "scenarios": scenarios}


def _tail_child(world: World, spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=world.workdir) as tmp:
        spec = {**spec, "result_path": str(Path(tmp) / "result.json")}
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        try:
            done = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--child", str(spec_path)],
                env=reader_env(world, spec["reader"], spec),
                capture_output=True,
                text=True,
                timeout=timeout_s,
                cwd=str(ROOT),
            )
        except subprocess.TimeoutExpired:
            return {"error": f"did not finish in {timeout_s:g} s"}
        if done.returncode != 0:
            tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
            return {"error": " | ".join(tail)[-300:]}
        return dict(json.loads(Path(spec["result_path"]).read_text()))


def _tail_line(out: dict[str, Any]) -> str:
    if "error" in out:
        return f"FAILED: {out['error']}"
    parts = []
    for what in ("small", "large"):
        lat = latency_summary(out[what]["latency_s"])
        parts.append(
            f"{what} {out[what]['seconds']:6.2f} s (p50 {lat['p50'] or 0:.3f} p99 {lat['p99'] or 0:.3f} "
            f"max {lat['max'] or 0:.3f})"
        )
    hedges = out.get("s3_stats", {}).get("hedges")
    if hedges:
        parts.append(f"hedges {hedges['sent']}/{hedges['won']} of {out['s3_stats']['requests']} GETs")
    return "  ".join(parts)


def summarize_tail(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per ``scenario/reader``: medians over repetitions of total seconds and of p50/p99/max (small and
    large), their ranges, failures, and fastload's hedge counts."""
    out: dict[str, dict[str, Any]] = {}
    for key in dict.fromkeys(f"{r['scenario']}/{r['reader']}" for r in runs):
        group = [r for r in runs if f"{r['scenario']}/{r['reader']}" == key]
        ok = [r for r in group if "error" not in r]
        row: dict[str, Any] = {"runs": len(group), "failed": [r["error"] for r in group if "error" in r]}
        for what in ("small", "large"):
            figures = {"seconds": [r[what]["seconds"] for r in ok]}
            for name in ("p50", "p99", "max"):
                figures[name] = [latency_summary(r[what]["latency_s"])[name] for r in ok]
            row[what] = {
                name: {"median": statistics.median(v), "min": min(v), "max": max(v)} if v else None
                for name, v in figures.items()
            }
        stats = [r["s3_stats"] for r in ok if "s3_stats" in r]
        if stats:
            row["hedges_sent"] = [s["hedges"]["sent"] for s in stats]
            row["hedges_won"] = [s["hedges"]["won"] for s in stats]
            row["requests"] = [s["requests"] for s in stats]
        out[key] = row
    return out


def tail_targets(summary: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets, on medians: fastload under each stall scenario <= 1.5x its fault-free time
    (small and large), p99 under 5% paused bodies <= 3x the fault-free p99, fault-free hedges <= 1%."""

    def fig(key: str, what: str, name: str) -> float | None:
        row = summary.get(key, {}).get(what)
        return None if not row or row.get(name) is None else float(row[name]["median"])

    targets = []
    for scenario in ("paused", "stopped", "first-byte"):
        for what in ("small", "large"):
            base, got = fig("clean/fastload", what, "seconds"), fig(f"{scenario}/fastload", what, "seconds")
            ratio = None if base is None or got is None else got / base
            targets.append(
                {"target": f"{scenario}: {what} <= 1.5x fault-free time", "measured": ratio, "minimum": 1.5}
            )
    for what in ("small", "large"):
        base, got = fig("clean/fastload", what, "p99"), fig("paused/fastload", what, "p99")
        ratio = None if base is None or got is None else got / base
        targets.append(
            {"target": f"paused: {what} p99 <= 3x fault-free p99", "measured": ratio, "minimum": 3.0}
        )
    clean = summary.get("clean/fastload", {})
    share = None
    if clean.get("requests"):
        share = max(s / max(r, 1) for s, r in zip(clean["hedges_sent"], clean["requests"], strict=True))
    targets.append({"target": "fault-free hedges <= 1% of GETs", "measured": share, "minimum": 0.01})
    for t in targets:  # here the figure must stay at or below its bound
        t["met"] = None if t["measured"] is None else t["measured"] <= t["minimum"]
    return targets


def format_tail(report: dict[str, Any]) -> str:
    tail = report["tail"]
    rows = []
    for key, row in tail["summary"].items():
        scenario, reader = key.split("/")
        cells = [scenario, TAIL_LABELS.get(reader, reader)]
        for what in ("small", "large"):
            data = row[what]
            if data["seconds"] is None:
                cells += ["-", "-"]
                continue
            sec = data["seconds"]
            cells.append(f"{sec['median']:.2f} ({sec['min']:.2f}-{sec['max']:.2f})")
            cells.append(" / ".join(f"{data[n]['median'] * 1000:.0f}" for n in ("p50", "p99", "max")))
        hedges = (
            f"{statistics.median(row['hedges_sent']):.0f}/{statistics.median(row['requests']):.0f}"
            if row.get("requests")
            else ""
        )
        cells.append(
            hedges + (f" FAILED {len(row['failed'])}x: {row['failed'][0][:60]}" if row["failed"] else "")
        )
        rows.append(cells)
    header = [
        "stalls",
        "reader",
        "small: all s (range)",
        "small p50/p99/max ms",
        "large: all s (range)",
        "large p50/p99/max ms",
        "hedges/GETs",
    ]
    lines = [markdown_table(header, rows), "", "Targets:"]
    for t in tail["targets"]:
        verdict = "n/a" if t["met"] is None else ("met" if t["met"] else "NOT met")
        lines.append(f"- {t['target']}: {_fmt(t['measured'], '.3f')} ({verdict})")
    return "\n".join(lines)


def make_tail_objects(world: World, args: argparse.Namespace) -> tuple[list[Any], list[Any]]:
    """``--tail-small`` objects of ``--tail-small-kib`` and ``--tail-large`` of ``--tail-large-mib``."""
    import numpy as np

    client = upload_client(world, max_pool_connections=SMALL_THREADS)
    rng = np.random.default_rng(SEED + 17)
    small = []
    for i in range(args.tail_small):
        data = rng.bytes(args.tail_small_kib << 10)
        key = f"tail/small-{i:05d}.bin"
        client.put_object(Bucket=BUCKET, Key=key, Body=data)
        small.append([key, len(data), hashlib.sha256(data).hexdigest()])
    large = []
    for i in range(args.tail_large):
        data = rng.bytes(args.tail_large_mib * MIB)
        key = f"tail/large-{i:03d}.bin"
        client.put_object(Bucket=BUCKET, Key=key, Body=data)
        large.append([key, len(data), hashlib.sha256(data).hexdigest()])
    return small, large


def main_tail(args: argparse.Namespace, report: dict[str, Any]) -> int:
    args.probe = "no"
    data_bytes = args.tail_small * (args.tail_small_kib << 10) + args.tail_large * args.tail_large_mib * MIB
    began = time.perf_counter()
    with world_up(args, data_bytes) as world:
        small, large = make_tail_objects(world, args)
        print(f"uploaded {len(small)} small and {len(large)} large objects", flush=True)
        report["tail"] = run_tail(world, args, small, large)
    report["tail"]["targets"] = tail_targets(report["tail"]["summary"])
    report["elapsed_s"] = time.perf_counter() - began
    s = report["settings"]
    print(
        f"\nMachine: {describe(report['machine'])}\nOrigin: Ceph RGW (memstore) behind latency_proxy "
        f"({s['latency_ms']:g} ms, {s['conn_mbps']:g} MB/s per response) behind FaultProxy; "
        f"{s['tail_small']} objects of {s['tail_small_kib']} KiB (16 threads), then {s['tail_large']} x "
        f"{s['tail_large_mib']} MiB one by one; pauses {s['tail_pause_s']:g} s; medians of {s['reps']} "
        f"repetition(s) (range)\n\n{format_tail(report)}",
        flush=True,
    )
    _write_json(args.json, report)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return run_child(args.child)
    readers = [r for r in READERS if r in args.readers.split(",")]
    total, object_bytes = args.total_mib * MIB, args.object_mib * MIB
    small_payload = args.small_count * (SMALL_MIN_BYTES + SMALL_MAX_BYTES) // 2
    data_bytes = total + 2 * small_payload  # the small objects, and their shards
    info = machine_info()
    print(describe(info), flush=True)
    report: dict[str, Any] = {
        "command": " ".join(
            ["python", "benchmarks/s3_read.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "machine": info,
        "settings": vars(args) | {"part_bytes_ceiling": PART_BYTES, "small_threads": SMALL_THREADS},
    }
    if args.tail:
        return main_tail(args, report)
    failures: dict[str, str] = {}
    began = time.perf_counter()
    with world_up(args, data_bytes) as world:
        large, upload_s = make_large(world, total, object_bytes)
        print(f"uploaded {len(large)} large objects ({total / MIB:.0f} MiB) in {upload_s:.1f} s", flush=True)
        report["large_upload_s"] = upload_s
        if args.probe != "no":
            print("proxy ceilings (ceiling reader, one run each):", flush=True)
            report["probe"] = probe_proxies(world, large, args)
            print(format_probe(report["probe"]), flush=True)
            if args.probe == "only":
                _write_json(args.json, report)
                return 0
        capped = world.proxies["capped"]
        base = {
            "endpoint_url": capped.endpoint_url,
            "objects": large,
            "chunk_bytes": args.chunk_mib * MIB,
            "concurrency": args.ceiling_concurrency,
            "part_bytes": PART_BYTES,
            "proxy_pids": [capped.pid],
        }
        if args.fastload_before:
            readers.insert(1, "fastload-before")
        specs = {r: dict(base) for r in readers}
        if args.fastload_before:
            specs["fastload-before"]["pythonpath"] = str(Path(args.fastload_before).resolve())
        if "ceiling-direct" in specs:
            specs["ceiling-direct"].update(endpoint_url=world.rgw.endpoint_url, proxy_pids=[])
        print(
            f"large objects: {len(large)} x {args.object_mib} MiB, readers {', '.join(readers)}", flush=True
        )
        runs = interleave(world, readers, specs, args.reps, not args.no_verify_pass, failures)
        summary = summarize(runs, readers)
        targets = check_targets(summary)
        report |= {"runs": [r.__dict__ | {"mib_s": r.mib_s} for r in runs], "summary": summary}
        report |= {"targets": targets, "failures": dict(failures)}
        if args.small_count > 0:
            print(f"small objects: {args.small_count:,}, uploading and packing ...", flush=True)
            small = make_small(world, args.small_count)
            print(
                f"  PUT {args.small_count:,} objects in {small['put_s']:.0f} s "
                f"({small['puts_per_s']:.0f}/s); pack {small['pack_s']:.1f} s; "
                f"copy {len(small['shards'])} shards {small['copy_s']:.1f} s",
                flush=True,
            )
            small_spec = {
                **base,
                "objects": small["objects"],
                "shards": small["shards"],
                "small_prefix": "small/",
            }
            small_readers = list(SMALL_READERS)
            small_runs = interleave(
                world,
                small_readers,
                dict.fromkeys(small_readers, small_spec),
                args.reps,
                not args.no_verify_pass,
                failures,
            )
            small_summary = summarize(small_runs, small_readers)
            ratio = None
            if SMALL_SUBJECT in small_summary and "per-object" in small_summary:
                ratio = small_summary[SMALL_SUBJECT]["x"]["per-object"]["of_medians"]
            report["small"] = {key: value for key, value in small.items() if key not in ("objects",)} | {
                "count": args.small_count,
                "runs": [r.__dict__ | {"mib_s": r.mib_s} for r in small_runs],
                "summary": small_summary,
                "packed_x_per_object": ratio,
            }
            report["targets"].append(
                {
                    "target": SMALL_TARGET[0],
                    "minimum": SMALL_TARGET[1],
                    "strict": False,
                    "measured": ratio,
                    "met": None if ratio is None else ratio >= SMALL_TARGET[1],
                }
            )
            report["failures"] = dict(failures)
    report["elapsed_s"] = time.perf_counter() - began
    print(render(report), flush=True)
    _write_json(args.json, report)
    return 1 if failures.keys() - {"s3torchconnector"} else 0


def render(report: dict[str, Any]) -> str:
    s = report["settings"]
    out = [
        f"Machine: {describe(report['machine'])}",
        f"Origin: Ceph RGW (memstore) on 127.0.0.1 behind latency_proxy ({s['latency_ms']:g} ms before each "
        f"response, {s['conn_mbps']:g} MB/s per response); medians of {s['reps']} interleaved repetitions.",
        "",
    ]
    if "probe" in report:
        out += [
            f"Proxy ceilings: the ceiling reader over {s['probe_mib']} MiB, median of {s['probe_reps']} "
            "interleaved repetitions (proxy CPU s/GiB in brackets)",
            "",
            format_probe(report["probe"]),
            "",
        ]
    out += [
        f"Large objects: {s['total_mib']} MiB as {s['object_mib']} MiB objects",
        "",
        format_large(report["summary"]),
        "",
        format_ratios(report["summary"]),
    ]
    if "small" in report:
        small = report["small"]
        out += [
            "",
            f"Small objects: {small['count']:,} objects of 80-120 KiB "
            f"({small['payload_bytes'] / MIB:.0f} MiB), {len(small['shards'])} tar shards",
            "",
            format_small(small["summary"]),
            "",
            f"{SMALL_SUBJECT} / per-object samples/s: {_fmt(small['packed_x_per_object'])}",
        ]
    loads = [r["load_1min"] for r in report.get("runs", []) + report.get("small", {}).get("runs", [])]
    if loads:
        out += [
            "",
            f"Noise: 1-minute load average before the runs {min(loads):.1f}-{max(loads):.1f} on "
            f"{report['machine']['cpus_usable']} cores; 'other CPU' is the machine's busy time minus the "
            "reader's, the proxy's and RGW's during each run (other processes).",
        ]
    out += ["", "Targets:", format_targets(report["targets"])]
    for reader, why in report.get("failures", {}).items():
        out += [f"- {reader} left out: {why.splitlines()[-1] if why else ''}"]
    return "\n".join(out)


def _write_json(path: str | None, report: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(report, indent=1, default=str))
        print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
