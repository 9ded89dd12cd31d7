"""Fixtures for the Ray tests: one local Ray cluster per test module (2 CPUs, no dashboard), shut down at the
module's end so no Ray process outlives the tests.

Ray starts in 2-3 s on 2 cores, so a module starts it once. Its workers get ``worker_env`` (dummy S3
credentials, nothing from this machine's AWS configuration).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from ray_helpers import worker_env


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A local Ray cluster for this module; yields the ``ray`` module, connected.

    Ray's processes inherit this process's environment when they start, so the workers' S3 settings are
    set just for ``ray.init`` (a job ``runtime_env`` would work too, but makes Ray start fresh workers
    instead of the ones it prestarts: seconds on 2 cores)."""
    if ray.is_initialized():
        ray.shutdown()
    with pytest.MonkeyPatch.context() as env:
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            env.delenv(name, raising=False)
        for name, value in worker_env(tmp_path_factory.mktemp("ray-env")).items():
            env.setenv(name, value)
        # "near_data": a custom resource, as nodes near the data would be started with (serve places feeders)
        ray.init(
            num_cpus=2, resources={"near_data": 4}, include_dashboard=False, logging_level=logging.WARNING
        )
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture
def s3_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """The workers' dummy credentials in this process too (the driver talks to S3 as well); afterwards the
    S3 clients fastload cached in this process are closed."""
    from fastload.s3 import runtime

    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    for name, value in worker_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    yield
    runtime.reset()
