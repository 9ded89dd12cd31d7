"""Helpers for the integration tests: run the real CLI, read what a pack wrote, read it back with peers."""

from __future__ import annotations

import gc
import io
import json
import os
import subprocess
import sys
import tarfile
import warnings
from pathlib import Path
from typing import Any

import webdataset as wds

from fastload import formats

CLI_TIMEOUT_S = 120


def proxied_config(proxy: Any) -> Any:
    """An ``S3Config`` for the moto server behind ``proxy`` (a FaultProxy): path addressing, two attempts
    with short backoffs, 20 s deadline."""
    from fastload.config import S3Config

    return S3Config(
        endpoint_url=proxy.endpoint_url,
        region="us-east-1",
        addressing_style="path",
        max_attempts=2,
        base_backoff_s=0.01,
        max_backoff_s=0.05,
        deadline_s=20.0,
    )


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONWARNINGS", "COVERAGE"))}
    env.update({"PYTHONIOENCODING": "utf-8", "LC_ALL": "C.UTF-8"})
    env.update(extra)
    return env


def run_cli(
    *args: str | os.PathLike[str], check: bool | int = False, **env: str
) -> subprocess.CompletedProcess[str]:
    """``python -m fastload ARGS`` in a real subprocess; ``check=N`` asserts exit status N (True means 0)."""
    cmd = [sys.executable, "-m", "fastload", *(os.fspath(a) for a in args)]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="backslashreplace",
        env=cli_env(**env),
        timeout=CLI_TIMEOUT_S,
    )
    if check is not False:
        want = 0 if check is True else check
        assert proc.returncode == want, (
            f"{' '.join(cmd)} exited {proc.returncode}, expected {want}\n"
            f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return proc


def pack_cli(
    src: Path | list[Path], dst: Path, *options: str, check: bool | int = True
) -> subprocess.CompletedProcess[str]:
    sources = src if isinstance(src, list) else [src]
    return run_cli("pack", *sources, dst, "--quiet", *options, check=check)


def read_manifest(dst: Path) -> dict[str, Any]:
    """``index.json`` as written (v2: shards listed, no per-sample columns)."""
    return json.loads(manifest_path(dst).read_bytes())


def manifest_path(dst: Path) -> Path:
    """Where the dataset at ``dst`` keeps ``index.json``: beside the shards, or in ``_fastload/``."""
    inside = dst / "_fastload" / "index.json"
    return inside if inside.exists() else dst / "index.json"


def read_index(dst: Path) -> dict[str, Any]:
    """``index.json`` with each shard's per-sample columns (keys, offsets, sizes, crcs, ...) attached from its
    sample table, each shard in the v1 form: what tests that look at samples read."""
    raw = read_manifest(dst)
    raw["shards"] = [s.to_dict() for s in formats.load_index(dst, tables=True).shards]
    return raw


def make_v1(dst: Path, *, crcs: bool = False) -> None:
    """Turn a packed dataset into what an older fastload wrote: ``index.json`` v1 listing every sample (with
    per-sample CRC32Cs only if ``crcs``), no sample tables."""
    from dataclasses import replace

    index = formats.load_index(dst, tables=True)
    shards = [replace(s, table=None, format=None, crcs=s.crcs if crcs else []) for s in index.shards]
    tables = [s.table.name for s in formats.load_index(dst).shards if s.table is not None]
    manifest_path(dst).write_bytes(replace(index, shards=shards).to_json())
    for name in tables:
        (dst / name).unlink()
    assert read_manifest(dst)["version"] == 1


def shard_paths(dst: Path) -> list[Path]:
    """Shard files in index order."""
    return [dst / s["name"] for s in read_index(dst)["shards"]]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones included): relative path -> bytes."""
    out: dict[str, bytes] = {}
    for root, _dirs, files in os.walk(folder):
        for name in files:
            path = Path(root) / name
            out[path.relative_to(folder).as_posix()] = path.read_bytes()
    return out


def webdataset_samples(urls: list[Path]) -> list[dict[str, Any]]:
    """All samples of ``urls`` read by ``webdataset.WebDataset`` in order.

    webdataset leaves its tar streams for the garbage collector to close, which raises ResourceWarning (an
    error under this suite's settings); that is webdataset's business, so it is silenced here only.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        dataset = wds.WebDataset([os.fspath(u) for u in urls], shardshuffle=False)
        samples = list(dataset)
        del dataset
        gc.collect()
    return samples


def fields_of(sample: dict[str, Any]) -> dict[str, bytes]:
    """A WebDataset sample's data fields (without ``__key__``, ``__url__``, ...)."""
    return {k: v for k, v in sample.items() if not k.startswith("__")}


def tar_members(data: bytes) -> list[tuple[str, bytes]]:
    """``(name, bytes)`` of every member of an in-memory tar, read with Python's tarfile."""
    out = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
        for info in tf:
            assert info.isfile(), f"{info.name} is not a regular file"
            f = tf.extractfile(info)
            assert f is not None
            out.append((info.name, f.read()))
    return out


def expected_member_order(samples: dict[str, dict[str, bytes]], keys: list[str] | None = None) -> list[str]:
    """Member names in the order fastload writes them: samples by key (or ``keys``), fields sorted."""
    return [f"{k}.{f}" for k in (sorted(samples) if keys is None else keys) for f in sorted(samples[k])]
