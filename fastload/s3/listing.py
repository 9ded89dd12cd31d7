"""Listing an S3 prefix with ListObjectsV2 (paginated, each page retried), once per process."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fastload.config import S3Config
from fastload.errors import S3Error
from fastload.s3.client import Failure, get_client
from fastload.s3.retrying import Retrier, give_up_on


@dataclass(frozen=True)
class ObjectInfo:
    """One listed object."""

    key: str
    size: int
    etag: str


def list_objects(
    bucket: str,
    prefix: str,
    *,
    config: S3Config,
    client: Any = None,
    retrier: Retrier | None = None,
    delimiter: str | None = None,
) -> Iterator[ObjectInfo | str]:
    """Objects under ``prefix`` in key order; with ``delimiter`` also common prefixes (as ``str``)."""
    client = client if client is not None else get_client(config)
    retrier = retrier or Retrier.from_config(config)
    token: str | None = None
    while True:
        params: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        if token:
            params["ContinuationToken"] = token
        if delimiter:
            params["Delimiter"] = delimiter

        def spent(failure: Failure, tries: int, elapsed_s: float) -> Exception:
            return S3Error(
                f"listing s3://{bucket}/{prefix} failed after {tries} attempt(s) in {elapsed_s:.1f}s: "
                f"{failure.message}; retry later or check the endpoint",
                bucket=bucket,
                key=prefix,
            )

        give_up = give_up_on(bucket, prefix, what="list", spent=spent)
        page = retrier.call(lambda p=params: client.list_objects_v2(**p), give_up)  # type: ignore[misc]
        for common in page.get("CommonPrefixes", []):
            yield str(common["Prefix"])
        for obj in page.get("Contents", []):
            yield ObjectInfo(str(obj["Key"]), int(obj["Size"]), str(obj.get("ETag", "")))
        if not page.get("IsTruncated"):
            return
        token = page.get("NextContinuationToken")
        if not token:
            raise S3Error(
                f"listing s3://{bucket}/{prefix}: truncated page without a continuation token",
                bucket=bucket,
                key=prefix,
            )
