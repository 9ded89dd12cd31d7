"""Fixtures for the ShardDataset/DataLoader tests: small packed datasets, made once per test module.

- ``uneven``: 95 samples (``cls``, ``txt``, ``json``, ``bin``) in 7 tar shards of 40, 1, 7, 3, 13, 9 and 22
  samples, cut by ``max_samples`` and by file size (one sample is larger than a shard).
- ``small``: 30 samples in tar shards of at most 7.

DataLoader warns (a UserWarning, an error in this suite) when ``num_workers`` exceeds the machine's cores;
these tests use up to 3 workers on purpose, so that one warning is ignored here.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
import torch.utils.data
from botocore.config import Config

from fastload.s3 import runtime

from .helpers import UNEVEN_OPTIONS, UNEVEN_SHARD_COUNTS, Packed, pack_files, small_files, uneven_files

HERE = Path(__file__).resolve().parent
BUCKET = "fastload-dataset-tests"
REGION = "us-east-1"
ACCESS_KEY, SECRET_KEY = "AKIDDATASETTESTS", "dataset-tests-secret"
WORKER_COUNT_WARNING = "ignore:This DataLoader will create:UserWarning"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.filterwarnings(WORKER_COUNT_WARNING))


@pytest.fixture(scope="module")
def uneven(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    packed = pack_files(tmp_path_factory.mktemp("uneven"), uneven_files(), **UNEVEN_OPTIONS)
    assert packed.counts == UNEVEN_SHARD_COUNTS, "the fixture no longer makes the uneven shards it promises"
    return packed


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    packed = pack_files(tmp_path_factory.mktemp("small"), small_files(), max_samples=7)
    assert packed.counts == [7, 7, 7, 7, 2]
    return packed


@pytest.fixture
def prompt_worker_shutdown(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """For tests where a DataLoader worker raises: torch then waits ``MP_STATUS_CHECK_INTERVAL`` (5 s) per
    worker before terminating the workers of the failed iterator (plain torch does this too, with any
    IterableDataset). Shorten that wait and shut the failed iterator down before the test ends."""
    monkeypatch.setattr(torch.utils.data._utils, "MP_STATUS_CHECK_INTERVAL", 0.5)
    yield
    gc.collect()


@pytest.fixture(scope="module")
def uploaded(moto_url: str, uneven: Packed) -> str:
    """``uneven`` uploaded as is (shards and index.json) under s3://BUCKET/ds."""
    client = boto3.client(
        "s3",
        endpoint_url=moto_url,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(s3={"addressing_style": "path"}),
    )
    client.create_bucket(Bucket=BUCKET)
    for path in sorted(p for p in uneven.root.rglob("*") if p.is_file()):
        rel = path.relative_to(uneven.root).as_posix()
        if not rel.startswith("."):
            client.put_object(Bucket=BUCKET, Key=f"ds/{rel}", Body=path.read_bytes())
    client.close()
    return f"s3://{BUCKET}/ds"


@pytest.fixture
def s3_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Dummy credentials in the environment (inherited by forked workers), nothing from this machine's AWS
    configuration; afterwards the S3 clients fastload cached in this process are closed."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    yield
    runtime.reset()
