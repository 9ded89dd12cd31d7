"""Helpers for the ShardDataset/DataLoader tests: packed datasets described by their source bytes, loaders
with real worker processes, and the keys they deliver."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastload
from fastload import formats
from fastload.core.sharding import rank_order

# A bound on every wait for a batch from a worker: a hang fails the test instead of the suite.
WORKER_TIMEOUT_S = 60
SUBPROCESS_TIMEOUT_S = 120


@dataclass(frozen=True)
class Packed:
    """A packed dataset and the bytes it was packed from."""

    root: Path
    samples: dict[str, dict[str, bytes]]  # key -> field -> source bytes
    index: dict[str, Any]  # index.json as v1 (every sample listed; from the sample tables of a v2 index)

    @property
    def keys(self) -> list[str]:
        """Every key, in index order (shard by shard)."""
        return [k for s in self.index["shards"] for k in s["keys"]]

    @property
    def counts(self) -> list[int]:
        return [s["samples"] for s in self.index["shards"]]

    def where(self, key: str) -> tuple[str, int]:
        """``(shard name, position in shard)`` of ``key`` according to index.json."""
        for shard in self.index["shards"]:
            if key in shard["keys"]:
                return shard["name"], shard["keys"].index(key)
        raise KeyError(key)

    def rank_keys(self, **kwargs: Any) -> list[str]:
        """The canonical order of one rank (``core.sharding``), as keys."""
        shards = self.index["shards"]
        plan = rank_order(self.counts, **kwargs)
        return [shards[s]["keys"][i] for s, i in plan.samples]


def write_files(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def samples_of(files: dict[str, bytes]) -> dict[str, dict[str, bytes]]:
    out: dict[str, dict[str, bytes]] = {}
    for rel, data in files.items():
        folder, _, base = rel.rpartition("/")
        stem, _, field = base.partition(".")
        out.setdefault(f"{folder}/{stem}" if folder else stem, {})[field] = data
    return out


def pack_files(base: Path, files: dict[str, bytes], **options: Any) -> Packed:
    """Write ``files`` under ``base/src`` and pack them into ``base/ds``."""
    write_files(base / "src", files)
    fastload.pack(base / "src", base / "ds", progress=False, **options)
    return Packed(base / "ds", samples_of(files), attached_index(base / "ds"))


def attached_index(root: Path) -> dict[str, Any]:
    """The dataset's ``index.json`` in v1 form, every shard's per-sample columns listed: as written (v1),
    or the v2 manifest with each shard's sample table attached. Written back to ``index.json`` (e.g. after
    a test changes it), it is a v1 index that readers still take."""
    inside = root / "_fastload" / "index.json"  # (Parquet datasets keep it there)
    raw: dict[str, Any] = json.loads((inside if inside.exists() else root / "index.json").read_bytes())
    if raw.get("version", 1) == 1:
        return raw
    index = formats.load_index(str(root))
    full = [formats.full_entry(str(root), e, shard_format=index.shard_format) for e in index.shards]
    shards = json.loads(json.dumps([e.to_dict() for e in full]))  # (as JSON has them: rows as lists)
    return {**raw, "version": 1, "shards": shards}


# Seven groups of samples of one size each. With 256 KiB shards and at most 40 samples a shard, each group
# becomes one shard: 40 tiny samples, one sample larger than a shard, then 7, 3, 13, 9 and 22 samples.
UNEVEN_GROUPS = [(40, 100), (1, 300_000), (7, 30_000), (3, 78_000), (13, 14_500), (9, 24_000), (22, 7_500)]
UNEVEN_SHARD_COUNTS = [n for n, _ in UNEVEN_GROUPS]
UNEVEN_OPTIONS = {"shard_size_bytes": 256 << 10, "max_samples": 40}


def uneven_files(seed: int = 11) -> dict[str, bytes]:
    """Samples with ``cls``, ``txt``, ``json`` and ``bin`` fields in uneven groups (see UNEVEN_GROUPS)."""
    rng = random.Random(seed)
    files: dict[str, bytes] = {}
    i = 0
    for group, (n, size) in enumerate(UNEVEN_GROUPS):
        for _ in range(n):
            key = f"part{group}/{i:05d}"
            files[f"{key}.cls"] = b"%d" % (i % 10)
            files[f"{key}.txt"] = f"sample {i} ü".encode()
            files[f"{key}.json"] = json.dumps({"i": i, "group": group}).encode()
            files[f"{key}.bin"] = rng.randbytes(size + rng.randrange(0, 200))
            i += 1
    return files


def small_files(n: int = 30, seed: int = 5) -> dict[str, bytes]:
    """``n`` small samples with ``cls``, ``txt`` and ``bin`` fields."""
    rng = random.Random(seed)
    files: dict[str, bytes] = {}
    for i in range(n):
        key = f"s/{i:04d}"
        files[f"{key}.cls"] = b"%d" % (i % 3)
        files[f"{key}.txt"] = f"text {i}".encode()
        files[f"{key}.bin"] = rng.randbytes(rng.randrange(1, 2000))
    return files


def make_loader(
    packed: Packed | str,
    *,
    batch_size: int,
    num_workers: int = 0,
    loader: dict[str, Any] | None = None,
    **kw: Any,
) -> tuple[Any, Any]:
    """A fresh ``ShardDataset`` and ``fastload.DataLoader`` over it."""
    source = packed.root if isinstance(packed, Packed) else packed
    ds = fastload.ShardDataset(source, **kw)
    options = dict(loader or {})
    if num_workers:
        options.setdefault("timeout", WORKER_TIMEOUT_S)
    dl = fastload.DataLoader(ds, batch_size=batch_size, num_workers=num_workers, **options)
    return ds, dl


def batch_keys(batches: Iterable[Any]) -> list[list[str]]:
    """The keys of each batch (default collation gives a dict with a ``__key__`` list; ``collate_fn=list``
    a list of sample dicts)."""
    out = []
    for b in batches:
        out.append(list(b["__key__"]) if isinstance(b, dict) else [s["__key__"] for s in b])
    return out


def flat(batches: Iterable[list[str]]) -> list[str]:
    return [k for b in batches for k in b]


def keys_of(batches: Iterable[Any]) -> list[str]:
    return flat(batch_keys(batches))


def take(iterator: Iterator[Any], n: int) -> list[Any]:
    """Exactly ``n`` items of ``iterator`` (no more are requested from it)."""
    out = []
    for _ in range(n):
        out.append(next(iterator))
    return out


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONWARNINGS", "COVERAGE"))}
    env.update({"PYTHONIOENCODING": "utf-8", "OMP_NUM_THREADS": "1"})
    env.update(extra)
    return env


def run_python(script: Path, *args: str | os.PathLike[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, os.fspath(script), *(os.fspath(a) for a in args)],
        capture_output=True,
        text=True,
        env=child_env(**env),
        timeout=SUBPROCESS_TIMEOUT_S,
    )
