"""`fastload cp` syncs (issue 31): an object already at the destination with the same bytes is skipped, in
every direction (local -> S3, S3 -> local, S3 -> S3 server-side), told by the index's CRC32C or the ETag,
never by the size alone; after an append only the new shards, their tables and `index.json` (last) move.
Every request goes through a fault proxy in front of moto, which counts them."""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

import fastload
from fastload.copy import copy
from fastload.s3 import runtime
from fastload.testing.faultproxy import FaultProxy

from .helpers import proxied_config, read_manifest

BUCKET = "cp-sync"
MIB = 1 << 20


@pytest.fixture
def proxy(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    runtime.reset()
    s3 = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):  # (moto lives a session)
        for obj in page.get("Contents", []):
            s3.delete_object(Bucket=BUCKET, Key=obj["Key"])
    with FaultProxy(moto_url, io_timeout_s=10.0) as p:
        yield p
    runtime.reset()


@pytest.fixture
def s3(moto_url: str) -> Iterator[object]:
    client = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1")
    yield client
    client.close()


@pytest.fixture
def dataset(many_tree, tmp_path) -> Path:
    dst = tmp_path / "ds"
    fastload.pack(many_tree.root, dst, shard_size_bytes=16 << 10, progress=False)
    assert len(read_manifest(dst)["shards"]) > 4
    (dst / "notes").mkdir()  # a file of no index, and one sent in parts (a multipart ETag)
    (dst / "notes" / "README.txt").write_bytes(b"not a shard\n")
    (dst / "notes" / "big.bin").write_bytes(random.Random(5).randbytes(6 * MIB + 3))
    return dst


class Requests:
    """The requests a proxy saw from a mark on: writes (PUT/POST/DELETE) and object GETs (not listings)."""

    def __init__(self, proxy: FaultProxy) -> None:
        self.proxy, self.first = proxy, len(proxy.requests())

    def since(self) -> list[tuple[str, str]]:
        return [(r.method, r.target) for r in self.proxy.requests()[self.first :]]

    def writes(self) -> list[str]:
        return [t for m, t in self.since() if m in ("PUT", "POST", "DELETE")]

    def reads(self) -> list[str]:
        return [t for m, t in self.since() if m == "GET" and "list-type" not in t and "uploads" not in t]

    def keys(self, what: list[str], prefix: str) -> set[str]:
        """The keys under ``prefix`` that ``what`` (targets) touched (query strings dropped)."""
        out = set()
        for target in what:
            path = target.split("?", 1)[0]
            mark = f"/{BUCKET}/{prefix}"
            if mark in path:
                out.add(path.split(mark, 1)[1])
        return out


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_second_copy_of_an_unchanged_dataset_sends_no_data_in_any_direction(dataset, proxy, tmp_path):
    config = proxied_config(proxy)
    names = set(_tree(dataset))
    up = copy(str(dataset), f"s3://{BUCKET}/a/", recursive=True, config=config, progress=False)
    assert up.files == len(names) and not up.same
    down = tmp_path / "down"
    copy(f"s3://{BUCKET}/a/", str(down), recursive=True, config=config, progress=False)
    across = copy(f"s3://{BUCKET}/a/", f"s3://{BUCKET}/b/", recursive=True, config=config, progress=False)
    assert across.files == len(names) and across.server_side
    assert _tree(down) == _tree(dataset)

    mark = Requests(proxy)
    again = [
        copy(str(dataset), f"s3://{BUCKET}/a/", recursive=True, config=config, progress=False),
        copy(f"s3://{BUCKET}/a/", str(down), recursive=True, config=config, progress=False),
        copy(f"s3://{BUCKET}/a/", f"s3://{BUCKET}/b/", recursive=True, config=config, progress=False),
    ]
    assert mark.writes() == [] and mark.reads() == [], (mark.writes(), mark.reads())
    for report in again:
        assert report.files == 0 and report.bytes == 0 and len(report.same) == len(names)
        assert report.same_bytes == sum(len(b) for b in _tree(dataset).values())
        summary = report.summary()
        assert "copied 0 file(s), 0 bytes" in summary and f"skipped {len(names)} already at the" in summary
    # local -> S3: MD5s and the multipart ETag of big.bin recomputed; S3 -> local: CRC32C of shards and
    # tables against index.json, MD5 or multipart ETag for the rest; S3 -> S3: the same ETags
    assert again[0].reasons == {"same MD5 (ETag)": len(names) - 1, "same multipart ETag": 1}
    shards = read_manifest(dataset)["shards"]
    assert again[1].reasons["same CRC32C as index.json"] == 2 * len(shards)
    assert again[1].reasons["same multipart ETag"] == 1
    # moto gives CopyObject of a multipart object a new ETag: the source's, recorded at the copy, is read
    # back with a HEAD (no data)
    recorded = "same source ETag (recorded by an earlier server-side copy)"
    assert again[2].reasons == {"same MD5 (ETag)": len(names) - 1, recorded: 1}


def _append(dataset: Path, tmp_path: Path) -> list[str]:
    """Simulate an append: a new shard and its table, numbered after the others, and index.json rewritten
    (the shards before it untouched); return the new files' names."""
    extra = tmp_path / "extra"
    extra.mkdir()
    for i in range(20):
        (extra / f"z{i:03d}.bin").write_bytes(random.Random(i).randbytes(500 + i))
    packed = tmp_path / "packed-extra"
    fastload.pack(extra, packed, shard_size_bytes=1 << 20, progress=False)
    index = read_manifest(dataset)
    (entry,) = read_manifest(packed)["shards"]
    number = len(index["shards"])
    name = f"shard-{number:06d}.tar"
    shutil.copyfile(packed / entry["name"], dataset / name)
    shutil.copyfile(packed / entry["table"]["name"], dataset / f"{name}.fltable")
    entry = {**entry, "name": name, "table": {**entry["table"], "name": f"{name}.fltable"}}
    index["shards"].append(entry)
    (dataset / "index.json").write_text(json.dumps(index))
    return [name, f"{name}.fltable", "index.json"]


def test_after_an_append_only_the_new_shard_its_table_and_index_json_move(dataset, proxy, tmp_path):
    config = proxied_config(proxy)
    down = tmp_path / "down"
    copy(str(dataset), f"s3://{BUCKET}/a/", recursive=True, config=config, progress=False)
    copy(f"s3://{BUCKET}/a/", str(down), recursive=True, config=config, progress=False)
    copy(f"s3://{BUCKET}/a/", f"s3://{BUCKET}/b/", recursive=True, config=config, progress=False)
    new = _append(dataset, tmp_path)
    assert len(fastload.ShardDataset(dataset, decode=False)) == 220  # the appended dataset reads

    mark = Requests(proxy)
    up = copy(str(dataset), f"s3://{BUCKET}/a/", recursive=True, config=config, progress=False)
    puts = mark.writes()
    assert mark.keys(puts, "a/") == set(new) and puts[-1].endswith("/a/index.json"), puts
    assert up.files == 3 and up.reasons["new"] == 2 and up.reasons["size differs"] == 1, up.summary()

    mark = Requests(proxy)
    downed = copy(f"s3://{BUCKET}/a/", str(down), recursive=True, config=config, progress=False)
    gets = mark.reads()
    assert mark.keys(gets, "a/") == set(new) and "/a/index.json" in gets[-1], gets
    assert mark.writes() == [] and downed.files == 3 and _tree(down) == _tree(dataset)

    mark = Requests(proxy)
    across = copy(f"s3://{BUCKET}/a/", f"s3://{BUCKET}/b/", recursive=True, config=config, progress=False)
    copies = mark.writes()
    assert mark.keys(copies, "b/") == set(new) and copies[-1].endswith("/b/index.json"), copies
    assert mark.reads() == [] and across.files == 3, "server-side: no byte through this process"
    again = tmp_path / "again"
    copy(f"s3://{BUCKET}/b/", str(again), recursive=True, config=config, progress=False)
    assert _tree(again) == _tree(dataset)
    assert len(fastload.ShardDataset(f"s3://{BUCKET}/b/", s3_config=config, decode=False)) == 220


def _flip(path: Path, at: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_same_name_and_size_with_other_bytes_is_copied(dataset, proxy, tmp_path, s3):
    config = proxied_config(proxy)
    shard = read_manifest(dataset)["shards"][2]
    table = shard["table"]["name"]
    down = tmp_path / "down"
    copy(str(dataset), f"s3://{BUCKET}/a/", recursive=True, config=config, progress=False)
    copy(f"s3://{BUCKET}/a/", str(down), recursive=True, config=config, progress=False)
    copy(f"s3://{BUCKET}/a/", f"s3://{BUCKET}/b/", recursive=True, config=config, progress=False)

    # S3 -> local: a shard, its table and two files of no index changed in place at the destination
    for name in (shard["name"], table, "notes/README.txt", "notes/big.bin"):
        _flip(down / name, at=len((down / name).read_bytes()) // 2)
    report = copy(f"s3://{BUCKET}/a/", str(down), recursive=True, config=config, progress=False)
    assert report.files == 4 and _tree(down) == _tree(dataset), report.summary()
    assert report.reasons["checksum differs (CRC32C)"] == 2 and report.reasons["checksum differs (MD5)"] == 1
    assert report.reasons["checksum differs (multipart ETag)"] == 1

    # local -> S3: the source changed in place (size kept); index.json still says the old CRC32C
    _flip(dataset / shard["name"])
    _flip(dataset / "notes" / "big.bin")
    mark = Requests(proxy)
    report = copy(str(dataset), f"s3://{BUCKET}/a/", recursive=True, config=config, progress=False)
    assert mark.keys(mark.writes(), "a/") == {shard["name"], "notes/big.bin"}, report.summary()
    got = s3.get_object(Bucket=BUCKET, Key=f"a/{shard['name']}")["Body"].read()
    assert got == (dataset / shard["name"]).read_bytes()

    # S3 -> S3: another object of the same size at the destination
    s3.put_object(Bucket=BUCKET, Key=f"b/{table}", Body=bytes((dataset / table).stat().st_size))
    mark = Requests(proxy)
    report = copy(f"s3://{BUCKET}/a/", f"s3://{BUCKET}/b/", recursive=True, config=config, progress=False)
    assert mark.keys(mark.writes(), "b/") == {table, shard["name"], "notes/big.bin"}, report.summary()
    back = tmp_path / "back"
    copy(f"s3://{BUCKET}/b/", str(back), recursive=True, config=config, progress=False)
    assert _tree(back) == _tree(dataset)


def test_dry_run_lists_what_would_move_and_moves_nothing(dataset, proxy, tmp_path, capsys):
    from fastload.cli import main

    config = proxied_config(proxy)
    copy(str(dataset), f"s3://{BUCKET}/a/", recursive=True, config=config, progress=False)
    new = _append(dataset, tmp_path)
    mark = Requests(proxy)
    report = copy(str(dataset), f"s3://{BUCKET}/a/", recursive=True, config=config, dry_run=True)
    assert mark.writes() == [] and report.files == 3 and report.dry_run
    moving = [line for line in report.plan_lines() if line.startswith("copy")]
    assert sorted(moving) == sorted(
        f"copy  s3://{BUCKET}/a/{n}  ({'size differs' if n == 'index.json' else 'new'})" for n in new
    )
    assert report.summary().startswith("would copy 3 file(s)") and "would skip" in report.summary()

    argv = ["cp", "-r", "--dry-run", "--endpoint-url", proxy.endpoint_url, str(dataset), f"s3://{BUCKET}/a/"]
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0 and f"copy  s3://{BUCKET}/a/{new[0]}  (new)" in out and "would copy 3 file(s)" in out
    assert mark.writes() == []


def test_a_parquet_dataset_s_shards_and_tables_are_checked_by_its_index_in_fastload_dir(
    sparse_tree, proxy, tmp_path
):
    """A Parquet dataset keeps index.json and the tables in _fastload/; its shards' names are relative to
    the folder above: the CRC32C checks find them there."""
    config = proxied_config(proxy)
    ds = tmp_path / "pq"
    fastload.pack(
        str(sparse_tree.root), ds, shard_format="parquet", shard_size_bytes=16 << 10, progress=False
    )
    shards = json.loads((ds / "_fastload" / "index.json").read_text())["shards"]
    copy(str(ds), f"s3://{BUCKET}/pq/", recursive=True, config=config, progress=False)
    down = tmp_path / "down"
    copy(f"s3://{BUCKET}/pq/", str(down), recursive=True, config=config, progress=False)
    mark = Requests(proxy)
    again = copy(f"s3://{BUCKET}/pq/", str(down), recursive=True, config=config, progress=False)
    assert again.files == 0 and again.reasons["same CRC32C as index.json"] == 2 * len(shards), again.summary()
    assert mark.reads() == [] and mark.writes() == []


def test_credentials_that_may_write_but_not_list_copy_everything_as_before(
    dataset, proxy, tmp_path, monkeypatch
):
    """Without s3:ListBucket on the destination nothing can be compared: every object is copied (as cp did
    before it synced), and the summary says why. (The listing's 403 is raised by a patched listing.)"""
    import fastload.s3.listing as listing
    from fastload.errors import AccessDeniedError

    config = proxied_config(proxy)
    copy(str(dataset), f"s3://{BUCKET}/a/", recursive=True, config=config, progress=False)
    real = listing.list_objects

    def denied(bucket, prefix, **kw):
        if prefix.startswith("a/"):
            raise AccessDeniedError(f"s3://{bucket}/{prefix}: access denied", bucket=bucket, key=prefix)
        return real(bucket, prefix, **kw)

    monkeypatch.setattr(listing, "list_objects", denied)
    report = copy(str(dataset), f"s3://{BUCKET}/a/", recursive=True, config=config, progress=False)
    assert report.files == len(_tree(dataset)) and not report.same
    assert "not listed (ListObjectsV2 denied)" in report.summary()
    one = copy(f"s3://{BUCKET}/a/index.json", str(dataset / "index.json"), config=config, progress=False)
    assert one.files == 1 and "not listed" in one.summary()


def test_the_journal_of_an_append_killed_at_the_source_is_left_out(dataset, proxy, tmp_path, monkeypatch):
    """An append that failed half-way leaves its journal (``.fastload-pack/append-*``) beside index.json:
    copied, it would make the copy look like an append of its own in progress; it is left out, and said."""
    from fastload.packing import append as append_module

    extra = tmp_path / "extra"
    extra.mkdir()
    for i in range(30):
        (extra / f"y{i:03d}.bin").write_bytes(random.Random(i).randbytes(900 + i))
    real = append_module.AppendedJob.write
    calls = {"n": 0}

    def failing(self, tmp, **kw):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(5, "injected failure")
        return real(self, tmp, **kw)

    with monkeypatch.context() as patched, pytest.raises(OSError, match="injected"):
        patched.setattr(append_module.AppendedJob, "write", failing)
        fastload.pack(extra, dataset, shard_size_bytes=8 << 10, workers=1, append=True, progress=False)
    journal = sorted(p.relative_to(dataset).as_posix() for p in (dataset / ".fastload-pack").rglob("*"))
    assert [p for p in journal if (dataset / p).is_file()], journal  # the run left its journal

    config = proxied_config(proxy)
    up = copy(str(dataset), f"s3://{BUCKET}/j/", recursive=True, config=config, progress=False)
    assert up.journal and all("/.fastload-pack/" in p for p in up.journal), up.journal
    assert "pack journal (.fastload-pack/)" in up.summary()
    assert not [c for c in up.copied if "/.fastload-pack/" in c], up.copied
    down = tmp_path / "down"
    back = copy(f"s3://{BUCKET}/j/", str(down), recursive=True, config=config, progress=False)
    assert not back.journal and not (down / ".fastload-pack").exists()
    want = [s["__key__"] for s in fastload.ShardDataset(dataset, decode=False)]
    assert [s["__key__"] for s in fastload.ShardDataset(down, decode=False)] == want

    # the same from S3: a journal uploaded by an older fastload is left out of a download too
    shutil.copytree(dataset / ".fastload-pack", tmp_path / "jr" / ".fastload-pack")
    copy(str(tmp_path / "jr"), f"s3://{BUCKET}/j/", recursive=True, config=config, progress=False)
    again = copy(f"s3://{BUCKET}/j/", str(tmp_path / "down2"), recursive=True, config=config, progress=False)
    assert again.journal and not (tmp_path / "down2" / ".fastload-pack").exists()
