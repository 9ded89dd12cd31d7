"""The errors of a request to an object of another store (https, the Hub), named by its URL: the
counterpart of :func:`fastload.s3.client.fail_fast_error` (whose words are S3's: bucket, key, AWS
credentials)."""

from __future__ import annotations

from fastload.core.retry import Fault
from fastload.errors import AccessDeniedError, S3Error, S3NotFoundError
from fastload.s3.client import Failure


def fail_fast_url_error(failure: Failure, url: str) -> S3Error:
    """:func:`fail_fast_error` for an object of another store, named by its ``url`` (https, hf)."""
    hub = "huggingface" in url or "/resolve/" in url
    if failure.fault is Fault.NOT_FOUND:
        return S3NotFoundError(
            f"{url}: not found ({failure.message}); check the URL"
            + (" (repository, revision and path; a private or gated dataset needs HF_TOKEN)" if hub else ""),
            bucket="",
            key=url,
            url=url,
        )
    if failure.fault is Fault.DENIED:
        return AccessDeniedError(
            f"{url}: access denied ({failure.message}); "
            + (
                "set HF_TOKEN to a token that may read this repository (and accept its terms on the Hub, "
                "if gated)"
                if hub
                else "give the headers the server wants: --header 'Authorization: ...' on the command line, "
                "S3Config(headers={'Authorization': ...}) in Python"
            ),
            bucket="",
            key=url,
            url=url,
        )
    return S3Error(
        f"{url}: the server rejected the request ({failure.message}); this will not succeed on retry",
        bucket="",
        key=url,
        url=url,
    )
