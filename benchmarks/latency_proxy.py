"""A lean HTTP/1.1 proxy for S3 read benchmarks: first-byte latency plus a per-response bandwidth cap.

Why not ``fastload.testing.faultproxy``? It applies one fault per request (a request cannot get both
``latency`` and ``bandwidth``), opens a fresh upstream connection per request and copies every 64 KiB of body
through Python with a lock per piece. Both forward close to RGW's direct speed on loopback, but FaultProxy
costs about 1 CPU s/GiB against 0.35 here (splice), CPU that RGW and the reader need on a small machine;
``benchmarks/s3_read.py`` measures both ceilings first (``--probe``).

This one, stdlib only, one thread per client connection, each with one keep-alive upstream connection:

- forwards each request byte for byte (Host included, so SigV4 signatures stay valid) to one loopback
  upstream; ``Expect: 100-continue`` is answered by the proxy and the upstream's interim 1xx skipped;
- waits ``latency_s`` after the upstream's response head arrives, then sends it (S3's first-byte latency);
- paces each response body to ``bytes_per_s`` from its first byte (S3's per-connection bandwidth);
- moves Content-Length bodies with ``os.splice`` (socket -> pipe -> socket, no copy through Python) in
  pieces of at most ``PIECE_BYTES``; chunked and close-delimited bodies go through Python.

Loopback only; no faults, no rewriting. Run it in a process of its own so that its CPU time is not charged
to the reader being measured:

    python benchmarks/latency_proxy.py --upstream http://127.0.0.1:PORT --latency-ms 20 --conn-mbps 50

prints ``{"endpoint_url": ..., "pid": ...}`` as one JSON line and serves until SIGTERM or SIGINT. With
``--faultproxy`` it serves ``fastload.testing.faultproxy.FaultProxy`` instead (with a latency rule when
``--latency-ms`` > 0; it cannot add the bandwidth cap on top), for comparing the two, or with ``--stall``
rules for the tail-latency benchmark (``s3_read.py --tail``), chained in front of a capped proxy::

    --faultproxy --seed 7 --stall body:0.05:12       # 5% of GETs: body pauses 12 s, then the proxy closes
    --faultproxy --stall body:0.02:forever           # 2%: the body stops until the proxy shuts down
    --faultproxy --stall first-byte:0.05:12          # 5%: no response head for 12 s
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import ipaddress
import json
import os
import signal
import socket
import sys
import threading
import time
from urllib.parse import urlsplit

PIECE_BYTES = 256 << 10
PIPE_BYTES = 1 << 20
MAX_HEAD_BYTES = 64 << 10
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 1)


class _Closed(Exception):
    """A peer closed or broke the connection; the client connection ends."""


class _Conn:
    """A socket with a read buffer: message heads and chunk lines are parsed out of ``buf``."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def fill(self) -> None:
        data = self.sock.recv(PIECE_BYTES)
        if not data:
            raise _Closed("closed")
        self.buf += data

    def head(self) -> bytes | None:
        """One message head, or None when the peer closed cleanly before sending one."""
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            if len(self.buf) > MAX_HEAD_BYTES:
                raise _Closed("head too long")
            try:
                self.fill()
            except _Closed:
                if self.buf:
                    raise
                return None
        head = bytes(self.buf[: end + 4])
        del self.buf[: end + 4]
        return head

    def line(self) -> bytes:
        while (end := self.buf.find(b"\r\n")) < 0:
            self.fill()
        line = bytes(self.buf[: end + 2])
        del self.buf[: end + 2]
        return line

    def take(self, limit: int) -> bytes:
        """Up to ``limit`` bytes (at least one), buffered ones first."""
        if not self.buf:
            self.fill()
        data = bytes(self.buf[:limit])
        del self.buf[:limit]
        return data


def _headers(head: bytes) -> tuple[str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    fields: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
    return lines[0], fields


class LatencyProxy:
    """``with LatencyProxy("http://127.0.0.1:PORT", latency_s=0.02, bytes_per_s=50e6) as p: p.endpoint_url``.

    ``bytes_per_s=None`` means no cap; ``splice=False`` copies bodies through Python instead.
    """

    def __init__(
        self,
        upstream: str,
        *,
        latency_s: float = 0.0,
        bytes_per_s: float | None = None,
        splice: bool = True,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ValueError(f"{upstream=} must look like http://127.0.0.1:PORT")
        if not ipaddress.ip_address(parts.hostname).is_loopback:
            raise ValueError(f"{upstream=} must be a loopback address")
        if latency_s < 0 or (bytes_per_s is not None and bytes_per_s <= 0):
            raise ValueError(f"{latency_s=} must be >= 0 and {bytes_per_s=} > 0 (or None)")
        self.upstream = (parts.hostname, parts.port)
        self.latency_s = latency_s
        self.bytes_per_s = bytes_per_s
        self.splice = splice and hasattr(os, "splice")
        self._listener: socket.socket | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self.requests = 0
        self.address: tuple[str, int] = ("127.0.0.1", 0)

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.address[0]}:{self.address[1]}"

    def start(self) -> LatencyProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(256)
        self._listener = listener
        self.address = listener.getsockname()[:2]
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
        with self._lock:
            socks = list(self._socks)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> LatencyProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------- connections

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), name="proxy-conn", daemon=True).start()

    def _track(self, sock: socket.socket, add: bool) -> None:
        with self._lock:
            (self._socks.add if add else self._socks.discard)(sock)

    def _serve(self, client_sock: socket.socket) -> None:
        client_sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._track(client_sock, True)
        client, up = _Conn(client_sock), None
        pipe = os.pipe() if self.splice else None
        if pipe is not None:
            with contextlib.suppress(OSError):
                fcntl.fcntl(pipe[1], _F_SETPIPE_SZ, PIPE_BYTES)
        try:
            while not self._stop.is_set():
                head = client.head()
                if head is None:
                    break
                if up is None:
                    up_sock = socket.create_connection(self.upstream)
                    up_sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self._track(up_sock, True)
                    up = _Conn(up_sock)
                keep_client, keep_up = self._exchange(client, up, head, pipe)
                if not keep_up:
                    self._track(up.sock, False)
                    up.sock.close()
                    up = None
                if not keep_client:
                    break
        except (_Closed, OSError):
            pass
        finally:
            for conn in (client, up):
                if conn is not None:
                    self._track(conn.sock, False)
                    conn.sock.close()
            if pipe is not None:
                os.close(pipe[0])
                os.close(pipe[1])

    def _exchange(
        self, client: _Conn, up: _Conn, head: bytes, pipe: tuple[int, int] | None
    ) -> tuple[bool, bool]:
        """Forward one request and relay its response; returns (keep client, keep upstream)."""
        line, fields = _headers(head)
        method = line.split(" ", 1)[0]
        if "chunked" in fields.get("transfer-encoding", "").lower():
            client.sock.sendall(
                b"HTTP/1.1 501 Not Implemented\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
            return False, False
        length = int(fields.get("content-length", "0") or 0)
        if length and fields.get("expect", "").lower() == "100-continue":
            client.sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = bytearray()
        while len(body) < length:
            body += client.take(length - len(body))
        with self._lock:
            self.requests += 1
        up.sock.sendall(head + body)
        while True:  # skip interim responses (the proxy answered 100 Continue itself)
            resp = up.head()
            if resp is None:
                raise _Closed("upstream closed without a response")
            status_line, resp_fields = _headers(resp)
            status = int(status_line.split(" ", 2)[1])
            if status >= 200:
                break
        if self.latency_s and self._stop.wait(self.latency_s):
            raise _Closed("stopping")
        client.sock.sendall(resp)
        keep = "close" not in fields.get("connection", "").lower()
        keep_up = "close" not in resp_fields.get("connection", "").lower()
        if method == "HEAD" or status in (204, 304):
            return keep and keep_up, keep_up
        if "chunked" in resp_fields.get("transfer-encoding", "").lower():
            self._relay_chunked(client, up)
            return keep and keep_up, keep_up
        if "content-length" in resp_fields:
            self._relay_length(client, up, int(resp_fields["content-length"]), pipe)
            return keep and keep_up, keep_up
        self._relay_to_close(client, up)
        return False, False

    # ------------------------------------------------------------------------------------------- bodies

    def _pace(self, started: float, sent: int) -> None:
        if self.bytes_per_s is not None:
            delay = started + sent / self.bytes_per_s - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                raise _Closed("stopping")

    def _relay_length(self, client: _Conn, up: _Conn, remaining: int, pipe: tuple[int, int] | None) -> None:
        started, sent = time.monotonic(), 0
        while remaining and up.buf:  # bytes that came with the head
            data = up.take(min(remaining, PIECE_BYTES))
            client.sock.sendall(data)
            remaining -= len(data)
            sent += len(data)
            self._pace(started, sent)
        src, dst = up.sock.fileno(), client.sock.fileno()
        while remaining:
            want = min(remaining, PIECE_BYTES)
            if pipe is None:
                data = up.sock.recv(want)
                if not data:
                    raise _Closed("upstream closed inside a body")
                client.sock.sendall(data)
                n = len(data)
            else:
                n = os.splice(src, pipe[1], want, flags=_SPLICE_FLAGS)
                if not n:
                    raise _Closed("upstream closed inside a body")
                left = n
                while left:
                    left -= os.splice(pipe[0], dst, left, flags=_SPLICE_FLAGS)
            remaining -= n
            sent += n
            self._pace(started, sent)

    def _relay_chunked(self, client: _Conn, up: _Conn) -> None:
        started, sent = time.monotonic(), 0
        while True:
            line = up.line()
            client.sock.sendall(line)
            size = int(line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                while (trailer := up.line()) != b"\r\n":
                    client.sock.sendall(trailer)
                client.sock.sendall(trailer)
                return
            left = size + 2
            while left:
                data = up.take(min(left, PIECE_BYTES))
                client.sock.sendall(data)
                left -= len(data)
                sent += len(data)
                self._pace(started, sent)

    def _relay_to_close(self, client: _Conn, up: _Conn) -> None:
        started, sent = time.monotonic(), 0
        with contextlib.suppress(_Closed):
            while True:
                data = up.take(PIECE_BYTES)
                client.sock.sendall(data)
                sent += len(data)
                self._pace(started, sent)


class _Stop(BaseException):
    pass


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop(signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--upstream", required=True, help="http://127.0.0.1:PORT")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="added before each response head")
    parser.add_argument("--conn-mbps", type=float, default=0.0, help="per-response cap in MB/s (0: none)")
    parser.add_argument("--copy", action="store_true", help="copy bodies through Python (no splice)")
    parser.add_argument("--faultproxy", action="store_true", help="serve fastload's FaultProxy instead")
    parser.add_argument(
        "--stall",
        action="append",
        default=[],
        metavar="KIND:FRACTION:SECONDS",
        help="FaultProxy only: stall that fraction of GETs (KIND body or first-byte; SECONDS or forever)",
    )
    parser.add_argument("--seed", type=int, default=0, help="FaultProxy's seed (which requests stall)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGINT, _raise_stop)
    if args.faultproxy:
        from fastload.testing.faultproxy import Fault, FaultProxy, Rule

        if args.conn_mbps:
            parser.error("FaultProxy applies one fault per request: give --latency-ms or nothing")
        fault_proxy = FaultProxy(args.upstream, seed=args.seed).start()
        if args.latency_ms:
            fault_proxy.add(Rule(Fault.latency(delay_s=args.latency_ms / 1000)))
        for stall in args.stall:
            kind, fraction, seconds = stall.split(":")
            duration = 86_400.0 if seconds == "forever" else float(seconds)
            fault = (
                Fault.stall_mid_body(after_bytes=16 << 10, duration_s=duration)
                if kind == "body"
                else Fault.hang(duration_s=duration)
            )
            fault_proxy.add(Rule(fault, method="GET", probability=float(fraction)))
        proxy: LatencyProxy | FaultProxy = fault_proxy
    else:
        if args.stall:
            parser.error("--stall needs --faultproxy")
        proxy = LatencyProxy(
            args.upstream,
            latency_s=args.latency_ms / 1000,
            bytes_per_s=args.conn_mbps * 1e6 if args.conn_mbps else None,
            splice=not args.copy,
        ).start()
    print(json.dumps({"endpoint_url": proxy.endpoint_url, "pid": os.getpid()}), flush=True)
    try:
        while True:
            time.sleep(3600)
    except _Stop:
        return 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with contextlib.suppress(Exception):
            proxy.close()


if __name__ == "__main__":
    sys.exit(main())
