"""The reader's transports (``fastload.s3.transport``): the direct ``http.client`` path (the default) and the
botocore fallback, over moto behind the fault proxy; error parsing; connection reuse; HTTPS (a TLS front on
moto with a throwaway certificate); credentials; the recycling of part buffers."""

from __future__ import annotations

import contextlib
import select
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import fastload
from fastload.core.retry import Fault as RetryFault
from fastload.errors import AccessDeniedError, ConfigError, RangeReadError, S3NotFoundError
from fastload.s3 import transport as s3get
from fastload.s3.partbuffers import BufferPool
from fastload.testing.faultproxy import Fault, FaultProxy, Rule

from .helpers import gets, sha, timed, url


def read_all(key: str, config: fastload.S3Config, chunk: int = 100_003) -> bytes:
    out = bytearray()
    with fastload.open(url(key), config=config) as f:
        while data := f.read(chunk):
            out += data
    return bytes(out)


@pytest.mark.parametrize(
    ("status", "body", "fault", "message"),
    [
        (
            503,
            b"<Error><Code>SlowDown</Code><Message>x</Message></Error>",
            RetryFault.THROTTLE,
            "HTTP 503 SlowDown",
        ),
        (
            500,
            b"<?xml?><Error><Code>InternalError</Code></Error>",
            RetryFault.SERVER,
            "HTTP 500 InternalError",
        ),
        (400, b"<Error><Code>RequestTimeout</Code></Error>", RetryFault.TIMEOUT, "HTTP 400 RequestTimeout"),
        (
            412,
            b"<Error><Code>PreconditionFailed</Code></Error>",
            RetryFault.CHANGED,
            "HTTP 412 PreconditionFailed",
        ),
        (403, b"<Error><Code>AccessDenied</Code></Error>", RetryFault.DENIED, "HTTP 403 AccessDenied"),
        (404, b"", RetryFault.NOT_FOUND, "HTTP 404"),
        (400, b"not xml", RetryFault.CLIENT, "HTTP 400"),
    ],
)
def test_error_status_and_code_are_classified(
    status: int, body: bytes, fault: RetryFault, message: str
) -> None:
    failure = s3get.error_failure(status, body)
    assert (failure.fault, failure.status, failure.message) == (fault, status, message)


@pytest.mark.parametrize("transport", ["direct", "botocore"])
def test_both_transports_read_every_object_exactly(
    proxy: FaultProxy,
    make_config: Callable[..., fastload.S3Config],
    objects: dict[str, bytes],
    transport: str,
) -> None:
    config = make_config(proxy, transport=transport)
    for key, data in objects.items():
        assert sha(timed(lambda k=key: read_all(k, config))[0]) == sha(data), key  # type: ignore[misc]


@pytest.mark.parametrize("transport", ["direct", "botocore"])
def test_both_transports_ride_out_a_mix_of_faults(
    proxy: FaultProxy,
    make_config: Callable[..., fastload.S3Config],
    objects: dict[str, bytes],
    transport: str,
) -> None:
    """503 SlowDown, 500, reset, truncation and a stall on the same object: bytes exact, every fault
    counted under its cause, on both transports."""
    config = make_config(proxy, transport=transport)
    for nth, fault in enumerate(
        [
            Fault.slowdown(),
            Fault.internal_error(),
            Fault.request_timeout(),
            Fault.reset_mid_body(after_bytes=10_000),
            Fault.truncate_body(after_bytes=20_000),
            Fault.stall_mid_body(after_bytes=30_000, duration_s=20),
        ],
        start=2,
    ):
        proxy.add(Rule(fault, method="GET", key="obj-3m", nth={nth}))
    data, elapsed = timed(lambda: read_all("obj-3m", config))
    assert sha(data) == sha(objects["obj-3m"])
    retries = fastload.s3_stats()["retries"]
    assert retries.get("throttle") == 1 and retries.get("server") == 1, retries
    # RequestTimeout and the stall (one read_timeout_s, not the fault's 20 s)
    assert retries.get("timeout") == 2, retries
    assert retries.get("connection", 0) + retries.get("short_body", 0) == 2, retries
    assert elapsed < 8.0


def test_fallback_gives_the_same_errors(
    proxy: FaultProxy, make_config: Callable[..., fastload.S3Config]
) -> None:
    for transport in ("direct", "botocore"):
        config = make_config(proxy, transport=transport)
        with pytest.raises(S3NotFoundError, match="no-such-key"):
            timed(lambda c=config: read_all("no-such-key", c))  # type: ignore[misc]
    config = make_config(proxy, transport="botocore", max_attempts=2)
    proxy.add(Rule(Fault.internal_error(), method="GET", key="small"))
    with pytest.raises(RangeReadError, match="HTTP 500"):
        timed(lambda: read_all("small", config))


def test_connections_are_reused(
    proxy: FaultProxy, make_config: Callable[..., fastload.S3Config], objects: dict[str, bytes]
) -> None:
    """Many GETs over a few keep-alive connections: at most one per request in flight, across readers."""
    config = make_config(proxy, max_concurrency=4)
    for _ in range(3):
        assert timed(lambda: read_all("obj-3m", config))[0] == objects["obj-3m"]
    requests = len(gets(proxy, "obj-3m"))
    pool = s3get.direct_transport(config).pool(proxy.endpoint_url)
    assert requests >= 3 * 12
    hedges = fastload.s3_stats()["hedges"]["sent"]  # a hedge goes out on a new connection, by design
    assert pool.created <= 4 + 1 + hedges, (pool.created, requests, hedges)


def test_a_plain_http_endpoint_never_loads_the_tls_context(
    proxy: FaultProxy,
    make_config: Callable[..., fastload.S3Config],
    objects: dict[str, bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CA store is loaded for the first https pool only: every DataLoader worker of an http endpoint
    would pay its ~10-300 ms (and OpenSSL's process-wide locks, inherited over fork) for nothing."""

    def refused(*args: object, **kwargs: object) -> ssl.SSLContext:
        raise AssertionError("an SSL context was built for a plain-http endpoint")

    config = make_config(proxy)
    monkeypatch.setattr(ssl, "create_default_context", refused)
    transport = s3get.HttpPools(config, None)
    assert transport.pool(proxy.endpoint_url).scheme == "http"
    monkeypatch.undo()
    assert transport.pool("https://127.0.0.1:9/x").scheme == "https"


def test_a_connection_closed_while_idle_is_not_reused(
    proxy: FaultProxy, make_config: Callable[..., fastload.S3Config], objects: dict[str, bytes]
) -> None:
    """The store may close a keep-alive connection while it sits in the pool; the next request must not
    fail (or be counted as a retry) because of it."""
    config = make_config(proxy, max_concurrency=1)
    assert timed(lambda: read_all("small", config))[0] == objects["small"]
    pool = s3get.direct_transport(config).pool(proxy.endpoint_url)
    idle = list(pool._idle)
    assert idle
    for conn in idle:  # what a server's close looks like from here: the peer end is gone
        sock = s3get.connection_socket(conn)
        assert sock is not None
        sock.shutdown(socket.SHUT_RD)
    fastload.s3_stats(reset=True)
    assert timed(lambda: read_all("small", config))[0] == objects["small"]
    assert fastload.s3_stats()["retries_total"] == 0


@pytest.fixture
def no_credentials(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    yield


@pytest.mark.parametrize("transport", ["direct", "botocore"])
def test_missing_credentials_say_what_to_set(
    no_credentials: None, proxy: FaultProxy, make_config: Callable[..., fastload.S3Config], transport: str
) -> None:
    config = make_config(proxy, transport=transport)
    with pytest.raises(AccessDeniedError, match="no AWS credentials found; set AWS_ACCESS_KEY_ID") as info:
        timed(lambda: read_all("small", config))
    assert "small" in str(info.value)
    assert proxy.requests() == []


def test_no_secret_in_errors(proxy: FaultProxy, make_config: Callable[..., fastload.S3Config]) -> None:
    from .helpers import SECRET_KEY

    config = make_config(proxy, max_attempts=2)
    proxy.add(Rule(Fault.internal_error(), method="GET", key="small"))
    errors = []
    for key in ("small", "no-such-key"):
        with pytest.raises((RangeReadError, S3NotFoundError)) as info:
            timed(lambda k=key: read_all(k, config))  # type: ignore[misc]
        errors.append(f"{info.value!s} {info.value!r} {info.value.__cause__!r}")
    for text in errors:
        assert SECRET_KEY not in text and "Signature=" not in text and "Credential=" not in text, text


def test_buffer_pool_reuses_up_to_its_cap() -> None:
    pool = BufferPool()
    a, b = pool.take(1 << 20), pool.take(1 << 20)
    pool.give(a, cap_bytes=1 << 20)
    pool.give(b, cap_bytes=1 << 20)  # over the cap: dropped
    assert pool.idle_bytes == 1 << 20
    assert pool.take(1 << 20) is a
    assert pool.take(1 << 20) is not b


def test_recycled_buffers_never_change_bytes_already_returned(
    proxy: FaultProxy, make_config: Callable[..., fastload.S3Config], objects: dict[str, bytes]
) -> None:
    """Parts' buffers go back to a process-wide pool: two readers at once, reads that span parts, and a
    seek back must still see exactly the object's bytes."""
    config = make_config(proxy, part_size_bytes=1 << 20, max_concurrency=2)
    results: dict[str, bytes] = {}

    def run(key: str) -> None:
        results[key] = read_all(key, config, chunk=(1 << 20) + 12_345)

    threads = [threading.Thread(target=run, args=(k,)) for k in ("obj-2m", "obj-3m")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert results == {"obj-2m": objects["obj-2m"], "obj-3m": objects["obj-3m"]}
    with fastload.open(url("obj-3m"), config=config) as f:
        head = f.read(2_500_000)
        f.seek(100)
        again = f.read(1_000_000)
    assert head == objects["obj-3m"][:2_500_000] and again == objects["obj-3m"][100:1_000_100]


class TlsFront:
    """A TLS-terminating forwarder to a plain-HTTP upstream (one thread per connection, no faults)."""

    def __init__(self, upstream_port: int, certfile: str, keyfile: str) -> None:
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(certfile, keyfile)
        self._upstream_port = upstream_port
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self.port = self._server.getsockname()[1]
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            conn.settimeout(5)
            with (
                self._context.wrap_socket(conn, server_side=True) as tls,
                socket.create_connection(("127.0.0.1", self._upstream_port)) as up,
            ):
                while not self._stop.is_set():
                    ready, _, _ = select.select([tls, up], [], [], 0.2)
                    if tls in ready or tls.pending():
                        data = tls.recv(1 << 16)
                        if not data:
                            return
                        up.sendall(data)
                    if up in ready:
                        data = up.recv(1 << 16)
                        if not data:
                            return
                        tls.sendall(data)

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        self._server.close()


@pytest.fixture
def tls_front(tmp_path: Path, moto_url: str) -> Iterator[tuple[str, str]]:
    """``(https endpoint in front of moto, path of the CA file that verifies it)``."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subject = ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"]
    files = ["-keyout", str(key), "-out", str(cert)]
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", *subject, *files],
        check=True,
        capture_output=True,
        timeout=60,
    )
    front = TlsFront(urlsplit(moto_url).port or 80, str(cert), str(key))
    yield f"https://127.0.0.1:{front.port}", str(cert)
    front.close()


def test_https_with_the_ca_bundle_botocore_uses(
    tls_front: tuple[str, str],
    make_config: Callable[..., fastload.S3Config],
    proxy: FaultProxy,
    objects: dict[str, bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    endpoint, ca_file = tls_front
    monkeypatch.setenv("AWS_CA_BUNDLE", ca_file)
    config = replace(make_config(proxy), endpoint_url=endpoint)
    assert timed(lambda: read_all("obj-1m", config))[0] == objects["obj-1m"]


def test_https_certificate_failure_is_not_retried(
    tls_front: tuple[str, str],
    make_config: Callable[..., fastload.S3Config],
    proxy: FaultProxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    endpoint, _ = tls_front
    monkeypatch.delenv(
        "AWS_CA_BUNDLE", raising=False
    )  # the system store does not trust the test's certificate
    config = replace(make_config(proxy), endpoint_url=endpoint)
    with pytest.raises(ssl.SSLCertVerificationError):
        timed(lambda: read_all("obj-1m", config), timeout_s=5)
    assert fastload.s3_stats()["retries_total"] == 0


def test_an_http_proxy_in_the_environment_sends_requests_through_botocore(
    proxy: FaultProxy, make_config: Callable[..., fastload.S3Config], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The direct transport does not speak to HTTP proxies; botocore does, so an object whose endpoint
    botocore would reach through one is read through botocore."""
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    proxied = s3get.open_object(make_config(proxy), "fastload-s3reader", "small")
    assert isinstance(proxied, s3get.DirectObject)
    proxied._resolved()
    assert isinstance(proxied._fallback, s3get.BotocoreObject)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    direct = s3get.open_object(make_config(proxy), "fastload-s3reader", "small")
    assert isinstance(direct, s3get.DirectObject)
    direct._resolved()
    assert direct._fallback is None


def test_transport_setting() -> None:
    assert fastload.S3Config().transport == "direct"
    assert fastload.S3Config.from_env({"FASTLOAD_S3_TRANSPORT": "botocore"}).transport == "botocore"
    with pytest.raises(ConfigError, match="transport='urllib3'; choose direct or botocore"):
        fastload.S3Config(transport="urllib3")
