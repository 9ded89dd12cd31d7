"""An object overwritten between two ranged GETs: ObjectChangedError, never bytes of two versions."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from typing import Any

import pytest

import fastload
from fastload.errors import ObjectChangedError
from fastload.testing.faultproxy import Fault, FaultProxy, RequestInfo, Rule

from .helpers import BUCKET, PART, bounded, gets, url


@pytest.mark.parametrize("same_size", [True, False], ids=["same-size", "other-size"])
def test_overwrite_between_ranges_raises_object_changed(
    proxy: FaultProxy, make_config: Callable[..., fastload.S3Config], direct: Any, same_size: bool
) -> None:
    key = f"overwritten/{uuid.uuid4().hex}"
    rng = random.Random(7)
    old = rng.randbytes(2 << 20)
    new = rng.randbytes(len(old) if same_size else len(old) + 12345)
    old_etag = direct.put_object(Bucket=BUCKET, Key=key, Body=old)["ETag"]
    config = make_config(proxy)
    seen: list[RequestInfo] = []
    overwritten: list[str] = []

    def overwrite(request: RequestInfo) -> None:  # runs on a proxy thread, talks to moto directly
        overwritten.append(direct.put_object(Bucket=BUCKET, Key=key, Body=new)["ETag"])

    proxy.add(Rule(Fault.latency(delay_s=0), key=key, where=lambda r: bool(seen.append(r))))  # records only
    proxy.add(Rule(Fault.overwrite_before(overwrite), method="GET", key=key, has_range=True, nth={3}))
    served = bytearray()

    def read() -> None:
        with fastload.open(url(key), config=config) as f:
            while chunk := f.read(100_000):
                served.extend(chunk)

    with pytest.raises(ObjectChangedError) as caught:
        bounded(read, 20)

    assert overwritten and overwritten[0] != old_etag
    assert served == old[: len(served)]  # whatever was handed out is the old version, up to the failure
    assert len(served) < len(old)
    err = caught.value
    assert (err.bucket, err.key) == (BUCKET, key)
    assert url(key) in str(err) and "open it again" in str(err)
    # Every GET after the first carries If-Match with the first response's ETag; moto honours it (412).
    requests = [r for r in seen if r.method == "GET"]
    assert requests[0].header("If-Match") is None
    assert all(r.header("If-Match") == old_etag for r in requests[1:])
    statuses = [r.status for r in gets(proxy, key)]
    assert 412 in statuses
    assert fastload.s3_stats()["retries_total"] == 0  # a changed object is not retried


def test_overwrite_before_the_first_range_is_simply_the_new_version(
    proxy: FaultProxy, make_config: Callable[..., fastload.S3Config], direct: Any
) -> None:
    key = f"overwritten/{uuid.uuid4().hex}"
    rng = random.Random(8)
    old, new = rng.randbytes(3 * PART), rng.randbytes(3 * PART)
    direct.put_object(Bucket=BUCKET, Key=key, Body=old)
    proxy.add(
        Rule(
            Fault.overwrite_before(lambda r: direct.put_object(Bucket=BUCKET, Key=key, Body=new)),
            method="GET",
            key=key,
            nth={1},
        )
    )
    config = make_config(proxy)

    def read() -> bytes:
        with fastload.open(url(key), config=config) as f:
            return f.read()

    assert bounded(read) == new
