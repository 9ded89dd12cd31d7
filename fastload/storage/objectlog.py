"""An append-only log of text lines in an object store (``s3://``, ``gs://``, ``az://``), where an object
cannot be appended to: numbered segment objects ``ROOT/NAME/{seq:08d}.jsonl``.

Writing (:class:`SegmentLog`): :meth:`~SegmentLog.append` never waits for the store; a background thread
rewrites the open segment whole (every line it holds) at most every ``interval_s``. A segment that holds
``segment_bytes`` is final, and the next one opens. Before its first write the log lists its existing
segments and continues after the last, so a restarted job adds segments and never overwrites one.

A failing store costs nothing but a warning: the first failure of an outage is logged (logger
``fastload.telemetry``), the lines wait for the next attempt, and past ``max_pending_bytes`` of waiting
lines the oldest are dropped and counted (:attr:`SegmentLog.dropped`). :meth:`~SegmentLog.close` (also run
at exit) writes what is left, waiting at most ``close_timeout_s``.

Reading: :func:`list_segments` (each log's segment URLs in order) and :func:`read_lines`.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import re
import threading
import time
from collections.abc import Callable

from fastload.config import S3Config
from fastload.storage.access import list_files, read_bytes

log = logging.getLogger("fastload.telemetry")
STORES = ("s3://", "gs://", "az://")
SUFFIX = ".jsonl"
_SEGMENT = re.compile(r"/([^/]+)/(\d{8,})\.jsonl$")
WRITE_DEADLINE_S = 30.0  # one write's retries (a stalled store must not hold lines for S3Config's 120 s)


def is_store(url: str) -> bool:
    return url.startswith(STORES)


def segment_url(root: str, name: str, seq: int) -> str:
    return f"{root.rstrip('/')}/{name}/{seq:08d}{SUFFIX}"


def list_segments(root: str, *, config: S3Config, name: str | None = None) -> dict[str, list[str]]:
    """Each log's segment URLs under ``root`` (only log ``name``'s, if given), by log name, oldest first."""
    found: dict[str, list[tuple[int, str]]] = {}
    base = root.rstrip("/")
    for url in list_files(base if name is None else f"{base}/{name}", SUFFIX, config=config):
        m = _SEGMENT.search(url)
        if m is not None and url[: m.start()] == base:
            found.setdefault(m.group(1), []).append((int(m.group(2)), url))
    return {name: [url for _, url in sorted(segs)] for name, segs in sorted(found.items())}


def read_lines(url: str, *, config: S3Config) -> list[str]:
    return read_bytes(url, config=config).decode("utf-8", errors="replace").splitlines()


def put_bytes(url: str, data: bytes, *, config: S3Config) -> None:
    """``data`` as the object ``url``, whole or not at all; its requests out of the process's S3 counters
    (they count the data's reads)."""
    if url.startswith("gs://"):
        from fastload.core.weburls import parse_gs_url
        from fastload.s3 import gcswrite

        gcswrite.upload(data, *parse_gs_url(url), config)
    elif url.startswith("az://"):
        from fastload.s3 import azwrite
        from fastload.s3.azstore import parse_az_url

        azwrite.upload(data, *parse_az_url(url), config)
    else:
        from fastload.s3.client import parse_s3_url
        from fastload.s3.retrying import Retrier
        from fastload.s3.stats import S3Stats
        from fastload.s3.upload import upload_from

        bucket, key = parse_s3_url(url)
        retrier = Retrier.from_config(config, stats=S3Stats())
        read_at: Callable[[int, int], bytes] = lambda offset, n: data[offset : offset + n]  # noqa: E731
        upload_from(read_at, len(data), bucket, key, source="telemetry", config=config, retrier=retrier)


class SegmentLog:
    """The log ``NAME`` under ``root``, written by a thread of its own (started at the first append)."""

    def __init__(
        self,
        root: str,
        name: str,
        *,
        config: S3Config,
        interval_s: float = 5.0,
        segment_bytes: int = 1 << 20,
        max_pending_bytes: int = 8 << 20,
        close_timeout_s: float = 10.0,
    ) -> None:
        self.root = root.rstrip("/")
        self.name = name
        self.config = dataclasses.replace(config, deadline_s=min(config.deadline_s, WRITE_DEADLINE_S))
        self.interval_s = interval_s
        self.segment_bytes = segment_bytes
        self.max_pending_bytes = max_pending_bytes
        self.close_timeout_s = close_timeout_s
        self.written = 0  # lines in the store
        self.dropped = 0  # lines given up: over max_pending_bytes while failing, or unwritten at close
        self.failures = 0  # failed writes (or listings)
        self._seq: int | None = None  # the open segment (None: not listed yet)
        self._segment: list[bytes] = []  # the open segment's lines already in the store
        self._segment_bytes = 0
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._cond = threading.Condition()
        self._closing = False
        self._failing: str | None = None  # the outage's first error
        self._thread: threading.Thread | None = None
        self._pid = 0  # the process whose thread writes

    @property
    def url(self) -> str:
        return f"{self.root}/{self.name}/"

    def append(self, line: str) -> None:
        """Queue one line (no newline) for the next write; returns at once."""
        data = line.encode("utf-8") + b"\n"
        with self._cond:
            if self._closing:  # (a record after close: counted, never an error in the training loop)
                self.dropped += 1
                return
            self._pending.append(data)
            self._pending_bytes += len(data)
            if self._thread is None:
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name="fastload-telemetry", daemon=True)
                self._thread.start()
                atexit.register(self.close)
            self._cond.notify()

    def close(self) -> None:
        """Write what is left and stop the thread, waiting at most ``close_timeout_s``; lines still
        unwritten then are counted in :attr:`dropped` and logged."""
        if self._thread is not None and os.getpid() != self._pid:
            return  # a forked child's exit: the thread and its lines are the parent's
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify()
            thread = self._thread
        atexit.unregister(self.close)
        if thread is None:
            return
        thread.join(self.close_timeout_s)
        with self._cond:
            left, self._pending, self._pending_bytes = len(self._pending), [], 0
            self.dropped += left
        if left:
            why = self._failing or f"the store did not answer within {self.close_timeout_s:g}s"
            log.warning("fastload telemetry: %d record(s) not written to %s: %s", left, self.url, why)

    def _run(self) -> None:
        last = float("-inf")
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closing or bool(self._pending))
                delay = last + self.interval_s - time.monotonic()
                if delay > 0 and not self._closing:
                    self._cond.wait_for(lambda: self._closing, timeout=delay)
                closing = self._closing
            last = time.monotonic()
            self._write()
            if closing:
                return

    def _write(self) -> None:
        with self._cond:
            taken = list(self._pending)
        if not taken:
            return
        try:
            if self._seq is None:
                listed = list_segments(self.root, config=self.config, name=self.name).get(self.name, [])
                self._seq = int(listed[-1].rsplit("/", 1)[1][: -len(SUFFIX)]) + 1 if listed else 0
            body = b"".join(self._segment + taken)
            put_bytes(segment_url(self.root, self.name, self._seq), body, config=self.config)
        except Exception as exc:  # any failure: training goes on, the lines wait for the next attempt
            self._failed(exc)
            return
        if self._failing is not None:
            log.warning(
                "fastload telemetry: writing to %s works again (%d failures)", self.url, self.failures
            )
            self._failing = None
        with self._cond:  # (close() may have given up on them meanwhile: then there are none)
            del self._pending[: len(taken)]
            self._pending_bytes = sum(len(t) for t in self._pending)
        self.written += len(taken)
        self._segment += taken
        self._segment_bytes += sum(len(t) for t in taken)
        if self._segment_bytes >= self.segment_bytes:
            self._seq += 1
            self._segment, self._segment_bytes = [], 0

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        if self._failing is None:
            self._failing = f"{type(exc).__name__}: {exc}"
            log.warning(
                "fastload telemetry: writing to %s failed (%s); training goes on, and the records are "
                "written again every %gs (up to %d MiB kept; this is logged once)",
                self.url,
                self._failing,
                self.interval_s,
                self.max_pending_bytes >> 20,
            )
        with self._cond:
            while self._pending_bytes > self.max_pending_bytes and self._pending:
                self._pending_bytes -= len(self._pending.pop(0))
                self.dropped += 1
