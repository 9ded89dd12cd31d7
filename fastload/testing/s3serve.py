"""A small S3-compatible endpoint on loopback that serves one local folder as one bucket, read-only.

It answers the subset of S3 that fastload (and boto3, webdataset over ``http://``) use to read:
``HEAD``/``GET`` of objects with ``Range`` (206 + ``Content-Range``; 416 when unsatisfiable), ``ETag``,
``If-Match`` (412) and ``If-None-Match`` (304); ``ListObjectsV2`` with ``prefix``, ``delimiter``,
``max-keys``, ``continuation-token``, ``start-after`` and ``encoding-type=url``; ``HeadBucket`` and
``ListBuckets``. Path-style and virtual-host addressing both work; any credentials are accepted (nothing
is checked, which is why it binds loopback only). Writes answer 501.

It emulates an object store's first-byte latency (``latency_s``: a sleep before each status line) and a
per-connection bandwidth cap (``conn_bytes_per_s``: each body is paced from its first byte), and it is
built not to be the bottleneck: bodies go out with ``socket.sendfile`` (no copy through Python), one
thread per connection, keep-alive::

    with S3Server("/data/shards", bucket="bench", latency_s=0.02, conn_bytes_per_s=50e6) as server:
        fastload.open("s3://bench/shard-000000.tar", config=S3Config(endpoint_url=server.endpoint_url))

    python -m fastload.testing.s3serve /data/shards --bucket bench --latency-ms 20 --conn-mbps 50

The command prints one JSON line (``endpoint_url``, ``bucket``, ``pid``) and serves until SIGTERM/SIGINT.
Keys map to files under the root, symlinks followed (so a served folder can link in others); a key with
an empty, ``.`` or ``..`` segment is NoSuchKey, so no key names a path above the root. The ETag is a
digest of (inode, size, mtime), stable while the file is unchanged.

GCS's JSON API and Azure's blob API are answered for the same files too (``storedialects``: reads and
listings only, no authorisation checked), so one origin serves ``s3://``, ``gs://`` and ``az://`` alike.

(Over 400 lines on purpose: one small HTTP server whose request parsing, S3 operations and paced bodies
share the same connection state; it is a test and bench fixture, not a code path of training.)
"""

from __future__ import annotations

import argparse
import base64
import binascii
import contextlib
import hashlib
import http.server
import ipaddress
import json
import os
import re
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import formatdate
from types import FrameType
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit
from xml.sax.saxutils import escape

from fastload.errors import ConfigError
from fastload.testing import storedialects
from fastload.testing.serving import ServedOnAThread

PIECE_BYTES = 64 << 10
"""Bytes per paced ``sendfile`` call: each piece leaves when its first byte is due (1.3 ms at 50 MB/s)."""
MAX_KEYS = 1000
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
_XML = '<?xml version="1.0" encoding="UTF-8"?>\n'
_NS = "http://s3.amazonaws.com/doc/2006-03-01/"


@dataclass(frozen=True)
class ServeStats:
    """Counters since the server started: requests by method, body bytes sent, connections accepted."""

    requests: dict[str, int]
    body_bytes: int
    connections: int


class _S3Error(Exception):
    def __init__(self, status: int, code: str, message: str, headers: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, tuple(headers)


def _etag(st: os.stat_result) -> str:
    digest = hashlib.md5(f"{st.st_ino}-{st.st_size}-{st.st_mtime_ns}".encode(), usedforsecurity=False)
    return f'"{digest.hexdigest()}"'


def _iso(mtime: float) -> str:
    return datetime.fromtimestamp(mtime, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _etag_matches(header: str, etag: str) -> bool:
    wanted = [t.strip() for t in header.split(",")]
    bare = etag.strip('"')
    return any(t == "*" or t.removeprefix("W/").strip('"') == bare for t in wanted)


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``(start, end_exclusive)`` for a single ``bytes=`` range of an object of ``size`` bytes, or None to
    send the whole object (no header, or a form S3 ignores such as multiple ranges). Raises
    :class:`_S3Error` 416 when the range starts at or after the end (an empty object has no valid range)."""
    if header is None:
        return None
    match = _RANGE.match(header.strip())
    if match is None or (not match[1] and not match[2]):
        return None
    if not match[1]:  # suffix: the last N bytes
        n = int(match[2])
        if n == 0 or size == 0:
            raise _S3Error(416, "InvalidRange", "The requested range is not satisfiable", _unsatisfied(size))
        return max(0, size - n), size
    start = int(match[1])
    if match[2] and int(match[2]) < start:
        return None  # an invalid range is ignored, as S3 does
    if start >= size:
        raise _S3Error(416, "InvalidRange", "The requested range is not satisfiable", _unsatisfied(size))
    end = int(match[2]) + 1 if match[2] else size
    return start, min(end, size)


def _unsatisfied(size: int) -> list[tuple[str, str]]:
    return [("Content-Range", f"bytes */{size}")]


def list_keys(root: str, prefix: str) -> list[str]:
    """Every file under ``root`` whose key starts with ``prefix``, in S3 order (UTF-8 byte order)."""
    folder, _, _ = prefix.rpartition("/")
    if folder and not _safe(folder.split("/")):
        return []  # no file has an empty, "." or ".." segment in its key
    start = os.path.join(root, *folder.split("/")) if folder else root
    keys: list[str] = []
    seen: set[tuple[int, int]] = set()
    for here, dirs, files in os.walk(start, followlinks=True):
        st = os.stat(here)
        if (st.st_dev, st.st_ino) in seen:  # a symlink loop, or a folder linked twice
            dirs.clear()
            continue
        seen.add((st.st_dev, st.st_ino))
        dirs.sort()
        rel = os.path.relpath(here, root)
        base = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        keys.extend(k for k in (base + f for f in files) if k.startswith(prefix))
    keys.sort(key=lambda k: k.encode("utf-8", "surrogateescape"))
    return keys


def _safe(parts: Sequence[str]) -> bool:
    return all(p not in ("", ".", "..") and "\0" not in p for p in parts)


@dataclass(frozen=True)
class ListPage:
    """One ListObjectsV2 page: ``entries`` are keys and common prefixes (``is_prefix``) in order."""

    entries: list[tuple[str, bool]]
    truncated: bool
    next_token: str | None


def _token(marker: str, is_prefix: bool) -> str:
    return base64.urlsafe_b64encode(json.dumps([marker, is_prefix]).encode()).decode()


def _untoken(token: str) -> tuple[str, bool]:
    try:
        marker, is_prefix = json.loads(base64.urlsafe_b64decode(token.encode()))
        return str(marker), bool(is_prefix)
    except (ValueError, TypeError, binascii.Error):
        raise _S3Error(400, "InvalidArgument", "The continuation token provided is incorrect") from None


def list_page(
    keys: Sequence[str],
    *,
    prefix: str,
    delimiter: str,
    max_keys: int,
    token: str | None,
    start_after: str,
) -> ListPage:
    """The page of ``keys`` (sorted, all starting with ``prefix``) after the token or ``start_after``,
    grouping keys by ``delimiter`` into common prefixes; entries of both kinds count towards ``max_keys``."""
    marker, skip_under = _untoken(token) if token else (start_after, False)
    entries: list[tuple[str, bool]] = []
    seen_prefixes: set[str] = set()
    if max_keys == 0:
        return ListPage(entries, False, None)
    for key in keys:
        if marker and (key <= marker or (skip_under and key.startswith(marker))):
            continue
        entry, is_prefix = key, False
        if delimiter:
            cut = key.find(delimiter, len(prefix))
            if cut >= 0:
                entry, is_prefix = key[: cut + len(delimiter)], True
                if entry in seen_prefixes:
                    continue
        if len(entries) == max_keys:
            return ListPage(entries, True, _token(*entries[-1]))
        if is_prefix:
            seen_prefixes.add(entry)
        entries.append((entry, is_prefix))
    return ListPage(entries, False, None)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fastload-s3serve"
    sys_version = ""
    timeout = 120  # an idle keep-alive connection is closed after this many seconds
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.count("connections")

    # -- verbs ---------------------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch(head_only=False)

    def do_HEAD(self) -> None:
        self._dispatch(head_only=True)

    def _refuse_write(self) -> None:
        self.close_connection = True  # the request body (if any) is not read
        self.server.count(self.command)
        try:
            self._error(_S3Error(501, "NotImplemented", "this endpoint is read-only"), head_only=False)
        finally:
            self.server.done()

    do_PUT = do_POST = do_DELETE = do_PATCH = _refuse_write

    # -- routing -------------------------------------------------------------------------------------------

    def _dispatch(self, *, head_only: bool) -> None:
        self.server.count(self.command)  # (and one more request in flight until its bytes are counted)
        try:
            self._route(head_only=head_only)
        finally:
            self.server.done()

    def _route(self, *, head_only: bool) -> None:
        try:
            split = urlsplit(self.path)
            path = unquote(split.path)
            query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
            dialect = storedialects.route(path, query, self.headers.get)
            if dialect is not None:  # GCS's JSON API or Azure's blob API on the same files
                self._dialect(dialect, head_only)
                return
            bucket, key = self._bucket_and_key(path)
            if bucket is None:
                self._list_buckets(head_only)
            elif bucket != self.server.bucket:
                raise _S3Error(404, "NoSuchBucket", "The specified bucket does not exist")
            elif not key:
                if head_only:
                    self._respond(200, [("Content-Length", "0")], b"", head_only=True)
                else:
                    self._list_objects(query)
            else:
                self._object(key, head_only)
        except _S3Error as exc:
            self._error(exc, head_only=head_only)

    def _bucket_and_key(self, path: str) -> tuple[str | None, str]:
        host = (self.headers.get("Host") or "").rsplit(":", 1)[0].lower()
        if host.startswith(self.server.bucket + "."):
            return self.server.bucket, path.lstrip("/")
        bucket, _, key = path.lstrip("/").partition("/")
        return (bucket or None), key

    # -- responses -----------------------------------------------------------------------------------------

    def _respond(
        self, status: int, headers: Sequence[tuple[str, str]], body: bytes, *, head_only: bool
    ) -> None:
        self._wait_first_byte()
        self.send_response(status)
        self.send_header("x-amz-request-id", self.server.request_id())
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        if body and not head_only:
            self._send_bytes(body)

    def _error(self, exc: _S3Error, *, head_only: bool) -> None:
        request_id = self.server.request_id()
        body = (
            f"{_XML}<Error><Code>{exc.code}</Code><Message>{escape(exc.message)}</Message>"
            f"<Resource>{escape(self.path)}</Resource><RequestId>{request_id}</RequestId></Error>"
        ).encode()
        headers = [
            *exc.headers,
            ("Content-Type", "application/xml"),
            ("Content-Length", "0" if head_only else str(len(body))),
        ]
        if self.close_connection:
            headers.append(("Connection", "close"))
        self._respond(exc.status, headers, body, head_only=head_only)

    def _wait_first_byte(self) -> None:
        if self.server.latency_s > 0:
            time.sleep(self.server.latency_s)

    def _send_bytes(self, body: bytes) -> None:
        rate = self.server.conn_bytes_per_s
        view = memoryview(body)
        started, sent = time.monotonic(), 0
        while sent < len(view):
            n = len(view) - sent if rate is None else min(PIECE_BYTES, len(view) - sent)
            self._pace(started, sent)
            self.connection.sendall(view[sent : sent + n])
            sent += n
        self.server.add_bytes(sent)

    def _send_file(self, f: Any, offset: int, count: int) -> None:
        rate = self.server.conn_bytes_per_s
        started, sent = time.monotonic(), 0
        while sent < count:
            n = count - sent if rate is None else min(PIECE_BYTES, count - sent)
            self._pace(started, sent)
            done = self.connection.sendfile(f, offset + sent, n)
            if done == 0:
                raise ConnectionError("the file ended early or the client went away")
            sent += done
        self.server.add_bytes(sent)

    def _pace(self, started: float, sent: int) -> None:
        rate = self.server.conn_bytes_per_s
        if rate is not None:
            delay = started + sent / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)

    # -- S3 operations -------------------------------------------------------------------------------------

    def _list_buckets(self, head_only: bool) -> None:
        body = (
            f'{_XML}<ListAllMyBucketsResult xmlns="{_NS}"><Owner><ID>fastload</ID></Owner><Buckets>'
            f"<Bucket><Name>{escape(self.server.bucket)}</Name>"
            f"<CreationDate>{_iso(self.server.started)}</CreationDate></Bucket></Buckets>"
            "</ListAllMyBucketsResult>"
        ).encode()
        self._respond(
            200,
            [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))],
            body,
            head_only=head_only,
        )

    def _open(self, key: str) -> tuple[Any, os.stat_result]:
        parts = key.split("/")
        if not _safe(parts):
            raise _S3Error(404, "NoSuchKey", "The specified key does not exist.")
        try:
            f = open(os.path.join(self.server.root, *parts), "rb")  # noqa: SIM115 - closed by the caller
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError):
            raise _S3Error(404, "NoSuchKey", "The specified key does not exist.") from None
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            f.close()
            raise _S3Error(404, "NoSuchKey", "The specified key does not exist.")
        return f, st

    def _dialect(self, asked: storedialects.Route, head_only: bool) -> None:
        if asked.bucket != self.server.bucket:
            raise _S3Error(404, "NoSuchBucket", "The specified bucket does not exist")
        if asked.kind == "object":
            self._object(asked.key, head_only, gcs=asked.gcs_generation)
            return
        if asked.kind == "gcs-meta":
            f, st = self._open(asked.key)
            f.close()
            body, kind = storedialects.gcs_meta(st), "application/json"
        else:
            root = self.server.root
            keys = list_keys(root, asked.prefix)
            listed = [(k, os.path.getsize(os.path.join(root, *k.split("/")))) for k in keys]
            gcs = asked.kind == "gcs-list"
            body = storedialects.gcs_list(listed) if gcs else storedialects.azure_list(listed)
            kind = "application/json" if gcs else "application/xml"
        headers = [("Content-Type", kind), ("Content-Length", str(len(body)))]
        self._respond(200, headers, body, head_only=head_only)

    def _object(self, key: str, head_only: bool, *, gcs: bool = False) -> None:
        f, st = self._open(key)
        with f:
            etag, size = _etag(st), st.st_size
            if_match = self.headers.get("If-Match")
            if if_match is not None and not _etag_matches(if_match, etag):
                raise _S3Error(
                    412, "PreconditionFailed", "At least one of the pre-conditions you specified did not hold"
                )
            if_none = self.headers.get("If-None-Match")
            common = [
                ("ETag", etag),
                ("Last-Modified", formatdate(st.st_mtime, usegmt=True)),
                ("Accept-Ranges", "bytes"),
                *([("x-goog-generation", storedialects.generation(st))] if gcs else []),
            ]
            if if_none is not None and _etag_matches(if_none, etag):
                self._respond(304, common, b"", head_only=True)
                return
            span = parse_range(self.headers.get("Range"), size) if not head_only else None
            start, end = span if span is not None else (0, size)
            headers = [
                *common,
                ("Content-Type", "application/octet-stream"),
                ("Content-Length", str(end - start)),
            ]
            if span is not None:
                headers.append(("Content-Range", f"bytes {start}-{end - 1}/{size}"))
            self._respond(206 if span is not None else 200, headers, b"", head_only=True)
            if not head_only and end > start:
                self._send_file(f, start, end - start)

    def _list_objects(self, query: dict[str, str]) -> None:
        prefix = query.get("prefix", "")
        delimiter = query.get("delimiter", "")
        encode = query.get("encoding-type") == "url"
        try:
            max_keys = int(query.get("max-keys", str(MAX_KEYS)))
        except ValueError:
            raise _S3Error(400, "InvalidArgument", "max-keys must be an integer") from None
        if max_keys < 0:
            raise _S3Error(400, "InvalidArgument", "max-keys must be >= 0")
        max_keys = min(max_keys, MAX_KEYS)
        token = query.get("continuation-token")
        start_after = query.get("start-after", "")
        keys = list_keys(self.server.root, prefix)
        page = list_page(
            keys, prefix=prefix, delimiter=delimiter, max_keys=max_keys, token=token, start_after=start_after
        )

        def text(value: str) -> str:
            return escape(quote(value, safe="/~") if encode else value)

        parts = [
            f'{_XML}<ListBucketResult xmlns="{_NS}"><Name>{escape(self.server.bucket)}</Name>',
            f"<Prefix>{text(prefix)}</Prefix>",
            f"<KeyCount>{len(page.entries)}</KeyCount><MaxKeys>{max_keys}</MaxKeys>",
            f"<IsTruncated>{'true' if page.truncated else 'false'}</IsTruncated>",
        ]
        if delimiter:
            parts.append(f"<Delimiter>{text(delimiter)}</Delimiter>")
        if encode:
            parts.append("<EncodingType>url</EncodingType>")
        if token:
            parts.append(f"<ContinuationToken>{escape(token)}</ContinuationToken>")
        if page.next_token:
            parts.append(f"<NextContinuationToken>{page.next_token}</NextContinuationToken>")
        if start_after:
            parts.append(f"<StartAfter>{text(start_after)}</StartAfter>")
        for entry, is_prefix in page.entries:
            if is_prefix:
                parts.append(f"<CommonPrefixes><Prefix>{text(entry)}</Prefix></CommonPrefixes>")
                continue
            try:
                st = os.stat(os.path.join(self.server.root, *entry.split("/")))
            except OSError:
                continue  # vanished since the walk
            parts.append(
                f"<Contents><Key>{text(entry)}</Key><LastModified>{_iso(st.st_mtime)}</LastModified>"
                f"<ETag>{escape(_etag(st))}</ETag><Size>{st.st_size}</Size>"
                "<StorageClass>STANDARD</StorageClass></Contents>"
            )
        parts.append("</ListBucketResult>")
        body = "".join(parts).encode("utf-8", "surrogateescape")
        self._respond(
            200,
            [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))],
            body,
            head_only=False,
        )


class _HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 256
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        *,
        root: str,
        bucket: str,
        latency_s: float,
        conn_bytes_per_s: float | None,
    ) -> None:
        super().__init__(address, _Handler)
        self.root = root
        self.bucket, self.latency_s, self.conn_bytes_per_s = bucket, latency_s, conn_bytes_per_s
        self.started = time.time()
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._bytes = 0
        self._in_flight = 0  # requests counted whose answers' bytes are not yet (stats() waits for them)
        self._next_id = 0

    def count(self, what: str) -> None:
        with self._lock:
            self._counts[what] = self._counts.get(what, 0) + 1
            self._in_flight += what != "connections"

    def done(self) -> None:
        """A request counted by :meth:`count` has sent (and counted) its answer."""
        with self._lock:
            self._in_flight -= 1

    def add_bytes(self, n: int) -> None:
        with self._lock:
            self._bytes += n

    def request_id(self) -> str:
        with self._lock:
            self._next_id += 1
            return f"{self._next_id:016X}"

    def stats(self) -> ServeStats:
        deadline = time.monotonic() + 2.0  # a client may have every byte before the server counts them
        while self._in_flight > 0 and time.monotonic() < deadline:
            time.sleep(0.002)
        with self._lock:
            counts = dict(self._counts)
            connections = counts.pop("connections", 0)
            return ServeStats(counts, self._bytes, connections)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)) or exc is None:
            return  # a client that went away is not the server's problem
        self.errors.append(exc)


class S3Server(ServedOnAThread):
    """Serve ``root`` as bucket ``bucket`` on ``http://127.0.0.1:PORT`` (see the module docstring).

    ``latency_s`` is slept before every response's status line; ``conn_bytes_per_s`` (None = no cap) paces
    every body from its first byte. ``port=0`` picks a free port. Use as a context manager or call
    :meth:`start` and :meth:`close`.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        bucket: str = "bench",
        host: str = "127.0.0.1",
        port: int = 0,
        latency_s: float = 0.0,
        conn_bytes_per_s: float | None = None,
    ) -> None:
        self.root = os.path.abspath(os.fspath(root))
        if not os.path.isdir(self.root):
            raise ConfigError(f"{self.root} is not a folder; serve the folder that holds the objects")
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ConfigError(
                f"host={host!r}: the endpoint accepts any credentials, so it serves loopback only"
            )
        if not bucket or "/" in bucket:
            raise ConfigError(f"bucket={bucket!r} must be a non-empty name without '/'")
        if latency_s < 0 or (conn_bytes_per_s is not None and conn_bytes_per_s <= 0):
            raise ConfigError(
                f"latency_s={latency_s} must be >= 0 and conn_bytes_per_s={conn_bytes_per_s} > 0"
            )
        self.bucket, self.host, self.port = bucket, host, port
        self.latency_s, self.conn_bytes_per_s = latency_s, conn_bytes_per_s
        self._server: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint_url(self) -> str:
        if self._server is None:
            raise RuntimeError("the server is not started; call start() or use it as a context manager")
        return f"http://{self.host}:{self._server.server_address[1]}"

    def url(self, key: str) -> str:
        """``s3://bucket/key`` for a key of this bucket."""
        return f"s3://{self.bucket}/{key}"

    def start(self) -> S3Server:
        server = _HTTPServer(
            (self.host, self.port),
            root=self.root,
            bucket=self.bucket,
            latency_s=self.latency_s,
            conn_bytes_per_s=self.conn_bytes_per_s,
        )
        self._serve(server, "s3serve")
        return self

    def stats(self) -> ServeStats:
        if self._server is None:
            return ServeStats({}, 0, 0)
        return self._server.stats()

    @property
    def errors(self) -> list[BaseException]:
        return [] if self._server is None else list(self._server.errors)


@contextlib.contextmanager
def serving(root: str, **options: Any) -> Iterator[S3Server]:
    """``with serving(root, latency_s=0.02) as server:`` — an :class:`S3Server` for the block."""
    with S3Server(root, **options) as server:
        yield server


def _stop(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fastload.testing.s3serve", description="Serve a folder as one S3 bucket on loopback."
    )
    parser.add_argument("root", metavar="ROOT", help="folder whose files are the bucket's objects")
    parser.add_argument("--bucket", default="bench")
    parser.add_argument("--port", type=int, default=0, help="0 = any free port (printed)")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="first-byte latency per request")
    parser.add_argument(
        "--conn-mbps", type=float, default=0.0, help="per-connection cap in MB/s (10^6 bytes/s); 0 = none"
    )
    args = parser.parse_args(argv)
    try:
        server = S3Server(
            args.root,
            bucket=args.bucket,
            port=args.port,
            latency_s=args.latency_ms / 1000,
            conn_bytes_per_s=args.conn_mbps * 1e6 if args.conn_mbps > 0 else None,
        ).start()
    except (ConfigError, OSError) as exc:
        print(f"s3serve: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _stop)
    print(
        json.dumps({"endpoint_url": server.endpoint_url, "bucket": server.bucket, "pid": os.getpid()}),
        flush=True,
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
