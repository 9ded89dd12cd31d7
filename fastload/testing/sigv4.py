"""AWS Signature Version 4 on a raw request head: verify it, or sign it again after a rewrite.

Pure (hashlib/hmac). SigV4 signs the request's headers, Range included, so a proxy that rewrites Range
(``ignore_range``, ``shift_range``) breaks the signature for servers that check it (Ceph RGW, AWS). Give the
proxy ``resign=SigV4Resigner(secret_key)`` and it signs such requests again with the same access key, date
and scope. The payload hash comes from the ``x-amz-content-sha256`` header, so the body is not needed.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from urllib.parse import quote, unquote

from fastload.testing.httpwire import Head, parse_head, replace_header

ALGORITHM = "AWS4-HMAC-SHA256"
_AUTH = re.compile(
    r"^AWS4-HMAC-SHA256\s+Credential=([^/,\s]+)/(\d{8})/([^/,\s]+)/([^/,\s]+)/aws4_request\s*,"
    r"\s*SignedHeaders=([^,\s]+)\s*,\s*Signature=([0-9a-f]{64})\s*$"
)


@dataclass(frozen=True)
class Authorization:
    """The fields of a SigV4 ``Authorization`` header."""

    access_key: str
    date: str
    region: str
    service: str
    signed_headers: tuple[str, ...]
    signature: str

    @property
    def scope(self) -> str:
        return f"{self.date}/{self.region}/{self.service}/aws4_request"

    def header_value(self) -> str:
        return (
            f"{ALGORITHM} Credential={self.access_key}/{self.scope}, "
            f"SignedHeaders={';'.join(self.signed_headers)}, Signature={self.signature}"
        )


def parse_authorization(value: str) -> Authorization | None:
    """The parsed header, or None if it is not a SigV4 header."""
    match = _AUTH.match(value.strip())
    if match is None:
        return None
    access_key, date, region, service, signed, signature = match.groups()
    return Authorization(access_key, date, region, service, tuple(signed.split(";")), signature)


def _encode(text: str) -> str:
    return quote(text, safe="-_.~")


def canonical_query(query: str) -> str:
    """Query parameters decoded, encoded again the SigV4 way and sorted by key, then value."""
    pairs = []
    for part in query.split("&") if query else []:
        key, _, value = part.partition("=")
        pairs.append((_encode(unquote(key)), _encode(unquote(value))))
    return "&".join(f"{k}={v}" for k, v in sorted(pairs))


def canonical_request(head: Head, signed_headers: tuple[str, ...]) -> str:
    """S3's canonical request for ``head``: the path is used as sent (S3 does not normalize it)."""
    method, target = head.request_parts()
    path, _, query = target.partition("?")
    lines = []
    for name in signed_headers:
        values = head.get_all(name)
        if not values:
            raise ValueError(f"signed header {name!r} is missing from the request")
        lines.append(f"{name}:{','.join(' '.join(v.split()) for v in values)}")
    payload = head.get("x-amz-content-sha256") or "UNSIGNED-PAYLOAD"
    return "\n".join(
        [method, path, canonical_query(query), "\n".join(lines) + "\n", ";".join(signed_headers), payload]
    )


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def signature(secret_key: str, amz_date: str, auth: Authorization, canonical: str) -> str:
    """The hex signature of a canonical request under ``auth``'s scope."""
    string_to_sign = "\n".join(
        [ALGORITHM, amz_date, auth.scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = _hmac(("AWS4" + secret_key).encode(), auth.date)
    for part in (auth.region, auth.service, "aws4_request"):
        key = _hmac(key, part)
    return hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()


def _amz_date(head: Head) -> str:
    amz_date = head.get("x-amz-date")
    if amz_date is None:
        raise ValueError("a SigV4-signed request needs an X-Amz-Date header")
    return amz_date


def verify_head(raw_head: bytes, secret_key: str) -> bool:
    """Whether the head's SigV4 ``Authorization`` header is valid for ``secret_key``."""
    head = parse_head(raw_head)
    auth = parse_authorization(head.get("authorization") or "")
    if auth is None:
        return False
    try:
        expected = signature(secret_key, _amz_date(head), auth, canonical_request(head, auth.signed_headers))
    except ValueError:
        return False
    return hmac.compare_digest(expected, auth.signature)


def resign_head(raw_head: bytes, secret_key: str) -> bytes:
    """``raw_head`` signed again (signed headers it no longer has are left out); unchanged if unsigned."""
    head = parse_head(raw_head)
    auth = parse_authorization(head.get("authorization") or "")
    if auth is None:
        return raw_head
    signed = tuple(name for name in auth.signed_headers if head.get(name) is not None)
    unsigned = Authorization(auth.access_key, auth.date, auth.region, auth.service, signed, "0" * 64)
    new_sig = signature(secret_key, _amz_date(head), unsigned, canonical_request(head, signed))
    signed_auth = Authorization(auth.access_key, auth.date, auth.region, auth.service, signed, new_sig)
    return replace_header(raw_head, "Authorization", signed_auth.header_value())


@dataclass(frozen=True)
class SigV4Resigner:
    """A ``resign`` hook for :class:`~fastload.testing.faultproxy.FaultProxy`."""

    secret_key: str

    def __call__(self, raw_head: bytes) -> bytes:
        return resign_head(raw_head, self.secret_key)

    def __repr__(self) -> str:
        return "SigV4Resigner(secret_key=...)"
