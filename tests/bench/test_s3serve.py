"""The embedded S3 endpoint (fastload.testing.s3serve) over real HTTP on loopback: ranges, preconditions,
listing pagination, errors, latency and bandwidth emulation; and fastload's own S3 code and boto3 against
it."""

from __future__ import annotations

import http.client
import os
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import boto3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastload
from fastload.config import S3Config
from fastload.testing.s3serve import PIECE_BYTES, S3Server, list_page

SIZE = 10_000


@pytest.fixture
def creds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "any")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "any")
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "bucket"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "c").mkdir(parents=True)
    (root / "obj.bin").write_bytes(os.urandom(SIZE))
    (root / "empty").write_bytes(b"")
    for i in range(25):
        (root / "a" / "b" / f"f{i:02d}.bin").write_bytes(bytes([i]) * (100 + i))
    for i in range(3):
        (root / "a" / "c" / f"g{i}.bin").write_bytes(b"g")
    (root / "a" / "odd + name é.txt").write_bytes(b"odd")
    return root


@pytest.fixture
def server(tree: Path) -> Iterator[S3Server]:
    with S3Server(tree, bucket="bench") as s:
        yield s
        assert s.errors == []


def request(server: S3Server, method: str, path: str, headers: dict[str, str] | None = None):
    port = int(server.endpoint_url.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request(method, path, headers=headers or {})
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp, body


def test_ranges(server: S3Server, tree: Path) -> None:
    data = (tree / "obj.bin").read_bytes()
    resp, body = request(server, "GET", "/bench/obj.bin", {"Range": "bytes=100-199"})
    assert resp.status == 206 and body == data[100:200]
    assert resp.getheader("Content-Range") == f"bytes 100-199/{SIZE}"
    assert resp.getheader("Content-Length") == "100"
    resp, body = request(server, "GET", "/bench/obj.bin", {"Range": "bytes=9990-"})
    assert resp.status == 206 and body == data[9990:]
    resp, body = request(server, "GET", "/bench/obj.bin", {"Range": "bytes=-10"})
    assert resp.status == 206 and body == data[-10:]
    assert resp.getheader("Content-Range") == f"bytes {SIZE - 10}-{SIZE - 1}/{SIZE}"
    resp, body = request(server, "GET", "/bench/obj.bin", {"Range": "bytes=9000-20000"})  # end clipped
    assert resp.status == 206 and body == data[9000:]
    resp, body = request(server, "GET", "/bench/obj.bin")
    assert resp.status == 200 and body == data and resp.getheader("Accept-Ranges") == "bytes"
    resp, body = request(server, "GET", "/bench/obj.bin", {"Range": "bytes=0-1,5-6"})  # ignored, as S3 does
    assert resp.status == 200 and body == data


@pytest.mark.parametrize(("key", "range_"), [("obj.bin", f"bytes={SIZE}-"), ("empty", "bytes=0-99")])
def test_unsatisfiable_range_is_416(server: S3Server, key: str, range_: str) -> None:
    resp, body = request(server, "GET", f"/bench/{key}", {"Range": range_})
    size = SIZE if key == "obj.bin" else 0
    assert resp.status == 416 and b"<Code>InvalidRange</Code>" in body
    assert resp.getheader("Content-Range") == f"bytes */{size}"


def test_if_match_and_if_none_match(server: S3Server) -> None:
    head, _ = request(server, "HEAD", "/bench/obj.bin")
    etag = head.getheader("ETag")
    assert etag and etag.startswith('"') and head.getheader("Content-Length") == str(SIZE)
    resp, body = request(server, "GET", "/bench/obj.bin", {"Range": "bytes=0-9", "If-Match": etag})
    assert resp.status == 206 and len(body) == 10
    resp, body = request(server, "GET", "/bench/obj.bin", {"Range": "bytes=0-9", "If-Match": '"other"'})
    assert resp.status == 412 and b"<Code>PreconditionFailed</Code>" in body
    resp, _ = request(server, "GET", "/bench/obj.bin", {"If-Match": "*"})
    assert resp.status == 200
    resp, body = request(server, "GET", "/bench/obj.bin", {"If-None-Match": etag})
    assert resp.status == 304 and body == b""


def test_etag_changes_when_the_file_is_replaced(server: S3Server, tree: Path) -> None:
    before = request(server, "HEAD", "/bench/obj.bin")[0].getheader("ETag")
    (tree / "obj.bin").write_bytes(os.urandom(SIZE + 1))
    after = request(server, "HEAD", "/bench/obj.bin")[0].getheader("ETag")
    assert before != after
    resp, _ = request(server, "GET", "/bench/obj.bin", {"Range": "bytes=0-9", "If-Match": before or ""})
    assert resp.status == 412


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/bench/missing", 404, b"NoSuchKey"),
        ("GET", "/bench/a/../obj.bin", 404, b"NoSuchKey"),
        ("GET", "/bench/a", 404, b"NoSuchKey"),  # a folder is not an object
        ("GET", "/other/obj.bin", 404, b"NoSuchBucket"),
        ("PUT", "/bench/new", 501, b"NotImplemented"),
        ("HEAD", "/bench/missing", 404, b""),
    ],
)
def test_errors(server: S3Server, method: str, path: str, status: int, code: bytes) -> None:
    resp, body = request(server, method, path)
    assert resp.status == status
    assert code in body
    assert (body == b"") == (method == "HEAD")


def test_list_pagination_over_http(server: S3Server) -> None:
    keys: list[str] = []
    token = None
    pages = 0
    while True:
        query = "list-type=2&prefix=a/b/&max-keys=7" + (
            f"&continuation-token={quote(token)}" if token else ""
        )
        resp, body = request(server, "GET", f"/bench?{query}")
        assert resp.status == 200
        text = body.decode()
        keys += [part.split("</Key>")[0] for part in text.split("<Key>")[1:]]
        pages += 1
        if "<IsTruncated>true</IsTruncated>" not in text:
            break
        token = text.split("<NextContinuationToken>")[1].split("<")[0]
    assert pages == 4
    assert keys == [f"a/b/f{i:02d}.bin" for i in range(25)]


def test_list_with_boto3_delimiter_start_after_and_url_encoding(server: S3Server, creds: None) -> None:
    s3 = boto3.client("s3", endpoint_url=server.endpoint_url, region_name="us-east-1")
    pages = list(
        s3.get_paginator("list_objects_v2").paginate(
            Bucket="bench", Prefix="a/", Delimiter="/", PaginationConfig={"PageSize": 1}
        )
    )
    prefixes = [p["Prefix"] for page in pages for p in page.get("CommonPrefixes", [])]
    contents = [o["Key"] for page in pages for o in page.get("Contents", [])]
    assert prefixes == ["a/b/", "a/c/"]  # each once, though a/b/ holds 25 keys
    assert contents == ["a/odd + name é.txt"]  # boto3 asked for encoding-type=url and decoded it
    assert len(pages) == 3
    page = s3.list_objects_v2(Bucket="bench", Prefix="a/c/", StartAfter="a/c/g0.bin")
    assert [o["Key"] for o in page["Contents"]] == ["a/c/g1.bin", "a/c/g2.bin"]
    assert page["Contents"][0]["Size"] == 1
    body = s3.get_object(Bucket="bench", Key="a/odd + name é.txt")["Body"].read()
    assert body == b"odd"


KEYS = st.lists(st.text("ab/", min_size=1, max_size=5), unique=True, max_size=30).map(sorted)


@settings(max_examples=150, deadline=None)
@given(KEYS, st.sampled_from(["", "/"]), st.integers(1, 6))
def test_paging_gives_the_same_entries_as_one_page(keys: list[str], delimiter: str, max_keys: int) -> None:
    whole = list_page(keys, prefix="", delimiter=delimiter, max_keys=10_000, token=None, start_after="")
    assert not whole.truncated
    got: list[tuple[str, bool]] = []
    token = None
    for _ in range(100):
        page = list_page(keys, prefix="", delimiter=delimiter, max_keys=max_keys, token=token, start_after="")
        assert len(page.entries) <= max_keys
        got += page.entries
        if not page.truncated:
            break
        token = page.next_token
    assert got == whole.entries
    assert len(got) == len(set(got))


def test_latency_and_bandwidth_are_emulated(tree: Path) -> None:
    (tree / "big.bin").write_bytes(os.urandom(2_000_000))
    with S3Server(tree, latency_s=0.05, conn_bytes_per_s=20e6) as slow:
        began = time.monotonic()
        resp, _ = request(slow, "HEAD", "/bench/obj.bin")
        assert resp.status == 200 and time.monotonic() - began >= 0.05
        began = time.monotonic()
        resp, body = request(slow, "GET", "/bench/big.bin")
        took = time.monotonic() - began
        assert resp.status == 200 and len(body) == 2_000_000
        assert took >= 0.05 + (2_000_000 - PIECE_BYTES) / 20e6  # first byte, then 20 MB/s to within a piece
        assert took < 1.0


def test_fastload_reads_lists_and_trains_from_it(
    tmp_path: Path, creds: None, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "src"
    for i in range(40):
        (src / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 3}" / f"{i:03d}.bin").write_bytes(os.urandom(500 + i))
        (src / f"d{i % 3}" / f"{i:03d}.cls").write_bytes(str(i % 5).encode())
    root = tmp_path / "served"
    fastload.pack(src, root / "ds", max_samples=7, progress=False)
    with S3Server(root, bucket="bench") as server:
        config = S3Config(endpoint_url=server.endpoint_url, region="us-east-1", addressing_style="path")
        shard = root / "ds" / "shard-000001.tar"
        with fastload.open("s3://bench/ds/shard-000001.tar", config=config) as f:
            f.seek(1000)
            assert f.read(3000) == shard.read_bytes()[1000:4000]
        dataset = fastload.ShardDataset("s3://bench/ds", s3_config=config, decode=False)
        keys = sorted(s["__key__"] for s in dataset)
        assert keys == sorted(f"d{i % 3}/{i:03d}" for i in range(40))
        from fastload.cli import main

        os.environ["AWS_ENDPOINT_URL"] = server.endpoint_url
        try:
            assert main(["ls", "s3://bench/ds/"]) == 0
        finally:
            del os.environ["AWS_ENDPOINT_URL"]
        listed = capsys.readouterr().out
        assert "shard-000005.tar" in listed and "index.json" in listed
        assert server.errors == []


def test_refuses_non_loopback_and_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="loopback"):
        S3Server(tmp_path, host="0.0.0.0")
    with pytest.raises(ValueError, match="not a folder"):
        S3Server(tmp_path / "nope")


def test_the_endpoint_process_serves_and_a_bad_start_says_why(tree: Path) -> None:
    from fastload.bench.workload import Endpoint
    from fastload.errors import FastloadError

    endpoint = Endpoint(str(tree), latency_s=0.0, conn_bytes_per_s=None)
    try:
        port = int(endpoint.endpoint_url.rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/bench/obj.bin", headers={"Range": "bytes=0-9"})
        resp = conn.getresponse()
        assert resp.status == 206 and len(resp.read()) == 10
        conn.close()
        assert (endpoint.cpu_s() or 0.0) >= 0
    finally:
        endpoint.close()
    with pytest.raises(FastloadError, match=r"did not start: s3serve: .* is not a folder"):
        Endpoint(str(tree / "missing"), latency_s=0.0, conn_bytes_per_s=None)
