"""When retrying cannot help: the budget runs out (RangeReadError) or the store says no (404, 403)."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Callable, Iterator

import pytest

import fastload
from fastload.errors import AccessDeniedError, RangeReadError, S3NotFoundError
from fastload.testing.faultproxy import Fault, FaultProxy, Rule

from .helpers import BUCKET, PART, SECRET_KEY, bounded, quiesce, url

KEY = "obj-3m"


def test_storm_longer_than_the_deadline_raises_range_read_error(
    proxy: FaultProxy, make_config: Callable[..., fastload.S3Config]
) -> None:
    deadline_s = 2.0
    config = make_config(proxy, deadline_s=deadline_s, max_attempts=1000)  # the deadline binds, not attempts
    proxy.add(Rule(Fault.slowdown(), method="GET", key=KEY))

    with fastload.open(url(KEY), config=config) as f, pytest.raises(RangeReadError) as caught:
        started = time.monotonic()  # the client exists: the clock measures requests and backoff only
        try:
            bounded(f.read, deadline_s + 10)
        finally:
            elapsed = time.monotonic() - started
    assert deadline_s - config.max_backoff_s - 0.1 < elapsed < deadline_s + 1.5, elapsed
    err = caught.value
    assert (err.bucket, err.key, err.start, err.end, err.cause) == (BUCKET, KEY, 0, PART, "throttle")
    assert err.attempts > 5
    message = str(err)
    for words in (BUCKET, KEY, f"bytes 0-{PART - 1}", f"{err.attempts} attempt", "503 SlowDown"):
        assert words in message, (words, message)
    assert SECRET_KEY not in message
    assert isinstance(err, OSError)
    stats = fastload.s3_stats()
    assert stats["failures"] >= 1
    assert stats["throttles"] == stats["retries"]["throttle"] + stats["failures"]


@pytest.mark.parametrize("how", ["read", "read_n"])
def test_no_partial_data_before_the_error(
    proxy: FaultProxy, make_config: Callable[..., fastload.S3Config], objects: dict[str, bytes], how: str
) -> None:
    """Bytes before the failing range were served; the call that needs the failing range raises rather than
    returning short data, and every byte handed out is the object's."""
    config = make_config(proxy, deadline_s=1.5, max_attempts=1000)
    data = objects[KEY]
    served: list[bytes] = []

    def read() -> bytes:
        with fastload.open(url(KEY), config=config) as f:
            served.append(f.read(PART + 10))
            proxy.add(Rule(Fault.slowdown(), method="GET", key=KEY))  # from now on every GET fails
            return f.read() if how == "read" else f.read(len(data))

    with pytest.raises(RangeReadError) as caught:
        bounded(read, 15)
    assert served == [data[: PART + 10]]
    assert caught.value.start >= PART
    assert caught.value.cause == "throttle"


def test_permanent_hang_gives_up_with_cause_timeout(
    proxy: FaultProxy, make_config: Callable[..., fastload.S3Config]
) -> None:
    config = make_config(proxy, max_attempts=2)
    proxy.add(Rule(Fault.hang(duration_s=30), method="GET", key=KEY))

    def read() -> bytes:
        with fastload.open(url(KEY), config=config) as f:
            return f.read(10)

    started = time.monotonic()
    with pytest.raises(RangeReadError) as caught:
        bounded(read, 10)
    elapsed = time.monotonic() - started
    err = caught.value
    # not 2 x 30 s; an attempt whose hedge (sent after hedge_floor_s) is still out waits for it too
    attempt_s = config.read_timeout_s + config.hedge_floor_s
    assert 2 * config.read_timeout_s <= elapsed < 2 * attempt_s + 1.5, elapsed
    assert (err.cause, err.attempts, err.start, err.end) == ("timeout", 2, 0, PART)
    assert "2 attempt" in str(err) and "timed out" in str(err)
    stats = fastload.s3_stats()
    assert proxy.stats().injected["hang"] == 2 + stats["hedges"]["sent"]  # the hedges hung too
    assert stats["hedges"]["won"] == 0
    assert stats["retries"] == {"timeout": 1}


def fail_fast(target: str, config: fastload.S3Config, *, seek_end: bool) -> None:
    """Open ``target`` and read it (after a seek from the end, which asks HEAD first); the read must fail
    in well under a second (one request, no backoff). The clock starts once the client exists."""
    with fastload.open(target, config=config) as f:
        started = time.monotonic()
        try:
            bounded(lambda: f.seek(-10, 2) if seek_end else f.read(), 10)
        finally:
            elapsed = time.monotonic() - started
            assert elapsed < 1.0, elapsed


@pytest.mark.parametrize(
    "where",
    ["missing-key", "missing-bucket", "missing-key-seek-end"],
)
def test_not_found_fails_at_once(proxy: FaultProxy, config: fastload.S3Config, where: str) -> None:
    target = f"s3://{BUCKET}-nope/obj-1m" if where == "missing-bucket" else url("no/such/key")

    with pytest.raises(S3NotFoundError) as caught:
        fail_fast(target, config, seek_end=where.endswith("seek-end"))
    assert isinstance(caught.value, FileNotFoundError)
    assert caught.value.url == target
    assert target in str(caught.value)
    requests = proxy.requests()
    assert len(requests) == 1 and requests[0].status == 404
    assert requests[0].method == ("HEAD" if where.endswith("seek-end") else "GET")
    assert fastload.s3_stats()["retries_total"] == 0


class _Forbidden(http.server.BaseHTTPRequestHandler):
    """An S3-like origin that answers every request 403 AccessDenied (moto allows everything)."""

    protocol_version = "HTTP/1.1"

    def _deny(self, body: bool) -> None:
        xml = (
            b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
            b"<Message>Access Denied</Message><RequestId>FORBIDDEN1</RequestId></Error>"
        )
        self.send_response(403)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(xml)))
        self.end_headers()
        if body:
            self.wfile.write(xml)

    def do_GET(self) -> None:
        self._deny(True)

    def do_HEAD(self) -> None:
        self._deny(False)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def forbidding_proxy() -> Iterator[FaultProxy]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Forbidden)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        with FaultProxy(f"http://127.0.0.1:{server.server_address[1]}") as proxy:
            yield proxy
            quiesce()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.mark.parametrize("seek_end", [False, True], ids=["get", "head"])
def test_access_denied_fails_at_once(
    forbidding_proxy: FaultProxy, make_config: Callable[..., fastload.S3Config], seek_end: bool
) -> None:
    config = make_config(forbidding_proxy)

    with pytest.raises(AccessDeniedError) as caught:
        fail_fast(url(KEY), config, seek_end=seek_end)
    err = caught.value
    assert isinstance(err, PermissionError)
    message = str(err)
    assert url(KEY) in message and "access denied" in message
    assert SECRET_KEY not in message and "AKID" not in message
    assert [r.status for r in forbidding_proxy.requests()] == [403]
    assert fastload.s3_stats()["retries_total"] == 0
