"""`fastload cp -r` publishes `index.json` last, local -> S3 and S3 -> local: a copy that fails part way (a
fault injected on one shard's requests, through the fault proxy in front of moto) leaves no `index.json` at
the destination, so the partial copy never opens as the whole dataset; and a reader that meets a missing
shard or sample table names an incomplete copy as a likely cause."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

import fastload
from fastload.copy import copy
from fastload.errors import FastloadError, NotFoundError
from fastload.s3 import runtime
from fastload.testing.faultplan import Fault, Rule
from fastload.testing.faultproxy import FaultProxy

from .helpers import proxied_config, read_manifest

BUCKET = "cp-order"


@pytest.fixture
def proxy(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    runtime.reset()
    s3 = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    with FaultProxy(moto_url, io_timeout_s=10.0) as p:
        yield p
    runtime.reset()


def _keys(moto_url: str, prefix: str) -> list[str]:
    s3 = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1")
    found = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return sorted(o["Key"][len(prefix) :] for o in found)


@pytest.fixture
def dataset(many_tree, tmp_path) -> Path:
    dst = tmp_path / "ds"
    fastload.pack(many_tree.root, dst, shard_size_bytes=4 << 10, progress=False)
    assert len(read_manifest(dst)["shards"]) > 8  # more than one batch of jobs
    return dst


def test_upload_puts_index_json_last_and_not_at_all_when_a_shard_fails(dataset, proxy, moto_url):
    config = proxied_config(proxy)
    copy(str(dataset), f"s3://{BUCKET}/ok/", recursive=True, config=config, progress=False)
    puts = [r.target for r in proxy.requests() if r.method == "PUT" and "/ok/" in r.target]
    assert puts[-1].endswith("/ok/index.json") and sum("index.json" in t for t in puts) == 1
    assert len(fastload.ShardDataset(f"s3://{BUCKET}/ok/", s3_config=config, decode=False)) == 200

    shard = read_manifest(dataset)["shards"][5]["name"]
    proxy.add(Rule(Fault.internal_error(), method="PUT", key=f"/bad/{shard}"))
    with pytest.raises(FastloadError):
        copy(str(dataset), f"s3://{BUCKET}/bad/", recursive=True, config=config, progress=False)
    left = _keys(moto_url, "bad/")
    assert shard not in left and "index.json" not in left, left


def test_download_writes_index_json_last_and_not_at_all_when_a_shard_fails(dataset, proxy, tmp_path):
    config = proxied_config(proxy)
    copy(str(dataset), f"s3://{BUCKET}/src/", recursive=True, config=config, progress=False)
    shard = read_manifest(dataset)["shards"][5]["name"]
    good = tmp_path / "good"
    copy(f"s3://{BUCKET}/src/", str(good), recursive=True, config=config, progress=False)
    assert sorted(p.name for p in good.iterdir()) == sorted(p.name for p in dataset.iterdir())
    gets = [r.target for r in proxy.requests() if r.method == "GET" and "/src/" in r.target]
    assert "index.json" in gets[-1], gets[-3:]

    proxy.add(Rule(Fault.internal_error(), method="GET", key=f"/src/{shard}"))
    bad = tmp_path / "bad"
    with pytest.raises(FastloadError):
        copy(f"s3://{BUCKET}/src/", str(bad), recursive=True, config=config, progress=False)
    left = sorted(p.name for p in bad.iterdir())
    assert not (bad / "index.json").exists() and shard not in left, left
    assert not [n for n in left if n.endswith(".part")], left


@pytest.mark.parametrize("what", ["shard", "table"])
def test_a_missing_shard_or_table_names_an_incomplete_copy(dataset, what):
    shards = read_manifest(dataset)["shards"]
    entry, first = shards[3], sum(s["samples"] for s in shards[:3])
    gone = dataset / (entry["name"] if what == "shard" else entry["table"]["name"])
    gone.unlink()
    with pytest.raises(NotFoundError) as info:
        list(fastload.ShardDataset(dataset, decode=False))
    message = str(info.value)
    assert str(gone) in message and "is missing" in message
    assert "incomplete copy" in message and "copy the dataset again whole" in message
    if what == "table":
        assert "fastload index --upgrade" in message
    with pytest.raises(NotFoundError, match="incomplete copy"):  # random access says the same
        fastload.MapDataset(dataset, decode=False)[first]
