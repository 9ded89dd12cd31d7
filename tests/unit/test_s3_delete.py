"""DeleteObjects answered 200 with per-key ``Errors``: the failed keys (and only they) are sent again under
the retry policy; a key refused for good raises naming it. (The 503s on whole requests are tested on RGW
through the fault proxy: tests/s3/test_s3_rgw_every_request_retried.py.)"""

from __future__ import annotations

import random
from typing import Any

import pytest

from fastload.config import S3Config
from fastload.core.retry import RetryPolicy
from fastload.errors import AccessDeniedError, S3Error
from fastload.s3.delete import delete_keys
from fastload.s3.gate import ConcurrencyGate
from fastload.s3.retrying import Retrier


class Bucket:
    """A bucket's keys behind ``delete_objects``; ``fail[key]`` lists error codes its next deletes get."""

    def __init__(self, keys: list[str], fail: dict[str, list[str]]) -> None:
        self.keys, self.fail, self.calls = set(keys), fail, []  # type: ignore[var-annotated]

    def delete_objects(self, *, Bucket: str, Delete: dict[str, Any]) -> dict[str, Any]:
        asked = [o["Key"] for o in Delete["Objects"]]
        self.calls.append(asked)
        errors = []
        for key in asked:
            codes = self.fail.get(key)
            if codes:
                errors.append({"Key": key, "Code": codes.pop(0), "Message": "injected"})
            else:
                self.keys.discard(key)
        return {"Errors": errors} if errors else {}


def retrier() -> Retrier:
    return Retrier(
        RetryPolicy(max_attempts=5), ConcurrencyGate(4), rng=random.Random(0), sleep=lambda s: None
    )


def test_keys_failed_in_a_200_answer_are_sent_again_alone() -> None:
    keys = [f"p/{i:04d}" for i in range(2500)]
    bucket = Bucket(keys, {"p/0007": ["InternalError", "SlowDown"], "p/2100": ["SlowDown"]})
    delete_keys("b", keys, config=S3Config(), client=bucket, retrier=retrier())
    assert bucket.keys == set()
    sizes = [len(c) for c in bucket.calls]
    assert sizes == [1000, 1, 1, 1000, 500, 1], sizes  # batches of 1,000; a failed key again, alone
    assert bucket.calls[1] == ["p/0007"] and bucket.calls[5] == ["p/2100"]


def test_a_key_refused_for_good_is_named() -> None:
    bucket = Bucket(["a", "b"], {"b": ["AccessDenied"]})
    with pytest.raises(AccessDeniedError, match="s3://bk/b: access denied"):
        delete_keys("bk", ["a", "b"], config=S3Config(), client=bucket, retrier=retrier())


def test_a_key_that_keeps_failing_ends_with_its_name_after_the_budget() -> None:
    bucket = Bucket(["a"], {"a": ["InternalError"] * 10})
    with pytest.raises(S3Error, match=r"deleting 1 object\(s\) of s3://bk/ \(the first: a\) failed after 5"):
        delete_keys("bk", ["a"], config=S3Config(), client=bucket, retrier=retrier())
