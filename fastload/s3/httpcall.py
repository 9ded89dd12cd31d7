"""One whole request to a store's HTTP API outside the ranged reader (an upload, a delete, an object's
metadata: ``s3.gcswrite``, ``s3.azwrite``): a body of bytes, a local file's contents or a stream (another
store's object, opened again for every attempt: :class:`Stream`), on a connection of its own, retried
as every store request is (429/5xx, resets: ``core.retry``); when it fails for good, raised naming the
object's URL and what to do. Each store passes how its requests are authorised (``sign``: a Bearer token,
a Shared Key signature), applied afresh on every attempt.
"""

from __future__ import annotations

import http.client
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO
from urllib.parse import urlsplit

from fastload.config import S3Config
from fastload.core.retry import Fault
from fastload.errors import PreconditionFailedError, S3Error
from fastload.s3.client import Failure
from fastload.s3.retrying import BadResponse, Retrier
from fastload.s3.transport import error_failure
from fastload.s3.urlerrors import fail_fast_url_error

ERROR_BODY_BYTES = 64 << 10
Sign = Callable[[str, str, dict[str, str]], dict[str, str]]  # (method, url, headers) -> headers to send


SEND_BLOCK_BYTES = 1 << 20  # a file or stream body is sent in reads of this size


@dataclass(frozen=True)
class Stream:
    """A body of ``size`` bytes read from what ``open()`` returns (a new one for every attempt)."""

    open: Callable[[], BinaryIO]
    size: int


Body = bytes | str | Stream | None  # str: a local file's path


@dataclass(frozen=True)
class Answer:
    """A store's answer to :func:`call`: status, headers (names lower-cased) and the whole body."""

    status: int
    headers: dict[str, str]
    body: bytes


def request_once(
    config: S3Config, method: str, url: str, body: Body, headers: dict[str, str], sign: Sign
) -> Answer:
    """One attempt (``body``: bytes, a local file's path or a :class:`Stream`, sent with its
    ``Content-Length``); a :class:`~fastload.s3.retrying.BadResponse` for a status of 300 or more."""
    parts = urlsplit(url)
    conn: http.client.HTTPConnection
    timeout, block = config.read_timeout_s, SEND_BLOCK_BYTES
    if parts.scheme == "https":
        context = ssl.create_default_context()
        conn = http.client.HTTPSConnection(
            parts.hostname or "", parts.port, timeout=timeout, context=context, blocksize=block
        )
    else:
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout, blocksize=block)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    sent = dict(headers)
    if body is not None:
        if isinstance(body, str):
            size = os.path.getsize(body)
        else:
            size = body.size if isinstance(body, Stream) else len(body)
        sent = {"Content-Length": str(size), "Content-Type": "application/octet-stream", **sent}
    sent = sign(method, url, sent)
    try:
        if isinstance(body, (str, Stream)):
            with open(body, "rb") if isinstance(body, str) else body.open() as f:
                conn.request(method, target, body=f, headers=sent)
                resp = conn.getresponse()
        else:
            conn.request(method, target, body=body, headers=sent)
            resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    if resp.status >= 300:
        raise BadResponse(error_failure(resp.status, data[:ERROR_BODY_BYTES]))
    return Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)


def call(
    config: S3Config,
    method: str,
    url: str,
    *,
    what: str,
    service: str,
    sign: Sign,
    body: Body = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    """:func:`request_once`, retried by the config's policy. ``what`` (the ``gs://``/``az://`` URL) names
    the object in errors: not found, denied or refused at once (``S3NotFoundError``...), else after the
    last attempt an ``S3Error`` that says to check the connection to ``service``. A refused condition (412:
    GCS's ``ifGenerationMatch``, Azure's ``If-Match``; Azure's 409 ``BlobAlreadyExists`` for
    ``If-None-Match: *``) raises :class:`PreconditionFailedError` at once: read again and retry."""

    def give_up(failure: Failure, tries: int, elapsed_s: float) -> Exception:
        if failure.fault is Fault.CHANGED or "BlobAlreadyExists" in failure.message:
            return PreconditionFailedError(
                f"{what} changed since it was read ({failure.message}): another writer published first",
                bucket="",
                key=what,
                url=what,
            )
        if failure.fault in (Fault.NOT_FOUND, Fault.DENIED, Fault.CLIENT):
            return fail_fast_url_error(failure, what)
        return S3Error(
            f"{what}: {method} failed after {tries} attempts in {elapsed_s:.1f}s ({failure.message}); "
            f"check the connection to {service} and run the command again",
            bucket="",
            key=what,
            url=what,
        )

    answer: Answer = Retrier.from_config(config).call(
        lambda: request_once(config, method, url, body, headers or {}, sign), give_up
    )
    return answer
