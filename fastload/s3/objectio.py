"""The seam between the reader and a store: what a transport answers (:class:`Body`, :class:`ObjectIO`), how
a request is cut short from another thread (:class:`Abort`), the one loop that reads a body into a buffer
(:func:`fill`), and what the reader has learned of its object (:class:`ObjectState`: size, ETag, the
If-Match headers every later request carries).

A store (S3 today; https, GCS, Azure later) adds a transport that answers a GET with a range and
If-Match as a :class:`Body` (status, ``Content-Range``, ``Content-Length``, ETag, the body read piece by
piece) and raises :class:`~fastload.s3.retrying.BadResponse` for an error status; signing and addressing
stay inside that transport. The part fetches (``s3.partfetch``), the hedges (``s3.races``) and the reader
see only this module's types.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from fastload.core.ranges import ByteRange
from fastload.errors import ObjectChangedError


class Abort:
    """Lets another thread cut one request short: shuts its connection's socket down (waking a read that
    blocks on it). Attached when the request has a socket, detached before the connection is reused."""

    __slots__ = ("_children", "_lock", "_sock", "fired")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: Any = None
        self._children: list[Abort] = []
        self.fired = False

    def child(self) -> Abort:
        """An abort of its own for one of several requests (a split hedge's ranges), fired with this one."""
        child = Abort()
        with self._lock:
            self._children.append(child)
            fired = self.fired
        if fired:
            child.fire()
        return child

    def attach(self, sock: Any) -> None:
        with self._lock:
            self._sock = sock
            if self.fired:
                _shutdown(sock)

    def detach(self) -> None:
        with self._lock:
            self._sock = None

    def fire(self) -> None:
        with self._lock:
            self.fired = True
            if self._sock is not None:
                _shutdown(self._sock)
            children = list(self._children)
        for child in children:
            child.fire()


def _shutdown(sock: Any) -> None:
    with contextlib.suppress(OSError):  # already closed
        sock.shutdown(2)  # socket.SHUT_RDWR


class Readable(Protocol):
    def readinto(self, view: memoryview) -> int:
        """Up to ``len(view)`` bytes into ``view``; 0 at the end (or once cut); raises on reset/timeout."""


class Body(Readable, Protocol):
    """One response: status and range headers, and its body read piece by piece."""

    status: int
    content_range: str | None
    content_length: int | None
    etag: str | None

    def close(self) -> None:
        """Done with the body (the connection is reused only if it was read to its end)."""


class ObjectIO(Protocol):
    """Requests on one object (one version, if given)."""

    @property
    def abortable(self) -> bool:
        """Whether ``get(..., abort=)`` honours the abort (so its GETs may be hedged)."""

    def get(self, headers: dict[str, str], *, abort: Abort | None = None, fresh: bool = False) -> Body:
        """A GET with ``headers`` (Range, If-Match); :class:`BadResponse` on an error status. ``abort.fire()``
        cuts it short (where :attr:`abortable`); ``fresh``: on a new connection (a hedge), not a pooled."""

    def head(self, headers: dict[str, str]) -> Body:
        """A HEAD (its body is empty); raises :class:`BadResponse` on an error status."""


def fill(
    body: Readable, view: memoryview, since: float = 0.0, progress: Callable[[int, float], None] | None = None
) -> tuple[int, float]:
    """Read ``body`` into ``view`` until it is full or the body ends: the bytes read and the longest wait
    for a piece after ``since`` (a ``time.monotonic()``; 0: not measured). ``progress(n, now)`` after each
    piece (measured runs only), so a caller keeps count of what arrived even when a later read raises."""
    got, last, gap = 0, since, 0.0
    while got < len(view):
        n = body.readinto(view[got:])
        if not n:
            break
        got += n
        if since:
            now = time.monotonic()
            last, gap = now, max(gap, now - last)
            if progress is not None:
                progress(n, now)
    return got, gap


def overlong(body: Body) -> bool:
    """Whether ``body`` has bytes left after its range was read in full."""
    return bool(body.readinto(memoryview(bytearray(1))))


class ObjectState:
    """What the reader has learned of ``s3://bucket/key`` (or of the object at ``url``, another store's:
    ``bucket`` empty): its size and ETag (from the first answer; every later answer must agree) and, after a
    200 with the whole object, its bytes. Shared by the reader, its part fetches and their hedges (any
    thread)."""

    def __init__(self, bucket: str, key: str, version_id: str | None, *, url: str | None = None) -> None:
        self.bucket, self.key, self.version_id = bucket, key, version_id
        self._url = url
        self.size: int | None = None
        self.etag: str | None = None
        self.whole: memoryview | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return self._url or f"s3://{self.bucket}/{self.key}"

    @property
    def object_url(self) -> str | None:
        """The URL errors name for a store other than S3 (None for S3: they name bucket and key)."""
        return self._url

    def headers(self, byte_range: ByteRange | None = None) -> dict[str, str]:
        """Range and If-Match (once the ETag is known; a pinned version needs none; a weak ETag, ``W/...``,
        never matches If-Match: answers are compared with it instead)."""
        headers = {"Range": byte_range.header()} if byte_range is not None else {}
        if self.etag and not self.version_id and not self.etag.startswith("W/"):
            headers["If-Match"] = self.etag
        return headers

    def learn(self, size: int, etag: str | None) -> None:
        """An answer's object size and ETag; :class:`ObjectChangedError` if they differ from the known."""
        with self._lock:
            if self.etag is not None and etag is not None and etag != self.etag:
                raise ObjectChangedError(
                    f"{self.url} changed while being read (ETag {self.etag} became {etag}); open it again "
                    "to read the new version",
                    bucket=self.bucket,
                    key=self.key,
                    url=self._url,
                )
            if self.size is not None and size != self.size:
                raise ObjectChangedError(
                    f"{self.url} changed size while being read ({self.size} -> {size}); open it again",
                    bucket=self.bucket,
                    key=self.key,
                    url=self._url,
                )
            self.size = size
            self.etag = self.etag or etag
