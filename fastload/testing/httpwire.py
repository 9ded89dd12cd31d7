"""HTTP/1.1 message heads as bytes: parse, rewrite one header in place, decide body framing.

Pure functions, no sockets. The fault proxy keeps every byte of a head it does not mean to change, so a
request signed by the client (SigV4 signs the headers) reaches the upstream exactly as it was sent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from email.utils import formatdate
from typing import Literal
from xml.sax.saxutils import escape

MAX_HEAD_BYTES = 64 * 1024
HEAD_END = b"\r\n\r\n"

_RANGE = re.compile(r"^\s*bytes\s*=\s*(\d+)\s*-\s*(\d*)\s*$")
_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$")
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")


class HttpParseError(ValueError):
    """A message head or chunked body that is not valid HTTP/1.1."""


@dataclass(frozen=True)
class Head:
    """One parsed message head; ``raw`` holds its exact bytes, final blank line included."""

    start_line: str
    headers: tuple[tuple[str, str], ...]
    raw: bytes

    def get(self, name: str) -> str | None:
        """The last value of header ``name`` (case-insensitive), or None."""
        name = name.lower()
        found = None
        for key, value in self.headers:
            if key.lower() == name:
                found = value
        return found

    def get_all(self, name: str) -> list[str]:
        name = name.lower()
        return [value for key, value in self.headers if key.lower() == name]

    @property
    def version(self) -> str:
        """``HTTP/1.1`` or ``HTTP/1.0``: last word of a request line, first of a status line."""
        words = self.start_line.split(" ")
        return words[0] if words[0].startswith("HTTP/") else words[-1]

    def request_parts(self) -> tuple[str, str]:
        """``(method, target)`` of a request head."""
        parts = self.start_line.split(" ")
        if len(parts) != 3 or not _TOKEN.match(parts[0]) or not parts[2].startswith("HTTP/1."):
            raise HttpParseError(f"bad request line {self.start_line!r}")
        return parts[0], parts[1]

    def status(self) -> int:
        """The status code of a response head."""
        parts = self.start_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise HttpParseError(f"bad status line {self.start_line!r}")
        return int(parts[1])


def parse_head(raw: bytes) -> Head:
    """Parse a head that ends with CRLF CRLF; header names and values are decoded as Latin-1."""
    if not raw.endswith(HEAD_END):
        raise HttpParseError("head does not end with a blank line")
    lines = raw[: -len(HEAD_END)].decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.match(name):
            raise HttpParseError(f"bad header line {line!r}")
        headers.append((name, value.strip(" \t")))
    return Head(lines[0], tuple(headers), raw)


def replace_header(raw: bytes, name: str, value: str | None) -> bytes:
    """``raw`` with every ``name`` header set to ``value`` (dropped if None, appended if absent).

    All other bytes, including the case and spacing of other headers, stay as they were.
    """
    lines = raw[: -len(HEAD_END)].split(b"\r\n")
    key = name.lower().encode("latin-1")
    new = None if value is None else f"{name}: {value}".encode("latin-1")
    out = [lines[0]]
    placed = False
    for line in lines[1:]:
        if line.partition(b":")[0].lower() == key:
            if new is not None and not placed:
                out.append(new)
                placed = True
            continue
        out.append(line)
    if new is not None and not placed:
        out.append(new)
    return b"\r\n".join(out) + HEAD_END


Framing = tuple[Literal["none", "length", "chunked", "close"], int]
"""How a body is delimited: ``("length", n)``, ``("chunked", 0)``, ``("close", 0)`` or ``("none", 0)``."""


def _content_length(head: Head) -> int | None:
    values = {v.strip() for value in head.get_all("content-length") for v in value.split(",")}
    if not values:
        return None
    if len(values) != 1 or not next(iter(values)).isdigit():
        raise HttpParseError(f"bad Content-Length {sorted(values)}")
    return int(next(iter(values)))


def _is_chunked(head: Head) -> bool | None:
    """True if the last transfer coding is chunked, False if another, None without Transfer-Encoding."""
    codings = [c.strip().lower() for value in head.get_all("transfer-encoding") for c in value.split(",")]
    return None if not codings else codings[-1] == "chunked"


def request_framing(head: Head) -> Framing:
    """The body framing of a request (RFC 9112 section 6.3)."""
    chunked = _is_chunked(head)
    if chunked is False:
        raise HttpParseError("request Transfer-Encoding must end with chunked")
    if chunked:
        return ("chunked", 0)
    length = _content_length(head)
    return ("length", length) if length else ("none", 0)


def response_framing(head: Head, request_method: str) -> Framing:
    """The body framing of a response to ``request_method``."""
    status = head.status()
    if request_method == "HEAD" or status < 200 or status in (204, 304):
        return ("none", 0)
    chunked = _is_chunked(head)
    if chunked is not None:
        return ("chunked", 0) if chunked else ("close", 0)
    length = _content_length(head)
    if length is None:
        return ("close", 0)
    return ("length", length) if length else ("none", 0)


def wants_close(head: Head) -> bool:
    """Whether this message ends its connection (``Connection: close``, or HTTP/1.0 without keep-alive)."""
    tokens = {t.strip().lower() for value in head.get_all("connection") for t in value.split(",")}
    if head.version == "HTTP/1.0":
        return "keep-alive" not in tokens
    return "close" in tokens


def chunk_size(line: bytes) -> int:
    """The size in a chunk-size line (``1a;ext=1\\r\\n`` -> 26)."""
    text = line.split(b";", 1)[0].strip()
    try:
        return int(text, 16)
    except ValueError:
        raise HttpParseError(f"bad chunk size line {line[:40]!r}") from None


def shift_range(value: str, shift_bytes: int) -> str | None:
    """A ``Range: bytes=a-b`` value moved ``shift_bytes`` later; None for suffix or multi-ranges."""
    match = _RANGE.match(value)
    if match is None:
        return None
    start, end = int(match[1]) + shift_bytes, match[2]
    return f"bytes={start}-{int(end) + shift_bytes if end else ''}"


def shift_content_range(value: str, shift_bytes: int) -> str | None:
    """A ``Content-Range: bytes a-b/n`` value claiming the range ``shift_bytes`` later; None if unparsable."""
    match = _CONTENT_RANGE.match(value)
    if match is None:
        return None
    start, end = int(match[1]) + shift_bytes, int(match[2]) + shift_bytes
    return f"bytes {start}-{end}/{match[3]}"


S3_ERRORS: dict[str, tuple[int, str, str]] = {
    "slowdown": (503, "SlowDown", "Please reduce your request rate."),
    "internal_error": (500, "InternalError", "We encountered an internal error. Please try again."),
    "access_denied": (403, "AccessDenied", "Access Denied"),
    "request_timeout": (
        400,
        "RequestTimeout",
        "Your socket connection to the server was not read from or written to within the timeout period."
        " Idle connections will be closed.",
    ),
}
"""Fault kind -> (status, S3 error code, S3's message) for the errors the proxy answers itself."""

_REASONS = {
    400: "Bad Request",
    403: "Forbidden",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


def error_response(
    status: int, code: str, message: str, *, resource: str, request_id: str, head_only: bool, close: bool
) -> bytes:
    """A complete S3-style XML error response (no body bytes for a HEAD request)."""
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{escape(message)}</Message>"
        f"<Resource>{escape(resource)}</Resource><RequestId>{request_id}</RequestId>"
        f"<HostId>faultproxy</HostId></Error>"
    ).encode()
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
        f"x-amz-request-id: {request_id}\r\n"
        f"Date: {formatdate(usegmt=True)}\r\n"
        "Server: faultproxy\r\n"
        "Content-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n"
    ).encode("latin-1")
    return head if head_only else head + body
