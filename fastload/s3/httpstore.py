"""Plain HTTP(S) as a store (``https://`` URLs, and the Hub's after ``hf://`` is resolved): its transport
behind ``s3.objectio``'s seam, so its objects are read by the same ranged reader as S3's (retries, the
206/``Content-Range`` checks, the whole-object-200 rule, hedging, the AIMD gate, ``s3_stats`` counters).

The transport is S3's pooled keep-alive HTTP/1.1 (:class:`~fastload.s3.transport.HttpPools`) without
signing: the config's ``headers`` go with every request (and ``Authorization: Bearer HF_TOKEN`` for the Hub),
but only to the host of the URL given, never to a host a redirect leads to (the Hub answers ``/resolve/``
with a redirect to its CDN, whose signed URL carries its own authorisation). A redirect is followed (up to
:data:`MAX_REDIRECTS`) and its target kept for the object's later ranges; a target that stops answering
(a signed URL that expired: 401/403/404) is resolved again from the URL given, once.

Pinning: an ETag (strong) travels as ``If-Match`` on every request after the first, as for S3. A server
that sends no ETag but ``Last-Modified`` is pinned by ``If-Unmodified-Since`` and every answer's
``Last-Modified`` must be the first one's (a server that ignores the condition is still caught by the
comparison); a server with neither is pinned by the object's size only: a rewrite of the same size while
it is read is not detected (``docs/stores.md``).
"""

from __future__ import annotations

import threading
from urllib.parse import urljoin, urlsplit

from fastload.config import S3Config
from fastload.core.retry import Fault
from fastload.s3 import runtime
from fastload.s3.client import Failure
from fastload.s3.objectio import Abort, Body
from fastload.s3.reader import RangedReader
from fastload.s3.retrying import BadResponse
from fastload.s3.transport import HttpPools, Redirected
from fastload.s3.urlerrors import fail_fast_url_error

MAX_REDIRECTS = 5


def http_pools(config: S3Config) -> HttpPools:
    """This process's connection pools for plain HTTP(S) under ``config`` (kept by ``s3.runtime``, like
    S3's direct transport: closed at exit, new after fork)."""
    pools: HttpPools = runtime.current().transports.get(("http", config), lambda: HttpPools(config, None))
    return pools


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


class HttpObject:
    """Requests on the object at ``url`` (see the module docstring); ``headers`` go to ``url``'s host
    only."""

    abortable = True

    def __init__(self, pools: HttpPools, url: str, headers: dict[str, str]) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"{url!r} is not an http(s) URL")
        self._pools, self._url, self._headers = pools, url, headers
        self._host = _origin(url)
        self._location = url  # where the last redirect led (the CDN's URL), for every later request
        self._last_modified: str | None = None  # the validator of a server without ETags
        self._lock = threading.Lock()

    def get(self, headers: dict[str, str], *, abort: Abort | None = None, fresh: bool = False) -> Body:
        return self._request("GET", headers, abort, fresh)

    def head(self, headers: dict[str, str]) -> Body:
        return self._request("HEAD", headers, None, False)

    def _request(self, method: str, headers: dict[str, str], abort: Abort | None, fresh: bool) -> Body:
        with self._lock:
            url, last_modified = self._location, self._last_modified
        if last_modified is not None and "If-Match" not in headers:
            headers = {**headers, "If-Unmodified-Since": last_modified}
        try:
            body = self._follow(method, url, headers, abort, fresh)
        except BadResponse as exc:
            if url == self._url or exc.failure.fault not in (Fault.DENIED, Fault.NOT_FOUND):
                raise
            with self._lock:  # a redirect's target that expired: ask the URL given again
                self._location = self._url
            body = self._follow(method, self._url, headers, abort, fresh)
        seen = getattr(body, "last_modified", None)
        if body.etag is None and seen is not None:
            with self._lock:
                known = self._last_modified = self._last_modified or seen
            if seen != known:
                body.close()
                raise BadResponse(Failure(Fault.CHANGED, 412, f"Last-Modified {known} became {seen}"))
        return body

    def _follow(
        self, method: str, url: str, headers: dict[str, str], abort: Abort | None, fresh: bool
    ) -> Body:
        for _ in range(MAX_REDIRECTS + 1):
            sent = {**self._headers, **headers} if _origin(url) == self._host else headers
            try:
                body = self._pools.send(method, url, sent, abort, fresh, follow=True)
            except Redirected as moved:
                url = urljoin(url, moved.location)
                if moved.status in (301, 302, 303, 307, 308) and method in ("GET", "HEAD"):
                    continue
                raise
            if url != self._location:
                with self._lock:
                    self._location = url
            return body
        raise BadResponse(Failure(Fault.CLIENT, 310, f"over {MAX_REDIRECTS} redirects from {self._url}"))


def open_http(url: str, config: S3Config, *, headers: dict[str, str] | None = None) -> RangedReader:
    """The ranged reader of the object at ``url`` (``http://`` or ``https://``), sending ``config.headers``
    (and ``headers``: the Hub's token) to its host."""
    sent = dict(config.header_pairs)
    sent.update(headers or {})

    def store() -> HttpObject:
        return HttpObject(http_pools(config), url, sent)

    return RangedReader("", url, config=config, store=store, url=url)


def get_document(url: str, config: S3Config, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    """The whole body and headers of a small document at ``url`` (an API's JSON answer: no ranges, a body
    of any framing), retried as every store request is; ``headers`` go to ``url``'s host only."""
    from fastload.s3.retrying import Retrier

    obj = HttpObject(http_pools(config), url, headers)

    def attempt() -> tuple[bytes, dict[str, str]]:
        body = obj.get({})
        try:
            out = bytearray()
            piece = bytearray(1 << 16)
            view = memoryview(piece)
            while n := body.readinto(view):
                out += view[:n]
            length = body.content_length
            if length is not None and len(out) != length:
                raise BadResponse(Failure(Fault.SHORT_BODY, body.status, f"body has {len(out)} of {length}"))
            return bytes(out), dict(getattr(body, "headers", {}))
        finally:
            body.close()

    def give_up(failure: Failure, tries: int, elapsed_s: float) -> Exception:
        if failure.fault in (Fault.NOT_FOUND, Fault.DENIED, Fault.CLIENT):
            return fail_fast_url_error(failure, url)
        from fastload.errors import RangeReadError

        return RangeReadError(
            bucket="",
            key=url,
            start=0,
            end=1,
            attempts=tries,
            elapsed_s=elapsed_s,
            last_error=f"GET: {failure.message}",
            cause=failure.fault.value,
            url=url,
        )

    return Retrier.from_config(config).call(attempt, give_up)
