"""`fastload cp` syncs on Ceph RGW and moto (issue 31): S3 to S3 copies server-side (CopyObject up to the
single-copy limit, UploadPartCopy parts above it: lowered here to 8 MiB), keeping the source's metadata and
recording a multipart source's ETag so that the next copy skips it; a source replaced during a copy is
refused (CopySourceIfMatch); and a `fastload cp -r` SIGKILLed mid-copy, run again, sends only what had not
arrived, with the right bytes, in both directions. A fault proxy in front of each store counts requests."""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from s3util import (
    KIB,
    MIB,
    fastload_argv,
    keys_under,
    open_uploads,
    point_env_at,
    run_cli,
    s3_config,
    s3_env,
    snapshot,
)
from test_s3_rgw_pack import start_pack, wait_then_kill, write_tree

import fastload
from fastload.core.syncplan import SOURCE_ETAG_META
from fastload.errors import S3Error
from fastload.s3 import runtime
from fastload.testing.faultproxy import Fault, FaultProxy, Rule, SigV4Resigner


@pytest.fixture(params=["rgw", "moto"])
def store(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Any, Any, FaultProxy]]:
    """(server, boto3 client, a recording proxy in front of it) for RGW and for moto; its credentials in
    the environment."""
    server = request.getfixturevalue("rgw" if request.param == "rgw" else "moto_s3")
    client = request.getfixturevalue("rgw_client" if request.param == "rgw" else "moto_client")
    point_env_at(server, monkeypatch)
    proxy = FaultProxy(server.endpoint_url, resign=SigV4Resigner(server.secret_key), io_timeout_s=15).start()
    try:
        yield server, client, proxy
    finally:
        proxy.close()
        runtime.reset()


def _writes(proxy: FaultProxy, since: int = 0) -> list[str]:
    return [r.target for r in proxy.requests()[since:] if r.method in ("PUT", "POST", "DELETE")]


def _object_gets(proxy: FaultProxy, since: int = 0) -> list[str]:
    return [
        r.target
        for r in proxy.requests()[since:]
        if r.method == "GET" and "list-type" not in r.target and "uploads" not in r.target
    ]


def test_s3_to_s3_copies_server_side_whole_and_in_parts_then_skips(
    store: tuple[Any, Any, FaultProxy], bucket: Callable[..., str]
) -> None:
    server, client, proxy = store
    name = bucket(server)
    rng = random.Random(31)
    whole, big = rng.randbytes(MIB + 5), rng.randbytes(12 * MIB + 7)
    multi = rng.randbytes(11 * MIB + 3)
    client.put_object(Bucket=name, Key="src/whole.bin", Body=whole)
    client.put_object(Bucket=name, Key="src/big.bin", Body=big)
    up = client.create_multipart_upload(
        Bucket=name, Key="src/multi.bin", ContentType="application/x-test", Metadata={"owner": "team-a"}
    )
    parts = []
    for number, first in enumerate(range(0, len(multi), 6 * MIB), start=1):
        resp = client.upload_part(
            Bucket=name,
            Key="src/multi.bin",
            UploadId=up["UploadId"],
            PartNumber=number,
            Body=multi[first : first + 6 * MIB],
        )
        parts.append({"PartNumber": number, "ETag": resp["ETag"]})
    client.complete_multipart_upload(
        Bucket=name, Key="src/multi.bin", UploadId=up["UploadId"], MultipartUpload={"Parts": parts}
    )
    config = s3_config(server, endpoint_url=proxy.endpoint_url)

    report = fastload.copy(
        f"s3://{name}/src/", f"s3://{name}/dst/", recursive=True, config=config, max_single_copy_bytes=8 * MIB
    )
    assert report.files == 3 and report.server_side and report.bytes == len(whole) + len(big) + len(multi)
    assert _object_gets(proxy) == [], "no byte passed through fastload"
    writes = _writes(proxy)
    # whole.bin: one CopyObject; big.bin and multi.bin (> 8 MiB): UploadPartCopy parts of 5 MiB
    assert [t for t in writes if t.endswith("/dst/whole.bin")] == [f"/{name}/dst/whole.bin"]
    for key, size in (("big.bin", len(big)), ("multi.bin", len(multi))):
        part_puts = [t for t in writes if f"/dst/{key}?" in t and "partNumber=" in t]
        assert len(part_puts) == -(-size // (5 * MIB)), writes
    for key, data in (("whole.bin", whole), ("big.bin", big), ("multi.bin", multi)):
        assert client.get_object(Bucket=name, Key=f"dst/{key}")["Body"].read() == data
    head = client.head_object(Bucket=name, Key="dst/multi.bin")
    source_etag = client.head_object(Bucket=name, Key="src/multi.bin")["ETag"].strip('"')
    assert head["Metadata"] == {"owner": "team-a", SOURCE_ETAG_META: source_etag}
    assert head["ContentType"] == "application/x-test"
    assert open_uploads(client, name) == []

    mark = len(proxy.requests())
    again = fastload.copy(
        f"s3://{name}/src/", f"s3://{name}/dst/", recursive=True, config=config, max_single_copy_bytes=8 * MIB
    )
    assert again.files == 0 and len(again.same) == 3 and _writes(proxy, mark) == [], again.summary()
    recorded = "same source ETag (recorded by an earlier server-side copy)"
    assert again.reasons == {"same MD5 (ETag)": 1, recorded: 2}, again.summary()

    # the multipart source copied whole by CopyObject (the default limit) also keeps its metadata
    one = fastload.copy(f"s3://{name}/src/multi.bin", f"s3://{name}/one/", config=config)
    assert one.files == 1 and client.get_object(Bucket=name, Key="one/multi.bin")["Body"].read() == multi
    assert client.head_object(Bucket=name, Key="one/multi.bin")["Metadata"][SOURCE_ETAG_META] == source_etag
    assert fastload.copy(f"s3://{name}/src/multi.bin", f"s3://{name}/one/", config=config).files == 0


def test_a_source_replaced_during_a_copy_in_parts_is_refused(
    store: tuple[Any, Any, FaultProxy], bucket: Callable[..., str]
) -> None:
    """RGW and moto ignore x-amz-copy-source-if-match (a CopyObject there copies the newer source whole);
    a copy in parts checks the source's ETag again before completing, and aborts."""
    server, client, proxy = store
    name = bucket(server)
    client.put_object(Bucket=name, Key="src/a.bin", Body=b"a" * (11 * MIB))
    proxy.add(
        Rule(
            Fault.overwrite_before(
                lambda _r: client.put_object(Bucket=name, Key="src/a.bin", Body=b"b" * (11 * MIB))
            ),
            method="PUT",
            where=lambda r: "/dst/a.bin?" in r.target and "partNumber=2" in r.target,
            times=1,
        )
    )
    config = s3_config(server, endpoint_url=proxy.endpoint_url, max_attempts=2, base_backoff_s=0.01)
    with pytest.raises(S3Error, match="the source changed while it was copied"):
        fastload.copy(
            f"s3://{name}/src/", f"s3://{name}/dst/", recursive=True, config=config, max_single_copy_bytes=MIB
        )
    assert keys_under(client, name, "dst/") == [] and open_uploads(client, name) == []
    again = fastload.copy(
        f"s3://{name}/src/", f"s3://{name}/dst/", recursive=True, config=config, max_single_copy_bytes=MIB
    )
    assert again.files == 1 and client.get_object(Bucket=name, Key="dst/a.bin")["Body"].read() == b"b" * (
        11 * MIB
    )


def _dataset(tmp_path: Path) -> Path:
    """A packed dataset of a dozen small shards, and an 11 MiB file beside it (uploaded in parts)."""
    rng = random.Random(7)
    src = write_tree(
        tmp_path / "in",
        {f"d{i % 3}/{i:04d}.bin": rng.randbytes(rng.randrange(500, 4000)) for i in range(120)},
    )
    ds = tmp_path / "ds"
    fastload.pack(src, ds, shard_size_bytes=32 * KIB, progress=False)
    (ds / "extra").mkdir()
    (ds / "extra" / "big.bin").write_bytes(rng.randbytes(11 * MIB + 1))
    return ds


def _keys(targets: list[str], name: str, prefix: str) -> set[str]:
    mark = f"/{name}/{prefix}"
    return {t.split("?", 1)[0].split(mark, 1)[1] for t in targets if mark in t.split("?", 1)[0]}


def test_a_killed_cp_r_run_again_sends_only_what_had_not_arrived(
    rgw: Any,
    rgw_client: Any,
    rgw_proxy: Callable[..., FaultProxy],
    bucket: Callable[..., str],
    tmp_path: Path,
) -> None:
    name = bucket(rgw)
    ds = _dataset(tmp_path)
    everything = snapshot(ds)

    # local -> S3, killed while the big file's second part hangs (every shard and table had arrived)
    proxy = rgw_proxy()
    proxy.add(Rule(Fault.hang(duration_s=30), method="PUT", where=lambda r: "partNumber=2" in r.target))
    argv = fastload_argv("cp", "-r", f"{ds}/", f"s3://{name}/up/", "--quiet")
    with (tmp_path / "up.stderr").open("wb") as stderr:
        proc = start_pack(argv, s3_env(rgw, endpoint_url=proxy.endpoint_url), tmp_path, stderr)
        wait_then_kill(
            proc,
            lambda: (
                len(open_uploads(rgw_client, name, "up/")) == 1
                and len(keys_under(rgw_client, name, "up/")) == len(everything) - 2
            ),
        )
    arrived = {k[len("up/") :] for k in keys_under(rgw_client, name, "up/")}
    assert "index.json" not in arrived and "extra/big.bin" not in arrived

    counting = rgw_proxy()
    out = run_cli(
        "cp",
        "-r",
        f"{ds}/",
        f"s3://{name}/up/",
        "--quiet",
        env=s3_env(rgw, endpoint_url=counting.endpoint_url),
    )
    sent = _keys(_writes(counting), name, "up/")
    assert sent == {"extra/big.bin", "index.json"}, sent
    assert f"skipped {len(arrived)} already at the destination" in out.stdout, out.stdout
    assert open_uploads(rgw_client, name, "up/") == [], "the killed multipart upload was aborted"
    mark = len(counting.requests())
    out = run_cli(
        "cp",
        "-r",
        f"{ds}/",
        f"s3://{name}/up/",
        "--quiet",
        env=s3_env(rgw, endpoint_url=counting.endpoint_url),
    )
    assert _writes(counting, mark) == [] and "same multipart ETag: 1" in out.stdout, out.stdout  # RGW's ETag

    # S3 -> local, killed while the big file's last bytes stall (every shard and table had landed)
    down = tmp_path / "down"
    stall = rgw_proxy()
    stall.add(
        Rule(
            Fault.stall_mid_body(after_bytes=256 * KIB, duration_s=30),
            method="GET",
            where=lambda r: (
                "big.bin" in r.target
                and r.range is not None
                and int(r.range.split("=")[1].split("-")[0]) >= 6 * MIB
            ),
        )
    )

    def names() -> list[str]:  # (names only: a download's .part file comes and goes)
        return [os.path.relpath(os.path.join(r, f), down) for r, _, fs in os.walk(down) for f in fs]

    def landed() -> list[str]:
        return [p for p in names() if not p.endswith(".part")]

    def part_files() -> list[str]:
        return [p for p in names() if p.endswith(".part")]

    argv = fastload_argv("cp", "-r", f"s3://{name}/up/", down, "--quiet")
    with (tmp_path / "down.stderr").open("wb") as stderr:
        proc = start_pack(argv, s3_env(rgw, endpoint_url=stall.endpoint_url), tmp_path, stderr)
        wait_then_kill(proc, lambda: len(landed()) == len(everything) - 2 and bool(part_files()))
    assert "index.json" not in landed() and part_files()

    counting = rgw_proxy()
    run_cli(
        "cp", "-r", f"s3://{name}/up/", down, "--quiet", env=s3_env(rgw, endpoint_url=counting.endpoint_url)
    )
    fetched = _keys(_object_gets(counting), name, "up/")
    assert fetched == {"extra/big.bin", "index.json"}, fetched
    assert snapshot(down) == everything, "every byte right, no .part file left"
    assert not [n for n in os.listdir(down) if n.endswith(".part")]


def test_one_503_on_each_server_side_copy_request_costs_a_retry_not_the_copy(
    store: tuple[Any, Any, FaultProxy], bucket: Callable[..., str]
) -> None:
    server, client, proxy = store
    name = bucket(server)
    rng = random.Random(8)
    small, big = rng.randbytes(1000), rng.randbytes(11 * MIB)
    client.put_object(Bucket=name, Key="src/small.bin", Body=small)
    client.put_object(Bucket=name, Key="src/big.bin", Body=big)
    seen: set[str] = set()

    def first_copy_request_of_each_kind(r: Any) -> bool:
        kind = (
            ("UploadPartCopy" if "partNumber=" in r.target else "CopyObject")
            if r.header("x-amz-copy-source")
            else ("HEAD" if r.method == "HEAD" else "")
        )
        if not kind or kind in seen:
            return False
        seen.add(kind)
        return True

    rule = proxy.add(Rule(Fault.slowdown(), where=first_copy_request_of_each_kind))
    config = s3_config(server, endpoint_url=proxy.endpoint_url, base_backoff_s=0.01, max_backoff_s=0.05)
    report = fastload.copy(
        f"s3://{name}/src/", f"s3://{name}/dst/", recursive=True, config=config, max_single_copy_bytes=8 * MIB
    )
    assert report.files == 2 and seen == {"CopyObject", "UploadPartCopy", "HEAD"} and rule.fired == 3
    assert client.get_object(Bucket=name, Key="dst/small.bin")["Body"].read() == small
    assert client.get_object(Bucket=name, Key="dst/big.bin")["Body"].read() == big
    assert fastload.s3_stats()["retries_total"] >= 3
