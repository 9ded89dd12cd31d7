"""The direct transport's HTTP/1.1: one keep-alive connection (:class:`Connection`) sending a request without
a body and reading its response (:class:`Response`): status line and headers parsed from one buffer, the
body by ``Content-Length`` (read straight into the caller's buffer), chunked, or to the connection's close.

Why not ``http.client``: a small ranged GET spent about 0.15-0.2 ms of CPU in it (its headers go through
the ``email`` parser, one ``readline`` per header, a ``makefile`` per response), about a third of the
GET's client CPU; a read of 200 small column chunks paid it 200 times. This covers what
S3 GETs and HEADs need and no more (no request bodies, no ``Expect``, no proxies: botocore takes those).
Failures raise what ``http.client`` raises for them (``RemoteDisconnected``, ``BadStatusLine``,
``IncompleteRead`` in a chunked body) or ``OSError``/``TimeoutError`` from the socket, so
:func:`~fastload.s3.client.classify_exception` classifies them as before; a body that ends before its
``Content-Length`` reads as 0 (the caller counts what it got), as ``HTTPResponse.readinto`` does. A body
read fills the caller's piece (as ``HTTPResponse.readinto`` through its buffered file does: one Python
iteration of the reader's loop per piece, not per ``recv``).
"""

from __future__ import annotations

import http.client
import socket
import ssl
from collections.abc import Callable, Mapping

from fastload.s3.objectio import fill

MAX_HEAD_BYTES = 64 << 10  # status line and headers; S3's are under 2 KiB
_RECV_BYTES = 64 << 10
_DEFAULT_PORTS = {"http": 80, "https": 443}


class Connection:
    """A connection to ``host:port`` (TLS with ``context``); :meth:`connect`, then one :meth:`request` at a
    time, each response read to its end (or the connection closed) before the next."""

    def __init__(self, scheme: str, host: str, port: int, *, timeout: float, context: ssl.SSLContext | None):
        self.host, self.port, self.timeout, self.context = host, port, timeout, context
        netloc = f"[{host}]" if ":" in host else host
        self.host_header = netloc if port == _DEFAULT_PORTS.get(scheme) else f"{netloc}:{port}"
        self.sock: socket.socket | None = None

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.context is not None:
                sock = self.context.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        self.sock = sock

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()

    def request(self, method: str, path: str, headers: Mapping[str, str]) -> Response:
        """Send ``method path`` with ``headers`` (plus ``Host`` and ``Accept-Encoding: identity``, as
        ``http.client`` adds them) and read the response's head."""
        sock = self.sock
        if sock is None:
            raise http.client.NotConnected(f"{self.host}:{self.port}")
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host_header}", "Accept-Encoding: identity"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        lines.append("\r\n")
        sock.sendall("\r\n".join(lines).encode("latin-1"))
        return Response(sock, method)


class Response:
    """One response: ``status``, ``headers`` (lowercase names), ``will_close`` (the server closes the
    connection after it), and its body through :meth:`readinto`/:meth:`read`; :attr:`finished` once the
    body was read to its end, :attr:`reusable` when the connection may carry the next request."""

    def __init__(self, sock: socket.socket, method: str) -> None:
        self._sock = sock
        self._buf = bytearray()
        self._pos = 0  # bytes of _buf already consumed
        self._failed: OSError | None = None  # raised by the next readinto (its bytes were returned)
        while True:
            head = self._read_head()
            status_line, _, rest = head.partition(b"\r\n")
            version, status, reason = _status(status_line)
            if status >= 200 or status == 101:
                break  # (1xx but 101: an interim answer, the real one follows)
        self.status, self.reason, self.version = status, reason, version
        headers: dict[str, str] = {}
        for line in rest.decode("latin-1").split("\r\n"):
            name, sep, value = line.partition(":")
            if not sep:
                continue
            name, value = name.strip().lower(), value.strip()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        self.headers = headers
        connection = headers.get("connection", "").lower()
        self.will_close = "close" in connection or (version == "HTTP/1.0" and "keep-alive" not in connection)
        self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self._left: int | None  # body bytes still to read; None: to the connection's close
        length = headers.get("content-length")
        if method == "HEAD" or status in (204, 304):
            self._left = 0
        elif self.chunked:
            self._left = 0
            self._chunk_left: int | None = None  # of the current chunk; None: read its size line next
        elif length is not None and length.strip().isdigit():
            self._left = int(length)
        else:
            self._left, self.will_close = None, True
        self.finished = self._left == 0 and not self.chunked

    @property
    def reusable(self) -> bool:
        """Whether the connection can carry another request: this body read to its end, the server keeps
        the connection, and nothing was received beyond this response."""
        return self.finished and not self.will_close and self._pos == len(self._buf)

    def getheader(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name.lower(), default)

    def readinto(self, view: memoryview) -> int:
        """Body bytes into ``view`` until it is full or the body ends (0: at its end, or the connection
        ended early). Bytes that arrived before a failure (a timeout, a reset) are returned first; the
        failure is raised by the next call, so a caller keeps every byte received."""
        if self._failed is not None:
            failed, self._failed = self._failed, None
            raise failed
        if self.finished or not len(view):
            return 0
        if self.chunked:
            return self._readinto_chunked(view)
        if self._left is not None and len(view) > self._left:
            view = view[: self._left]
        got = self._take(view)
        try:
            while got < len(view):  # (as BufferedReader.readinto: fewer, larger pieces for the caller)
                n = self._sock.recv_into(view[got:])
                if not n:
                    break
                got += n
        except OSError as exc:
            if not got:
                raise
            self._failed = exc
        if self._left is not None:
            self._left -= got
            self.finished = not self._left
        elif not got:  # a body to the connection's close: its end
            self.finished = True
        return got

    def read(self, limit: int) -> bytes:
        """Up to ``limit`` body bytes (fewer only at the body's end)."""
        out = bytearray(limit)
        view = memoryview(out)
        got, _ = fill(self, view)
        del view
        return bytes(out[:got])

    # -- internals --

    def _take(self, view: memoryview) -> int:
        """Bytes already received (after the head) into ``view``."""
        n = min(len(view), len(self._buf) - self._pos)
        if n > 0:
            view[:n] = self._buf[self._pos : self._pos + n]
            self._pos += n
        return max(n, 0)

    def _fill(self) -> bool:
        """Receive more into the buffer (dropping what was consumed); False when the peer closed."""
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        chunk = self._sock.recv(_RECV_BYTES)
        self._buf += chunk
        return bool(chunk)

    def _read_head(self) -> bytes:
        def cut_short(nothing: bool) -> Exception:
            if nothing:
                return http.client.RemoteDisconnected("Remote end closed connection without response")
            return http.client.BadStatusLine("response head cut short")

        return self._until(b"\r\n\r\n", f"response head over {MAX_HEAD_BYTES} bytes", cut_short)

    def _line(self) -> bytes:
        """The next CRLF-terminated line of a chunked body (without its CRLF)."""
        return self._until(b"\r\n", "chunk size line", lambda nothing: http.client.IncompleteRead(b""))

    def _until(self, end_mark: bytes, too_long: str, cut_short: Callable[[bool], Exception]) -> bytes:
        """The received bytes up to ``end_mark`` (consumed with it, returned without it), receiving more
        as needed; ``LineTooLong(too_long)`` past ``MAX_HEAD_BYTES``; when the peer closes first,
        ``cut_short(nothing)`` (``nothing``: no byte of it had arrived)."""
        while True:
            end = self._buf.find(end_mark, self._pos)
            if end >= 0:
                found = bytes(self._buf[self._pos : end])
                self._pos = end + len(end_mark)
                return found
            if len(self._buf) - self._pos > MAX_HEAD_BYTES:
                raise http.client.LineTooLong(too_long)
            nothing = self._pos == len(self._buf)
            if not self._fill():
                raise cut_short(nothing)

    def _readinto_chunked(self, view: memoryview) -> int:
        if self._chunk_left is None:
            size_line = self._line().split(b";", 1)[0].strip()
            try:
                size = int(size_line, 16)
            except ValueError:
                raise http.client.IncompleteRead(b"") from None
            if size == 0:
                while self._line():  # trailers, up to the empty line
                    pass
                self.finished = True
                return 0
            self._chunk_left = size
        if len(view) > self._chunk_left:
            view = view[: self._chunk_left]
        n = self._take(view)
        if not n:
            if not self._fill():
                raise http.client.IncompleteRead(b"")
            n = self._take(view)
        self._chunk_left -= n
        if not self._chunk_left:
            if self._line():
                raise http.client.IncompleteRead(b"")  # a chunk's data must end with CRLF
            self._chunk_left = None
        return n


def _status(line: bytes) -> tuple[str, int, str]:
    text = line.decode("latin-1")
    version, _, rest = text.partition(" ")
    code, _, reason = rest.partition(" ")
    if not version.startswith("HTTP/") or len(code) != 3 or not code.isdigit():
        raise http.client.BadStatusLine(text[:100] or repr(line[:100]))
    return version, int(code), reason.strip()
