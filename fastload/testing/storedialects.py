"""The requests of Google Cloud Storage's JSON API and Azure Blob Storage that fastload reads with, as
``s3serve`` answers them for the same files (a benchmark origin that serves ``s3://``, ``gs://`` and
``az://`` at one speed: ``benchmarks/stores.py --cloud --origin s3serve``). Pure: a request's path, query
and headers in, what to serve out; authorisation is not checked (loopback only, as for S3).

- GCS: ``GET /storage/v1/b/BUCKET/o/NAME?alt=media`` (with Range) is the object (``x-goog-generation``
  added); without ``alt=media`` its metadata (``size``, ``generation``) as JSON; ``GET
  /storage/v1/b/BUCKET/o?prefix=P`` lists (one page).
- Azure (a request with ``x-ms-version``): ``GET/HEAD /ACCOUNT/CONTAINER/BLOB`` is the object;
  ``?restype=container&comp=list&prefix=P`` lists (one page, XML).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from xml.sax.saxutils import escape

_GCS_OBJECT = re.compile(r"/storage/v1/b/([^/]+)/o/(.+)")
_GCS_LIST = re.compile(r"/storage/v1/b/([^/]+)/o/?")


@dataclass(frozen=True)
class Route:
    """What a GCS or Azure request asks of the bucket: ``object`` (``key``; with ``gcs_generation``: add
    the header), ``gcs-meta`` (``key``'s metadata), ``gcs-list`` or ``az-list`` (keys under ``prefix``)."""

    kind: str
    bucket: str
    key: str = ""
    prefix: str = ""
    gcs_generation: bool = False


def route(path: str, query: Mapping[str, str], header: Callable[[str], str | None]) -> Route | None:
    """The route of a request (``path`` percent-decoded), or None: an S3 request."""
    if m := _GCS_OBJECT.fullmatch(path):
        kind = "object" if query.get("alt") == "media" else "gcs-meta"
        return Route(kind, m[1], m[2], gcs_generation=kind == "object")
    if m := _GCS_LIST.fullmatch(path):
        return Route("gcs-list", m[1], prefix=query.get("prefix", ""))
    if header("x-ms-version") is None:
        return None
    _account, _, rest = path.lstrip("/").partition("/")
    container, _, blob = rest.partition("/")
    if query.get("comp") == "list":
        return Route("az-list", container, prefix=query.get("prefix", ""))
    return Route("object", container, blob)


def generation(st: os.stat_result) -> str:
    """A GCS generation for a file: changes when the file does."""
    return str(st.st_mtime_ns ^ st.st_ino)


def gcs_meta(st: os.stat_result) -> bytes:
    return json.dumps({"size": str(st.st_size), "generation": generation(st)}).encode()


def gcs_list(listed: list[tuple[str, int]]) -> bytes:
    return json.dumps({"items": [{"name": k, "size": str(n)} for k, n in listed]}).encode()


def azure_list(listed: list[tuple[str, int]]) -> bytes:
    blobs = "".join(
        f"<Blob><Name>{escape(k)}</Name><Properties><Content-Length>{n}</Content-Length></Properties></Blob>"
        for k, n in listed
    )
    head = '<?xml version="1.0" encoding="utf-8"?><EnumerationResults>'
    return f"{head}<Blobs>{blobs}</Blobs><NextMarker/></EnumerationResults>".encode()
