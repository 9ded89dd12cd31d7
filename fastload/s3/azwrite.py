"""Writes and properties on Azure Blob Storage (``az://``): Put Blob (one request, a block blob whole or not
at all; a retry sends it again), Delete Blob, a blob's size; signed as reads are (``s3.azstore``), retried
on 429/5xx and resets, named by their ``az://`` URL when they fail for good. ``index.json`` is published
conditionally (:func:`get_with_etag`, :func:`upload_if`): read with its ETag, written with ``If-Match`` on
it (``If-None-Match: *`` where there is none), so a writer that published meanwhile is never overwritten."""

from __future__ import annotations

import contextlib

from fastload.config import S3Config
from fastload.errors import S3NotFoundError
from fastload.s3 import httpcall
from fastload.s3.azstore import azure_account


def _call(
    config: S3Config,
    method: str,
    url: str,
    what: str,
    body: httpcall.Body = None,
    headers: dict[str, str] | None = None,
) -> httpcall.Answer:
    sign = azure_account().sign
    service = "Azure Blob Storage"
    return httpcall.call(
        config, method, url, what=what, service=service, sign=sign, body=body, headers=headers
    )


def _url(container: str, blob: str) -> str:
    account = azure_account()
    return account.with_sas(account.url(container, blob))


def blob_size(container: str, blob: str, config: S3Config) -> int | None:
    """The size of ``az://container/blob``, or None if there is none."""
    try:
        resp = _call(config, "HEAD", _url(container, blob), f"az://{container}/{blob}")
    except S3NotFoundError:
        return None
    return int(resp.headers.get("content-length", "0"))


def upload(source: httpcall.Body, container: str, blob: str, config: S3Config) -> str | None:
    """``source`` (bytes, a local file's path or a stream) as the block blob ``az://container/blob``; the
    MD5 (base64) Azure reports of what it stored, None if it reports none."""
    url = _url(container, blob)
    answer = _call(config, "PUT", url, f"az://{container}/{blob}", source, {"x-ms-blob-type": "BlockBlob"})
    return answer.headers.get("content-md5") or None


def get_with_etag(container: str, blob: str, config: S3Config) -> tuple[bytes, str] | None:
    """The bytes of ``az://container/blob`` and their ETag (one Get Blob), or None if there is none."""
    try:
        answer = _call(config, "GET", _url(container, blob), f"az://{container}/{blob}")
    except S3NotFoundError:
        return None
    return answer.body, answer.headers.get("etag", "")


def upload_if(data: bytes, container: str, blob: str, config: S3Config, *, etag: str | None) -> str:
    """``data`` as ``az://container/blob`` only if the blob there still has ``etag`` (``If-Match``; None:
    only if there is none, ``If-None-Match: *``); the new ETag. :class:`PreconditionFailedError` when Azure
    refuses (412, or 409 ``BlobAlreadyExists``), a retry whose first attempt landed included."""
    condition = {"If-None-Match": "*"} if etag is None else {"If-Match": etag}
    headers = {"x-ms-blob-type": "BlockBlob", **condition}
    answer = _call(config, "PUT", _url(container, blob), f"az://{container}/{blob}", data, headers)
    return answer.headers.get("etag", "")


def delete(container: str, blob: str, config: S3Config) -> None:
    """Delete ``az://container/blob`` (nothing happens if it is not there)."""
    with contextlib.suppress(S3NotFoundError):
        _call(config, "DELETE", _url(container, blob), f"az://{container}/{blob}")
