"""A fault-injecting HTTP/1.1 proxy for S3 tests, on 127.0.0.1, stdlib only (socket and threading).

Point the S3 client at ``proxy.endpoint_url`` (path-style addressing); the proxy forwards each request
byte for byte, Host header included, to the one loopback upstream it was given (moto, Ceph RGW), so the
client's SigV4 signature stays valid. Faults are scripted per request while the test runs::

    with FaultProxy(moto_url, seed=7) as proxy:
        s3 = boto3.client("s3", endpoint_url=proxy.endpoint_url, ...)
        proxy.add(Rule(Fault.slowdown(), method="GET", key="shard-0003", times=2))
        proxy.add(Rule(Fault.reset_mid_body(after_bytes=4096), has_range=True, nth={3, 7}))
        ...
        assert proxy.stats().injected["slowdown"] == 2

Connections: keep-alive towards the client; one fresh upstream connection per request. Request bodies
(Content-Length or chunked, forwarded with their framing) are read into memory before forwarding;
``Expect: 100-continue`` is answered by the proxy. Response bodies are streamed (Content-Length, chunked
or close-delimited). Unexpected errors in proxy threads (a bug, a failing callback) are kept in
``proxy.errors`` and raised by ``close()``; client disconnects and upstream failures are not errors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from urllib.parse import urlsplit

from fastload.testing import httpwire as wire
from fastload.testing.faultplan import FAULT_KINDS, ActiveRule, Fault, FaultKind, FaultPlan, RequestInfo, Rule
from fastload.testing.sigv4 import SigV4Resigner

__all__ = [
    "FAULT_KINDS",
    "ActiveRule",
    "Fault",
    "FaultKind",
    "FaultProxy",
    "FaultProxyError",
    "ProxyStats",
    "RequestInfo",
    "RequestRecord",
    "Rule",
    "SigV4Resigner",
]

_PIECE = 64 * 1024
_EARLY = {"slowdown", "internal_error", "request_timeout", "reset_before_response", "hang"}
_MID_BODY = {"reset_mid_body", "truncate_body", "stall_mid_body"}


class FaultProxyError(RuntimeError):
    """A proxy thread failed unexpectedly (``errors`` holds every exception); raised by ``close()``."""

    def __init__(self, errors: list[BaseException]) -> None:
        super().__init__(f"{len(errors)} error(s) in fault proxy threads; first: {errors[0]!r}")
        self.errors = errors


@dataclass(frozen=True)
class ProxyStats:
    """Counters since the proxy started; ``injected`` counts faults that took effect, by kind."""

    requests: int
    upstream_requests: int
    injected: Mapping[str, int]
    connections: int
    bytes_to_client: int
    bytes_from_client: int
    bytes_to_upstream: int
    bytes_from_upstream: int
    upstream_errors: int


@dataclass(frozen=True)
class RequestRecord:
    """One request as the proxy saw it: ``fault`` is the kind its rule chose (None: passed through)."""

    number: int
    method: str
    target: str
    range: str | None
    fault: FaultKind | None
    status: int | None = None
    """Status sent to the client; None if no response head was sent."""


class _ClientGone(Exception):
    """The client closed, reset or timed out; the handler ends quietly."""


class _UpstreamFailed(Exception):
    """The upstream refused, reset, timed out or sent bad HTTP (``before_response``: nothing sent yet)."""

    def __init__(self, message: str, *, before_response: bool = False) -> None:
        super().__init__(message)
        self.before_response = before_response


class _Reader:
    """Buffered reads from one socket; socket errors become ``error`` (a _ClientGone or _UpstreamFailed)."""

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
        """The raw body bytes as on the wire, chunk framing included, in pieces."""
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


def _parse_upstream(upstream: str | tuple[str, int]) -> tuple[str, int]:
    if isinstance(upstream, str):
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ValueError(f"{upstream=} must look like http://127.0.0.1:PORT")
        host, port = parts.hostname, parts.port
    else:
        host, port = upstream
    host = "127.0.0.1" if host == "localhost" else host
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"upstream host {host!r} must be a loopback address such as 127.0.0.1")
    return host, port


class FaultProxy:
    """The proxy; ``with FaultProxy(upstream) as proxy:`` starts it and stops it within about a second.

    ``upstream`` is ``"http://127.0.0.1:PORT"`` or ``(host, port)`` on loopback. ``seed`` seeds every rule's
    random draws. ``resign`` re-signs request heads the proxy rewrote (``SigV4Resigner(secret_key)``),
    needed only for servers that verify signatures. ``io_timeout_s`` bounds every socket wait.
    """

    def __init__(
        self,
        upstream: str | tuple[str, int],
        *,
        seed: int = 0,
        resign: Callable[[bytes], bytes] | None = None,
        io_timeout_s: float = 30.0,
    ) -> None:
        self.upstream = _parse_upstream(upstream)
        self._resign = resign
        self._io_timeout_s = io_timeout_s
        self._plan = FaultPlan(seed=seed)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._threads: set[threading.Thread] = set()
        self._sockets: set[socket.socket] = set()
        self._records: list[RequestRecord] = []
        self._injected: Counter[str] = Counter()
        self._counts: Counter[str] = Counter()
        self.errors: list[BaseException] = []
        self.address: tuple[str, int] = ("127.0.0.1", 0)

    # -- lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        if self._listener is not None:
            raise RuntimeError("FaultProxy already started")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        listener.settimeout(0.05)
        self._listener = listener
        self.address = listener.getsockname()[:2]
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name="faultproxy-accept", daemon=True
        )
        self._accept_thread.start()
        return self

    def close(self) -> None:
        """Stop accepting, cut every connection, join the threads; raise FaultProxyError if any failed."""
        self._stop.set()
        if self._accept_thread is not None:
            self._accept_thread.join(timeout=1.0)
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            socks, threads = list(self._sockets), list(self._threads)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + 1.0
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if self.errors:
            raise FaultProxyError(list(self.errors))

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.close()
        except FaultProxyError:
            if exc is None:
                raise

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.address[0]}:{self.address[1]}"

    # -- plan and counters --------------------------------------------------------------------------------

    def add(self, rule: Rule) -> ActiveRule:
        """Add a rule at the end of the plan; its time window (``for_s``) starts now."""
        with self._lock:
            return self._plan.add(rule, now=time.monotonic())

    def remove(self, active: ActiveRule) -> None:
        with self._lock:
            self._plan.remove(active)

    def clear(self) -> None:
        """Remove every rule: requests pass through from now on."""
        with self._lock:
            self._plan.clear()

    def stats(self) -> ProxyStats:
        with self._lock:
            c = self._counts
            return ProxyStats(
                requests=c["requests"],
                upstream_requests=c["upstream_requests"],
                injected=dict(self._injected),
                connections=c["connections"],
                bytes_to_client=c["bytes_to_client"],
                bytes_from_client=c["bytes_from_client"],
                bytes_to_upstream=c["bytes_to_upstream"],
                bytes_from_upstream=c["bytes_from_upstream"],
                upstream_errors=c["upstream_errors"],
            )

    def requests(self) -> list[RequestRecord]:
        """Every request read so far, in arrival order."""
        with self._lock:
            return list(self._records)

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def _mark(self, kind: str) -> None:
        with self._lock:
            self._injected[kind] += 1

    # -- threads ------------------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if not self._stop.is_set():
                    self.errors.append(RuntimeError("fault proxy listener failed"))
                return
            self._count("connections")
            thread = threading.Thread(target=self._serve, args=(client,), name="faultproxy-conn", daemon=True)
            with self._lock:
                self._threads.add(thread)
            thread.start()

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.add(sock)
        if self._stop.is_set():  # close() may have missed it
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _untrack_close(self, sock: socket.socket, *, reset: bool = False) -> None:
        with self._lock:
            self._sockets.discard(sock)
        if reset:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()

    def _serve(self, client: socket.socket) -> None:
        reset = False
        try:
            client.settimeout(self._io_timeout_s)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._track(client)
            reader = _Reader(client, _ClientGone, lambda n: self._count("bytes_from_client", n))
            while not self._stop.is_set():
                raw = reader.read_head()
                if raw is None:
                    break
                keep, reset = self._handle(client, reader, raw)
                if not keep:
                    break
        except _ClientGone:
            pass
        except BaseException as exc:  # a bug or a failing callback: keep it for close()
            self.errors.append(exc)
            reset = True
        finally:
            self._untrack_close(client, reset=reset)
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _send(self, client: socket.socket, data: bytes) -> None:
        try:
            client.sendall(data)
        except OSError as exc:
            raise _ClientGone(repr(exc)) from exc
        self._count("bytes_to_client", len(data))

    def _handle(self, client: socket.socket, reader: _Reader, raw: bytes) -> tuple[bool, bool]:
        """Serve one request; returns ``(keep_alive, reset)``."""
        try:
            head = wire.parse_head(raw)
            method, target = head.request_parts()
            framing = wire.request_framing(head)
        except wire.HttpParseError as exc:
            self._send(client, _error(400, "BadRequest", str(exc), "/"))
            return False, False
        with self._lock:
            self._counts["requests"] += 1
            info = RequestInfo(self._counts["requests"], method, target, head.headers)
            active = self._plan.decide(info, now=time.monotonic())
            fault = active.rule.fault if active is not None else None
            self._records.append(
                RequestRecord(info.number, method, target, info.range, fault.kind if fault else None)
            )
        status, keep, reset = self._respond(client, reader, head, info, framing, fault)
        if status is not None:
            with self._lock:
                record = self._records[info.number - 1]
                self._records[info.number - 1] = dataclasses.replace(record, status=status)
        return keep and not wire.wants_close(head), reset

    def _respond(
        self,
        client: socket.socket,
        reader: _Reader,
        head: wire.Head,
        info: RequestInfo,
        framing: wire.Framing,
        fault: Fault | None,
    ) -> tuple[int | None, bool, bool]:
        """Answer one request; returns ``(status sent, keep_alive, reset)``."""
        kind = fault.kind if fault else None
        expects = (head.get("expect") or "").lower() == "100-continue" and framing[0] != "none"
        if fault is not None and fault.kind in _EARLY:
            body_skipped = expects  # the client waits for 100 Continue before sending its body
            if not body_skipped:
                for _ in reader.body(framing):
                    pass
            self._mark(fault.kind)
            if fault.kind == "reset_before_response":
                return None, False, True
            if fault.kind == "hang":
                self._stop.wait(fault.duration_s)
                return None, False, False
            status, code, message = wire.S3_ERRORS[fault.kind]
            close = body_skipped or fault.kind == "request_timeout"
            self._send(
                client, _error(status, code, message, info.path, head_only=info.method == "HEAD", close=close)
            )
            return status, not close, False

        if expects:
            self._send(client, b"HTTP/1.1 100 Continue\r\n\r\n")
        body = b"".join(reader.body(framing))
        out = self._rewrite_request(head, fault)
        if kind == "overwrite_before":
            assert fault is not None and fault.callback is not None
            try:
                fault.callback(info)
            except Exception as exc:
                self.errors.append(exc)
                self._send(client, _error(502, "ProxyCallbackFailed", repr(exc), info.path))
                return 502, False, False
            self._mark(kind)
        try:
            upstream = socket.create_connection(self.upstream, timeout=self._io_timeout_s)
        except OSError as exc:
            self._count("upstream_errors")
            self._send(client, _error(502, "ProxyUpstreamFailed", repr(exc), info.path))
            return 502, False, False
        try:
            self._track(upstream)
            keep_client = not wire.wants_close(head)
            return self._exchange(client, upstream, out + body, info, fault, keep_client=keep_client)
        except _UpstreamFailed as exc:
            self._count("upstream_errors")
            if exc.before_response:
                self._send(client, _error(502, "ProxyUpstreamFailed", str(exc), info.path))
                return 502, False, False
            return None, False, True  # the response head is out: reset so the client sees a broken body
        finally:
            self._untrack_close(upstream)

    def _rewrite_request(self, head: wire.Head, fault: Fault | None) -> bytes:
        raw = head.raw
        value = head.get("range")
        if fault is None or value is None:
            return raw
        if fault.kind == "ignore_range":
            raw = wire.replace_header(raw, "Range", None)
        elif fault.kind == "shift_range" and (shifted := wire.shift_range(value, fault.shift_bytes)):
            raw = wire.replace_header(raw, "Range", shifted)
        else:
            return raw
        self._mark(fault.kind)
        return self._resign(raw) if self._resign is not None else raw

    def _exchange(
        self,
        client: socket.socket,
        upstream: socket.socket,
        request: bytes,
        info: RequestInfo,
        fault: Fault | None,
        *,
        keep_client: bool,
    ) -> tuple[int | None, bool, bool]:
        """Send the request upstream and relay the response, applying response-side faults.

        ``Connection`` is hop-by-hop: an upstream's ``Connection: close`` (moto says it on every response)
        becomes ``keep-alive`` when the body is length-delimited and the client did not ask to close.
        """
        try:
            upstream.sendall(request)
        except OSError as exc:
            raise _UpstreamFailed(repr(exc), before_response=True) from exc
        self._count("upstream_requests")
        self._count("bytes_to_upstream", len(request))
        up = _Reader(upstream, _UpstreamFailed, lambda n: self._count("bytes_from_upstream", n))
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
            shifted = wire.shift_content_range(value, fault.shift_bytes) if value else None
            if shifted:
                raw = wire.replace_header(raw, "Content-Range", shifted)
                self._mark(kind)
        if fault is not None and kind == "latency":
            self._mark(kind)
            if self._stop.wait(fault.delay_s):
                return None, False, True
        keep = keep_client and framing[0] != "close"
        if keep and wire.wants_close(head):
            raw = wire.replace_header(raw, "Connection", "keep-alive")
        self._send(client, raw)
        status = head.status()

        cut: int | None = None
        if fault is not None and kind in _MID_BODY:
            cut = fault.after_bytes
            if framing[0] == "length":
                cut = min(cut, max(framing[1] - 1, 0))
        pace = fault.bytes_per_s if fault is not None and kind == "bandwidth" else None
        if pace is not None:
            self._mark("bandwidth")
        sent, started = 0, time.monotonic()
        piece_limit = _PIECE if pace is None else max(1, min(_PIECE, int(pace / 50)))
        for data in up.body(framing):
            for start in range(0, len(data), piece_limit):
                piece = data[start : start + piece_limit]
                if cut is not None and sent + len(piece) > cut:
                    self._send(client, piece[: cut - sent])
                    return self._cut_body(status, fault)
                self._send(client, piece)
                sent += len(piece)
                if pace is not None:
                    delay = started + sent / pace - time.monotonic()
                    if delay > 0 and self._stop.wait(delay):
                        return status, False, True
        return status, keep, False

    def _cut_body(self, status: int, fault: Fault | None) -> tuple[int | None, bool, bool]:
        assert fault is not None
        self._mark(fault.kind)
        if fault.kind == "stall_mid_body":
            self._stop.wait(fault.duration_s)
        return status, False, fault.kind == "reset_mid_body"


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
