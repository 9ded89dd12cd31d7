"""Writes and properties on Azure Blob Storage (``az://``): Put Blob (one request, a block blob whole or not
at all; a retry sends it again), Delete Blob, a blob's size; signed as reads are (``s3.azstore``), retried
on 429/5xx and resets, named by their ``az://`` URL when they fail for good."""

from __future__ import annotations

import contextlib
import http.client
import os
from urllib.parse import urlsplit

from fastload.config import S3Config
from fastload.core.retry import Fault
from fastload.errors import S3Error, S3NotFoundError
from fastload.s3.azstore import azure_account
from fastload.s3.client import Failure
from fastload.s3.retrying import BadResponse, Retrier
from fastload.s3.transport import error_failure
from fastload.s3.urlerrors import fail_fast_url_error


def _request(
    config: S3Config, method: str, url: str, body: bytes | str | None, headers: dict[str, str]
) -> http.client.HTTPResponse:
    parts = urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname or "", parts.port, timeout=config.read_timeout_s)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    size = os.path.getsize(body) if isinstance(body, str) else len(body or b"")
    sent = dict(headers)
    if method == "PUT":
        sent.update({"Content-Length": str(size), "Content-Type": "application/octet-stream"})
    sent = azure_account().sign(method, url, sent)
    try:
        if isinstance(body, str):
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
        raise BadResponse(error_failure(resp.status, data[: 64 << 10]))
    return resp


def _call(
    config: S3Config,
    method: str,
    url: str,
    what: str,
    body: bytes | str | None = None,
    headers: dict[str, str] | None = None,
) -> http.client.HTTPResponse:
    def give_up(failure: Failure, tries: int, elapsed_s: float) -> Exception:
        if failure.fault in (Fault.NOT_FOUND, Fault.DENIED, Fault.CLIENT):
            return fail_fast_url_error(failure, what)
        return S3Error(
            f"{what}: {method} failed after {tries} attempts in {elapsed_s:.1f}s ({failure.message}); check "
            "the connection to Azure Blob Storage and run the command again",
            bucket="",
            key=what,
            url=what,
        )

    resp: http.client.HTTPResponse = Retrier.from_config(config).call(
        lambda: _request(config, method, url, body, headers or {}), give_up
    )
    return resp


def _url(container: str, blob: str) -> str:
    account = azure_account()
    return account.with_sas(account.url(container, blob))


def blob_size(container: str, blob: str, config: S3Config) -> int | None:
    """The size of ``az://container/blob``, or None if there is none."""
    try:
        resp = _call(config, "HEAD", _url(container, blob), f"az://{container}/{blob}")
    except S3NotFoundError:
        return None
    return int(resp.headers.get("Content-Length", "0"))


def upload(source: bytes | str, container: str, blob: str, config: S3Config) -> None:
    """``source`` (bytes, or a local file's path) as the block blob ``az://container/blob``."""
    url = _url(container, blob)
    _call(config, "PUT", url, f"az://{container}/{blob}", source, {"x-ms-blob-type": "BlockBlob"})


def delete(container: str, blob: str, config: S3Config) -> None:
    """Delete ``az://container/blob`` (nothing happens if it is not there)."""
    with contextlib.suppress(S3NotFoundError):
        _call(config, "DELETE", _url(container, blob), f"az://{container}/{blob}")
