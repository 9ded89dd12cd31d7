"""Google Cloud Storage (``gs://``) as a store: its transport behind ``s3.objectio``'s seam, so its objects
are read by the same ranged reader as S3's (parallel ranged GETs, retries on 429/5xx and resets, a checked
``Content-Range`` on every 206, the whole-object-200 rule, hedging, the AIMD gate, ``s3_stats`` counters).

Requests are GCS's JSON API over fastload's pooled HTTP/1.1 (:class:`~fastload.s3.transport.HttpPools`,
shared with the web store): ``GET /storage/v1/b/BUCKET/o/NAME?alt=media`` with a ``Range`` for the bytes,
the object's metadata (``size``, ``generation``) for a HEAD, ``/storage/v1/b/BUCKET/o?prefix=`` to list and
``/upload/storage/v1/b/BUCKET/o?uploadType=media`` to write. Why not a client library: measured in
``benchmarks/RESULTS.md`` (the SDK and obstore cost more CPU per GiB for ranged reads, and would need the
range contract rebuilt around them).

Pinning: the object's *generation* plays the ETag's part. Every media answer carries ``x-goog-generation``
(and a HEAD's metadata its ``generation``); the reader keeps the first as the object's ETag, compares every
later answer's with it and sends it back as ``If-Match``, which this transport turns into
``ifGenerationMatch=`` (GCS answers 412 when the object was replaced: ``ObjectChangedError``).

Configuration, as Google's own clients read it: ``STORAGE_EMULATOR_HOST`` (``host:port`` or a URL) sends
every request to an emulator, unauthenticated; otherwise a Bearer token from application default
credentials (``GOOGLE_APPLICATION_CREDENTIALS``, ``gcloud auth application-default login``, the metadata
server), through ``google-auth`` (imported only here, only then). ``S3Config(unsigned=True)``
(``--no-sign-request``) reads public buckets without a token. Tokens never reach a log or a message.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any
from urllib.parse import quote

from fastload.config import S3Config
from fastload.core.retry import Fault
from fastload.core.weburls import parse_gs_url
from fastload.errors import AccessDeniedError, ConfigError, IndexFormatError, S3Error
from fastload.s3.client import Failure
from fastload.s3.httpstore import get_document, http_pools
from fastload.s3.objectio import Abort, Body
from fastload.s3.reader import RangedReader
from fastload.s3.retrying import BadResponse
from fastload.s3.transport import HttpPools

GCS_ENDPOINT = "https://storage.googleapis.com"
SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
_REFRESH_MARGIN_S = 300.0  # a token this close to expiry is refreshed before use


def gcs_endpoint() -> str:
    """Where requests go: ``STORAGE_EMULATOR_HOST`` (``host:port`` means ``http://host:port``, as Google's
    clients read it), else GCS's own endpoint."""
    host = os.environ.get("STORAGE_EMULATOR_HOST", "").strip().rstrip("/")
    if not host:
        return GCS_ENDPOINT
    return host if "://" in host else f"http://{host}"


class GcsAuth:
    """The ``Authorization`` header of GCS requests: none for an emulator or ``unsigned``; else a Bearer
    token of application default credentials, refreshed before it expires (one refresh at a time)."""

    def __init__(self, anonymous: bool) -> None:
        self._anonymous = anonymous
        self._creds: Any = None
        self._lock = threading.Lock()

    def headers(self) -> dict[str, str]:
        if self._anonymous:
            return {}
        with self._lock:
            creds = self._creds = self._creds or _default_credentials()
            expiry = getattr(creds, "expiry", None)
            stale = expiry is not None and expiry.timestamp() - _REFRESH_MARGIN_S < time.time()
            if not getattr(creds, "token", None) or stale:
                _refresh(creds)
            return {"Authorization": f"Bearer {creds.token}"}

    def close(self) -> None:
        """(Kept by ``s3.runtime``, which closes what it keeps: nothing to close.)"""


def _refresh(creds: Any) -> None:
    """A new access token for ``creds``; a failure as an error that says what to check (no token in it)."""
    import google.auth.exceptions
    import google.auth.transport.requests

    try:
        creds.refresh(google.auth.transport.requests.Request())
    except google.auth.exceptions.RefreshError as exc:
        raise AccessDeniedError(
            f"gs://: Google refused the credentials' token request ({type(exc).__name__}: {str(exc)[:200]}); "
            "check GOOGLE_APPLICATION_CREDENTIALS or run `gcloud auth application-default login` again",
            bucket="",
            key="gs://",
        ) from None
    except google.auth.exceptions.TransportError as exc:
        raise S3Error(
            f"gs://: could not reach Google's token service for an access token ({str(exc)[:200]}); check "
            "the network (HTTPS_PROXY), then run again",
            bucket="",
            key="gs://",
        ) from None


def _default_credentials() -> Any:
    try:
        import google.auth
        import google.auth.exceptions
    except ImportError:
        raise ConfigError(
            "reading gs:// needs Google credentials, found through google-auth: pip install google-auth "
            "(or set STORAGE_EMULATOR_HOST for an emulator, or pass --no-sign-request / "
            "S3Config(unsigned=True) for a public bucket)"
        ) from None
    try:
        creds, _project = google.auth.default(scopes=[SCOPE])
    except google.auth.exceptions.DefaultCredentialsError:
        raise ConfigError(
            "no Google credentials found for gs://: set GOOGLE_APPLICATION_CREDENTIALS to a service "
            "account's key file or run `gcloud auth application-default login` (for a public bucket: "
            "--no-sign-request / S3Config(unsigned=True); for an emulator: STORAGE_EMULATOR_HOST)"
        ) from None
    return creds


def gcs_auth(config: S3Config) -> GcsAuth:
    """This process's :class:`GcsAuth` under ``config`` (kept by ``s3.runtime``: new after fork)."""
    from fastload.s3 import runtime

    anonymous = config.unsigned or gcs_endpoint() != GCS_ENDPOINT
    auth: GcsAuth = runtime.current().transports.get(("gcs-auth", anonymous), lambda: GcsAuth(anonymous))
    return auth


def object_path(bucket: str, name: str) -> str:
    """The JSON API's path of an object (the name escaped whole: ``/`` too)."""
    return f"/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}"


class _MetaBody:
    """A HEAD's answer made of the object's metadata: its size and generation (no body)."""

    def __init__(self, size: int, generation: str | None) -> None:
        self.status = 200
        self.content_range: str | None = None
        self.content_length: int | None = size
        self.etag: str | None = generation

    def readinto(self, view: memoryview) -> int:
        return 0

    def close(self) -> None:
        pass


class GcsObject:
    """Requests on ``gs://bucket/name`` (see the module docstring)."""

    abortable = True

    def __init__(self, pools: HttpPools, auth: GcsAuth, endpoint: str, bucket: str, name: str) -> None:
        self._pools, self._auth = pools, auth
        self._url = endpoint + object_path(bucket, name)

    @staticmethod
    def _pinned(url: str, headers: dict[str, str]) -> tuple[str, dict[str, str]]:
        """``If-Match`` (the generation, standing for an ETag) as GCS's ``ifGenerationMatch``."""
        sent = dict(headers)
        generation = sent.pop("If-Match", None)
        return (f"{url}&ifGenerationMatch={quote(generation)}" if generation else url), sent

    def get(self, headers: dict[str, str], *, abort: Abort | None = None, fresh: bool = False) -> Body:
        url, sent = self._pinned(f"{self._url}?alt=media", headers)
        body = self._pools.send("GET", url, {**self._auth.headers(), **sent}, abort, fresh)
        body.etag = body.headers.get("x-goog-generation")  # the version's name; no generation: size only
        return body

    def head(self, headers: dict[str, str]) -> Body:
        url, sent = self._pinned(f"{self._url}?fields=size,generation", headers)
        body = self._pools.send("GET", url, {**self._auth.headers(), **sent})
        try:
            data = bytearray()
            piece = memoryview(bytearray(1 << 14))
            while n := body.readinto(piece):
                data += piece[:n]
        finally:
            body.close()
        try:
            meta = json.loads(data)
            return _MetaBody(int(meta["size"]), str(meta["generation"]) if meta.get("generation") else None)
        except (ValueError, KeyError, TypeError):
            failure = Failure(Fault.BAD_RANGE, body.status, "object metadata without a size")
            raise BadResponse(failure) from None


def open_gcs(url: str, config: S3Config) -> RangedReader:
    """The ranged reader of the object ``gs://bucket/name``."""
    bucket, name = parse_gs_url(url)
    if not name or name.endswith("/"):
        raise ConfigError(f"{url!r} names a folder, not an object; give the object's full name")
    endpoint = gcs_endpoint()

    def store() -> GcsObject:
        return GcsObject(http_pools(config), gcs_auth(config), endpoint, bucket, name)

    return RangedReader("", url, config=config, store=store, url=url)


def list_gcs(root: str, config: S3Config) -> list[tuple[str, int]]:
    """``(gs:// URL, size)`` of every object under the folder ``root`` (recursive), in name order; paged
    by ``nextPageToken``."""
    bucket, prefix = parse_gs_url(root)
    prefix = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
    base = f"{gcs_endpoint()}/storage/v1/b/{quote(bucket, safe='')}/o?prefix={quote(prefix, safe='')}"
    base += "&fields=items(name,size),nextPageToken"
    found: list[tuple[str, int]] = []
    token: str | None = None
    auth = gcs_auth(config)
    while True:
        url = base if token is None else f"{base}&pageToken={quote(token, safe='')}"
        data, _headers = get_document(url, config, auth.headers())
        try:
            page = json.loads(data)
            found += [(f"gs://{bucket}/{item['name']}", int(item["size"])) for item in page.get("items", [])]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise IndexFormatError(f"{url}: GCS's listing answered something that is not its JSON") from None
        token = page.get("nextPageToken")
        if not token:
            return sorted(found)
