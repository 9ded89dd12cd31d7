"""``fastload cp`` against Ceph RGW: a ranged download lands under its final name only when complete, and a
prefix download refuses keys that would land outside the destination folder."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from s3util import MIB, payload, run_cli, s3_config, s3_env, snapshot

import fastload
from fastload.config import S3Config
from fastload.errors import RangeReadError
from fastload.s3.reader import FIRST_PART_BYTES
from fastload.testing.faultproxy import Fault, Rule


def test_cp_downloads_one_object_with_ranged_gets(
    rgw: Any, rgw_client: Any, rgw_proxy: Callable[..., Any], bucket: Callable[..., str], tmp_path: Path
) -> None:
    name = bucket(rgw)
    data = payload(20 * MIB + 7, seed=60)
    rgw_client.put_object(Bucket=name, Key="dl/obj.bin", Body=data)
    proxy = rgw_proxy()  # no faults: it only records the requests
    out = tmp_path / "out"
    out.mkdir()

    proc = run_cli(
        "cp", f"s3://{name}/dl/obj.bin", out / "copy.bin", env=s3_env(rgw, endpoint_url=proxy.endpoint_url)
    )

    assert (out / "copy.bin").read_bytes() == data
    assert os.listdir(out) == ["copy.bin"]
    assert "copied 1 file(s)" in proc.stdout
    gets = [r for r in proxy.requests() if r.method == "GET"]
    first = FIRST_PART_BYTES  # a small first part, then parts of the default size
    assert len(gets) == 1 + -(-(20 * MIB - first) // S3Config().part_size_bytes)
    assert all(r.range and r.status == 206 for r in gets), gets


def test_a_failed_download_leaves_no_file_behind(
    rgw: Any,
    rgw_env: dict[str, str],
    rgw_client: Any,
    rgw_proxy: Callable[..., Any],
    bucket: Callable[..., str],
    tmp_path: Path,
) -> None:
    name = bucket(rgw)
    rgw_client.put_object(Bucket=name, Key="dl/obj.bin", Body=payload(12 * MIB, seed=61))
    proxy = rgw_proxy()
    # The first ranged GETs pass; from the fourth on, every response is cut after 1000 body bytes.
    proxy.add(Rule(Fault.reset_mid_body(after_bytes=1000), method="GET", has_range=True, nth=range(4, 500)))
    config = s3_config(
        rgw,
        endpoint_url=proxy.endpoint_url,
        part_size_bytes=MIB,
        max_concurrency=2,
        max_attempts=2,
        base_backoff_s=0.01,
        max_backoff_s=0.02,
    )
    out = tmp_path / "out"
    out.mkdir()
    target = out / "obj.bin"

    with pytest.raises(RangeReadError) as excinfo:
        fastload.copy(f"s3://{name}/dl/obj.bin", str(target), config=config)

    assert excinfo.value.key == "dl/obj.bin" and excinfo.value.attempts == 2
    assert any(r.status == 206 and r.fault is None for r in proxy.requests()), "some parts arrived first"
    assert not target.exists()
    assert [n for n in os.listdir(out) if n.endswith(".part")] == []
    assert os.listdir(out) == []


def test_prefix_download_refuses_a_key_with_dot_dot(
    rgw: Any, rgw_client: Any, bucket: Callable[..., str], tmp_path: Path
) -> None:
    name = bucket(rgw)
    for key in ("raw/a.txt", "raw/sub/b.txt", "raw/../evil.txt"):
        rgw_client.put_object(Bucket=name, Key=key, Body=key.encode())
    assert "raw/../evil.txt" in [o["Key"] for o in rgw_client.list_objects_v2(Bucket=name)["Contents"]]
    work = tmp_path / "work"
    dest = work / "inner" / "dest"
    dest.parent.mkdir(parents=True)

    proc = run_cli("cp", "-r", f"s3://{name}/raw/", dest, env=s3_env(rgw), check=None)

    assert proc.returncode != 0, proc.stdout
    assert "raw/../evil.txt" in proc.stderr, proc.stderr
    outside = {rel: data for rel, data in snapshot(work).items() if not rel.startswith("inner/dest/")}
    assert outside == {}, f"written outside {dest}: {sorted(outside)}"
    assert not (work / "inner" / "evil.txt").exists()
