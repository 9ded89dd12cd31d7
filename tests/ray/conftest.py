"""Fixtures for the Ray tests: one local Ray cluster (2 CPUs, no dashboard) for the Ray tests that run one
after another (tests/conftest.py puts them all on one pytest-xdist worker), shut down after the last of them
(the next test is not a Ray test, or none is left) so no Ray process outlives them.

Ray starts in 3-6 s on 2 cores (and takes a second or two to shut down), so the tests share one cluster
instead of one per module; a test leaves it as it found it (``test_serve``'s check: no feeder outlives a
test). Its workers get ``worker_env`` (dummy S3 credentials, nothing from this machine's AWS configuration).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from ray_helpers import worker_env

HERE = Path(__file__).resolve().parent
_started: list[bool] = []  # [True] while the cluster the fixture started is up


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The local Ray cluster of the Ray tests (started by the first module that asks, shut down after the
    last Ray test: :func:`pytest_runtest_teardown`); the ``ray`` module, connected.

    Ray's processes inherit this process's environment when they start, so the workers' S3 settings are
    set just for ``ray.init`` (a job ``runtime_env`` would work too, but makes Ray start fresh workers
    instead of the ones it prestarts: seconds on 2 cores)."""
    if _started and ray.is_initialized():
        return ray
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
    _started[:] = [True]
    return ray


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the last Ray test in a row (the next test is elsewhere, or none is left) and its fixtures'
    teardown: shut the cluster down, as a module fixture's teardown did (pytest-xdist tells a worker its
    next test too)."""
    try:
        return (yield)
    finally:
        if _started and (nextitem is None or HERE not in Path(nextitem.path).resolve().parents):
            _started.clear()
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
