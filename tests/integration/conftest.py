"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fastload.s3 import runtime


@pytest.fixture
def moto_env(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The session's moto endpoint as the AWS variables name it (fastload's clients made afresh)."""
    for name, value in {
        "AWS_ENDPOINT_URL": moto_url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    runtime.reset()
    try:
        yield moto_url
    finally:
        runtime.reset()
