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
The response's ``Connection`` header is hop-by-hop: moto's ``Connection: close`` becomes ``keep-alive``.

Pieces: ``faultplan`` (which request gets which fault; pure), ``httpwire`` (heads as bytes; pure),
``sigv4`` (verify or re-sign a head; pure), ``proxyconn`` (one client connection), this module (lifecycle,
rules and counters). Everything is re-exported here.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from urllib.parse import urlsplit

from fastload.testing.faultplan import FAULT_KINDS, ActiveRule, Fault, FaultKind, RequestInfo, Rule
from fastload.testing.proxyconn import ProxyState, RequestRecord, serve_connection
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


class FaultProxyError(RuntimeError):
    """A proxy thread failed unexpectedly (``errors`` holds every exception); raised by ``close()``."""

    def __init__(self, errors: list[BaseException]) -> None:
        super().__init__(f"{len(errors)} error(s) in fault proxy threads; first: {errors[0]!r}")
        self.errors = errors


@dataclass(frozen=True)
class ProxyStats:
    """Counters since the proxy started.

    ``injected`` counts, by kind, faults that took effect (a rule can fire without effect: ``shift_range``
    on a request without Range, a mid-body fault on an empty body). Byte counts are raw bytes on the wire,
    heads included; ``bytes_to_client`` counts bytes handed to the client socket.
    """

    requests: int
    upstream_requests: int
    injected: Mapping[str, int]
    connections: int
    bytes_to_client: int
    bytes_from_client: int
    bytes_to_upstream: int
    bytes_from_upstream: int
    upstream_errors: int


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

    ``upstream`` is ``"http://127.0.0.1:PORT"`` or ``(host, port)`` on loopback; the proxy connects nowhere
    else. ``seed`` seeds every rule's random draws. ``resign`` re-signs request heads the proxy rewrote
    (``SigV4Resigner(secret_key)``), needed only for servers that verify signatures. ``io_timeout_s``
    bounds every socket wait (an idle keep-alive connection is closed after it).
    """

    def __init__(
        self,
        upstream: str | tuple[str, int],
        *,
        seed: int = 0,
        resign: Callable[[bytes], bytes] | None = None,
        io_timeout_s: float = 30.0,
    ) -> None:
        if io_timeout_s <= 0:
            raise ValueError(f"{io_timeout_s=} must be > 0")
        self.upstream = _parse_upstream(upstream)
        self._state = ProxyState(self.upstream, seed=seed, resign=resign, io_timeout_s=io_timeout_s)
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self.address: tuple[str, int] = ("127.0.0.1", 0)

    # -- lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        """Listen on a free port of 127.0.0.1 and start accepting."""
        if self._listener is not None:
            raise RuntimeError("FaultProxy already started")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
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
        state = self._state
        state.stop.set()
        if self._accept_thread is not None:
            self._accept_thread.join(timeout=1.0)
        if self._listener is not None:
            self._listener.close()
        with state.lock:
            socks, threads = list(state.sockets), list(state.threads)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + 1.0
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if state.errors:
            raise FaultProxyError(list(state.errors))

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
        """Add a rule at the end of the plan (it applies from the next request); ``for_s`` starts now, or
        at the first matching request with ``from_first=True``."""
        with self._state.lock:
            return self._state.plan.add(rule, now=time.monotonic())

    def remove(self, active: ActiveRule) -> None:
        with self._state.lock:
            self._state.plan.remove(active)

    def clear(self) -> None:
        """Remove every rule: requests pass through from now on."""
        with self._state.lock:
            self._state.plan.clear()

    def stats(self) -> ProxyStats:
        state = self._state
        with state.lock:
            c = state.counts
            return ProxyStats(
                requests=c["requests"],
                upstream_requests=c["upstream_requests"],
                injected=dict(state.injected),
                connections=c["connections"],
                bytes_to_client=c["bytes_to_client"],
                bytes_from_client=c["bytes_from_client"],
                bytes_to_upstream=c["bytes_to_upstream"],
                bytes_from_upstream=c["bytes_from_upstream"],
                upstream_errors=c["upstream_errors"],
            )

    def requests(self) -> list[RequestRecord]:
        """Every request read so far, in arrival order."""
        with self._state.lock:
            return list(self._state.records)

    @property
    def errors(self) -> list[BaseException]:
        """Unexpected exceptions from proxy threads (bugs, failing callbacks); ``close()`` raises them."""
        return list(self._state.errors)

    def _accept_loop(self) -> None:
        state, listener = self._state, self._listener
        if listener is None:
            return
        while not state.stop.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                if not state.stop.is_set():
                    state.errors.append(exc)
                return
            thread = threading.Thread(
                target=serve_connection, args=(state, client), name="faultproxy-conn", daemon=True
            )
            with state.lock:
                state.counts["connections"] += 1
                state.threads.add(thread)
            thread.start()
