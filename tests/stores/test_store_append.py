"""Appends into ``gs://`` and ``az://`` datasets, as into ``s3://`` ones (``tests/s3/test_s3_append.py``):
``index.json`` is replaced only if it is still the version the append read (GCS: ``ifGenerationMatch`` on
its generation, ``0`` creating; Azure: ``If-Match`` on its ETag, ``If-None-Match: *`` creating). Azurite
honours both headers; ``gcp-storage-emulator`` ignores ``ifGenerationMatch``, so the GCS tests run through
``tests.servers.gcsgate``, which answers 412 as GCS does, in front of it."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import fastload
from fastload.errors import AppendConflictError, PreconditionFailedError
from fastload.s3 import conditional

from .helpers import run_cli

_NAMES = itertools.count()
_WRITE_IF = conditional.write_if  # (the real one, while a test patches it)


@dataclass
class Store:
    """A fresh bucket (container) on the emulator: ``root`` is its URL; ``rewrite`` replaces an object
    with the same bytes (a new generation / ETag), as another writer would."""

    root: str
    gate: Any = None

    def rewrite(self, url: str) -> None:
        config = fastload.S3Config.from_env()
        found = conditional.read_versioned(url, config=config)
        assert found is not None
        _WRITE_IF(url, found[0], tag=found[1], config=config)


@pytest.fixture(params=["gs", "az"])
def store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Store]:
    monkeypatch.chdir(tmp_path)  # (a gs:// URL taken for a local path would show as a folder "gs:")
    name = f"append{os.getpid()}x{next(_NAMES)}"  # (not test_azure.py's names: one Azurite a session)
    if request.param == "gs":
        from tests.servers.gcsgate import GcsGate

        emulator = request.getfixturevalue("gcs_emulator")
        emulator.make_bucket(name)
        with GcsGate(emulator.url) as gate:
            monkeypatch.setenv("STORAGE_EMULATOR_HOST", gate.host)
            yield Store(f"gs://{name}", gate)
    else:
        azurite = request.getfixturevalue("azurite")
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
        azurite.make_container(name)
        yield Store(f"az://{name}")
    assert not (tmp_path / f"{request.param}:").exists()


def tree(root: Path, first: int, n: int) -> Path:
    root.mkdir(parents=True)
    for i in range(first, first + n):
        (root / f"s{i:04d}.txt").write_bytes(b"x%d " % i * (1 + i % 4))
    return root


def samples(url: str, **kwargs: Any) -> dict[str, bytes]:
    return {s["__key__"]: s["txt"] for s in fastload.ShardDataset(url, decode=False, **kwargs)}


def expected(*roots: Path) -> dict[str, bytes]:
    return {p.stem: p.read_bytes() for root in roots for p in root.iterdir()}


def versions(url: str) -> list[tuple[int, int, int]]:
    found = conditional.read_versioned(f"{url}/index.json", config=fastload.S3Config.from_env())
    assert found is not None
    return [(v["version"], v["added"], v["samples"]) for v in json.loads(found[0])["versions"]]


def test_conditional_write_is_honoured(store: Store) -> None:
    config = fastload.S3Config.from_env()
    url = f"{store.root}/k.json"
    assert conditional.read_versioned(url, config=config) is None
    first = conditional.write_if(url, b"one", tag=None, config=config)
    with pytest.raises(PreconditionFailedError, match=r"k\.json"):
        conditional.write_if(url, b"again", tag=None, config=config)  # create-only on an existing object
    assert conditional.read_versioned(url, config=config) == (b"one", first)
    second = conditional.write_if(url, b"two", tag=first, config=config)
    with pytest.raises(PreconditionFailedError):
        conditional.write_if(url, b"stale", tag=first, config=config)  # on a replaced version
    assert conditional.read_versioned(url, config=config) == (b"two", second)


def test_pack_append_reads_back_every_sample_and_lists_the_versions(store: Store, tmp_path: Path) -> None:
    """``fastload pack --append`` twice (the first creates the dataset): every sample, old and new, read back
    with its bytes; version 1 is still the first append's stream."""
    url = f"{store.root}/ds"
    a, b = tree(tmp_path / "a", 0, 5), tree(tmp_path / "b", 5, 4)
    run_cli("pack", a, url, "--append", "--max-samples", "2")
    run_cli("pack", b, url, "--append", "--max-samples", "2")
    assert versions(url) == [(1, 3, 5), (2, 2, 9)]
    assert samples(url) == expected(a, b)
    assert samples(url, version=1) == expected(a)
    assert fastload.verify(url).problems == []
    again = run_cli("pack", b, url, "--append", "--max-samples", "2", check=None)  # the same inputs again
    assert again.returncode != 0 and "already holds these inputs as version 2" in again.stderr
    assert versions(url) == [(1, 3, 5), (2, 2, 9)]


def test_a_racing_appender_is_joined_not_overwritten(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between an append's read of index.json and its conditional write, another append lands: the write is
    refused (412), the append reads again and joins after the other; both land, nothing lost."""
    url = f"{store.root}/ds"
    a, b, c = tree(tmp_path / "a", 0, 4), tree(tmp_path / "b", 4, 3), tree(tmp_path / "c", 7, 5)
    fastload.pack(a, url, max_samples=2, append=True, progress=False)
    tags: list[str | None] = []
    real = conditional.write_if

    def racing(target: str, data: bytes, *, tag: str | None, config: Any) -> str:
        tags.append(tag)
        if len(tags) == 1:
            fastload.pack(c, url, max_samples=2, append=True, progress=False)  # (its write: tags[1])
        return real(target, data, tag=tag, config=config)

    monkeypatch.setattr(conditional, "write_if", racing)
    report = fastload.pack(b, url, max_samples=2, append=True, progress=False)
    monkeypatch.setattr(conditional, "write_if", real)
    assert len(tags) == 3 and tags[0] == tags[1] and tags[2] != tags[0]
    assert store.gate is None or store.gate.refused == 1  # (Azurite refused it itself)
    assert report.appended is not None and report.appended[0].version == 3
    assert versions(url) == [(1, 2, 4), (2, 3, 9), (3, 2, 12)]
    assert samples(url) == expected(a, b, c)
    assert fastload.ShardDataset(url, decode=False).view.version == 3


def test_an_append_always_beaten_says_so_and_resume_lands_it(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """index.json replaced before every conditional write: after 20 refusals the append stops with the
    conflict error naming the dataset and ``--resume``; index.json is as it was, the shards are kept, and
    the resumed append lands them."""
    url = f"{store.root}/ds"
    a, b = tree(tmp_path / "a", 0, 4), tree(tmp_path / "b", 4, 3)
    fastload.pack(a, url, max_samples=2, append=True, progress=False)
    real = conditional.write_if
    refused: list[str] = []

    def beaten(target: str, data: bytes, *, tag: str | None, config: Any) -> str:
        store.rewrite(target)
        try:
            return real(target, data, tag=tag, config=config)
        except PreconditionFailedError as exc:
            refused.append(exc.url)
            raise

    monkeypatch.setattr(conditional, "write_if", beaten)
    with pytest.raises(AppendConflictError, match=r"could not publish the append to .*--resume") as caught:
        fastload.pack(b, url, max_samples=2, append=True, progress=False)
    monkeypatch.setattr(conditional, "write_if", real)
    assert caught.value.url == url and url in str(caught.value)
    assert refused == [f"{url}/index.json"] * 20
    assert versions(url) == [(1, 2, 4)]
    assert samples(url) == expected(a)
    report = fastload.pack(b, url, max_samples=2, append=True, resume=True, progress=False)
    assert report.appended is not None and report.appended[0].version == 2
    assert samples(url) == expected(a, b)


def test_shardwriter_appends(store: Store) -> None:
    url = f"{store.root}/written"
    with fastload.ShardWriter(url, max_samples_per_shard=2) as w:
        for i in range(5):
            w.write({"__key__": f"{i:04d}", "txt": f"t{i}"})
    with fastload.ShardWriter(url, mode="append", max_samples_per_shard=2) as w:
        for i in range(5, 8):
            w.write({"__key__": f"{i:04d}", "txt": f"t{i}"})
    assert w.report is not None and "appended as version 2" in w.report.summary()
    assert samples(url) == {f"{i:04d}": f"t{i}".encode() for i in range(8)}
    assert samples(url, version=1) == {f"{i:04d}": f"t{i}".encode() for i in range(5)}
    with pytest.raises(Exception, match="0002"), fastload.ShardWriter(url, mode="append") as w:
        w.write({"__key__": "0002", "txt": "again"})  # a key the dataset holds: refused
    assert versions(url) == [(1, 3, 5), (2, 2, 8)]


def test_shardwriter_parts_merge_in_the_store(store: Store) -> None:
    """Two parts written into the store, then merged there (the merge took a gs:// URL for a local path)."""
    url = f"{store.root}/parts"
    for p in range(2):
        with fastload.ShardWriter(url, part=p, parts=2, max_samples_per_shard=2) as w:
            for i in range(p, 6, 2):
                w.write({"__key__": f"{i:04d}", "txt": f"t{i}"})
    report = fastload.ShardWriter.merge(url)
    assert report.samples == 6
    assert samples(url) == {f"{i:04d}": f"t{i}".encode() for i in range(6)}


def test_index_upgrade_meeting_an_append_writes_nothing(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fastload index --upgrade`` rewrites index.json from what it read: an append published after the
    upgrade checked index.json unchanged, just before it writes, refuses its write (conditional on the version
    checked, as an append's: no compare-then-write window), nothing is written and the append's version
    stays; run again, the upgrade completes."""
    from fastload.core.table import SUFFIX
    from fastload.packing import upgrade

    url = f"{store.root}/ds"
    a, b = tree(tmp_path / "a", 0, 6), tree(tmp_path / "b", 6, 3)
    fastload.pack(a, url, max_samples=2, progress=False)
    config = fastload.S3Config.from_env()
    table = f"shard-000000.tar{SUFFIX}"  # (removed: the upgrade rebuilds it, then writes index.json)
    assert conditional.read_versioned(f"{url}/{table}", config=config) is not None
    upgrade.destination(url, ".fastload-pack", config=config).remove(table)
    real = upgrade.publish_index

    def append_then_publish(*args: Any, **kwargs: Any) -> None:
        fastload.pack(b, url, max_samples=2, append=True, progress=False)
        real(*args, **kwargs)

    monkeypatch.setattr(upgrade, "publish_index", append_then_publish)
    with pytest.raises(AppendConflictError, match=r"changed while `fastload index --upgrade` ran"):
        upgrade.upgrade_index(url)
    monkeypatch.setattr(upgrade, "publish_index", real)
    assert versions(url) == [(1, 3, 6), (2, 2, 9)]
    upgrade.upgrade_index(url)
    assert versions(url) == [(1, 3, 6), (2, 2, 9)]
    assert samples(url) == expected(a, b)


def test_optimize_appends(store: Store) -> None:
    """``fastload.optimize(..., mode="append")`` into the store: every sample of both runs read back (its URL
    is the store's, not a local folder named ``gs:``), nothing left in ``.fastload-pack/``."""
    from fastload.storage.web import list_web

    url = f"{store.root}/ds"

    def make(n: int) -> dict[str, Any]:
        return {"__key__": f"k{n:05d}", "txt": f"text {n} " * (n % 4 + 1) * 60}

    def made(inputs: range) -> dict[str, bytes]:
        return {f"k{n:05d}": make(n)["txt"].encode() for n in inputs}

    options: dict[str, Any] = {"workers": 1, "shard_size_bytes": 4 << 10, "progress": False}
    fastload.optimize(make, range(12), url, **options)
    report = fastload.optimize(make, range(12, 24), url, mode="append", **options)
    assert report.samples == 12 and samples(url, version=1) == made(range(12))
    assert samples(url) == made(range(24)) and fastload.ShardDataset(url, decode=False).view.version == 2
    config = fastload.S3Config.from_env()
    assert list_web(url, "", config) and not list_web(f"{url}/.fastload-pack", "", config)


def test_pack_tokens_appends(store: Store, tmp_path: Path) -> None:
    """``pack_tokens(append=True)`` into the store: the documents of both runs read back in order (token
    datasets keep index.json in ``_fastload/``: the conditional write is there)."""
    url = f"{store.root}/tok"
    docs = [list(range(d * 100, d * 100 + 3 + d % 5)) for d in range(9)]
    for name, part in (("a", docs[:5]), ("b", docs[5:])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"input_ids": d}) + "\n" for d in part))
    options: dict[str, Any] = {"shard_size_bytes": 4096, "workers": 1, "progress": False}
    fastload.pack_tokens(tmp_path / "a.jsonl", url, **options)
    fastload.pack_tokens(tmp_path / "b.jsonl", url, append=True, **options)
    found = conditional.read_versioned(f"{url}/_fastload/index.json", config=fastload.S3Config.from_env())
    assert found is not None
    assert [(v["version"], v["samples"]) for v in json.loads(found[0])["versions"]] == [(1, 5), (2, 9)]
    got = [s[next(k for k in s if k.startswith("tokens."))].tolist() for s in fastload.ShardDataset(url)]
    assert got == docs


def test_a_publish_whose_answer_was_lost_lands_once(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The conditional write of index.json reaches the store, but the connection drops before its answer:
    the retry is refused (the version moved on: 412), the append reads index.json again, finds its own
    shards there, and reports them landed; one version added, nothing twice."""
    from fastload.s3 import httpcall

    url = f"{store.root}/ds"
    a, b = tree(tmp_path / "a", 0, 4), tree(tmp_path / "b", 4, 3)
    fastload.pack(a, url, max_samples=2, append=True, progress=False)
    real = httpcall.request_once
    dropped: list[str] = []

    def drop_first_answer(config: Any, method: str, target: str, *args: Any, **kwargs: Any) -> Any:
        answer = real(config, method, target, *args, **kwargs)
        conditional = "ifGenerationMatch" in target or "If-Match" in args[1]
        if method in ("PUT", "POST") and "index.json" in target and conditional and not dropped:
            dropped.append(target)
            raise ConnectionResetError("the answer was lost")
        return answer

    monkeypatch.setattr(httpcall, "request_once", drop_first_answer)
    report = fastload.pack(b, url, max_samples=2, append=True, progress=False)
    monkeypatch.setattr(httpcall, "request_once", real)
    assert len(dropped) == 1
    assert store.gate is None or store.gate.refused == 1  # (the retry; Azurite refused it itself)
    assert report.appended is not None and report.appended[0].version == 2
    assert versions(url) == [(1, 2, 4), (2, 2, 7)]
    assert samples(url) == expected(a, b)


def test_an_append_into_a_folder_of_other_files_is_refused(store: Store, tmp_path: Path) -> None:
    """Files but no index.json: there is no dataset to append to, and starting one would mix with them."""
    url = f"{store.root}/junk"
    _WRITE_IF(f"{url}/notes.txt", b"not a dataset", tag=None, config=fastload.S3Config.from_env())
    with pytest.raises(fastload.errors.PackError, match=r"junk holds files but no index\.json"):
        fastload.pack(tree(tmp_path / "a", 0, 2), url, append=True, progress=False)
    assert conditional.read_versioned(f"{url}/index.json", config=fastload.S3Config.from_env()) is None
