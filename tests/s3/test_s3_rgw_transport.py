"""Both reader transports against a store that checks SigV4 (Ceph RGW): the direct path's signatures are
accepted (and a wrong secret is refused, so the check is real), keys that need URL encoding, a pinned
version-less read, HEAD, and the botocore fallback on the same objects."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from s3util import MIB, payload, s3_config

import fastload
from fastload.errors import AccessDeniedError
from fastload.s3 import runtime

KEYS = ("plain.bin", "with space/and+plus=eq&amp.bin", "ünïcode/ключ~tilde.bin", "a//double-slash.bin")


@pytest.mark.parametrize("transport", ["direct", "botocore"])
def test_rgw_accepts_every_key(
    rgw: Any,
    rgw_env: dict[str, str],
    rgw_client: Any,
    bucket: Callable[..., str],
    transport: str,
) -> None:
    name = bucket(rgw)
    data = payload(3 * MIB + 5, seed=71)
    for key in KEYS:
        rgw_client.put_object(Bucket=name, Key=key, Body=data)
    config = s3_config(rgw, transport=transport, part_size_bytes=MIB, max_concurrency=4, deadline_s=20)
    for key in KEYS:
        with fastload.open(f"s3://{name}/{key}", config=config) as f:
            assert f.size == len(data)  # type: ignore[attr-defined]  # a HEAD
            assert f.read() == data, key


def test_rgw_refuses_a_wrong_secret_on_the_direct_path(
    rgw: Any,
    rgw_env: dict[str, str],
    rgw_client: Any,
    bucket: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = bucket(rgw)
    rgw_client.put_object(Bucket=name, Key="k.bin", Body=b"x" * 1000)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    config = s3_config(rgw, deadline_s=20, max_attempts=3)
    try:
        with (
            pytest.raises(AccessDeniedError, match="SignatureDoesNotMatch") as info,
            fastload.open(f"s3://{name}/k.bin", config=config) as f,
        ):
            f.read()
        assert "not-the-secret" not in str(info.value)
    finally:  # this config's client and connections hold the wrong secret: not for other tests
        runtime.current().forget(config)
