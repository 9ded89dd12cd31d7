"""The readers of ``benchmarks/s3_read.py``, child side: ``prepare_<reader>(spec)`` sets up its client and
sends one HEAD, and returns the run the clock times; each run checks what it read (sizes, or SHA-256)."""

from __future__ import annotations

import functools
import hashlib
import http.client
import os
import tarfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from s3_read_core import BUCKET, REGION, SMALL_THREADS, part_ranges


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


def boto_client(spec: dict[str, Any], **config: Any) -> Any:
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
    client = boto_client(spec)
    client.head_object(Bucket=BUCKET, Key=spec["objects"][0][0])

    def run() -> Tally:
        return _stream_objects(
            spec,
            lambda key: client.get_object(Bucket=BUCKET, Key=key)["Body"],
            lambda body, n: body.read(n),
        )

    return run


class Sink:
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

    client = boto_client(spec)
    client.head_object(Bucket=BUCKET, Key=spec["objects"][0][0])
    transfer = TransferConfig(max_concurrency=10)

    def run() -> Tally:
        check, tally = _Check(spec["verify"]), Tally()
        for key, size, sha in spec["objects"]:
            sink = Sink(size, keep=spec["verify"])
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
    client = boto_client(spec, max_pool_connections=SMALL_THREADS)
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
