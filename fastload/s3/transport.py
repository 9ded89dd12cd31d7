"""S3's transport: ranged GETs and HEADs of one object, answered as :class:`~fastload.s3.objectio.Body`
values (the seam, ``s3.objectio``, every store's transport answers through; signing stays here).

Two implementations behind one interface, chosen by ``S3Config.transport``:

- ``"direct"`` (default), :class:`DirectTransport`: pooled keep-alive HTTP/1.1 connections
  (:mod:`fastload.s3.http1`; checked for a closed peer before reuse); requests signed
  (:mod:`fastload.core.sigv4`, botocore's headers) with the client's own credentials (its session's),
  endpoint, addressing style and region (resolved once per bucket: :class:`~fastload.s3.client.Targets`),
  TLS verified with the client's CA bundle; bodies read
  straight into the caller's buffer in pieces of ``core.hedge.PIECE_BYTES`` (progress the hedging watchdog
  sees). A fraction of botocore's CPU per GiB, one copy less. Requests can be cut short from another thread
  (:class:`~fastload.s3.objectio.Abort`), which shuts the connection's socket (:func:`connection_socket`).
- ``"botocore"``, :class:`BotocoreObject`: ``client.get_object``/``head_object`` (bodies through
  ``StreamingBody.read``), for what the direct path does not cover (non-SigV4 signers, botocore plugins,
  region redirects). Its requests cannot be aborted, so they are not hedged.

Both raise :class:`~fastload.s3.retrying.BadResponse` for an HTTP error status (S3 error code parsed from
the XML body) and let timeouts, resets and cut bodies through as exceptions that
:func:`~fastload.s3.client.classify_exception` knows. No credential material reaches a message.

The connection pools and the plain request (:class:`HttpPools`) are what the direct transport shares with
the web store's (``s3.httpstore``: no signing). (Over 400 lines on purpose: the two S3 transports and the
pools under both are one interface's implementations, read together.)
"""

from __future__ import annotations

import functools
import http.client
import re
import select
import socket
import ssl
import threading
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from fastload.config import S3Config
from fastload.core.hedge import PIECE_BYTES
from fastload.core.retry import classify_status
from fastload.s3 import runtime
from fastload.s3.client import (
    Failure,
    ObjectTarget,
    Signer,
    Targets,
    Unreachable,
    classify_exception,
    credentials,
    get_client,
    is_no_credentials,
    no_credentials_error,
    tls_verify,
)
from fastload.s3.http1 import Connection, Response
from fastload.s3.objectio import Abort, Body, ObjectIO
from fastload.s3.retrying import BadResponse

_ERROR_BODY_BYTES = 64 << 10
_CODE = re.compile(rb"<Code>\s*([^<\s]+)\s*</Code>")


def error_failure(status: int, body: bytes) -> Failure:
    """The classified failure of an error response, from its status and the XML error ``<Code>``."""
    match = _CODE.search(body)
    code = match.group(1).decode("ascii", "replace")[:64] if match else None
    return Failure(classify_status(status, code), status, f"HTTP {status} {code or ''}".strip())


# -- direct: fastload.s3.http1 ----------------------------------------------------------------------------


class _Pool:
    """Idle keep-alive connections to one ``scheme://host:port``, most recently used first."""

    def __init__(self, scheme: str, host: str, port: int, config: S3Config, context: ssl.SSLContext | None):
        self.scheme, self.host, self.port = scheme, host, port
        self._config, self._context = config, context
        self._idle: list[Connection] = []
        self._lock = threading.Lock()
        self._max_idle = max(config.process_max_concurrency, config.max_concurrency) + 4
        self.created = 0  # connections opened (tests check reuse)

    def take(self) -> Connection:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self.connect()
            if _usable(conn):
                return conn
            conn.close()

    def close(self) -> None:
        """Close the idle connections (those in use close when their requests end)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def give_back(self, conn: Connection) -> None:
        with self._lock:
            if len(self._idle) < self._max_idle:
                self._idle.append(conn)
                return
        conn.close()

    def connect(self) -> Connection:
        """A new connection (into the pool once its request ends, like any other)."""
        timeout = self._config.connect_timeout_s
        context = self._context if self.scheme == "https" else None
        conn = Connection(self.scheme, self.host, self.port, timeout=timeout, context=context)
        try:
            conn.connect()
        except (TimeoutError, ssl.SSLError):
            conn.close()
            raise
        except (ConnectionRefusedError, socket.gaierror) as exc:  # nothing listens there, or no such host
            conn.close()
            refused = isinstance(exc, ConnectionRefusedError)
            reason = "connection refused" if refused else f"host not found: {exc}"
            raise Unreachable(f"{self.scheme}://{self.host}:{self.port}", reason) from exc
        except ConnectionError:
            conn.close()
            raise
        except OSError as exc:  # unreachable network or host
            conn.close()
            raise Unreachable(f"{self.scheme}://{self.host}:{self.port}", str(exc)) from exc
        sock = connection_socket(conn)
        assert sock is not None  # just connected
        sock.settimeout(self._config.read_timeout_s)  # from now on: the inactivity timeout
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        with self._lock:
            self.created += 1
        return conn


@functools.lru_cache(maxsize=1024)
def _route(url: str) -> tuple[tuple[str, str, int], str]:
    """``((scheme, host, port), path and query)`` of ``url`` (an object's URL, asked for again and again)."""
    parts = urlsplit(url)
    scheme, host = parts.scheme, parts.hostname or ""
    port = parts.port or (443 if scheme == "https" else 80)
    return (scheme, host, port), parts.path + (f"?{parts.query}" if parts.query else "")


def connection_socket(conn: Connection) -> socket.socket | None:
    """The socket of a connection (None once closed)."""
    return conn.sock


def _usable(conn: Connection) -> bool:
    """An idle connection whose peer has not closed it (nothing readable while no request is out)."""
    sock = connection_socket(conn)
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


class _DirectBody:
    """A response on a pooled connection, its body read into the caller's buffer."""

    def __init__(self, pool: _Pool, conn: Connection, resp: Response, abort: Abort):
        self._pool, self._conn, self._resp, self._abort = pool, conn, resp, abort
        self.status = resp.status
        headers = resp.headers
        self.content_range = headers.get("content-range")
        length = headers.get("content-length")
        self.content_length = int(length) if length is not None and length.isdigit() else None
        self.etag = headers.get("etag")
        self.last_modified = headers.get("last-modified")
        self.headers = headers  # (lowercase names) what a store's transport may read beyond the above

    def readinto(self, view: memoryview) -> int:
        return self._resp.readinto(view[:PIECE_BYTES])  # 0 at the end of the body, or when it was cut

    def close(self) -> None:
        self._abort.detach()  # before the connection may serve another request
        if self._resp.reusable:  # read to its end: the connection is reused
            self._pool.give_back(self._conn)
        else:
            self._conn.close()


class Redirected(Exception):
    """A 3xx answer with a ``Location`` (raised by :meth:`HttpPools.send` only when asked to follow)."""

    def __init__(self, status: int, location: str) -> None:
        super().__init__(f"HTTP {status} to {location}")
        self.status, self.location = status, location


_REDIRECTS = (301, 302, 303, 307, 308)


class HttpPools:
    """Requests over pooled keep-alive connections, one pool per ``scheme://host:port`` (what every store's
    direct transport shares; signing, if any, is the caller's)."""

    def __init__(self, config: S3Config, verify: str | None) -> None:
        self._config, self._verify = config, verify
        # built on the first https pool: loading the CA store costs ~10 ms and OpenSSL's locks in every
        # DataLoader worker, which a plain-http endpoint never needs
        self._context: ssl.SSLContext | None = None
        self._pools: dict[tuple[str, str, int], _Pool] = {}
        self._lock = threading.Lock()

    def pool(self, url: str) -> _Pool:
        ident = _route(url)[0]
        scheme, host, port = ident
        with self._lock:
            pool = self._pools.get(ident)
            if pool is None:
                context = None
                if scheme == "https":
                    if self._context is None:
                        self._context = ssl.create_default_context(cafile=self._verify)
                    context = self._context
                pool = self._pools[ident] = _Pool(scheme, host, port, self._config, context)
            return pool

    def close(self) -> None:
        """Close every idle connection."""
        with self._lock:
            pools = list(self._pools.values())
        for pool in pools:
            pool.close()

    def send(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        abort: Abort | None = None,
        fresh: bool = False,
        follow: bool = False,
    ) -> _DirectBody:
        """``method url`` with ``headers`` as given; :class:`BadResponse` for an error status (and a 3xx,
        unless ``follow``: then :class:`Redirected`)."""
        path = _route(url)[1]
        pool = self.pool(url)
        conn, abort = pool.connect() if fresh else pool.take(), abort or Abort()
        abort.attach(connection_socket(conn))  # a pooled connection is connected
        try:
            resp = conn.request(method, path, headers)
        except BaseException:
            abort.detach()
            conn.close()
            raise
        if resp.status >= 300:
            try:
                data = resp.read(_ERROR_BODY_BYTES) if method != "HEAD" else b""
            except (OSError, http.client.HTTPException):
                data = b""
            abort.detach()
            pool.give_back(conn) if resp.reusable else conn.close()
            location = resp.headers.get("location")
            if follow and resp.status in _REDIRECTS and location:
                raise Redirected(resp.status, location)
            raise BadResponse(error_failure(resp.status, data))
        return _DirectBody(pool, conn, resp, abort)


class DirectTransport(HttpPools):
    """Signed requests over pooled keep-alive connections (see the module docstring); unsigned ones for
    ``S3Config(unsigned=True)`` (public buckets)."""

    def __init__(self, config: S3Config, client: Any, creds: Any, verify: str | None) -> None:
        super().__init__(config, verify)
        self._client = client
        self._signer = Signer(creds)
        self._proxies = urllib.request.getproxies()  # HTTP(S)_PROXY, as botocore reads them
        self._targets = Targets(client)

    def proxied(self, url: str) -> bool:
        """Whether botocore would send requests for ``url`` through an HTTP proxy (not spoken here)."""
        parts = urlsplit(url)
        return parts.scheme in self._proxies and not urllib.request.proxy_bypass(parts.hostname or "")

    @property
    def client(self) -> Any:
        return self._client

    def target(self, bucket: str, key: str, version_id: str | None) -> ObjectTarget:
        if not self._signer.has_credentials and not self._config.unsigned:
            raise no_credentials_error(bucket, key)
        return self._targets.target(bucket, key, version_id)

    def request(
        self,
        method: str,
        target: ObjectTarget,
        headers: dict[str, str],
        abort: Abort | None = None,
        fresh: bool = False,
    ) -> _DirectBody:
        signed = headers if self._config.unsigned else self._signer.headers(method, target, headers)
        return self.send(method, target.url, signed, abort, fresh)


# -- botocore ---------------------------------------------------------------------------------------------


class _BotocoreBody:
    def __init__(self, resp: dict[str, Any]) -> None:
        self.status = int(resp["ResponseMetadata"]["HTTPStatusCode"])
        self.content_range = resp.get("ContentRange")
        self.content_length = resp.get("ContentLength")
        self.etag = resp.get("ETag")
        self._body = resp.get("Body")

    def readinto(self, view: memoryview) -> int:
        if self._body is None:
            return 0
        # StreamingBody.read (public) returns once it has the bytes asked for: a stall loses at most a piece
        data = self._body.read(min(len(view), PIECE_BYTES))
        view[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if self._body is not None:
            self._body.close()


class BotocoreObject:
    """``get_object``/``head_object`` on the botocore client."""

    def __init__(self, client: Any, bucket: str, key: str, version_id: str | None) -> None:
        self._client, self._params = client, {"Bucket": bucket, "Key": key}
        if version_id:
            self._params["VersionId"] = version_id

    def _call(self, method: Any, headers: dict[str, str]) -> Any:
        params = dict(self._params)
        if "If-Match" in headers:
            params["IfMatch"] = headers["If-Match"]
        if "Range" in headers:
            params["Range"] = headers["Range"]
        try:
            return method(**params)
        except Exception as exc:
            if is_no_credentials(exc):
                raise no_credentials_error(self._params["Bucket"], self._params["Key"]) from None
            failure = classify_exception(exc)
            if failure is not None and failure.status:
                raise BadResponse(failure) from exc
            raise

    abortable = False

    def get(self, headers: dict[str, str], *, abort: Abort | None = None, fresh: bool = False) -> Body:
        return _BotocoreBody(self._call(self._client.get_object, headers))

    def head(self, headers: dict[str, str]) -> Body:
        return _BotocoreBody({**self._call(self._client.head_object, headers), "Body": None})


class DirectObject:
    """The direct transport on one object; its URL and region are resolved on the first request. Behind an
    HTTP proxy (``HTTPS_PROXY``/``HTTP_PROXY`` for the endpoint) requests go through botocore instead."""

    def __init__(self, transport: DirectTransport, bucket: str, key: str, version_id: str | None) -> None:
        self._transport = transport
        self._where = (bucket, key, version_id)
        self._target: ObjectTarget | None = None
        self._fallback: BotocoreObject | None = None

    def _resolved(self) -> ObjectTarget:
        if self._target is None:  # two threads may both resolve: same answer, no harm
            target = self._transport.target(*self._where)
            if self._transport.proxied(target.url):
                self._fallback = BotocoreObject(self._transport.client, *self._where)
            self._target = target
        return self._target

    @property
    def abortable(self) -> bool:
        self._resolved()
        return self._fallback is None

    def get(self, headers: dict[str, str], *, abort: Abort | None = None, fresh: bool = False) -> Body:
        target = self._resolved()
        if self._fallback is not None:
            return self._fallback.get(headers)
        return self._transport.request("GET", target, headers, abort, fresh=fresh)

    def head(self, headers: dict[str, str]) -> Body:
        target = self._resolved()
        if self._fallback is not None:
            return self._fallback.head(headers)
        return self._transport.request("HEAD", target, headers)


def direct_transport(config: S3Config) -> DirectTransport:
    """This process's direct transport for ``config`` (a new one, with no connections, after fork), kept by
    :mod:`fastload.s3.runtime` (which closes its idle connections at exit)."""
    transport: DirectTransport = runtime.current().transports.get(
        config,
        lambda: DirectTransport(
            config, get_client(config), None if config.unsigned else credentials(config), tls_verify(config)
        ),
    )
    return transport


def open_object(config: S3Config, bucket: str, key: str, version_id: str | None = None) -> ObjectIO:
    """Requests on ``s3://bucket/key`` over the transport ``config.transport`` names."""
    if config.transport == "botocore":
        return BotocoreObject(get_client(config), bucket, key, version_id)
    return DirectObject(direct_transport(config), bucket, key, version_id)
