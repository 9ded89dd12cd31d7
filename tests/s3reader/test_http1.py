"""``fastload.s3.http1``, the direct transport's HTTP/1.1, against scripted answers on a socket pair: bodies
by length, chunked and to the close; interim answers; what a cut or malformed answer raises (what
``http.client`` raises, so the retry classification is unchanged); the request bytes sent."""

from __future__ import annotations

import http.client
import socket
from collections.abc import Iterator

import pytest

from fastload.s3.client import classify_exception
from fastload.s3.http1 import Connection, Response
from fastload.s3.transport import connection_socket


@pytest.fixture
def pair() -> Iterator[tuple[Connection, socket.socket]]:
    """A connection to a listening socket on loopback, and the accepted end (the test plays the server)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        conn = Connection("http", "127.0.0.1", server.getsockname()[1], timeout=5, context=None)
        conn.host_header = "example.com"
        conn.connect()
        theirs, _ = server.accept()
    yield conn, theirs
    conn.close()
    theirs.close()


def answer(pair: tuple[Connection, socket.socket], raw: bytes, method: str = "GET") -> Response:
    conn, server = pair
    server.sendall(raw)
    return conn.request(method, "/b/k?x=1", {"Range": "bytes=0-9"})


def body(resp: Response, piece: int = 3) -> bytes:
    out = bytearray()
    buf = bytearray(piece)
    while n := resp.readinto(memoryview(buf)):
        out += buf[:n]
    return bytes(out)


def test_the_request_carries_host_accept_encoding_and_the_headers(
    pair: tuple[Connection, socket.socket],
) -> None:
    answer(pair, b"HTTP/1.1 204 No Content\r\n\r\n")
    sent = pair[1].recv(4096)
    assert sent == (
        b"GET /b/k?x=1 HTTP/1.1\r\nHost: example.com\r\nAccept-Encoding: identity\r\nRange: bytes=0-9\r\n\r\n"
    )
    assert Connection("http", "::1", 9000, timeout=1, context=None).host_header == "[::1]:9000"


def test_a_body_by_length_in_pieces_then_the_next_response_on_the_same_connection(
    pair: tuple[Connection, socket.socket],
) -> None:
    head = b'HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-9/20\r\nETag: "e"\r\n'
    resp = answer(pair, head + b"Content-Length: 10\r\n\r\n0123456789")
    assert (resp.status, resp.getheader("Content-Range"), resp.headers["etag"]) == (
        206,
        "bytes 0-9/20",
        '"e"',
    )
    assert not resp.finished and not resp.will_close and not resp.reusable
    assert body(resp) == b"0123456789" and resp.finished and resp.reusable
    again = answer(pair, b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nab")
    assert again.status == 200 and again.read(100) == b"ab" and again.reusable


def test_bytes_beyond_a_response_make_its_connection_unusable(pair: tuple[Connection, socket.socket]) -> None:
    resp = answer(pair, b"HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\n")
    assert resp.finished and not resp.reusable


def test_a_chunked_body_with_trailers(pair: tuple[Connection, socket.socket]) -> None:
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    raw += b"5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: t\r\n\r\n"
    resp = answer(pair, raw)
    assert not resp.finished
    assert body(resp, piece=4) == b"hello world" and resp.finished and resp.reusable


def test_no_body_for_head_and_204_interim_answers_skipped(pair: tuple[Connection, socket.socket]) -> None:
    resp = answer(pair, b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n", method="HEAD")
    assert resp.finished and resp.read(10) == b"" and resp.getheader("content-length") == "99"
    resp = answer(
        pair, b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 404 Not Found\r\nContent-Length: 3\r\n\r\nno!"
    )
    assert resp.status == 404 and resp.reason == "Not Found" and resp.read(64) == b"no!"


@pytest.mark.parametrize(
    ("head", "closes"),
    [
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n", True),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n", True),
        (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n", False),
    ],
)
def test_will_close(pair: tuple[Connection, socket.socket], head: bytes, closes: bool) -> None:
    resp = answer(pair, head + b"ok")
    assert resp.will_close is closes and body(resp) == b"ok"


def test_a_body_to_the_close(pair: tuple[Connection, socket.socket]) -> None:
    conn, server = pair
    server.sendall(b"HTTP/1.1 200 OK\r\n\r\nall of it")
    server.shutdown(socket.SHUT_WR)
    resp = conn.request("GET", "/", {})
    assert resp.will_close and body(resp) == b"all of it" and resp.finished


def test_a_body_cut_short_reads_as_its_end_and_is_not_finished(
    pair: tuple[Connection, socket.socket],
) -> None:
    conn, server = pair
    server.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123")
    server.shutdown(socket.SHUT_WR)
    resp = conn.request("GET", "/", {})
    assert body(resp) == b"0123" and not resp.finished  # (the reader counts 4 of 10: a short body)


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b"", http.client.RemoteDisconnected),
        (b"HTTP/1.1 200 OK\r\nContent-", http.client.BadStatusLine),
        (b"SSH-2.0-OpenSSH\r\n\r\n", http.client.BadStatusLine),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel", http.client.IncompleteRead),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", http.client.IncompleteRead),
    ],
)
def test_cut_or_malformed_answers_raise_what_is_retried(
    pair: tuple[Connection, socket.socket], raw: bytes, error: type[Exception]
) -> None:
    conn, server = pair
    server.sendall(raw)
    server.shutdown(socket.SHUT_WR)
    with pytest.raises(error) as info:
        body(conn.request("GET", "/", {}))
    assert classify_exception(info.value) is not None  # a connection fault or a short body: retried


def test_a_head_without_end_is_refused(pair: tuple[Connection, socket.socket]) -> None:
    conn, server = pair
    server.sendall(b"HTTP/1.1 200 OK\r\n" + b"X: " + b"y" * (70 << 10))
    with pytest.raises(http.client.LineTooLong):
        conn.request("GET", "/", {})


def test_request_on_a_closed_connection() -> None:
    with pytest.raises(http.client.NotConnected):
        Connection("http", "127.0.0.1", 9, timeout=1, context=None).request("GET", "/", {})


def test_a_piece_is_filled_across_receives_and_bytes_before_a_timeout_are_kept(
    pair: tuple[Connection, socket.socket],
) -> None:
    conn, server = pair
    resp = answer(pair, b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n012")
    sock = connection_socket(conn)
    assert sock is not None
    buf = bytearray(8)
    server.sendall(b"345")
    sock.settimeout(0.05)
    assert resp.readinto(memoryview(buf)) == 6 and buf[:6] == b"012345"  # then the peer went silent
    with pytest.raises(TimeoutError):
        resp.readinto(memoryview(buf))
    server.sendall(b"6789")
    sock.settimeout(5)
    assert resp.readinto(memoryview(buf)) == 4 and buf[:4] == b"6789" and resp.finished
