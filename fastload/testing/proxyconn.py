"""One client connection of the fault proxy: read each request, apply its fault, forward it, relay the answer.

``ProxyState`` is what all connection threads share (plan, counters, records, open sockets, stop event),
guarded by one lock; ``serve_connection`` runs on a thread per client connection. Each request gets a
fresh upstream connection. Sockets time out after ``io_timeout_s``; every wait also ends at ``stop``.

(Over 400 lines on purpose: each fault kind is a short branch of the one relay loop that owns the client and
upstream sockets; the wire parsing is in ``httpwire`` and the plan in ``faultplan``.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from fastload.testing import httpwire as wire
from fastload.testing.faultplan import Fault, FaultKind, FaultPlan, RequestInfo

_PIECE = 64 * 1024
_EARLY = {"slowdown", "internal_error", "access_denied", "request_timeout", "reset_before_response", "hang"}
_MID_BODY = {"reset_mid_body", "truncate_body", "stall_mid_body"}


@dataclass(frozen=True)
class RequestRecord:
    """One request as the proxy saw it: ``fault`` is the kind its rule chose (None: passed through)."""

    number: int
    method: str
    target: str
    range: str | None
    fault: FaultKind | None
    status: int | None = None
    """Status sent to the client (recorded just before sending); None if no response head was sent."""


class ProxyState:
    """State shared by the proxy's threads; every field behind ``lock``."""

    def __init__(
        self,
        upstream: tuple[str, int],
        *,
        seed: int,
        resign: Callable[[bytes], bytes] | None,
        io_timeout_s: float,
    ) -> None:
        self.upstream = upstream
        self.resign = resign
        self.io_timeout_s = io_timeout_s
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.plan = FaultPlan(seed=seed)
        self.counts: Counter[str] = Counter()
        self.injected: Counter[str] = Counter()
        self.records: list[RequestRecord] = []
        self.sockets: set[socket.socket] = set()
        self.threads: set[threading.Thread] = set()
        self.errors: list[BaseException] = []

    def count(self, name: str, n: int = 1) -> None:
        with self.lock:
            self.counts[name] += n

    def mark(self, kind: str) -> None:
        """Count a fault that takes effect (called before the client can see it)."""
        with self.lock:
            self.injected[kind] += 1

    def track(self, sock: socket.socket) -> None:
        with self.lock:
            self.sockets.add(sock)
        if self.stop.is_set():  # close() may have taken its list before this socket was added
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def untrack_close(self, sock: socket.socket, *, reset: bool = False) -> None:
        """Close ``sock``; with ``reset`` send RST instead of FIN (SO_LINGER 0)."""
        with self.lock:
            self.sockets.discard(sock)
        if reset:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()


class _ClientGone(Exception):
    """The client closed, reset or timed out; the connection ends quietly."""


class _UpstreamFailed(Exception):
    """The upstream refused, reset, timed out or sent bad HTTP (``before_response``: nothing sent yet)."""

    def __init__(self, message: str, *, before_response: bool = False) -> None:
        super().__init__(message)
        self.before_response = before_response


class _Reader:
    """Buffered reads from one socket; socket errors become ``error`` (_ClientGone or _UpstreamFailed)."""

    def __init__(self, sock: socket.socket, error: type[Exception], count: Callable[[int], None]) -> None:
        self._sock = sock
        self._error = error
        self._count = count
        self._buf = bytearray()

    def _fill(self) -> bool:
        try:
            data = self._sock.recv(_PIECE)
        except OSError as exc:  # timeouts included
            raise self._error(repr(exc)) from exc
        self._count(len(data))
        self._buf += data
        return bool(data)

    def read_head(self) -> bytes | None:
        """One message head, or None on a clean end of stream before its first byte."""
        while (end := self._buf.find(wire.HEAD_END)) < 0:
            if len(self._buf) > wire.MAX_HEAD_BYTES:
                raise self._error("message head too long")
            if not self._fill():
                if self._buf:
                    raise self._error("connection closed inside a message head")
                return None
        head = bytes(self._buf[: end + len(wire.HEAD_END)])
        del self._buf[: end + len(wire.HEAD_END)]
        return head

    def read_line(self) -> bytes:
        while (end := self._buf.find(b"\r\n")) < 0:
            if len(self._buf) > wire.MAX_HEAD_BYTES or not self._fill():
                raise self._error("connection closed or line too long in chunked body")
        line = bytes(self._buf[: end + 2])
        del self._buf[: end + 2]
        return line

    def read_some(self, limit: int) -> bytes:
        """Up to ``limit`` bytes; b"" only at end of stream."""
        if not self._buf:
            self._fill()
        data = bytes(self._buf[:limit])
        del self._buf[:limit]
        return data

    def body(self, framing: wire.Framing) -> Iterator[bytes]:
        """The raw body bytes as on the wire, chunk framing and trailers included, in pieces."""
        kind, remaining = framing
        if kind == "length":
            yield from self._exactly(remaining)
        elif kind == "chunked":
            while True:
                line = self.read_line()
                yield line
                try:
                    size = wire.chunk_size(line)
                except wire.HttpParseError as exc:
                    raise self._error(str(exc)) from exc
                if size == 0:
                    while (line := self.read_line()) != b"\r\n":
                        yield line
                    yield line
                    return
                yield from self._exactly(size + 2)
        elif kind == "close":
            while data := self.read_some(_PIECE):
                yield data

    def _exactly(self, remaining: int) -> Iterator[bytes]:
        while remaining:
            data = self.read_some(min(remaining, _PIECE))
            if not data:
                raise self._error("connection closed inside a body")
            remaining -= len(data)
            yield data


def serve_connection(state: ProxyState, client: socket.socket) -> None:
    """Serve requests on ``client`` until either side closes; never raises (errors go to state.errors)."""
    _Connection(state, client).serve()


class _Connection:
    def __init__(self, state: ProxyState, client: socket.socket) -> None:
        self.state = state
        self.client = client
        self.reader = _Reader(client, _ClientGone, lambda n: state.count("bytes_from_client", n))

    def serve(self) -> None:
        state, reset = self.state, False
        try:
            self.client.settimeout(state.io_timeout_s)
            self.client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            state.track(self.client)
            while not state.stop.is_set():
                raw = self.reader.read_head()
                if raw is None:
                    break
                keep, reset = self._handle(raw)
                if not keep:
                    break
        except _ClientGone:
            pass
        except BaseException as exc:  # a bug: keep it for close() rather than print it from a thread
            state.errors.append(exc)
            reset = True
        finally:
            state.untrack_close(self.client, reset=reset)
            with state.lock:
                state.threads.discard(threading.current_thread())

    def _send(self, data: bytes) -> None:
        self.state.count("bytes_to_client", len(data))  # before sending: the client may read stats at once
        try:
            self.client.sendall(data)
        except OSError as exc:
            raise _ClientGone(repr(exc)) from exc

    def _send_head(self, number: int, status: int, data: bytes) -> None:
        """Record the status of request ``number``, then send a response head (and any body given)."""
        with self.state.lock:
            records = self.state.records
            records[number - 1] = dataclasses.replace(records[number - 1], status=status)
        self._send(data)

    def _handle(self, raw: bytes) -> tuple[bool, bool]:
        """Serve one request; returns ``(keep_alive, reset)``."""
        state = self.state
        try:
            head = wire.parse_head(raw)
            method, target = head.request_parts()
            framing = wire.request_framing(head)
        except wire.HttpParseError as exc:
            self._send(_error(400, "BadRequest", str(exc), "/"))
            return False, False
        failed = None
        with state.lock:
            state.counts["requests"] += 1
            info = RequestInfo(state.counts["requests"], method, target, head.headers)
            try:
                active = state.plan.decide(info, now=time.monotonic())
            except Exception as exc:  # a rule's ``where`` predicate failed
                state.errors.append(exc)
                active, failed = None, exc
            fault = active.rule.fault if active is not None else None
            state.records.append(
                RequestRecord(info.number, method, target, info.range, fault.kind if fault else None)
            )
        if failed is not None:
            self._send_head(info.number, 502, _error(502, "ProxyRuleFailed", repr(failed), info.path))
            return False, False
        keep, reset = self._respond(head, info, framing, fault)
        return keep and not wire.wants_close(head), reset

    def _respond(
        self, head: wire.Head, info: RequestInfo, framing: wire.Framing, fault: Fault | None
    ) -> tuple[bool, bool]:
        state = self.state
        expects = (head.get("expect") or "").lower() == "100-continue" and framing[0] != "none"
        if fault is not None and fault.kind in _EARLY:
            return self._answer_early(info, framing, fault, body_skipped=expects)
        if expects:
            self._send(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = b"".join(self.reader.body(framing))
        out = self._rewrite_request(head, fault)
        if fault is not None and fault.callback is not None:  # overwrite_before
            try:
                fault.callback(info)
            except Exception as exc:
                state.errors.append(exc)
                self._send_head(info.number, 502, _error(502, "ProxyCallbackFailed", repr(exc), info.path))
                return False, False
            state.mark(fault.kind)
        try:
            upstream = socket.create_connection(state.upstream, timeout=state.io_timeout_s)
        except OSError as exc:
            state.count("upstream_errors")
            self._send_head(info.number, 502, _error(502, "ProxyUpstreamFailed", repr(exc), info.path))
            return False, False
        try:
            state.track(upstream)
            return self._exchange(upstream, out + body, info, fault, keep_client=not wire.wants_close(head))
        except _UpstreamFailed as exc:
            state.count("upstream_errors")
            if exc.before_response:
                self._send_head(info.number, 502, _error(502, "ProxyUpstreamFailed", str(exc), info.path))
                return False, False
            return False, True  # the response head is out: reset so the client sees a broken body
        finally:
            state.untrack_close(upstream)

    def _answer_early(
        self, info: RequestInfo, framing: wire.Framing, fault: Fault, *, body_skipped: bool
    ) -> tuple[bool, bool]:
        """Faults that never contact the upstream. With Expect: 100-continue the body is never sent."""
        if not body_skipped:
            for _ in self.reader.body(framing):
                pass
        self.state.mark(fault.kind)
        if fault.kind == "reset_before_response":
            return False, True
        if fault.kind == "hang":
            self.state.stop.wait(fault.duration_s)
            return False, False
        status, code, message = wire.S3_ERRORS[fault.kind]
        close = body_skipped or fault.kind == "request_timeout"
        error = _error(status, code, message, info.path, head_only=info.method == "HEAD", close=close)
        self._send_head(info.number, status, error)
        return not close, False

    def _rewrite_request(self, head: wire.Head, fault: Fault | None) -> bytes:
        raw, value = head.raw, head.get("range")
        if fault is None or value is None:
            return raw
        if fault.kind == "ignore_range":
            raw = wire.replace_header(raw, "Range", None)
        elif fault.kind == "shift_range" and (shifted := wire.shift_range(value, fault.shift_bytes)):
            raw = wire.replace_header(raw, "Range", shifted)
        else:
            return raw
        self.state.mark(fault.kind)
        return self.state.resign(raw) if self.state.resign is not None else raw

    def _exchange(
        self,
        upstream: socket.socket,
        request: bytes,
        info: RequestInfo,
        fault: Fault | None,
        *,
        keep_client: bool,
    ) -> tuple[bool, bool]:
        """Send the request upstream and relay the response, applying response-side faults.

        ``Connection`` is hop-by-hop: an upstream's ``Connection: close`` (moto says it on every response)
        becomes ``keep-alive`` when the body is length-delimited and the client did not ask to close.
        """
        state = self.state
        try:
            upstream.sendall(request)
        except OSError as exc:
            raise _UpstreamFailed(repr(exc), before_response=True) from exc
        state.count("upstream_requests")
        state.count("bytes_to_upstream", len(request))
        up = _Reader(upstream, _UpstreamFailed, lambda n: state.count("bytes_from_upstream", n))
        try:
            while True:  # skip interim 1xx responses (100 Continue: the proxy answered that itself)
                raw = up.read_head()
                if raw is None:
                    raise _UpstreamFailed("closed without a response")
                head = wire.parse_head(raw)
                if head.status() >= 200:
                    break
            framing = wire.response_framing(head, info.method)
        except (_UpstreamFailed, wire.HttpParseError) as exc:
            raise _UpstreamFailed(str(exc), before_response=True) from exc
        kind = fault.kind if fault else None
        if fault is not None and kind == "wrong_content_range":
            value = head.get("content-range")
            if value and (shifted := wire.shift_content_range(value, fault.shift_bytes)):
                raw = wire.replace_header(raw, "Content-Range", shifted)
                state.mark(fault.kind)
        if fault is not None and kind == "latency":
            state.mark(fault.kind)
            if state.stop.wait(fault.delay_s):
                return False, True
        keep = keep_client and framing[0] != "close"
        if keep and wire.wants_close(head):
            raw = wire.replace_header(raw, "Connection", "keep-alive")
        self._send_head(info.number, head.status(), raw)
        return self._relay_body(up, framing, fault, keep=keep)

    def _relay_body(
        self, up: _Reader, framing: wire.Framing, fault: Fault | None, *, keep: bool
    ) -> tuple[bool, bool]:
        """Stream the body, paced for ``bandwidth``, cut short for the mid-body faults."""
        cut = None
        if fault is not None and fault.kind in _MID_BODY:
            # withhold at least one byte of a Content-Length body, so the fault is always visible
            cut = min(fault.after_bytes, framing[1] - 1) if framing[0] == "length" else fault.after_bytes
        pace = fault.bytes_per_s if fault is not None and fault.kind == "bandwidth" else None
        if pace is not None:
            self.state.mark("bandwidth")
        piece_limit = _PIECE if pace is None else max(1, min(_PIECE, int(pace / 50)))
        sent, started = 0, time.monotonic()
        for data in up.body(framing):
            for start in range(0, len(data), piece_limit):
                piece = data[start : start + piece_limit]
                if cut is not None and fault is not None and sent + len(piece) > cut:
                    return self._cut_body(piece[: cut - sent], fault)
                self._send(piece)
                sent += len(piece)
                if pace is not None:
                    delay = started + sent / pace - time.monotonic()
                    if delay > 0 and self.state.stop.wait(delay):
                        return False, True
        return keep, False

    def _cut_body(self, last: bytes, fault: Fault) -> tuple[bool, bool]:
        """Send the last bytes before a mid-body fault, then stall, close (FIN) or reset."""
        self.state.mark(fault.kind)
        self._send(last)
        if fault.kind == "stall_mid_body":
            self.state.stop.wait(fault.duration_s)
        return False, fault.kind == "reset_mid_body"


def _error(
    status: int, code: str, message: str, resource: str, *, head_only: bool = False, close: bool = True
) -> bytes:
    return wire.error_response(
        status,
        code,
        message,
        resource=resource,
        request_id=f"FAULTPROXY{time.monotonic_ns() % 10**12:012d}",
        head_only=head_only,
        close=close,
    )
