"""``fastload.s3.upload.upload_file`` on Ceph RGW: multipart uploads with per-part checksums, and failed
uploads aborted so that no part lingers and nothing appears under the key.

RGW verifies ``Content-MD5`` (it ignores ``x-amz-checksum-crc32c``, see test_servers.py), so a part whose
bytes were changed after their MD5 was computed must be refused by the server.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from s3util import MIB, key_exists, open_uploads, payload, s3_config

from fastload.errors import RangeReadError, S3Error
from fastload.s3.client import get_client
from fastload.s3.upload import upload_file
from fastload.testing.faultproxy import Fault, Rule


class CorruptingClient:
    """Delegates to a real client, but flips one byte of the body of part ``part_number`` after fastload
    computed its checksums: the request goes out with the original ``Content-MD5``."""

    def __init__(self, inner: Any, *, part_number: int) -> None:
        self._inner = inner
        self._part_number = part_number
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if callable(attr):

            def record(*args: Any, **kwargs: Any) -> Any:
                self.calls.append(name)
                return attr(*args, **kwargs)

            return record
        return attr

    def upload_part(self, **params: Any) -> Any:
        self.calls.append("upload_part")
        if params["PartNumber"] == self._part_number:
            body = bytearray(params["Body"])
            body[len(body) // 2] ^= 0x01
            assert "ContentMD5" in params, "fastload sends Content-MD5 with every part"
            params = {**params, "Body": bytes(body)}
            self.calls.append("corrupted")
        return self._inner.upload_part(**params)


def write_file(tmp_path: Path, size: int, seed: int) -> tuple[Path, bytes]:
    data = payload(size, seed)
    path = tmp_path / f"upload-{seed}.bin"
    path.write_bytes(data)
    return path, data


def test_upload_of_23_mib_in_5_mib_parts(
    rgw: Any, rgw_env: dict[str, str], rgw_client: Any, bucket: Callable[..., str], tmp_path: Path
) -> None:
    name = bucket(rgw)
    path, data = write_file(tmp_path, 23 * MIB, seed=1)
    config = s3_config(rgw, part_size_bytes=5 * MIB)
    upload_file(str(path), name, "up/23m.bin", config=config)

    got = rgw_client.get_object(Bucket=name, Key="up/23m.bin")
    assert got["Body"].read() == data
    parts = [data[i : i + 5 * MIB] for i in range(0, len(data), 5 * MIB)]
    md5_of_md5s = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest()
    assert got["ETag"] == f'"{md5_of_md5s}-5"', "five parts of 5, 5, 5, 5 and 3 MiB"
    assert open_uploads(rgw_client, name) == []


def test_a_corrupted_part_is_refused_by_the_server_and_the_upload_aborted(
    rgw: Any, rgw_env: dict[str, str], rgw_client: Any, bucket: Callable[..., str], tmp_path: Path
) -> None:
    name, key = bucket(rgw), "up/corrupt.bin"
    path, _ = write_file(tmp_path, 12 * MIB, seed=2)
    config = s3_config(rgw, part_size_bytes=5 * MIB, base_backoff_s=0.01, max_backoff_s=0.05)
    client = CorruptingClient(get_client(config), part_number=2)

    with pytest.raises(S3Error) as excinfo:
        upload_file(str(path), name, key, config=config, client=client)

    error = excinfo.value
    assert not isinstance(error, RangeReadError)
    assert (error.bucket, error.key) == (name, key)
    assert "BadDigest" in str(error) and f"s3://{name}/{key}" in str(error), str(error)
    assert client.calls.count("create_multipart_upload") == 1
    assert client.calls.count("corrupted") == 1, "a digest mismatch is not retried"
    assert client.calls.count("abort_multipart_upload") == 1
    assert "complete_multipart_upload" not in client.calls
    assert open_uploads(rgw_client, name) == []
    assert not key_exists(rgw_client, name, key)


def test_a_failing_complete_is_retried_then_the_upload_aborted(
    rgw: Any,
    rgw_env: dict[str, str],
    rgw_client: Any,
    rgw_proxy: Callable[..., Any],
    bucket: Callable[..., str],
    tmp_path: Path,
) -> None:
    name, key = bucket(rgw), "up/never-completed.bin"
    path, _ = write_file(tmp_path, 11 * MIB, seed=3)
    proxy = rgw_proxy()
    # CompleteMultipartUpload is POST ?uploadId=...; CreateMultipartUpload (POST ?uploads) is left alone.
    complete = proxy.add(
        Rule(Fault.internal_error(), method="POST", where=lambda r: "uploadId=" in r.target, times=10)
    )
    config = s3_config(
        rgw,
        endpoint_url=proxy.endpoint_url,
        part_size_bytes=5 * MIB,
        max_attempts=3,
        base_backoff_s=0.01,
        max_backoff_s=0.05,
    )

    with pytest.raises(S3Error) as excinfo:
        upload_file(str(path), name, key, config=config)

    message = str(excinfo.value)
    assert "completing failed after 3 attempt(s)" in message and f"s3://{name}/{key}" in message, message
    assert complete.fired == 3
    methods = [(r.method, r.status) for r in proxy.requests()]
    assert methods.count(("PUT", 200)) == 3, "three parts uploaded"
    assert ("DELETE", 204) in methods, "the upload was aborted"
    assert open_uploads(rgw_client, name) == []
    assert not key_exists(rgw_client, name, key)
