"""Shared fixtures: small, deterministic trees of sample files generated in ``tmp_path``.

A tree is described as ``{relative path: bytes}``; :func:`write_tree` writes it and returns the root.
Every tree fixture returns a :class:`Tree` so tests can compare packed output with the exact source bytes.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from moto.server import ThreadedMotoServer

TESTS = Path(__file__).resolve().parent

# A name whose full member path is well over 100 bytes (the ustar name field), so it needs a pax header.
LONG_DIR = "a-folder-name-that-is-rather-long-" + "x" * 40
LONG_STEM = "a-file-name-that-is-also-long-" + "y" * 40


@dataclass(frozen=True)
class Tree:
    """A generated source tree: its root and every file's bytes by ``/``-separated relative path."""

    root: Path
    files: dict[str, bytes]

    def samples(self) -> dict[str, dict[str, bytes]]:
        """``key -> {field: bytes}`` by WebDataset's rule (key = folder + name up to the first dot)."""
        out: dict[str, dict[str, bytes]] = {}
        for rel, data in self.files.items():
            folder, _, base = rel.rpartition("/")
            stem, _, field = base.partition(".")
            key = f"{folder}/{stem}" if folder else stem
            out.setdefault(key, {})[field] = data
        return out

    @property
    def payload_bytes(self) -> int:
        return sum(len(d) for d in self.files.values())


def write_tree(root: Path, files: dict[str, bytes]) -> Tree:
    """Write ``files`` under ``root`` (folders created as needed) and return the :class:`Tree`."""
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return Tree(root, dict(files))


def rich_files(seed: int = 0) -> dict[str, bytes]:
    """Several fields per sample, uneven sizes (including block-boundary sizes), nested folders,
    names over 100 bytes, non-ASCII names, a folder with a dot and a multi-dot field."""
    rng = random.Random(seed)
    boundary_sizes = [1, 511, 512, 513, 1024, 1535, 4096, 10_000]
    files: dict[str, bytes] = {}
    for i in range(24):
        folder = ["cats", "dogs/small", "dogs/big/very/deep/folder", "v1.2/data"][i % 4]
        key = f"{folder}/{i:04d}"
        size = boundary_sizes[i % len(boundary_sizes)] if i < 16 else rng.randrange(1, 20_000)
        files[f"{key}.jpg"] = rng.randbytes(size)
        files[f"{key}.cls"] = str(i % 5).encode()
        if i % 3 == 0:
            files[f"{key}.seg.png"] = rng.randbytes(rng.randrange(1, 3000))
        if i % 4 == 1:
            files[f"{key}.json"] = b'{"id": %d, "note": "caf\xc3\xa9"}' % i
    files["é/日本語.jpg"] = rng.randbytes(777)
    files["é/日本語.txt"] = "こんにちは".encode()
    files["é/ñandú/über.jpg"] = rng.randbytes(1300)
    files[f"{LONG_DIR}/{LONG_STEM}.jpg"] = rng.randbytes(2100)
    files[f"{LONG_DIR}/{LONG_STEM}.cls"] = b"4"
    files[f"{LONG_DIR}/日本語-{LONG_STEM}.jpg"] = rng.randbytes(900)
    files["top-level.jpg"] = rng.randbytes(300)
    return files


def many_files(
    n: int, *, seed: int = 1, max_bytes: int = 3000, fields: tuple[str, ...] = ("bin",)
) -> dict[str, bytes]:
    """``n`` samples of random sizes in ten folders."""
    rng = random.Random(seed)
    files: dict[str, bytes] = {}
    for i in range(n):
        for field in fields:
            files[f"part{i % 10}/{i:06d}.{field}"] = rng.randbytes(rng.randrange(1, max_bytes))
    return files


def sparse_files(seed: int = 2) -> dict[str, bytes]:
    """Samples where some fields are missing: every sample has ``jpg``, every other one ``cls``, every third
    one ``json``, and one sample holds only ``json``."""
    rng = random.Random(seed)
    files: dict[str, bytes] = {}
    for i in range(20):
        key = f"s/{i:04d}"
        files[f"{key}.jpg"] = rng.randbytes(rng.randrange(1, 4000))
        if i % 2 == 0:
            files[f"{key}.cls"] = b"%d" % (i % 7)
        if i % 3 == 0:
            files[f"{key}.json"] = b'{"i": %d}' % i
    files["s/only-json.json"] = b'{"only": true}'
    return files


def split_files(seed: int = 3) -> dict[str, bytes]:
    """``train/`` and ``val/`` top folders (for ``--partition-by 0:split``), class subfolders."""
    rng = random.Random(seed)
    files: dict[str, bytes] = {}
    for i in range(40):
        split = "val" if i % 4 == 3 else "train"
        key = f"{split}/class{i % 3}/{i:04d}"
        files[f"{key}.jpg"] = rng.randbytes(rng.randrange(1, 6000))
        files[f"{key}.cls"] = b"%d" % (i % 3)
    return files


@pytest.fixture
def make_tree(tmp_path: Path):
    """Factory: ``make_tree(files, name="src")`` writes a tree under ``tmp_path / name``."""

    def make(files: dict[str, bytes], name: str = "src") -> Tree:
        return write_tree(tmp_path / name, files)

    return make


@pytest.fixture
def tree_files() -> SimpleNamespace:
    """The file-set builders, for tests that tweak a tree before writing it with ``make_tree``."""
    return SimpleNamespace(rich=rich_files, many=many_files, sparse=sparse_files, split=split_files)


@pytest.fixture
def rich_tree(make_tree) -> Tree:
    return make_tree(rich_files())


@pytest.fixture
def sparse_tree(make_tree) -> Tree:
    return make_tree(sparse_files())


@pytest.fixture
def split_tree(make_tree) -> Tree:
    return make_tree(split_files())


@pytest.fixture
def many_tree(make_tree) -> Tree:
    """200 single-field samples, enough for dozens of small shards."""
    return make_tree(many_files(200))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the groups to name the tests
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With pytest-xdist (``-n``, ``--dist loadgroup``): each test file runs whole on one worker, so its
    module fixtures are built once; every test of ``tests/s3`` on one worker, so one Ceph RGW starts for the
    session instead of one per worker; and the Ray tests on one worker (one local Ray cluster at a time)."""
    for item in items:
        path = Path(item.path).resolve()
        rel = path.relative_to(TESTS).as_posix() if TESTS in path.parents else str(path)
        top = rel.split("/", 1)[0]
        item.add_marker(pytest.mark.xdist_group(top if top in ("s3", "ray") else rel))


@pytest.fixture(scope="session")
def thousands_tree(tmp_path_factory: pytest.TempPathFactory) -> Tree:
    """3000 small single-file samples (about 9 MB): big enough that a pack takes a noticeable moment and
    spans a hundred 64 KiB shards. Shared by the session: tests must not modify it (copy it first)."""
    return write_tree(tmp_path_factory.mktemp("thousands") / "src", many_files(3000, max_bytes=6000))


@pytest.fixture(scope="session")
def moto_url() -> Iterator[str]:
    """One moto S3 server on 127.0.0.1 for the whole test session (quick correctness checks only)."""
    werkzeug_log = logging.getLogger("werkzeug")
    level = werkzeug_log.level
    werkzeug_log.setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        if server._server is not None:  # stop() leaves the listening socket open
            server._server.server_close()
        werkzeug_log.setLevel(level)


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[object]:
    """One GCS emulator (``gcp-storage-emulator``) on 127.0.0.1 for the session: point fastload at it with
    ``STORAGE_EMULATOR_HOST`` (``monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.host)``)."""
    from tests.servers.gcs import GcsEmulator

    with GcsEmulator() as emulator:
        yield emulator


@pytest.fixture(scope="session")
def azurite() -> Iterator[object]:
    """One Azurite blob service on 127.0.0.1 for the session (``npm install -g azurite``): point fastload
    at it with ``AZURE_STORAGE_CONNECTION_STRING`` (``azurite.connection_string``)."""
    from tests.servers.azurite import Azurite

    with Azurite() as server:
        yield server
