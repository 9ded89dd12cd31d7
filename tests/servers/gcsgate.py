"""``ifGenerationMatch`` in front of a GCS emulator that ignores it (``gcp-storage-emulator``): a loopback
HTTP proxy forwarding every request to the emulator, except that a request carrying ``ifGenerationMatch=G``
(an upload's, a download's) is first checked against the object's generation upstream and answered 412
when it is not ``G`` (``0``: when the object exists), as Google Cloud Storage answers. Check and forward
happen under one lock, so two conditional requests through the gate never interleave.

    with GcsGate(emulator.url) as gate:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", gate.host)
"""

from __future__ import annotations

import http.client
import http.server
import json
import threading
from urllib.parse import parse_qs, quote, unquote, urlsplit

from fastload.testing.serving import ServedOnAThread

_OBJECT = "/storage/v1/b/"
_UPLOAD = "/upload/storage/v1/b/"


class GcsGate(ServedOnAThread):
    """The proxy on a free 127.0.0.1 port (:attr:`host` for ``STORAGE_EMULATOR_HOST``); :attr:`refused`
    counts the 412s it answered."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.refused = 0
        self.lock = threading.Lock()
        self.host = ""

    def start(self) -> GcsGate:
        gate = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                status, headers, data = gate.answer(self.command, self.path, dict(self.headers), body)
                self.send_response(status)
                for name, value in headers:
                    if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _any

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self.host = f"127.0.0.1:{server.server_address[1]}"
        self._serve(server, "gcs-gate")
        return self

    def _forward(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(*self.upstream, timeout=30)
        try:
            sent = {k: v for k, v in headers.items() if k.lower() not in ("host", "connection")}
            conn.request(method, path, body=body or None, headers=sent)
            resp = conn.getresponse()
            return resp.status, resp.getheaders(), resp.read()
        finally:
            conn.close()

    def _generation(self, bucket: str, name: str) -> str:
        """The object's generation upstream, ``"0"`` when there is none."""
        status, _, data = self._forward("GET", f"{_OBJECT}{bucket}/o/{quote(name, safe='')}", {}, b"")
        return str(json.loads(data)["generation"]) if status == 200 else "0"

    def answer(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        parts = urlsplit(path)
        query = parse_qs(parts.query)
        wanted = query.get("ifGenerationMatch", [None])[-1]
        if wanted is None:
            return self._forward(method, path, headers, body)
        if parts.path.startswith(_UPLOAD):
            bucket, name = parts.path[len(_UPLOAD) :].split("/", 1)[0], query["name"][-1]
        else:
            bucket, _, name = parts.path[len(_OBJECT) :].partition("/o/")
            name = unquote(name)
        with self.lock:
            if self._generation(bucket, name) != wanted:
                self.refused += 1
                error = {"error": {"code": 412, "message": "a pre-condition did not hold"}}
                return 412, [("Content-Type", "application/json")], json.dumps(error).encode()
            return self._forward(method, path, headers, body)
