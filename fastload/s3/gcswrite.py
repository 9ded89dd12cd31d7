"""Writes and metadata on Google Cloud Storage (``gs://``): an object's metadata, a media upload from a file
or bytes, a delete; each request retried as every store request is (429/5xx, resets: ``core.retry``) and,
when it fails for good, raised naming the ``gs://`` URL and what to do. Reads go through the ranged reader
(``s3.gcsstore``).

``index.json`` is published conditionally (:func:`get_with_generation`, :func:`upload_if`): read with the
generation it has, written with ``ifGenerationMatch`` on that generation (``0``: only where there is no
object), so a writer that published meanwhile is never overwritten (412:
:class:`~fastload.errors.PreconditionFailedError`).

Uploads are single media uploads (``uploadType=media``): the object appears whole or not at all, and a
retry sends the file again from its start. (Resumable uploads, for shards of many GiB on a flaky link, are
not built.)
"""

from __future__ import annotations

import contextlib
import json
from urllib.parse import quote

from fastload.config import S3Config
from fastload.s3 import httpcall
from fastload.s3.gcsstore import gcs_auth, gcs_endpoint, object_path

READ_ATTEMPTS = 10  # reads of an object replaced between its metadata and its bytes before giving up


def _call(config: S3Config, method: str, url: str, what: str, body: httpcall.Body = None) -> bytes:
    def sign(method: str, url: str, headers: dict[str, str]) -> dict[str, str]:
        return {**gcs_auth(config).headers(), **headers}

    service = "Google Cloud Storage"
    return httpcall.call(config, method, url, what=what, service=service, sign=sign, body=body).body


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


def upload(source: httpcall.Body, bucket: str, name: str, config: S3Config) -> str | None:
    """``source`` (bytes, a local file's path or a stream) as ``gs://bucket/name``, whole or not at all;
    the MD5 (base64) GCS reports of what it stored, None if it reports none."""
    return _uploaded(source, bucket, name, config, "").get("md5Hash") or None


def upload_if(data: bytes, bucket: str, name: str, config: S3Config, *, generation: str | None) -> str:
    """``data`` as ``gs://bucket/name`` only if the object there is still of ``generation`` (None: only if
    there is none, ``ifGenerationMatch=0``); the new generation. :class:`PreconditionFailedError` when GCS
    refuses (412), a retry whose first attempt landed included: read again, and see it."""
    meta = _uploaded(data, bucket, name, config, f"&ifGenerationMatch={quote(generation or '0', safe='')}")
    return meta.get("generation") or ""


def _uploaded(source: httpcall.Body, bucket: str, name: str, config: S3Config, extra: str) -> dict[str, str]:
    url = (
        f"{gcs_endpoint()}/upload/storage/v1/b/{quote(bucket, safe='')}/o?uploadType=media"
        f"&name={quote(name, safe='')}{extra}"
    )
    answer = _call(config, "POST", url, gs_url(bucket, name), source)
    try:
        meta = json.loads(answer)
    except ValueError:
        return {}
    if not isinstance(meta, dict):
        return {}
    return {k: str(v) for k, v in meta.items() if k in ("md5Hash", "generation")}


def get_with_generation(bucket: str, name: str, config: S3Config) -> tuple[bytes, str] | None:
    """The bytes of ``gs://bucket/name`` and their generation, or None if there is no such object: its
    generation from its metadata, then its bytes with ``ifGenerationMatch`` on it (replaced in between: read
    again), so bytes and generation are one version's."""
    from fastload.errors import PreconditionFailedError, S3NotFoundError

    what, path = gs_url(bucket, name), f"{gcs_endpoint()}{object_path(bucket, name)}"
    for attempt in range(READ_ATTEMPTS):
        try:
            meta = json.loads(_call(config, "GET", f"{path}?fields=generation", what))
            generation = str(meta["generation"])
            pinned = f"{path}?alt=media&ifGenerationMatch={quote(generation, safe='')}"
            return _call(config, "GET", pinned, what), generation
        except S3NotFoundError:
            return None
        except PreconditionFailedError:
            if attempt + 1 == READ_ATTEMPTS:
                raise  # (replaced between the metadata and the bytes every time)
    raise AssertionError("unreachable")


def delete(bucket: str, name: str, config: S3Config) -> None:
    """Delete ``gs://bucket/name`` (nothing happens if it is not there)."""
    from fastload.errors import S3NotFoundError

    with contextlib.suppress(S3NotFoundError):
        _call(config, "DELETE", f"{gcs_endpoint()}{object_path(bucket, name)}", gs_url(bucket, name))


def rewrite(src: tuple[str, str], dst: tuple[str, str], config: S3Config) -> int:
    """Copy ``gs://`` object ``src`` (bucket, name) to ``dst`` inside Google Cloud Storage (``rewriteTo``:
    no byte through this process; a large object takes several calls, each continuing the last); the
    size copied."""
    url = f"{gcs_endpoint()}{object_path(*src)}/rewriteTo{object_path(*dst)[len('/storage/v1') :]}"
    token = ""
    while True:
        answer = json.loads(_call(config, "POST", url + (f"?rewriteToken={quote(token)}" if token else ""),
                                  gs_url(*dst), b""))  # fmt: skip
        if answer.get("done"):
            return int(answer.get("totalBytesRewritten") or answer["resource"]["size"])
        token = answer["rewriteToken"]
