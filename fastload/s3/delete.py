"""Deleting S3 objects: ``DeleteObjects`` in batches of 1,000 keys, each batch retried like every other
request (503 SlowDown, 5xx, resets; :mod:`fastload.s3.retrying`). A batch's answer can be 200 and still
list keys it failed to delete (``Errors``: ``InternalError``, ``SlowDown`` per key); those keys are sent
again under the same retry budget, and a key refused for good (``AccessDenied``) raises naming it. Deleting
a key that is not there is success (S3 semantics)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastload.config import S3Config
from fastload.core.retry import classify_status
from fastload.errors import S3Error
from fastload.s3.client import Failure, get_client
from fastload.s3.retrying import BadResponse, Retrier, give_up_on

BATCH_KEYS = 1000  # DeleteObjects' limit

# HTTP statuses that S3 answers with these codes, when it refuses a whole request
_CODE_STATUS = {"SlowDown": 503, "ServiceUnavailable": 503, "InternalError": 500, "AccessDenied": 403}


def key_failure(error: dict[str, Any]) -> Failure:
    """The classified failure of one key of a DeleteObjects answer (``{"Key", "Code", "Message"}``)."""
    code = str(error.get("Code", "") or "")
    status = _CODE_STATUS.get(code, 400)
    message = f"{code}: {error.get('Message', '')}".strip(": ") or "no reason given"
    return Failure(classify_status(status, code or None), None, f"deleting {error.get('Key')}: {message}")


def delete_keys(
    bucket: str,
    keys: Sequence[str],
    *,
    config: S3Config,
    client: Any = None,
    retrier: Retrier | None = None,
) -> int:
    """Delete ``keys`` of ``bucket`` (see the module docstring); return how many keys were sent."""
    client = client if client is not None else get_client(config)
    retrier = retrier or Retrier.from_config(config)
    for first in range(0, len(keys), BATCH_KEYS):
        _delete_batch(client, retrier, bucket, list(keys[first : first + BATCH_KEYS]))
    return len(keys)


def _delete_batch(client: Any, retrier: Retrier, bucket: str, batch: list[str]) -> None:
    pending = list(batch)

    def attempt() -> None:
        resp = client.delete_objects(
            Bucket=bucket, Delete={"Objects": [{"Key": k} for k in pending], "Quiet": True}
        )
        errors = resp.get("Errors") or []
        failed = {str(e.get("Key")) for e in errors}
        pending[:] = [k for k in pending if k in failed]
        if errors:
            raise BadResponse(key_failure(errors[0]))  # retried if its fault is (SlowDown, InternalError)

    def spent(failure: Failure, tries: int, elapsed_s: float) -> Exception:
        first = pending[0] if pending else batch[0]
        return S3Error(
            f"deleting {len(pending)} object(s) of s3://{bucket}/ (the first: {first}) failed after {tries} "
            f"attempt(s) in {elapsed_s:.1f}s ({failure.message}); they are still there: run the command "
            "again, or delete them by hand",
            bucket=bucket,
            key=first,
        )

    def give_up(failure: Failure, tries: int, elapsed_s: float) -> Exception:
        key = pending[0] if pending else batch[0]  # the key that failed (or the batch's first)
        return give_up_on(bucket, key, what="delete objects in", spent=spent)(failure, tries, elapsed_s)

    retrier.call(attempt, give_up)
