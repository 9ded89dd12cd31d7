"""Fixtures for the fault proxy tests: a moto S3 server on loopback, clients, and a recording upstream."""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config

from fastload.testing import httpwire as wire
from fastload.testing.faultproxy import FaultProxy

BUCKET = "faultproxy-tests"
ACCESS_KEY = "AKIDFAULTPROXY"
SECRET_KEY = "faultproxy-secret"
OBJECTS = {"obj-1m": 1 << 20, "obj-2m": 2 << 20, "small": 1000}


def s3_client(endpoint_url: str, **config: Any) -> Any:
    """A boto3 S3 client: path-style, dummy credentials, one attempt (faults reach the test)."""
    options: dict[str, Any] = {
        "s3": {"addressing_style": "path"},
        "retries": {"total_max_attempts": 1, "mode": "standard"},
        "connect_timeout": 2,
        "read_timeout": 5,
    }
    options.update(config)
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(**options),
    )


@pytest.fixture(scope="session")
def objects(moto_url: str) -> dict[str, bytes]:
    """Seeded random objects uploaded straight to moto (not through a proxy)."""
    rng = random.Random(1234)
    data = {key: rng.randbytes(size) for key, size in OBJECTS.items()}
    direct = s3_client(moto_url)
    direct.create_bucket(Bucket=BUCKET)
    for key, body in data.items():
        direct.put_object(Bucket=BUCKET, Key=key, Body=body)
    direct.close()
    return data


@pytest.fixture
def proxy(moto_url: str, objects: dict[str, bytes]) -> Iterator[FaultProxy]:
    with FaultProxy(moto_url, seed=0) as p:
        yield p
    assert not p.errors


@pytest.fixture
def s3(proxy: FaultProxy) -> Iterator[Any]:
    client = s3_client(proxy.endpoint_url)
    yield client
    client.close()


class RecordingUpstream:
    """A loopback HTTP server that records each connection's raw bytes and answers one canned response.

    It answers once the request is complete (Content-Length read, or a chunked body's last chunk seen) and
    records until the proxy closes the connection. ``close_after``: end the response by closing (FIN).
    """

    def __init__(self, response: bytes, *, close_after: bool = False) -> None:
        self.response = response
        self.close_after = close_after
        self.received: dict[int, bytes] = {}
        """Raw bytes by connection number, in accept order; filled when the proxy closes the connection."""
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._loop, daemon=True)
        self._accept.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            thread = threading.Thread(target=self._serve, args=(conn, len(self._threads)), daemon=True)
            self._threads.append(thread)
            thread.start()

    @staticmethod
    def _complete(data: bytes) -> bool:
        end = data.find(wire.HEAD_END)
        if end < 0:
            return False
        head = wire.parse_head(data[: end + 4])
        body = data[end + 4 :]
        kind, length = wire.request_framing(head)
        if kind == "chunked":
            return body.endswith(b"\r\n\r\n") and (body.startswith(b"0\r\n") or b"\r\n0\r\n" in body)
        return len(body) >= length

    def _serve(self, conn: socket.socket, number: int) -> None:
        data = b""
        answered = False
        with conn:
            conn.settimeout(2.0)
            try:
                while chunk := conn.recv(65536):
                    data += chunk
                    if not answered and self._complete(data):
                        conn.sendall(self.response)
                        answered = True
                        if self.close_after:
                            conn.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        self.received[number] = data

    def wait_received(self, count: int, timeout_s: float = 3.0) -> list[bytes]:
        """The raw bytes of the first ``count`` connections, once the proxy has closed them."""
        deadline = time.monotonic() + timeout_s
        while len(self.received) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return [self.received[i] for i in sorted(self.received)]

    def close(self) -> None:
        self._stop.set()
        self._accept.join()
        self._listener.close()
        for thread in self._threads:
            thread.join(timeout=3)


@pytest.fixture
def recording_upstream() -> Iterator[type[RecordingUpstream]]:
    made: list[RecordingUpstream] = []

    class Made(RecordingUpstream):
        def __init__(self, response: bytes, *, close_after: bool = False) -> None:
            super().__init__(response, close_after=close_after)
            made.append(self)

    yield Made
    for upstream in made:
        upstream.close()
