"""URLs as users type them: a mistyped ``s3://`` or a scheme fastload does not read (``az://``, ``gcs://``)
is caught before it is taken for a local path."""

from __future__ import annotations

import re

from fastload.errors import ConfigError

# s3:/b/k, S3://b/k, s3///b/k, s3//b/k, s3:b/k: meant as S3 URLs, not local paths (s3/b/k stays a path)
_S3_TYPO = re.compile(r"^s3(?::/*|//+)", re.IGNORECASE)
# any RFC 3986 scheme followed by "://" (https://, gs://, az://, hf://, s3a://...)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
SUPPORTED = ("local paths", "file://", "s3://", "http(s)://", "hf://", "gs://", "az://")
READ = ("s3", "file", "http", "https", "hf", "gs", "az")
# Hadoop's names for S3 and the object-store URLs fsspec users type: what to write instead
_HINTS = {
    "s3a": "write s3:// for the same bucket",
    "s3n": "write s3:// for the same bucket",
    "gcs": "write gs://bucket/... for Google Cloud Storage",
    "abfs": "write az://CONTAINER/PATH for Azure Blob Storage",
    "azure": "write az://CONTAINER/PATH for Azure Blob Storage",
}


def check_url(text: str) -> None:
    """:class:`ConfigError` for a mistyped ``s3://`` URL (with the fix) or a URL scheme fastload does not
    read (listing the ones it does), either of which would otherwise be taken as a local path."""
    m = _S3_TYPO.match(text)
    if m is not None and not (text.startswith("s3://") and not text.startswith("s3:///")):
        fixed = "s3://" + text[m.end() :].lstrip("/")
        raise ConfigError(
            f"{text!r} looks like a mistyped S3 URL: did you mean {fixed}? (for a local path so named, "
            f"write ./{text})"
        )
    m = _SCHEME.match(text)
    if m is not None and m.group(1) not in READ:
        scheme = m.group(1)
        hint = _HINTS.get(scheme.lower())
        raise ConfigError(
            f"{text!r}: fastload does not read {scheme}:// URLs; it reads {', '.join(SUPPORTED)} "
            f"(s3://bucket/key, on AWS or any S3-compatible endpoint)"
            + (f"; {hint}" if hint else "")
            + f" (for a local path so named, write ./{text})"
        )


def check_writable(text: str) -> None:
    """:class:`ConfigError` for a destination fastload reads but cannot write (``http(s)://``, ``hf://``),
    after :func:`check_url`'s checks."""
    check_url(text)
    m = _SCHEME.match(text)
    if m is not None and m.group(1) in ("http", "https", "hf"):
        raise ConfigError(
            f"{text!r}: fastload reads {m.group(1)}:// URLs but cannot write to them; write to a local "
            "folder or s3:// (then upload with the store's own tools: `huggingface-cli upload` for the Hub)"
        )
