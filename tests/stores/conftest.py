"""Fixtures for the web stores: a small tar dataset packed once, served by ``fastload.testing.httpserve``."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

import fastload
from fastload.s3 import runtime
from fastload.testing.httpserve import WebServer


@pytest.fixture(scope="session")
def www(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``www/ds``: a packed dataset (5 shards of 24 samples), and ``www/wds``: the same shards without
    their index (as webdataset's users keep them)."""
    root = tmp_path_factory.mktemp("www")
    src = root / "src"
    rng = random.Random(32)
    for i in range(120):
        (src / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 3}" / f"{i:05d}.bin").write_bytes(rng.randbytes(rng.randrange(1, 6000)))
        (src / f"d{i % 3}" / f"{i:05d}.cls").write_bytes(str(i % 7).encode())
    fastload.pack(str(src), str(root / "www" / "ds"), max_samples=24)
    (root / "www" / "wds").mkdir()
    for shard in sorted((root / "www" / "ds").glob("*.tar")):
        (root / "www" / "wds" / shard.name).write_bytes(shard.read_bytes())
    return root / "www"


@pytest.fixture
def web(www: Path) -> Iterator[WebServer]:
    with WebServer(www) as server:
        yield server


@pytest.fixture(autouse=True)
def fresh_runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in (
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_ENDPOINT",
        "FASTLOAD_S3_UNSIGNED",
        "FASTLOAD_HTTP_HEADERS",
    ):
        monkeypatch.delenv(name, raising=False)
    runtime.reset()
    yield
    runtime.reset()
