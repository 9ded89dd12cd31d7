"""Uploading a local file (or any bytes read at offsets: another store's object) to S3: one PUT for small
files, else a multipart upload with parallel parts.

Every request carries a checksum of its bytes that the server verifies: ``Content-MD5`` (every S3
implementation checks it) and/or ``x-amz-checksum-crc32c`` (AWS S3 and newer stores check it). Each part is
retried on its own; a failed multipart upload is aborted, so no part lingers and nothing appears under the
final key. A completed object appears all at once (S3 semantics), never partially.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from crc32c import crc32c

from fastload.config import S3Config
from fastload.errors import ConfigError, S3Error
from fastload.s3.client import Failure, get_client
from fastload.s3.retrying import GiveUp, Retrier, give_up_on

MIN_PART_BYTES = 5 << 20
MAX_PARTS = 10_000
CHECKSUMS = ("crc32c", "md5", "both")


def part_size_for(size: int, wanted: int) -> int:
    """Part size for a ``size``-byte object: at least 5 MiB and few enough parts (<= 10,000)."""
    return max(MIN_PART_BYTES, wanted, -(-size // MAX_PARTS))


def _checksum_params(data: bytes | memoryview, checksum: str) -> dict[str, str]:
    params: dict[str, str] = {}
    if checksum in ("crc32c", "both"):
        params["ChecksumCRC32C"] = base64.b64encode(crc32c(data).to_bytes(4, "big")).decode()
    if checksum in ("md5", "both"):
        params["ContentMD5"] = base64.b64encode(hashlib.md5(data).digest()).decode()
    return params


def upload_file(
    path: str,
    bucket: str,
    key: str,
    *,
    config: S3Config,
    client: Any = None,
    checksum: str = "both",
    retrier: Retrier | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> str:
    """Upload ``path`` to ``s3://bucket/key``; return the new object's ETag. ``on_bytes(n)`` is called (from
    any thread) as each PUT or part of ``n`` bytes is stored, so the calls add up to the file's size."""
    with open(path, "rb") as f:
        fd = f.fileno()
        return upload_from(
            lambda offset, n: os.pread(fd, n, offset),
            os.fstat(fd).st_size,
            bucket,
            key,
            source=path,
            config=config,
            client=client,
            checksum=checksum,
            retrier=retrier,
            on_bytes=on_bytes,
        )


def upload_from(
    read_at: Callable[[int, int], bytes],
    size: int,
    bucket: str,
    key: str,
    *,
    source: str,
    config: S3Config,
    client: Any = None,
    checksum: str = "both",
    retrier: Retrier | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> str:
    """Upload the ``size`` bytes that ``read_at(offset, n)`` gives (called from several threads at once;
    a local file's ``pread``, another store's ranged reads) as :func:`upload_file` does; ``source`` names
    them in errors."""
    if checksum not in CHECKSUMS:
        raise ConfigError(f"checksum={checksum!r}; choose one of {', '.join(CHECKSUMS)}")
    client = client if client is not None else get_client(config)
    retrier = retrier or Retrier.from_config(config)
    part = part_size_for(size, config.part_size_bytes)
    url = f"s3://{bucket}/{key}"

    def give_up_for(what: str) -> GiveUp:
        def give_up(failure: Failure, tries: int, elapsed_s: float) -> Exception:
            error = inner(failure, tries, elapsed_s)
            if isinstance(error, S3Error) and not str(error).startswith("uploading"):
                error.args = (
                    f"uploading {source} to {url}: {what} was refused: {error}. Nothing was written "
                    "under the key (a multipart upload is aborted)",
                )
            return error

        def spent(failure: Failure, tries: int, elapsed_s: float) -> Exception:
            return S3Error(
                f"uploading {source} to {url}: {what} failed after {tries} attempt(s) in {elapsed_s:.1f}s "
                f"({failure.message}); nothing was left under the key: retry later",
                bucket=bucket,
                key=key,
            )

        inner = give_up_on(bucket, key, what="write to", spent=spent)
        return give_up

    if size <= part:
        data = read_at(0, size)
        params = {"Bucket": bucket, "Key": key, "Body": data, **_checksum_params(data, checksum)}
        resp = retrier.call(lambda: client.put_object(**params), give_up_for("PUT"))
        if on_bytes is not None:
            on_bytes(size)
        return str(resp.get("ETag", ""))
    create: dict[str, Any] = {"Bucket": bucket, "Key": key}
    if checksum in ("crc32c", "both"):
        create["ChecksumAlgorithm"] = "CRC32C"
    upload_id = retrier.call(lambda: client.create_multipart_upload(**create), give_up_for("starting"))[
        "UploadId"
    ]

    def send(number: int) -> dict[str, Any]:
        offset = (number - 1) * part
        data = read_at(offset, min(part, size - offset))
        sums = _checksum_params(data, checksum)
        params = {
            "Bucket": bucket,
            "Key": key,
            "UploadId": upload_id,
            "PartNumber": number,
            "Body": data,
            **sums,
        }
        resp = retrier.call(lambda: client.upload_part(**params), give_up_for(f"part {number}"))
        if on_bytes is not None:
            on_bytes(len(data))
        done = {"PartNumber": number, "ETag": resp["ETag"]}
        if "ChecksumCRC32C" in sums:
            done["ChecksumCRC32C"] = sums["ChecksumCRC32C"]
        return done

    count = -(-size // part)
    try:
        with ThreadPoolExecutor(
            max_workers=min(config.max_concurrency, count), thread_name_prefix="fastload-upload"
        ) as pool:
            parts = list(pool.map(send, range(1, count + 1)))
        resp = retrier.call(
            lambda: client.complete_multipart_upload(
                Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
            ),
            give_up_for("completing"),
        )
    except BaseException:
        abort(client, bucket, key, upload_id, retrier)
        raise
    return str(resp.get("ETag", ""))


def abort(client: Any, bucket: str, key: str, upload_id: str, retrier: Retrier) -> None:
    """Abort a multipart upload (retried); errors while aborting are reported, not raised over the cause."""

    def give_up(failure: Failure, tries: int, elapsed_s: float) -> Exception:
        return S3Error(
            f"could not abort multipart upload {upload_id} of s3://{bucket}/{key} "
            f"({failure.message}); abort it by hand or with a lifecycle rule",
            bucket=bucket,
            key=key,
        )

    try:
        retrier.call(
            lambda: client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id), give_up
        )
    except S3Error as exc:
        import warnings

        warnings.warn(str(exc), RuntimeWarning, stacklevel=2)


def abort_stale_uploads(
    client: Any,
    bucket: str,
    prefix: str,
    *,
    config: S3Config,
    keys: Collection[str] | None = None,
    match: Callable[[str], bool] | None = None,
) -> int:
    """Abort every open multipart upload under ``prefix`` (only those of ``keys``, and of keys ``match``
    accepts, when given); return how many were aborted."""
    retrier = Retrier.from_config(config)

    def spent(failure: Failure, tries: int, elapsed_s: float) -> Exception:
        return S3Error(
            f"listing open multipart uploads under s3://{bucket}/{prefix} failed ({failure.message})",
            bucket=bucket,
            key=prefix,
        )

    give_up = give_up_on(bucket, prefix, what="list uploads in", spent=spent)
    params: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
    aborted = 0
    while True:
        page = retrier.call(lambda p=dict(params): client.list_multipart_uploads(**p), give_up)  # type: ignore[misc]
        for upload in page.get("Uploads", []):
            if (keys is not None and upload["Key"] not in keys) or (
                match is not None and not match(upload["Key"])
            ):
                continue
            abort(client, bucket, upload["Key"], upload["UploadId"], retrier)
            aborted += 1
        if not page.get("IsTruncated"):
            return aborted
        params["KeyMarker"] = page.get("NextKeyMarker")
        params["UploadIdMarker"] = page.get("NextUploadIdMarker")
