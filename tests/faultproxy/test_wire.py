"""Message heads as bytes (httpwire) and SigV4 on raw heads (sigv4), checked against botocore's signer."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from fastload.testing import httpwire as wire
from fastload.testing.sigv4 import SigV4Resigner, parse_authorization, resign_head, verify_head

RAW = (
    b"GET /b/k HTTP/1.1\r\nHost: h:1\r\nx-Odd:  spaced  \r\nRange: bytes=0-9\r\nX-Dup: 1\r\nx-dup: 2\r\n\r\n"
)


def test_parse_head() -> None:
    head = wire.parse_head(RAW)
    assert head.request_parts() == ("GET", "/b/k")
    assert head.get("x-odd") == "spaced"
    assert head.get("X-DUP") == "2" and head.get_all("x-dup") == ["1", "2"]
    assert head.version == "HTTP/1.1"
    assert wire.parse_head(b"HTTP/1.0 503 Slow Down\r\n\r\n").status() == 503
    for bad in (b"GET / HTTP/1.1\r\nno colon\r\n\r\n", b"GET / HTTP/1.1\r\n"):
        with pytest.raises(wire.HttpParseError):
            wire.parse_head(bad)
    with pytest.raises(wire.HttpParseError):
        wire.parse_head(b"GET /\r\n\r\n").request_parts()


def test_replace_header_keeps_every_other_byte() -> None:
    assert wire.replace_header(RAW, "range", "bytes=5-9") == RAW.replace(
        b"Range: bytes=0-9", b"range: bytes=5-9"
    )
    assert wire.replace_header(RAW, "Range", None) == RAW.replace(b"Range: bytes=0-9\r\n", b"")
    assert wire.replace_header(RAW, "X-Dup", "3") == RAW.replace(b"X-Dup: 1\r\nx-dup: 2\r\n", b"X-Dup: 3\r\n")
    assert wire.replace_header(RAW, "X-New", "v") == RAW[:-2] + b"X-New: v\r\n\r\n"


@pytest.mark.parametrize(
    ("head", "method", "framing"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", "GET", ("length", 10)),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", "HEAD", ("none", 0)),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10, 10\r\n\r\n", "GET", ("length", 10)),
        (b"HTTP/1.1 204 No Content\r\n\r\n", "GET", ("none", 0)),
        (b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n", "GET", ("none", 0)),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 3\r\n\r\n",
            "GET",
            ("chunked", 0),
        ),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "GET", ("close", 0)),
        (b"HTTP/1.1 200 OK\r\n\r\n", "GET", ("close", 0)),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", "GET", ("none", 0)),
    ],
)
def test_response_framing(head: bytes, method: str, framing: wire.Framing) -> None:
    assert wire.response_framing(wire.parse_head(head), method) == framing


def test_request_framing() -> None:
    def framing(head: bytes) -> wire.Framing:
        return wire.request_framing(wire.parse_head(head))

    assert framing(b"GET / HTTP/1.1\r\n\r\n") == ("none", 0)
    assert framing(b"PUT / HTTP/1.1\r\nContent-Length: 5\r\n\r\n") == ("length", 5)
    assert framing(b"PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n") == ("chunked", 0)
    for bad in (b"Content-Length: 1, 2", b"Content-Length: x", b"Transfer-Encoding: gzip"):
        with pytest.raises(wire.HttpParseError):
            framing(b"PUT / HTTP/1.1\r\n" + bad + b"\r\n\r\n")


def test_wants_close() -> None:
    def close(head: bytes) -> bool:
        return wire.wants_close(wire.parse_head(head))

    assert close(b"HTTP/1.1 200 OK\r\nConnection: Close\r\n\r\n")
    assert not close(b"HTTP/1.1 200 OK\r\n\r\n")
    assert close(b"HTTP/1.0 200 OK\r\n\r\n")
    assert not close(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")


def test_range_arithmetic_and_chunk_sizes() -> None:
    assert wire.shift_range("bytes=100-199", 10) == "bytes=110-209"
    assert wire.shift_range("bytes=100-", 10) == "bytes=110-"
    assert wire.shift_range("bytes=-100", 10) is None
    assert wire.shift_range("bytes=0-1,5-6", 10) is None
    assert wire.shift_content_range("bytes 100-199/1000", -100) == "bytes 0-99/1000"
    assert wire.shift_content_range("bytes */1000", 1) is None
    assert wire.chunk_size(b"1a;chunk-signature=ab\r\n") == 26
    with pytest.raises(wire.HttpParseError):
        wire.chunk_size(b"zz\r\n")


def test_error_response_is_s3_shaped() -> None:
    raw = wire.error_response(
        503,
        "SlowDown",
        "Please reduce your request rate.",
        resource="/b/k",
        request_id="R1",
        head_only=False,
        close=False,
    )
    end = raw.index(wire.HEAD_END) + len(wire.HEAD_END)
    head, body = wire.parse_head(raw[:end]), raw[end:]
    assert head.status() == 503 and int(head.get("content-length") or 0) == len(body)
    assert b"<Code>SlowDown</Code><Message>Please reduce your request rate.</Message>" in body
    assert head.get("connection") == "keep-alive"
    only = wire.error_response(
        500, "InternalError", "m", resource="/", request_id="R", head_only=True, close=True
    )
    assert only.endswith(wire.HEAD_END) and b"Connection: close" in only


def botocore_signed_head(method: str, url: str, headers: dict[str, str]) -> bytes:
    """A raw request head signed by botocore's own S3 signer (an independent implementation)."""
    request = AWSRequest(method=method, url=url, headers=headers, data=b"")
    S3SigV4Auth(Credentials("AKID", "SECRET"), "s3", "us-east-1").add_auth(request)
    parts = urlsplit(url)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    lines = [f"{method} {target} HTTP/1.1", f"Host: {parts.netloc}"]
    lines += [f"{k}: {v}" for k, v in request.headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@pytest.mark.parametrize(
    ("method", "url", "headers"),
    [
        ("GET", "http://127.0.0.1:9000/bucket/key", {"Range": "bytes=0-99"}),
        ("GET", "http://127.0.0.1:9000/bucket/a%20b/c~d%C3%A9", {"X-Spaced": "  a   b "}),
        ("GET", "http://127.0.0.1:9000/bucket?list-type=2&prefix=a%2Fb&delimiter=%2F", {}),
        ("PUT", "http://localhost:1/bucket/k?partNumber=3&uploadId=x%2By", {"Content-Length": "0"}),
    ],
)
def test_verify_accepts_what_botocore_signs(method: str, url: str, headers: dict[str, str]) -> None:
    raw = botocore_signed_head(method, url, headers)
    assert verify_head(raw, "SECRET")
    assert not verify_head(raw, "WRONG")
    assert resign_head(raw, "SECRET") == raw  # nothing changed: the same signature again


def test_resign_after_a_range_rewrite() -> None:
    raw = botocore_signed_head("GET", "http://127.0.0.1:9000/bucket/key", {"Range": "bytes=0-99"})
    for rewritten in (
        wire.replace_header(raw, "Range", "bytes=10-109"),
        wire.replace_header(raw, "Range", None),
    ):
        assert not verify_head(rewritten, "SECRET")
        again = SigV4Resigner("SECRET")(rewritten)
        assert verify_head(again, "SECRET")
        auth = parse_authorization(wire.parse_head(again).get("authorization") or "")
        assert auth is not None and auth.access_key == "AKID"
        assert ("range" in auth.signed_headers) is (b"Range:" in again)
    unsigned = b"GET / HTTP/1.1\r\nHost: h\r\n\r\n"
    assert resign_head(unsigned, "SECRET") == unsigned
    assert not verify_head(unsigned, "SECRET")
    assert "SECRET" not in repr(SigV4Resigner("SECRET"))
