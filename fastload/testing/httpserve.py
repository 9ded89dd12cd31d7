"""A small web server on loopback that serves one local folder read-only, as a web store does, for tests
and benchmarks of ``https://``/``hf://`` reads (Python's ``http.server`` answers no ``Range``).

``GET``/``HEAD`` of ``/<path>`` with a single ``Range`` (206 + ``Content-Range``; 416 past the end),
``If-Match`` and ``If-Unmodified-Since`` (412); per-server modes that real servers show:

- ``etag``: ``"strong"`` (default; a digest of inode, size and mtime), ``"weak"`` (``W/"..."``, which
  ``If-Match`` never matches), ``"none"`` (``Last-Modified`` only), ``"bare"`` (neither: no validator);
- ``ignore_range``: every GET answered 200 with the whole file, as servers without range support do;
- ``require``: headers a request must carry (else 401), e.g. ``{"Authorization": "Bearer t"}``;
- ``hub``: the Hugging Face Hub's two routes over ``root/<org>/<name>/<path>`` (any revision):
  ``/datasets/ORG/NAME/resolve/REV/PATH`` answers 302 to ``http://localhost:PORT/cdn/ORG/NAME/PATH`` (another
  origin, as the Hub's CDN is: a request there that carries ``Authorization`` is refused with 400, as a
  signed CDN URL refuses it), and ``/api/datasets/ORG/NAME/tree/REV/PATH?recursive=true`` lists the files
  as JSON, ``page_size`` at a time with a ``Link: <...>; rel="next"`` header.

``latency_s`` is slept before each answer's status line, ``conn_bytes_per_s`` paces each body (as
``s3serve``). ``requests`` records ``(method, path, headers)`` of every request::

    with WebServer("/data/shards") as server:
        fastload.open(server.url("shard-000000.tar"))
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import socket
import stat
import threading
import time
from collections.abc import Mapping
from email.utils import formatdate, parsedate_to_datetime
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from fastload.errors import ConfigError
from fastload.testing.s3serve import PIECE_BYTES, parse_range
from fastload.testing.serving import ServedOnAThread

ETAG_MODES = ("strong", "weak", "none", "bare")


class _Refused(Exception):
    def __init__(self, status: int, headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(status)
        self.status, self.headers = status, headers


def _range(header: str | None, size: int) -> tuple[int, int] | None:
    """``s3serve.parse_range``'s answer; :class:`_Refused` 416 for a range past the end."""
    try:
        return parse_range(header, size)
    except Exception as exc:
        if getattr(exc, "status", None) == 416:
            raise _Refused(416, (("Content-Range", f"bytes */{size}"),)) from None
        raise


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fastload-httpserve"
    sys_version = ""
    timeout = 60
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self) -> None:
        self._dispatch(head_only=False)

    def do_HEAD(self) -> None:
        self._dispatch(head_only=True)

    def _dispatch(self, *, head_only: bool) -> None:
        web = self.server.web
        split = urlsplit(self.path)
        path = unquote(split.path)
        with web.lock:
            web.requests.append((self.command, path, dict(self.headers.items())))
        try:
            for name, value in web.require.items():
                if self.headers.get(name) != value and not path.startswith("/cdn/"):
                    raise _Refused(401)
            if web.hub and path.startswith("/api/datasets/"):
                self._tree(path, parse_qs(split.query))
            elif web.hub and path.startswith("/datasets/"):
                self._resolve(path)
            elif web.hub and path.startswith("/cdn/"):
                if self.headers.get("Authorization"):
                    raise _Refused(400)  # a signed URL refuses other authorisation
                self._file(path[len("/cdn/") :], head_only)
            else:
                self._file(path.lstrip("/"), head_only)
        except _Refused as exc:
            self._answer(exc.status, [*exc.headers, ("Content-Length", "0")])

    def _answer(self, status: int, headers: list[tuple[str, str]]) -> None:
        if self.server.web.latency_s:
            time.sleep(self.server.web.latency_s)
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()

    def _open(self, rel: str) -> tuple[Any, os.stat_result]:
        parts = rel.split("/")
        if any(p in ("", ".", "..") for p in parts):
            raise _Refused(404)
        try:
            f = open(os.path.join(self.server.web.root, *parts), "rb")  # noqa: SIM115 - closed by the caller
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError):
            raise _Refused(404) from None
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            f.close()
            raise _Refused(404)
        return f, st

    def _file(self, rel: str, head_only: bool) -> None:
        web = self.server.web
        f, st = self._open(rel)
        with f:
            digest = hashlib.md5(f"{st.st_ino}-{st.st_size}-{st.st_mtime_ns}".encode(), usedforsecurity=False)
            etag = {"strong": f'"{digest.hexdigest()}"', "weak": f'W/"{digest.hexdigest()}"'}.get(web.etag)
            modified = formatdate(st.st_mtime, usegmt=True)
            if_match = self.headers.get("If-Match")
            if if_match is not None and (etag is None or etag.startswith("W/") or if_match.strip() != etag):
                raise _Refused(412)
            since = self.headers.get("If-Unmodified-Since")
            if since is not None and web.etag != "bare":
                try:
                    if int(st.st_mtime) > parsedate_to_datetime(since).timestamp():
                        raise _Refused(412)
                except (TypeError, ValueError):
                    pass
            headers = [("Content-Type", "application/octet-stream")]
            if etag is not None:
                headers.append(("ETag", etag))
            if web.etag != "bare":
                headers.append(("Last-Modified", modified))
            size = st.st_size
            span = None if web.ignore_range or head_only else _range(self.headers.get("Range"), size)
            if not web.ignore_range:
                headers.append(("Accept-Ranges", "bytes"))
            start, end = span if span is not None else (0, size)
            headers.append(("Content-Length", str(end - start)))
            if span is not None:
                headers.append(("Content-Range", f"bytes {start}-{end - 1}/{size}"))
            self._answer(206 if span is not None else 200, headers)
            if not head_only:
                self._send(f, start, end - start)

    def _send(self, f: Any, offset: int, count: int) -> None:
        rate = self.server.web.conn_bytes_per_s
        started, sent = time.monotonic(), 0
        while sent < count:
            n = count - sent if rate is None else min(PIECE_BYTES, count - sent)
            if rate is not None:
                delay = started + sent / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            done = self.connection.sendfile(f, offset + sent, n)
            if done == 0:
                raise ConnectionError("the file ended early or the client went away")
            sent += done
        with self.server.web.lock:
            self.server.web.body_bytes += sent

    # -- the Hub ---------------------------------------------------------------------------------------

    def _repo(self, rest: str) -> tuple[str, str, str]:
        """``(org/name, revision, path)`` of ``ORG/NAME/<verb>/REV/PATH``."""
        parts = rest.split("/", 4)
        if len(parts) < 4:
            raise _Refused(404)
        org, name, _, rev = parts[:4]
        with self.server.web.lock:
            self.server.web.revisions.append(rev)
        return f"{org}/{name}", rev, parts[4] if len(parts) > 4 else ""

    def _resolve(self, path: str) -> None:
        repo, _, rel = self._repo(path[len("/datasets/") :])
        self._open(f"{repo}/{rel}")[0].close()  # 404 here, as the Hub answers, not at the CDN
        port = self.server.server_address[1]
        location = f"http://localhost:{port}/cdn/{quote(repo)}/{quote(rel)}?X-Signature=abc"
        self._answer(302, [("Location", location), ("Content-Length", "0")])

    def _tree(self, path: str, query: Mapping[str, list[str]]) -> None:
        repo, _, rel = self._repo(path[len("/api/datasets/") :])
        base = os.path.join(self.server.web.root, *repo.split("/"))
        folder = os.path.join(base, *[p for p in rel.split("/") if p])
        if not os.path.isdir(folder):
            raise _Refused(404)
        files = sorted(
            os.path.relpath(os.path.join(d, f), base).replace(os.sep, "/")
            for d, _, names in os.walk(folder)
            for f in names
        )
        start = int(query.get("cursor", ["0"])[0])
        size = self.server.web.page_size
        page = files[start : start + size]
        body = json.dumps([{"type": "file", "path": p, "size": 0} for p in page]).encode()
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        if start + size < len(files):
            host = self.headers.get("Host", "")
            headers.append(
                ("Link", f'<http://{host}{path}?recursive=true&cursor={start + size}>; rel="next"')
            )
        self._answer(200, headers)
        self.wfile.write(body)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 256
    allow_reuse_address = True
    web: WebServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away (the tests cut connections on purpose)


class WebServer(ServedOnAThread):
    """Serve ``root`` on ``http://127.0.0.1:PORT`` (see the module docstring); a context manager."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        etag: str = "strong",
        ignore_range: bool = False,
        require: Mapping[str, str] | None = None,
        hub: bool = False,
        page_size: int = 1000,
        latency_s: float = 0.0,
        conn_bytes_per_s: float | None = None,
        port: int = 0,
    ) -> None:
        self.root = os.path.abspath(os.fspath(root))
        if not os.path.isdir(self.root):
            raise ConfigError(f"{self.root} is not a folder")
        if etag not in ETAG_MODES:
            raise ConfigError(f"etag={etag!r}; choose one of {', '.join(ETAG_MODES)}")
        self.etag, self.ignore_range, self.hub, self.page_size = etag, ignore_range, hub, page_size
        self.require = dict(require or {})
        self.latency_s, self.conn_bytes_per_s, self.port = latency_s, conn_bytes_per_s, port
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.revisions: list[str] = []
        self.body_bytes = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint_url(self) -> str:
        if self._server is None:
            raise RuntimeError("the server is not started; use it as a context manager")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def url(self, path: str) -> str:
        return f"{self.endpoint_url}/{path.lstrip('/')}"

    def start(self) -> WebServer:
        server = _Server(("127.0.0.1", self.port), _Handler)
        server.web = self
        self._serve(server, "httpserve")
        return self
