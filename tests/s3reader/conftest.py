"""Fixtures for the S3 reader over real HTTP on loopback: moto (session) -> FaultProxy (per test) -> reader.

- ``moto_url`` (session): moto's ``ThreadedMotoServer`` on 127.0.0.1, the origin.
- ``direct`` (session): a boto3 client talking to moto itself (uploads, overwrites), never via the proxy.
- ``objects`` (session): seeded random objects of 0 bytes to 3 MiB plus a tar, a zip and a Parquet file.
- ``proxy`` (function): a seeded :class:`FaultProxy` in front of moto; ``make_proxy(seed)`` for more.
- ``make_config(proxy, **overrides)``: the reader's ``S3Config`` pointed at a proxy, with small timeouts and
  a ``process_max_concurrency`` no other test uses, so the process-wide AIMD gate never leaks between tests;
  hedging stays on, its deadlines' floor at 0.8 s (above what moto takes on a busy machine).

Every test starts with zeroed ``fastload.s3_stats()`` and dummy credentials in the environment. Its proxies
close only after the reader threads it started have finished (bounded), so those cannot touch the next test;
the S3 clients fastload cached for the test's configs are closed and dropped.
"""

from __future__ import annotations

import io
import itertools
import random
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from botocore.config import Config

import fastload
from fastload.s3 import runtime
from fastload.testing.faultproxy import FaultProxy

from .helpers import BUCKET, PART, REGION, SECRET_KEY, quiesce

ACCESS_KEY = "AKIDS3READERTESTS"
OBJECT_SIZES = {"obj-1m": 1 << 20, "obj-2m": 2 << 20, "obj-3m": 3 << 20, "small": 100_000, "empty": 0}
_pmc = itertools.count(100)  # process_max_concurrency values, one per config: a fresh AIMD gate each


def boto_client(endpoint_url: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(
            s3={"addressing_style": "path"},
            retries={"total_max_attempts": 1, "mode": "standard"},
            connect_timeout=2,
            read_timeout=5,
        ),
    )


@pytest.fixture(scope="session")
def direct(moto_url: str) -> Iterator[Any]:
    client = boto_client(moto_url)
    client.create_bucket(Bucket=BUCKET)
    yield client
    client.close()


def _tar_bytes(rng: random.Random) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(24):
            data = rng.randbytes(rng.randrange(0, 160_000))
            info = tarfile.TarInfo(f"samples/{i:04d}.bin")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _zip_bytes(rng: random.Random) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for i in range(20):
            method = zipfile.ZIP_STORED if i % 2 else zipfile.ZIP_DEFLATED
            data = rng.randbytes(rng.randrange(0, 150_000))
            zf.writestr(zipfile.ZipInfo(f"m/{i:03d}.bin"), data, compress_type=method)
    return out.getvalue()


def parquet_table(seed: int = 5) -> pa.Table:
    rng = random.Random(seed)
    rows = 600
    return pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "blob": pa.array([rng.randbytes(rng.randrange(1, 5000)) for _ in range(rows)], pa.binary()),
        }
    )


def _parquet_bytes() -> bytes:
    sink = io.BytesIO()
    pq.write_table(parquet_table(), sink, row_group_size=100, compression="none")
    return sink.getvalue()


@pytest.fixture(scope="session")
def objects(direct: Any) -> dict[str, bytes]:
    """Key -> bytes of every object uploaded (straight to moto) for the session; tests must not change
    them (a test that overwrites uses a key of its own)."""
    rng = random.Random(20240601)
    data = {key: rng.randbytes(size) for key, size in OBJECT_SIZES.items()}
    data["archive.tar"] = _tar_bytes(rng)
    data["archive.zip"] = _zip_bytes(rng)
    data["table.parquet"] = _parquet_bytes()
    for key, body in data.items():
        direct.put_object(Bucket=BUCKET, Key=key, Body=body)
    return data


@pytest.fixture(autouse=True)
def s3_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Dummy credentials and no AWS config files or variables from the machine running the tests."""
    for name in (
        "AWS_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "FASTLOAD_S3_ADDRESSING_STYLE",
        "FASTLOAD_S3_TRANSPORT",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture(autouse=True)
def fresh_stats() -> Iterator[None]:
    """A fresh S3 runtime for the test (zeroed counters, no clients, connections or gates); afterwards the
    clients and connections made for the test's configs (each test has its own proxy port) are closed and
    dropped, or the session would keep dozens of botocore clients and their service models alive."""
    runtime.reset()
    assert fastload.s3_stats()["requests"] == 0
    yield
    runtime.reset()


@pytest.fixture
def make_proxy(moto_url: str, objects: dict[str, bytes]) -> Iterator[Callable[..., FaultProxy]]:
    made: list[FaultProxy] = []

    def make(seed: int = 0) -> FaultProxy:
        proxy = FaultProxy(moto_url, seed=seed, io_timeout_s=10.0).start()
        made.append(proxy)
        return proxy

    yield make
    quiesce()  # before the proxies close: stragglers finish against them, not a closed port
    for proxy in made:
        proxy.close()  # raises FaultProxyError if a proxy thread failed


@pytest.fixture
def proxy(make_proxy: Callable[..., FaultProxy]) -> FaultProxy:
    return make_proxy(0)


@pytest.fixture
def make_config() -> Callable[..., fastload.S3Config]:
    def make(proxy: FaultProxy, **overrides: Any) -> fastload.S3Config:
        config = fastload.S3Config(
            endpoint_url=proxy.endpoint_url,
            region=REGION,
            addressing_style="path",
            part_size_bytes=PART,
            max_concurrency=4,
            process_max_concurrency=next(_pmc),
            read_timeout_s=1.0,
            connect_timeout_s=1.0,
            base_backoff_s=0.01,
            max_backoff_s=0.2,
            deadline_s=10.0,
            # hedging on, with deadlines above anything moto does on a busy machine (0.25 s by default):
            # these tests count GETs; tests/s3reader/test_hedge.py lowers the floor to hedge on purpose
            hedge_floor_s=0.8,
        )
        return replace(config, **overrides)

    return make


@pytest.fixture
def config(proxy: FaultProxy, make_config: Callable[..., fastload.S3Config]) -> fastload.S3Config:
    return make_config(proxy)
