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
import json
from urllib.parse import quote

from fastload.config import S3Config
from fastload.s3 import httpcall
from fastload.s3.gcsstore import gcs_auth, gcs_endpoint, object_path


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
    url = (
        f"{gcs_endpoint()}/upload/storage/v1/b/{quote(bucket, safe='')}/o?uploadType=media"
        f"&name={quote(name, safe='')}"
    )
    answer = _call(config, "POST", url, gs_url(bucket, name), source)
    try:
        md5 = json.loads(answer).get("md5Hash")
    except (ValueError, AttributeError):
        return None
    return str(md5) if md5 else None


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
