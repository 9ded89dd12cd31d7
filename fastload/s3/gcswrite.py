"""Writes and metadata on Google Cloud Storage (``gs://``): an object's metadata, a media upload from a file
or bytes, a delete; each request retried as every store request is (429/5xx, resets: ``core.retry``) and,
when it fails for good, raised naming the ``gs://`` URL and what to do. Reads go through the ranged reader
(``s3.gcsstore``).

Uploads are single media uploads (``uploadType=media``): the object appears whole or not at all, and a
retry sends the file again from its start. (Resumable uploads, for shards of many GiB on a flaky link, are
not built.)
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import ssl
from urllib.parse import quote, urlsplit

from fastload.config import S3Config
from fastload.core.retry import Fault
from fastload.errors import S3Error
from fastload.s3.client import Failure
from fastload.s3.gcsstore import gcs_auth, gcs_endpoint, object_path
from fastload.s3.retrying import BadResponse, Retrier
from fastload.s3.transport import error_failure
from fastload.s3.urlerrors import fail_fast_url_error

_ERROR_BODY_BYTES = 64 << 10


def _request(
    config: S3Config, method: str, url: str, body: bytes | str | None, headers: dict[str, str]
) -> bytes:
    """One request (``body``: bytes, or the path of a file to send); the answer's body. BadResponse for an
    error status."""
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(
            host, port, timeout=config.read_timeout_s, context=ssl.create_default_context()
        )
    else:
        conn = http.client.HTTPConnection(host, port, timeout=config.read_timeout_s)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    sent = {**gcs_auth(config).headers(), **headers}
    try:
        if isinstance(body, str):
            sent["Content-Length"] = str(os.path.getsize(body))
            with open(body, "rb") as f:
                conn.request(method, target, body=f, headers=sent)
                resp = conn.getresponse()
        else:
            conn.request(method, target, body=body, headers=sent)
            resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    if resp.status >= 300:
        raise BadResponse(error_failure(resp.status, data[:_ERROR_BODY_BYTES]))
    return data


def _call(config: S3Config, method: str, url: str, what: str, body: bytes | str | None = None) -> bytes:
    headers = {"Content-Type": "application/octet-stream"} if body is not None else {}

    def give_up(failure: Failure, tries: int, elapsed_s: float) -> Exception:
        if failure.fault in (Fault.NOT_FOUND, Fault.DENIED, Fault.CLIENT):
            return fail_fast_url_error(failure, what)
        return S3Error(
            f"{what}: {method} failed after {tries} attempts in {elapsed_s:.1f}s ({failure.message}); "
            "check the connection to Google Cloud Storage and run the command again",
            bucket="",
            key=what,
            url=what,
        )

    return Retrier.from_config(config).call(lambda: _request(config, method, url, body, headers), give_up)


def gs_url(bucket: str, name: str) -> str:
    return f"gs://{bucket}/{name}"


def object_size(bucket: str, name: str, config: S3Config) -> int | None:
    """The size of ``gs://bucket/name``, or None if there is none."""
    from fastload.errors import S3NotFoundError

    url = f"{gcs_endpoint()}{object_path(bucket, name)}?fields=size"
    try:
        meta = json.loads(_call(config, "GET", url, gs_url(bucket, name)))
    except S3NotFoundError:
        return None
    return int(meta["size"])


def upload(source: bytes | str, bucket: str, name: str, config: S3Config) -> None:
    """``source`` (bytes, or a local file's path) as ``gs://bucket/name``, whole or not at all."""
    url = (
        f"{gcs_endpoint()}/upload/storage/v1/b/{quote(bucket, safe='')}/o?uploadType=media"
        f"&name={quote(name, safe='')}"
    )
    _call(config, "POST", url, gs_url(bucket, name), source)


def delete(bucket: str, name: str, config: S3Config) -> None:
    """Delete ``gs://bucket/name`` (nothing happens if it is not there)."""
    from fastload.errors import S3NotFoundError

    with contextlib.suppress(S3NotFoundError):
        _call(config, "DELETE", f"{gcs_endpoint()}{object_path(bucket, name)}", gs_url(bucket, name))
