"""Helpers for the reader tests: bounded calls (no test may hang), hashes, and the proxy's request log."""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from fastload.testing.faultproxy import FaultProxy, RequestRecord

T = TypeVar("T")

BUCKET = "fastload-s3reader"
REGION = "us-east-1"
SECRET_KEY = "s3reader-secret-never-printed"
PART = 256 << 10
_RANGE = re.compile(r"^bytes=(\d+)-(\d+)$")


def url(key: str) -> str:
    return f"s3://{BUCKET}/{key}"


def sha(data: bytes | bytearray | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def bounded(fn: Callable[[], T], timeout_s: float = 15.0) -> T:
    """``fn()`` run on a daemon thread; the test fails (instead of hanging) if it is still running after
    ``timeout_s``. Exceptions from ``fn`` are re-raised here."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, name="bounded-call", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        pytest.fail(f"still running after {timeout_s} s: the reader hangs")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def timed(fn: Callable[[], T], timeout_s: float = 15.0) -> tuple[T, float]:
    """``bounded(fn)`` and the seconds it took."""
    started = time.monotonic()
    value = bounded(fn, timeout_s)
    return value, time.monotonic() - started


def parse_range(value: str) -> tuple[int, int]:
    """``(start, end_exclusive)`` of ``bytes=a-b``; fails the test on anything else."""
    match = _RANGE.match(value)
    assert match, f"not a plain byte range: {value!r}"
    return int(match.group(1)), int(match.group(2)) + 1


def gets(proxy: FaultProxy, key: str) -> list[RequestRecord]:
    """GET requests for ``key`` the proxy saw, in arrival order."""
    path = f"/{BUCKET}/{key}"
    return [r for r in proxy.requests() if r.method == "GET" and r.target.split("?")[0] == path]


def reader_threads() -> list[threading.Thread]:
    """Live threads of fastload's reader pools (named ``fastload-s3_N``)."""
    return [t for t in threading.enumerate() if t.name.startswith("fastload-s3") and t.is_alive()]


def wait_until(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


def quiesce(timeout_s: float = 12.0) -> None:
    """Wait (bounded) for reader threads to finish: read-ahead parts still running when a reader closed."""
    wait_until(lambda: not reader_threads(), timeout_s)
