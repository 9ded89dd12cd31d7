"""Fixtures for tests against S3 endpoints on 127.0.0.1: a real Ceph RGW and moto's fake.

- ``rgw`` (session): one ``RadosGateway`` for the whole session (~2-5 s to start); fails, never skips, when
  the Ceph binaries are missing, because CI installs them with ``.ci/install-s3-servers``.
- ``moto_s3`` (session): one ``MotoS3Server`` (for small objects only).
- ``rgw_client`` / ``moto_client`` (session): boto3 S3 clients for them, closed at the end.
- ``bucket`` (function): ``bucket(server) -> name`` creates a uniquely named bucket on ``server``; every
  bucket it made is emptied and deleted after the test. ``module_bucket``: the same, kept for a module.
- ``rgw_env`` (function): fastload's and botocore's environment variables set (monkeypatch) for the RGW,
  so in-process clients find its credentials; returns them as a dict for subprocesses.
- ``rgw_proxy`` (function): ``rgw_proxy(seed=0) -> FaultProxy`` in front of the RGW, re-signing rewritten
  requests; closed after the test, which fails if a proxy thread failed.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fastload.testing.faultproxy import FaultProxy, SigV4Resigner

# tests/servers is a plain folder of helpers, not an installed package: make `import servers` work from here.
TESTS_DIR = str(Path(__file__).resolve().parents[1])
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)

from servers.moto_server import MotoS3Server  # noqa: E402
from servers.rgw import INSTALL_HINT, RadosGateway, missing_binaries  # noqa: E402

S3Server = RadosGateway | MotoS3Server


@pytest.fixture(scope="session")
def rgw() -> Iterator[RadosGateway]:
    missing = missing_binaries()
    if missing:
        pytest.fail(f"Ceph binaries not found: {', '.join(missing)}; {INSTALL_HINT}", pytrace=False)
    with RadosGateway() as gateway:
        yield gateway


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3Server]:
    with MotoS3Server() as server:
        yield server


@pytest.fixture(scope="session")
def rgw_client(rgw: RadosGateway) -> Iterator[Any]:
    client = rgw.client(max_pool_connections=32)
    yield client
    client.close()


@pytest.fixture(scope="session")
def moto_client(moto_s3: MotoS3Server) -> Iterator[Any]:
    client = moto_s3.client(max_pool_connections=32)
    yield client
    client.close()


def empty_and_delete_bucket(client: Any, name: str) -> None:
    """Abort open multipart uploads, delete every object, then the bucket."""
    for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=name):
        for upload in page.get("Uploads", []):
            client.abort_multipart_upload(Bucket=name, Key=upload["Key"], UploadId=upload["UploadId"])
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
        keys = [{"Key": obj["Key"]} for obj in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=name, Delete={"Objects": keys, "Quiet": True})
    client.delete_bucket(Bucket=name)


def _bucket_factory() -> tuple[Callable[..., str], Callable[[], None]]:
    made: list[tuple[Any, str]] = []

    def make(server: S3Server, *, prefix: str = "fastload-test") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:16]}"
        client = server.client()
        try:
            client.create_bucket(Bucket=name)
        except BaseException:
            client.close()
            raise
        made.append((client, name))
        return name

    def cleanup() -> None:
        for client, name in made:
            try:
                empty_and_delete_bucket(client, name)
            finally:
                client.close()

    return make, cleanup


@pytest.fixture
def bucket() -> Iterator[Callable[..., str]]:
    make, cleanup = _bucket_factory()
    yield make
    cleanup()


@pytest.fixture(scope="module")
def module_bucket() -> Iterator[Callable[..., str]]:
    make, cleanup = _bucket_factory()
    yield make
    cleanup()


@pytest.fixture(params=["rgw", "moto"])
def bucket_store(
    request: pytest.FixtureRequest, bucket: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, Any]]:
    """A fresh bucket on RGW or moto, with fastload's environment pointing at it: ``(bucket, client)``."""
    from s3util import point_env_at

    from fastload.s3 import runtime

    server = request.getfixturevalue("rgw" if request.param == "rgw" else "moto_s3")
    point_env_at(server, monkeypatch)
    client = server.client()
    try:
        yield bucket(server), client
    finally:
        client.close()
        runtime.reset()


@pytest.fixture
def rgw_env(rgw: RadosGateway, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    from s3util import FOREIGN_AWS_VARIABLES, s3_env

    for name in FOREIGN_AWS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    env = s3_env(rgw)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def rgw_proxy(rgw: RadosGateway) -> Iterator[Callable[..., FaultProxy]]:
    proxies: list[FaultProxy] = []

    def make(*, seed: int = 0) -> FaultProxy:
        proxy = FaultProxy(rgw.endpoint_url, seed=seed, resign=SigV4Resigner(rgw.secret_key), io_timeout_s=15)
        proxies.append(proxy.start())
        return proxy

    yield make
    for proxy in proxies:
        proxy.close()  # raises FaultProxyError if a proxy thread failed
