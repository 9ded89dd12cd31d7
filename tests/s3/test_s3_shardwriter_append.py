"""``fastload.ShardWriter(s3_url, mode="append")`` on Ceph RGW and on moto: new shards after the existing
ones as a new version (the existing objects untouched), the pre-append stream readable as its version, and
an appender whose conditional PUT of ``index.json`` loses to another's (412) reading again and joining,
so both land; the same publish path as ``fastload pack --append`` (``packing.append``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from s3util import point_env_at

import fastload
from fastload.s3 import runtime


def write(url: str, numbers: range, *, mode: str = "create") -> fastload.WriteReport:
    with fastload.ShardWriter(url, mode=mode, max_samples_per_shard=2, workers=2) as w:
        for i in numbers:
            w.write({"__key__": f"k{i:05d}", "txt": f"text {i} " * (i % 4 + 1)})
    return w.report


def stream(url: str, **kwargs: Any) -> list[tuple[str, bytes]]:
    return [(s["__key__"], s["txt"]) for s in fastload.ShardDataset(url, decode=False, **kwargs)]


def objects(client: Any, name: str, prefix: str) -> dict[str, str]:
    listed = client.list_objects_v2(Bucket=name, Prefix=prefix).get("Contents", [])
    return {o["Key"]: o["ETag"] for o in listed}


def test_append_from_python_and_a_racing_appender_both_land(
    bucket_store: tuple[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    name, client = bucket_store
    url = f"s3://{name}/ds"
    write(url, range(4))
    before = objects(client, name, "ds/")
    old_stream = stream(url)

    from fastload.s3 import conditional

    puts: list[str | None] = []
    real_put = conditional.put_if

    def racing_put(bucket, key, data, *, etag, config, client=None):  # type: ignore[no-untyped-def]
        puts.append(etag)
        if len(puts) == 1:  # between our read of index.json and our PUT, another appender lands
            write(url, range(100, 103), mode="append")  # (its PUT: puts[1])
        return real_put(bucket, key, data, etag=etag, config=config, client=client)

    monkeypatch.setattr(conditional, "put_if", racing_put)
    report = write(url, range(4, 9), mode="append")
    monkeypatch.setattr(conditional, "put_if", real_put)

    # ours on the ETag read before the other landed (refused: 412), the other's, ours again after reading
    assert len(puts) == 3 and puts[0] == puts[1] and puts[2] != puts[0]
    assert report.appended is not None and report.appended[0].version == 3
    raw = json.loads(client.get_object(Bucket=name, Key="ds/index.json")["Body"].read())
    assert [(v["version"], v["added"], v["samples"]) for v in raw["versions"]] == [
        (1, 2, 4),
        (2, 2, 7),
        (3, 3, 12),
    ]
    after = objects(client, name, "ds/")
    assert {k: after[k] for k in before if k != "ds/index.json"} == {
        k: e for k, e in before.items() if k != "ds/index.json"
    }  # the existing shards and tables: not rewritten
    assert not [k for k in after if "/.fastload-pack/" in k]
    assert stream(url, version=1) == old_stream
    keys = sorted(k for k, _ in stream(url))
    assert keys == sorted([*(f"k{i:05d}" for i in range(9)), *(f"k{i:05d}" for i in range(100, 103))])


def test_optimize_appends_to_s3(
    moto_s3: Any, bucket: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fastload.optimize(..., mode="append")`` into ``s3://`` (moto): the same publish, the stream of
    one run over all the inputs, nothing left in ``.fastload-pack/``."""
    point_env_at(moto_s3, monkeypatch)
    name = bucket(moto_s3)
    url, whole = f"s3://{name}/ds", f"s3://{name}/whole"

    def make(n: int) -> dict[str, Any]:
        return {"__key__": f"k{n:05d}", "txt": f"text {n} " * (n % 4 + 1) * 60}

    options: dict[str, Any] = {"workers": 2, "shard_size_bytes": 4 << 10, "progress": False}
    fastload.optimize(make, range(40), whole, **options)
    fastload.optimize(make, range(20), url, **options)
    old = stream(url)
    report = fastload.optimize(make, range(20, 40), url, mode="append", **options)
    assert report.samples == 20 and stream(url, version=1) == old and stream(url) == stream(whole)
    client = moto_s3.client()
    try:
        assert not [k for k in objects(client, name, "ds/") if "/.fastload-pack/" in k]
    finally:
        client.close()
        runtime.reset()
