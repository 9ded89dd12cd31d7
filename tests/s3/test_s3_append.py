"""``fastload pack --append`` into an ``s3://`` dataset on Ceph RGW and on moto: the conditional PUT of
``index.json`` each store honours (``If-None-Match: *`` creating, ``If-Match`` on the ETag read), and two
appenders that publish at the same time both landing (the loser reads again and joins), nothing lost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import fastload
from fastload.errors import AppendConflictError, PreconditionFailedError
from fastload.s3.conditional import get_with_etag, put_if


def test_conditional_put_is_honoured(bucket_store: tuple[str, Any]) -> None:
    name, _ = bucket_store
    config = fastload.S3Config.from_env()
    assert get_with_etag(name, "k.json", config=config) is None
    first = put_if(name, "k.json", b"one", etag=None, config=config)
    with pytest.raises(PreconditionFailedError):
        put_if(name, "k.json", b"again", etag=None, config=config)  # If-None-Match: * on an existing key
    data, etag = get_with_etag(name, "k.json", config=config) or (b"", "")
    assert (data, etag) == (b"one", first)
    second = put_if(name, "k.json", b"two", etag=etag, config=config)
    with pytest.raises(PreconditionFailedError):
        put_if(name, "k.json", b"stale", etag=first, config=config)  # If-Match on a replaced ETag
    assert get_with_etag(name, "k.json", config=config) == (b"two", second)


def tree(root: Path, first: int, n: int) -> Path:
    root.mkdir(parents=True)
    for i in range(first, first + n):
        (root / f"s{i:04d}.txt").write_bytes(b"x%d " % i * (1 + i % 4))
    return root


def keys(url: str) -> list[str]:
    return sorted(s["__key__"] for s in fastload.ShardDataset(url, decode=False))


def test_append_to_s3_and_a_racing_appender_both_land(
    bucket_store: tuple[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, client = bucket_store
    url = f"s3://{name}/ds"
    a, b, c = tree(tmp_path / "a", 0, 4), tree(tmp_path / "b", 4, 3), tree(tmp_path / "c", 7, 5)
    fastload.pack(a, url, max_samples=2, append=True, progress=False)  # creates it: If-None-Match: *
    assert keys(url) == [f"s{i:04d}" for i in range(4)]

    from fastload.s3 import conditional

    puts: list[str | None] = []
    real_put = conditional.put_if

    def racing_put(bucket, key, data, *, etag, config, client=None):  # type: ignore[no-untyped-def]
        puts.append(etag)
        if len(puts) == 1:  # between our read of index.json and our PUT, another appender lands
            fastload.pack(c, url, max_samples=2, append=True, progress=False)  # (its PUT: puts[1])
        return real_put(bucket, key, data, etag=etag, config=config, client=client)

    monkeypatch.setattr(conditional, "put_if", racing_put)
    report = fastload.pack(b, url, max_samples=2, append=True, progress=False)
    monkeypatch.setattr(conditional, "put_if", real_put)
    # ours on the ETag read before the other landed (refused: 412), the other's, ours again after reading
    assert len(puts) == 3 and puts[0] == puts[1] and puts[2] != puts[0]
    assert report.appended is not None and report.appended[0].version == 3
    raw = json.loads(client.get_object(Bucket=name, Key="ds/index.json")["Body"].read())
    assert [(v["version"], v["added"], v["samples"]) for v in raw["versions"]] == [
        (1, 2, 4),
        (2, 3, 9),
        (3, 2, 12),
    ]
    assert keys(url) == [f"s{i:04d}" for i in range(12)]
    assert keys(url + "/") == keys(url)
    with pytest.raises(AppendConflictError):
        fastload.pack(b, url, max_samples=2, append=True, progress=False)
    leftovers = [
        o["Key"] for o in client.list_objects_v2(Bucket=name, Prefix="ds/.fastload-pack").get("Contents", [])
    ]
    assert leftovers == []


def test_a_botocore_without_conditional_put_is_named() -> None:
    """boto3>=1.28 is allowed, but PutObject took IfMatch only from late 2024: say so instead of botocore's
    "Unknown parameter"."""
    from types import SimpleNamespace

    model = SimpleNamespace(input_shape=SimpleNamespace(members={"Bucket": 1, "Key": 1, "Body": 1}))
    old = SimpleNamespace(
        meta=SimpleNamespace(service_model=SimpleNamespace(operation_model=lambda name: model))
    )
    config = fastload.S3Config()
    with pytest.raises(fastload.errors.ConfigError, match=r"IfMatch.*upgrade boto3 and botocore"):
        put_if("b", "k", b"x", etag="abc", config=config, client=old)
    with pytest.raises(fastload.errors.ConfigError, match="IfNoneMatch"):
        put_if("b", "k", b"x", etag=None, config=config, client=old)
