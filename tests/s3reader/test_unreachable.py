"""A closed endpoint (issue 28 item 9): a refused connection to an endpoint that never answered in this
process fails within seconds, naming the endpoint and what to check; one that answered before (a server
restarting) is still ridden out. Both transports; real sockets on loopback."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

import fastload
from fastload.cli import main
from fastload.errors import RangeReadError

from .helpers import BUCKET, REGION, bounded, sha, url


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Relay:
    """A TCP relay on a fixed loopback port to ``upstream``: ``down()`` closes it (connections are then
    refused) and cuts what is open; ``up()`` listens on the same port again."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream, self.port = upstream, closed_port()
        self._listener: socket.socket | None = None
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (a bare close would not stop it)
            listener.close()
        with self._lock:
            socks, self._socks = self._socks, []
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            with self._lock:
                self._socks += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


@pytest.fixture
def relay(moto_url: str, objects: dict[str, bytes]) -> Iterator[Relay]:
    host, port = moto_url.removeprefix("http://").split(":")
    made = Relay((host, int(port)))
    made.up()
    yield made
    made.down()


def config_for(endpoint: str, transport: str) -> fastload.S3Config:
    """The default retry budget (a closed endpoint used to take 20-29 s of it)."""
    return fastload.S3Config(
        endpoint_url=endpoint, region=REGION, addressing_style="path", transport=transport
    )


@pytest.mark.parametrize("transport", ["direct", "botocore"])
def test_a_closed_endpoint_that_never_answered_fails_within_seconds(transport: str) -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    config = config_for(endpoint, transport)
    began = time.monotonic()
    with pytest.raises(RangeReadError) as info:
        bounded(lambda: fastload.open(url("obj-1m"), config=config).read(10), timeout_s=20)
    took = time.monotonic() - began
    message = str(info.value)
    assert took < 6, f"{took:.1f}s of retries against a port nothing listens on"
    assert endpoint in message and "AWS_ENDPOINT_URL" in message and "server is running" in message, message
    assert info.value.cause == "unreachable"


def test_the_cli_names_a_closed_endpoint_within_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    began = time.monotonic()
    assert main(["ls", f"s3://{BUCKET}/", "--endpoint-url", endpoint]) == 1
    took = time.monotonic() - began
    err = capsys.readouterr().err
    assert took < 6 and endpoint in err and "--endpoint-url" in err, (took, err)


@pytest.mark.parametrize("transport", ["direct", "botocore"])
def test_an_endpoint_that_answered_before_is_retried_through_a_restart(
    transport: str, relay: Relay, objects: dict[str, bytes]
) -> None:
    config = config_for(f"http://127.0.0.1:{relay.port}", transport)
    with fastload.open(url("small"), config=config) as f:
        assert sha(f.read()) == sha(objects["small"])  # the endpoint has answered
    relay.down()

    def up_after_a_refusal() -> None:
        """Down for longer than a never-answered endpoint is given (4.5 s), and until the reader has met
        the refusal at least once (a loaded machine may start its first attempt late)."""
        went_down = time.monotonic()
        while fastload.s3_stats()["retries"].get("unreachable", 0) < 1 and time.monotonic() - went_down < 30:
            time.sleep(0.05)
        time.sleep(max(0.0, 4.5 - (time.monotonic() - went_down)))
        relay.up()

    back = threading.Thread(target=up_after_a_refusal)
    back.start()
    try:
        began = time.monotonic()
        with fastload.open(url("obj-1m"), config=replace(config, read_timeout_s=5.0)) as f:
            data = bounded(f.read, timeout_s=40)
        assert time.monotonic() - began >= 4.0
        assert sha(data) == sha(objects["obj-1m"])
        assert fastload.s3_stats()["retries"].get("unreachable", 0) >= 1
    finally:
        back.join()
