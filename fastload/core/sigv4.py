"""AWS Signature Version 4 headers for one S3 request without a body (the GETs and HEADs of the direct
transport): the same headers botocore's ``S3SigV4Auth`` adds (``X-Amz-Date``, ``X-Amz-Security-Token``
with a session token, ``X-Amz-Content-SHA256`` of the empty body, ``Authorization``), computed directly:
one SHA-256 and one HMAC a request, the day's signing key derived once (botocore builds a request object,
parses the URL and derives the key again on every request: most of a small ranged GET's CPU time in
Python). Pure: the caller passes the time. ``tests/unit/test_sigv4.py`` checks it against botocore."""

from __future__ import annotations

import datetime
import functools
import hashlib
import hmac
from collections.abc import Mapping
from urllib.parse import urlsplit

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
# headers botocore leaves unsigned (botocore.auth.SIGNED_HEADERS_BLACKLIST)
UNSIGNED = frozenset(
    {
        "connection",
        "expect",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "user-agent",
        "x-amzn-trace-id",
    }
)
REPLACED = frozenset({"authorization", "x-amz-date", "x-amz-content-sha256", "x-amz-security-token"})
DEFAULT_PORTS = {"http": 80, "https": 443}


@functools.lru_cache(maxsize=16)
def signing_key(secret_key: str, day: str, region: str, service: str) -> bytes:
    """The SigV4 signing key of ``day`` (``YYYYMMDD``), region and service."""
    key = ("AWS4" + secret_key).encode()
    for part in (day, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def host_header(url: str) -> str:
    """The ``Host`` value signed for ``url``: lowercase host, the port unless the scheme's default."""
    return _url_parts(url)[0]


@functools.lru_cache(maxsize=1024)
def _url_parts(url: str) -> tuple[str, str, str]:
    """``(Host value, path, canonical query)`` of ``url`` (an object's URL is signed again and again)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    if parts.port is not None and parts.port != DEFAULT_PORTS.get(parts.scheme):
        host = f"{host}:{parts.port}"
    return host, parts.path, canonical_query(parts.query)


def canonical_query(query: str) -> str:
    """The URL's query (already encoded), its ``key=value`` pairs sorted by key, then value."""
    if not query:
        return ""
    pairs = [pair.partition("=") for pair in query.split("&")]
    return "&".join(f"{k}={v}" for k, _, v in sorted(pairs, key=lambda p: (p[0], p[2])))


def sign(
    method: str,
    url: str,
    headers: Mapping[str, str],
    *,
    access_key: str,
    secret_key: str,
    token: str | None,
    region: str,
    now: datetime.datetime,
    service: str = "s3",
) -> dict[str, str]:
    """``headers`` plus the SigV4 headers for ``method`` on ``url`` (path and query as sent, already
    percent-encoded; S3 paths are not normalised) at time ``now`` (UTC); no body."""
    stamp = f"{now.year:04d}{now.month:02d}{now.day:02d}T{now.hour:02d}{now.minute:02d}{now.second:02d}Z"
    out = {k: v for k, v in headers.items() if k.lower() not in REPLACED}
    out["X-Amz-Date"] = stamp
    if token:
        out["X-Amz-Security-Token"] = token
    out["X-Amz-Content-SHA256"] = EMPTY_SHA256
    signed: dict[str, list[str]] = {}
    for name, value in out.items():
        low = name.lower()
        if low not in UNSIGNED:
            signed.setdefault(low, []).append(" ".join(value.split()))
    host, path, query = _url_parts(url)
    if "host" not in signed:
        signed["host"] = [host]
    names = sorted(signed)
    canonical = "\n".join(
        (
            method.upper(),
            path,
            query,
            "".join(f"{n}:{','.join(signed[n])}\n" for n in names),
            ";".join(names),
            EMPTY_SHA256,
        )
    )
    scope = f"{stamp[:8]}/{region}/{service}/aws4_request"
    to_sign = f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    key = signing_key(secret_key, stamp[:8], region, service)
    signature = hmac.digest(key, to_sign.encode(), "sha256").hex()
    out["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, SignedHeaders={';'.join(names)}, "
        f"Signature={signature}"
    )
    return out
