"""Server-side copies between two keys of one S3 endpoint: no byte passes through this process.

``CopyObject`` for an object up to :data:`MAX_COPY_OBJECT_BYTES` (S3's limit for it), else a multipart
upload whose parts are ``UploadPartCopy`` ranges of the source, ``max_concurrency`` at once. Every request
goes through the retry loop (:mod:`fastload.s3.retrying`) and names the source by the ETag it was listed
with (``x-amz-copy-source-if-match``): a source replaced during the copy fails with 412 and is reported,
never copied half old, half new. Stores that ignore that header (Ceph RGW and moto, as tested) are caught
for a copy in parts by a HEAD of the source before the upload is completed: a changed ETag aborts it. A
failed multipart copy is aborted, so nothing appears under the key. (One CopyObject is atomic: on such a
store a source replaced meanwhile is copied whole in its newer version.)

A copy of a multipart source (or one copied in parts) gets an ETag of its own parts, not the source's: the
source's ETag is recorded in the copy's metadata (``x-amz-meta-fastload-source-etag``,
:data:`fastload.core.syncplan.SOURCE_ETAG_META`, read back by :func:`recorded_source_etag`), so the next
``fastload cp`` knows the two are the same bytes. The source's ``Content-Type`` and user metadata are kept.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastload.config import S3Config
from fastload.core.retry import Fault
from fastload.core.syncplan import SOURCE_ETAG_META, multipart_parts
from fastload.errors import NotFoundError, S3Error
from fastload.s3.client import Failure, get_client
from fastload.s3.retrying import GiveUp, Retrier, give_up_on
from fastload.s3.upload import abort, part_size_for

MAX_COPY_OBJECT_BYTES = 5 << 30  # CopyObject's limit; larger objects are copied in parts


def copy_object(
    src_bucket: str,
    src_key: str,
    bucket: str,
    key: str,
    *,
    size: int,
    etag: str,
    config: S3Config,
    client: Any = None,
    retrier: Retrier | None = None,
    max_single_bytes: int = MAX_COPY_OBJECT_BYTES,
    on_bytes: Callable[[int], None] | None = None,
) -> str:
    """Copy ``s3://src_bucket/src_key`` (``size`` bytes, listed with ``etag``) to ``s3://bucket/key`` on
    the server; return the copy's ETag. ``on_bytes(n)`` as each ``n`` bytes are copied (from any thread).
    ``max_single_bytes``: the largest object copied with one ``CopyObject`` (tests lower it)."""
    client = client if client is not None else get_client(config)
    retrier = retrier or Retrier.from_config(config)
    etag = etag.strip('"')
    source = f"s3://{src_bucket}/{src_key}"
    copy_source = {"Bucket": src_bucket, "Key": src_key}
    guard = {"CopySourceIfMatch": f'"{etag}"'} if etag else {}
    give_up = _give_up(source, bucket, key)
    if size <= max_single_bytes:
        params: dict[str, Any] = {"Bucket": bucket, "Key": key, "CopySource": copy_source, **guard}
        if multipart_parts(etag):
            params.update(_kept_metadata(client, retrier, src_bucket, src_key, etag, give_up("HEAD")))
            params["MetadataDirective"] = "REPLACE"
        resp = retrier.call(lambda: client.copy_object(**params), give_up("CopyObject"))
        if on_bytes is not None:
            on_bytes(size)
        return str(resp.get("CopyObjectResult", {}).get("ETag", "")).strip('"')
    create = {"Bucket": bucket, "Key": key}
    create.update(_kept_metadata(client, retrier, src_bucket, src_key, etag, give_up("HEAD")))
    upload_id = retrier.call(lambda: client.create_multipart_upload(**create), give_up("starting"))[
        "UploadId"
    ]
    part = part_size_for(size, config.part_size_bytes)
    count = -(-size // part)

    def send(number: int) -> dict[str, Any]:
        first = (number - 1) * part
        last = min(size, first + part) - 1
        params = {
            "Bucket": bucket,
            "Key": key,
            "UploadId": upload_id,
            "PartNumber": number,
            "CopySource": copy_source,
            "CopySourceRange": f"bytes={first}-{last}",
            **guard,
        }
        resp = retrier.call(lambda: client.upload_part_copy(**params), give_up(f"UploadPartCopy {number}"))
        if on_bytes is not None:
            on_bytes(last + 1 - first)
        return {"PartNumber": number, "ETag": resp["CopyPartResult"]["ETag"]}

    try:
        with ThreadPoolExecutor(
            max_workers=min(config.max_concurrency, count), thread_name_prefix="fastload-copy"
        ) as pool:
            parts = list(pool.map(send, range(1, count + 1)))
        now = _head(client, retrier, src_bucket, src_key, give_up("HEAD")).get("ETag", "")
        if etag and str(now).strip('"') != etag:  # (stores that ignore the If-Match: RGW, moto)
            raise _changed(source, bucket, key, "its ETag after the parts were copied")
        resp = retrier.call(
            lambda: client.complete_multipart_upload(
                Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
            ),
            give_up("completing"),
        )
    except BaseException:
        abort(client, bucket, key, upload_id, retrier)
        raise
    return str(resp.get("ETag", "")).strip('"')


def recorded_source_etag(
    bucket: str, key: str, *, config: S3Config, client: Any = None, retrier: Retrier | None = None
) -> str | None:
    """The source ETag a server-side copy recorded on ``s3://bucket/key`` (one HEAD), or None: none
    recorded, or no such object."""
    client = client if client is not None else get_client(config)
    retrier = retrier or Retrier.from_config(config)
    try:
        head = _head(client, retrier, bucket, key, _give_up(f"s3://{bucket}/{key}", bucket, key)("HEAD"))
    except NotFoundError:
        return None
    value = (head.get("Metadata") or {}).get(SOURCE_ETAG_META)
    return str(value).strip('"').lower() if value else None


def _head(client: Any, retrier: Retrier, bucket: str, key: str, give_up: GiveUp) -> dict[str, Any]:
    return dict(retrier.call(lambda: client.head_object(Bucket=bucket, Key=key), give_up))


def _kept_metadata(
    client: Any, retrier: Retrier, bucket: str, key: str, etag: str, give_up: GiveUp
) -> dict[str, Any]:
    """The source's Content-Type and user metadata, plus the source ETag (:data:`SOURCE_ETAG_META`)."""
    head = _head(client, retrier, bucket, key, give_up)
    out: dict[str, Any] = {"Metadata": {**(head.get("Metadata") or {}), SOURCE_ETAG_META: etag}}
    if head.get("ContentType"):
        out["ContentType"] = head["ContentType"]
    return out


def _give_up(source: str, bucket: str, key: str) -> Callable[[str], GiveUp]:
    """The ``give_up`` of each request of a copy of ``source`` to ``s3://bucket/key``."""

    def for_request(what: str) -> GiveUp:
        def spent(failure: Failure, tries: int, elapsed_s: float) -> Exception:
            if failure.fault is Fault.CHANGED:
                return _changed(source, bucket, key, f"{what}: 412 Precondition Failed")
            return S3Error(
                f"copying {source} to s3://{bucket}/{key}: {what} failed after {tries} attempt(s) in "
                f"{elapsed_s:.1f}s ({failure.message}); nothing was left under the key: retry later",
                bucket=bucket,
                key=key,
            )

        return give_up_on(bucket, key, what="copy to", spent=spent)

    return for_request


def _changed(source: str, bucket: str, key: str, how: str) -> S3Error:
    return S3Error(
        f"copying {source} to s3://{bucket}/{key}: the source changed while it was copied ({how}); nothing "
        "was written under the key: run the copy again",
        bucket=bucket,
        key=key,
    )
