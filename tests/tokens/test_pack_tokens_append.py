"""``fastload pack-tokens --append`` / ``pack_tokens(append=True)``: token documents join a token dataset
as a new version through ``pack --append``'s publish (the totals in ``index.json`` grown, existing files
untouched, the pre-append version read as it was), refusals naming what differs, an interrupted append
finished with ``--resume``, and the same on S3 (moto)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastload
from fastload.cli import main
from fastload.errors import AppendConflictError, ConfigError, PackError
from fastload.packing import append as append_module

from .conftest import write_jsonl
from .helpers import documents, lognormal_lengths, moto_bucket

OPTIONS: dict[str, Any] = {"shard_size_bytes": 4096, "workers": 1, "progress": False}


def read_back(root: Path | str, **kw: Any) -> list[tuple[str, list[int]]]:
    """Every document in order: key and ids."""
    out = []
    for s in fastload.ShardDataset(root, **kw):
        ids = s[next(k for k in s if k.startswith("tokens."))].numpy()
        out.append((s["__key__"], ids.tolist()))
    return out


def manifest(root: Path) -> dict[str, Any]:
    return json.loads((root / "_fastload" / "index.json").read_bytes())  # type: ignore[no-any-return]


def files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "index.json"
    }


@pytest.fixture
def sources(tmp_path: Path) -> tuple[Path, Path, list[np.ndarray], list[np.ndarray]]:
    a = documents(lognormal_lengths(30, seed=1, median=40, cap=200))
    b = documents(lognormal_lengths(20, seed=2, median=40, cap=200), first=1000)
    write_jsonl(tmp_path / "a.jsonl", a)
    write_jsonl(tmp_path / "b.jsonl", b)
    return tmp_path / "a.jsonl", tmp_path / "b.jsonl", a, b


def test_an_append_grows_the_token_dataset_as_a_version(tmp_path: Path, sources: Any) -> None:
    a_src, b_src, a, b = sources
    dst = tmp_path / "ds"
    fastload.pack_tokens(a_src, dst, **OPTIONS)
    before, old = files(dst), read_back(dst)
    assert main(["pack-tokens", str(b_src), str(dst), "--append", "--shard-size", "4KiB", "--quiet"]) == 0
    index = manifest(dst)
    opts = index["options"]
    assert opts["documents"] == 50 == index["totals"]["samples"]
    assert opts["tokens"] == sum(d.size for d in (*a, *b))
    assert opts["max_token_id"] == int(max(d.max() for d in (*a, *b)))
    assert [(v["version"], v["samples"]) for v in index["versions"]] == [(1, 30), (2, 50)]
    after = files(dst)
    assert {n: after[n] for n in before} == before  # the existing shards and tables: not rewritten
    assert read_back(dst, version=1) == old
    got = read_back(dst)
    assert got[:30] == old and [k for k, _ in got[30:]] == [f"b/{i}" for i in range(20)]
    assert [ids for _, ids in got[30:]] == [d.tolist() for d in b]
    assert fastload.verify(dst).ok


def test_another_dtype_the_same_inputs_or_another_kind_are_refused(tmp_path: Path, sources: Any) -> None:
    a_src, b_src, *_ = sources
    dst = tmp_path / "ds"
    fastload.pack_tokens(a_src, dst, **OPTIONS)
    before = files(dst)
    with pytest.raises(ConfigError, match=r"dtype: 'int32' in the dataset, 'uint16' in this append"):
        fastload.pack_tokens(b_src, dst, append=True, dtype="uint16", **OPTIONS)
    with pytest.raises(AppendConflictError, match="already holds these inputs as version 1"):
        fastload.pack_tokens(a_src, dst, append=True, **OPTIONS)
    assert files(dst) == before
    tar = tmp_path / "tar"
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "x.txt").write_text("x")
    fastload.pack(tmp_path / "files", tar, progress=False)
    with pytest.raises(ConfigError, match=r"shard_format: the dataset is tar"):
        fastload.pack_tokens(b_src, tar, append=True, **OPTIONS)
    pq = tmp_path / "pq"
    fastload.pack(tmp_path / "files", pq, shard_format="parquet", progress=False)
    with pytest.raises(ConfigError, match=r"kind: None in the dataset, 'tokens' in this append"):
        fastload.pack_tokens(b_src, pq, append=True, **OPTIONS)


def test_an_interrupted_append_finishes_with_resume(
    tmp_path: Path, sources: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    a_src, b_src, *_ = sources
    clean, dst = tmp_path / "clean", tmp_path / "ds"
    for d in (clean, dst):
        fastload.pack_tokens(a_src, d, **OPTIONS)
    fastload.pack_tokens(b_src, clean, append=True, **OPTIONS)
    calls = {"n": 0}
    real = append_module.AppendedJob.write

    def failing(self, tmp_path, **kw):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(5, "injected failure")
        return real(self, tmp_path, **kw)

    monkeypatch.setattr(append_module.AppendedJob, "write", failing)
    with pytest.raises(OSError, match="injected"):
        fastload.pack_tokens(b_src, dst, append=True, **OPTIONS)
    monkeypatch.undo()
    assert "versions" not in manifest(dst)
    with pytest.raises(PackError, match="--resume"):
        fastload.pack_tokens(b_src, dst, append=True, **OPTIONS)
    report = fastload.pack_tokens(b_src, dst, append=True, resume=True, **OPTIONS)
    assert report.shards_kept >= 1 and "appended as version 2" in report.summary()
    got, want = manifest(dst), manifest(clean)
    for v in (*got["versions"], *want["versions"]):
        v.pop("created")
    assert got == want and files(dst) == files(clean)


def test_append_to_s3(tmp_path: Path, sources: Any, moto_url: str, monkeypatch: pytest.MonkeyPatch) -> None:

    from fastload.s3 import runtime

    moto_bucket(monkeypatch, tmp_path, moto_url, "fastload-token-append")
    a_src, b_src, a, b = sources
    try:
        config = fastload.S3Config(endpoint_url=moto_url, addressing_style="path")
        url = "s3://fastload-token-append/tok"
        fastload.pack_tokens(a_src, url, s3_config=config, **OPTIONS)
        report = fastload.pack_tokens(b_src, url, append=True, s3_config=config, **OPTIONS)
        assert report.appended is not None and report.appended[1].options["documents"] == 50
        got = read_back(url, s3_config=config)
        assert [ids for _, ids in got] == [d.tolist() for d in (*a, *b)]
        assert len(read_back(url, s3_config=config, version=1)) == 30
    finally:
        runtime.reset()
