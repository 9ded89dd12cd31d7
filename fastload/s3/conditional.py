"""A small object read with its ETag, and written back only if it is still that one (a conditional PUT):
what an append publishes ``index.json`` with, so two writers never lose each other's update.

``If-Match`` carries the ETag without its quotes: Ceph RGW 16.2 compares the bare value (a quoted one never
matches), moto and AWS S3 take either. ``If-None-Match: *`` creates an object only where there is none.
A refused condition (412; AWS's 409 ``ConditionalRequestConflict`` for a write racing another) raises
:class:`~fastload.errors.PreconditionFailedError`: read again and retry. docs/pack.md says which stores
honour the headers.

:func:`read_versioned` and :func:`write_if` do the same for an object named by its URL on any store that
publishes conditionally: ``s3://`` (the ETag, as above), ``gs://`` (the generation: ``ifGenerationMatch``,
``s3.gcswrite``) and ``az://`` (the ETag: ``If-Match`` on Put Blob, ``s3.azwrite``).
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import botocore

from fastload.config import S3Config
from fastload.errors import ConfigError, PreconditionFailedError, S3Error, S3NotFoundError
from fastload.s3.client import Failure, get_client, parse_s3_url
from fastload.s3.retrying import GiveUp, Retrier, give_up_on


def _md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode()


def _give_up(bucket: str, key: str, what: str) -> GiveUp:
    def spent(failure: Failure, tries: int, elapsed_s: float) -> Exception:
        return S3Error(
            f"s3://{bucket}/{key}: {what} failed after {tries} attempt(s) in {elapsed_s:.1f}s "
            f"({failure.message}); retry later",
            bucket=bucket,
            key=key,
        )

    inner = give_up_on(bucket, key, what="write to" if what.startswith("PUT") else "read", spent=spent)

    def give_up(failure: Failure, tries: int, elapsed_s: float) -> Exception:
        if failure.status == 412 or "ConditionalRequestConflict" in failure.message:
            return PreconditionFailedError(
                f"s3://{bucket}/{key} changed since it was read ({failure.message}): another writer "
                "published first",
                bucket=bucket,
                key=key,
            )
        return inner(failure, tries, elapsed_s)

    return give_up


def get_with_etag(bucket: str, key: str, *, config: S3Config, client: Any = None) -> tuple[bytes, str] | None:
    """The object's bytes and ETag (without quotes) from one GET; None when there is no such object."""
    client = client if client is not None else get_client(config)

    def attempt() -> tuple[bytes, str]:
        resp = client.get_object(Bucket=bucket, Key=key)
        body = resp["Body"]
        try:
            data = bytes(body.read())
        finally:
            body.close()
        return data, str(resp.get("ETag", "")).strip('"')

    try:
        return Retrier.from_config(config).call(attempt, _give_up(bucket, key, "GET"))
    except S3NotFoundError:
        return None


def put_if(
    bucket: str, key: str, data: bytes, *, etag: str | None, config: S3Config, client: Any = None
) -> str:
    """PUT ``data`` at ``s3://bucket/key`` only if the object there still has ``etag`` (None: only if there
    is none); return the new ETag (without quotes). Raises :class:`PreconditionFailedError` when the store
    refuses the condition. A retried PUT whose first attempt did land is refused too (its ETag moved on):
    callers read the object again and see their own write."""
    client = client if client is not None else get_client(config)
    wanted = "IfNoneMatch" if etag is None else "IfMatch"
    if wanted not in client.meta.service_model.operation_model("PutObject").input_shape.members:
        raise ConfigError(
            f"publishing s3://{bucket}/{key} needs a conditional PUT ({wanted}), which this botocore "
            f"({botocore.__version__}) cannot send; upgrade boto3 and botocore (late 2024 or newer)"
        )
    params: dict[str, Any] = {"Bucket": bucket, "Key": key, "Body": data, "ContentMD5": _md5(data)}
    if etag is None:
        params["IfNoneMatch"] = "*"
    else:
        params["IfMatch"] = etag.strip('"')
    resp = Retrier.from_config(config).call(lambda: client.put_object(**params), _give_up(bucket, key, "PUT"))
    return str(resp.get("ETag", "")).strip('"')


def read_versioned(url: str, *, config: S3Config) -> tuple[bytes, str] | None:
    """The bytes of the object at ``url`` (``s3://``, ``gs://`` or ``az://``) and its version tag (ETag;
    GCS: generation), from one consistent read; None when there is no such object."""
    if url.startswith("gs://"):
        from fastload.core.weburls import parse_gs_url
        from fastload.s3 import gcswrite

        return gcswrite.get_with_generation(*parse_gs_url(url), config)
    if url.startswith("az://"):
        from fastload.s3 import azwrite
        from fastload.s3.azstore import parse_az_url

        return azwrite.get_with_etag(*parse_az_url(url), config)
    return get_with_etag(*parse_s3_url(url), config=config)


def write_if(url: str, data: bytes, *, tag: str | None, config: S3Config) -> str:
    """Write ``data`` at ``url`` only if the object there still has version ``tag`` (as
    :func:`read_versioned` gave it; None: only if there is none); the new tag.
    :class:`PreconditionFailedError` when the store refuses the condition."""
    if url.startswith("gs://"):
        from fastload.core.weburls import parse_gs_url
        from fastload.s3 import gcswrite

        return gcswrite.upload_if(data, *parse_gs_url(url), config, generation=tag)
    if url.startswith("az://"):
        from fastload.s3 import azwrite
        from fastload.s3.azstore import parse_az_url

        return azwrite.upload_if(data, *parse_az_url(url), config, etag=tag)
    return put_if(*parse_s3_url(url), data, etag=tag, config=config)


__all__ = ["get_with_etag", "put_if", "read_versioned", "write_if"]
