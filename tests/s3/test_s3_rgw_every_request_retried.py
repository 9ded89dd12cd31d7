"""Every request fastload makes goes through the one retry policy (503 SlowDown, 5xx, resets): one 503 on any
kind of request of ``cp -r`` (both ways), ``pack`` S3 -> S3 (multipart shards, the clean-up of its journal
with DeleteObjects, the abort of a stale multipart upload) and ``verify`` costs a retry, never the run. On
Ceph RGW through the fault proxy."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from s3util import KIB, MIB, keys_under, open_uploads, run_cli, s3_env, snapshot

from fastload.testing.faultproxy import Fault, RequestInfo, Rule

IGNORED_PARAMETERS = ("prefix", "continuation-token", "key-marker", "upload-id-marker", "encoding-type")


def kind_of(request: RequestInfo) -> str:
    """A request's operation, as method and query parameter names: ``POST ?delete`` (DeleteObjects),
    ``GET ?list-type`` (ListObjectsV2), ``PUT ?partNumber&uploadId`` (UploadPart), ``GET`` (GetObject)..."""
    names = sorted({k for k, _ in parse_qsl(urlsplit(request.target).query, keep_blank_values=True)})
    names = [n for n in names if n not in IGNORED_PARAMETERS]
    return request.method + (" ?" + "&".join(names) if names else "")


class FirstOfEachKind:
    """A ``where`` predicate: true for the first request of each kind (and only for that request)."""

    def __init__(self) -> None:
        self.first: dict[str, int] = {}
        self.lock = threading.Lock()

    def __call__(self, request: RequestInfo) -> bool:
        with self.lock:
            number = self.first.setdefault(kind_of(request), request.number)
        return number == request.number


def tree(root: Path) -> Path:
    rng = random.Random(5)
    for i in range(30):
        path = root / f"d{i % 3}" / f"{i:03d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(rng.randrange(1, 40 * KIB)))
    (root / "big" / "000.bin").parent.mkdir()
    (root / "big" / "000.bin").write_bytes(rng.randbytes(9 * MIB))  # a multipart upload
    return root


def test_a_503_on_delete_objects_in_the_journal_clean_up_is_retried(
    rgw: Any, rgw_client: Any, rgw_proxy: Callable[..., Any], bucket: Callable[..., str], tmp_path: Path
) -> None:
    """The end of a finished pack deletes its journal (``.fastload-pack/``) with DeleteObjects, after
    listing it; a 503 on each gave a botocore traceback and exit 1."""
    src = tree(tmp_path / "src")
    name = bucket(rgw)
    proxy = rgw_proxy()
    deletes = proxy.add(Rule(Fault.slowdown(), method="POST", where=lambda r: "delete" in r.target, times=2))
    lists = proxy.add(
        Rule(Fault.slowdown(), method="GET", where=lambda r: "fastload-pack" in r.target, times=2)
    )
    env = s3_env(rgw, endpoint_url=proxy.endpoint_url)
    run_cli("pack", src, f"s3://{name}/ds", "--shard-size", "1MiB", "--quiet", env=env)
    assert deletes.fired == 2 and lists.fired == 2
    keys = keys_under(rgw_client, name, "ds/")
    assert "ds/index.json" in keys and not [k for k in keys if ".fastload-pack" in k], keys
    run_cli("verify", f"s3://{name}/ds", env=s3_env(rgw))


def test_one_503_on_every_kind_of_request_costs_a_retry_not_the_run(
    rgw: Any, rgw_client: Any, rgw_proxy: Callable[..., Any], bucket: Callable[..., str], tmp_path: Path
) -> None:
    src = tree(tmp_path / "src")
    name = bucket(rgw)
    # a multipart upload left open under the pack's destination (a killed pack's): pack aborts it
    stale = rgw_client.create_multipart_upload(Bucket=name, Key="packed/shard-000000.tar")
    first = FirstOfEachKind()
    proxy = rgw_proxy()
    rule = proxy.add(Rule(Fault.slowdown(), where=first))
    env = s3_env(rgw, endpoint_url=proxy.endpoint_url)
    run_cli("cp", "-r", f"{src}/", f"s3://{name}/raw/", "--quiet", env=env)
    run_cli("pack", f"s3://{name}/raw", f"s3://{name}/packed", "--shard-size", "9MiB", "--quiet", env=env)
    run_cli("cp", "-r", f"s3://{name}/raw/", tmp_path / "back", "--quiet", env=env)
    run_cli("verify", f"s3://{name}/packed", env=env)
    kinds = set(first.first)
    expected = {
        "PUT",  # PutObject
        "POST ?uploads",  # CreateMultipartUpload
        "PUT ?partNumber&uploadId",  # UploadPart
        "POST ?uploadId",  # CompleteMultipartUpload
        "DELETE ?uploadId",  # AbortMultipartUpload (the stale upload)
        "GET ?uploads",  # ListMultipartUploads
        "GET ?list-type",  # ListObjectsV2
        "POST ?delete",  # DeleteObjects (the journal)
        "GET",  # GetObject (ranged)
        "HEAD",  # HeadObject
    }
    assert expected <= kinds, sorted(kinds)
    assert rule.fired == len(kinds), (rule.fired, sorted(kinds))
    assert snapshot(tmp_path / "back") == snapshot(src)
    assert [u["UploadId"] for u in open_uploads(rgw_client, name)] == [], "the stale upload was aborted"
    assert stale["UploadId"]
