"""Creating a bucket (``fastload mb s3://bucket``): on a local endpoint to try fastload on, or any store."""

from __future__ import annotations

import re
from typing import Any

from fastload.config import S3Config
from fastload.core.retry import Fault
from fastload.errors import ConfigError, S3Error
from fastload.s3.client import Failure, get_client, parse_s3_url
from fastload.s3.retrying import Retrier, give_up_on

# S3's rules for new bucket names: 3-63 characters, lower-case letters, digits, dots and hyphens, starting
# and ending with a letter or digit (no "..", not an IP address)
_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_IP = re.compile(r"^\d+\.\d+\.\d+\.\d+$")


def bucket_of(url: str) -> str:
    """The bucket named by ``s3://bucket`` (a trailing ``/`` is fine; a key is refused), checked against S3's
    naming rules."""
    bucket, key = parse_s3_url(url)
    if key.strip("/"):
        raise ConfigError(f"{url!r} names an object or prefix; fastload mb takes a bucket: s3://{bucket}")
    if not _NAME.match(bucket) or ".." in bucket or _IP.match(bucket):
        raise ConfigError(
            f"{bucket!r} is not a valid bucket name: 3-63 characters, lower-case letters, digits, dots and "
            "hyphens, starting and ending with a letter or digit"
        )
    return bucket


def make_bucket(url: str, *, config: S3Config | None = None) -> bool:
    """Create the bucket of ``s3://bucket`` in ``config``'s region (:meth:`S3Config.from_env` by default):
    True if it was created, False if it already existed and these credentials can use it. Raises
    :class:`S3Error` when the name is taken by another account (or the bucket exists and these
    credentials may not use it: 403 on HEAD), and the usual errors (no credentials,
    access denied, endpoint unreachable) otherwise."""
    bucket = bucket_of(url)
    config = config or S3Config.from_env()
    client = get_client(config)
    retrier = Retrier.from_config(config)

    def spent(failure: Failure, tries: int, elapsed_s: float) -> Exception:
        return S3Error(
            f"creating s3://{bucket} failed after {tries} attempt(s) in {elapsed_s:.1f}s: {failure.message}; "
            "retry later or check the endpoint",
            bucket=bucket,
            key="",
        )

    fail = give_up_on(bucket, "", what="create", spent=spent)
    taken = S3Error(
        f"s3://{bucket} exists and belongs to someone else (bucket names are shared by every account of "
        "the store): choose another name",
        bucket=bucket,
        key="",
    )

    def head_give_up(failure: Failure, tries: int, elapsed_s: float) -> Exception:
        if failure.fault is Fault.DENIED:  # it exists (a missing bucket answers 404), not for us
            return S3Error(
                f"s3://{bucket} exists but these credentials may not use it (403 on HEAD): another "
                "account owns it (bucket names are shared by every account of the store: choose another "
                "name), or your policy does not allow s3:ListBucket on it",
                bucket=bucket,
                key="",
            )
        return _Missing() if failure.fault is Fault.NOT_FOUND else fail(failure, tries, elapsed_s)

    try:
        retrier.call(lambda: client.head_bucket(Bucket=bucket), head_give_up)
        return False  # there, and ours to use
    except _Missing:
        pass
    params: dict[str, Any] = {"Bucket": bucket}
    region = config.region or client.meta.region_name
    if region and region != "us-east-1":  # us-east-1 takes no LocationConstraint
        params["CreateBucketConfiguration"] = {"LocationConstraint": region}

    def create_give_up(failure: Failure, tries: int, elapsed_s: float) -> Exception:
        if "BucketAlreadyOwnedByYou" in failure.message:
            return _Existed()
        if "BucketAlreadyExists" in failure.message:
            return taken
        return fail(failure, tries, elapsed_s)

    try:
        retrier.call(lambda: client.create_bucket(**params), create_give_up)
    except _Existed:  # created meanwhile by another run with these credentials
        return False
    return True


class _Missing(Exception):
    """HEAD said 404: the bucket is to be created."""


class _Existed(Exception):
    """CreateBucket said the bucket is already ours."""
