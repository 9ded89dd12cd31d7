"""S3 URLs as users type them: a mistyped ``s3://`` is caught before it is taken for a local path."""

from __future__ import annotations

import re

from fastload.errors import ConfigError

# s3:/b/k, S3://b/k, s3///b/k, s3//b/k, s3:b/k: meant as S3 URLs, not local paths (s3/b/k stays a path)
_S3_TYPO = re.compile(r"^s3(?::/*|//+)", re.IGNORECASE)


def check_url(text: str) -> None:
    """:class:`ConfigError` with a suggestion for a mistyped ``s3://`` URL (which would otherwise be taken
    as a local path)."""
    m = _S3_TYPO.match(text)
    if m is not None and not (text.startswith("s3://") and not text.startswith("s3:///")):
        fixed = "s3://" + text[m.end() :].lstrip("/")
        raise ConfigError(
            f"{text!r} looks like a mistyped S3 URL: did you mean {fixed}? (for a local path so named, "
            f"write ./{text})"
        )
