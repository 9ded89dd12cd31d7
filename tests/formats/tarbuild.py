"""Tar archives of every dialect, written by independent writers (Python's ``tarfile`` and the GNU tar
command), and what each reader sees in them: fastload's index, verify and ShardDataset (C and Python
readers, direct and prefetched reads), ``tarfile`` and ``webdataset``."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from crc32c import crc32c
from webdataset.tariterators import group_by_keys, tar_file_iterator

import fastload
from fastload import formats
from fastload.formats import native
from fastload.packing.indexing import build_index

# (name, data); data None: a directory entry
Members = Sequence[tuple[str, bytes | None]]
Samples = dict[str, dict[str, bytes]]

TARFILE_FORMATS = {"tarfile-ustar": tarfile.USTAR_FORMAT, "tarfile-gnu": tarfile.GNU_FORMAT}
TARFILE_FORMATS["tarfile-pax"] = tarfile.PAX_FORMAT
GNU_FORMATS = ["gnu", "oldgnu", "ustar", "pax", "v7"]
HAVE_GNU_TAR = (
    shutil.which("tar") is not None
    and b"GNU tar" in subprocess.run(["tar", "--version"], capture_output=True, check=False).stdout
)
DIALECTS = [*TARFILE_FORMATS, *(f"gnutar-{f}" for f in GNU_FORMATS)]
# the longest member name each dialect stores (v7: 99 bytes; ustar: 255 as prefix + name)
NAME_LIMIT = {"tarfile-ustar": 255, "gnutar-ustar": 255, "gnutar-v7": 99}


def fits(dialect: str, names: Sequence[str]) -> bool:
    """Whether every name can be stored in ``dialect`` (ustar: split at a ``/`` into <= 155 + <= 100)."""
    limit = NAME_LIMIT.get(dialect)
    if limit is None:
        return True
    for name in names:
        raw = name.encode()
        if len(raw) > limit:
            return False
        if limit == 255 and len(raw) > 100:
            folder, _, base = raw.rpartition(b"/")
            if len(base) > 100 or len(folder) > 155 or not folder:
                return False
    return True


def write_tar(path: Path, members: Members, dialect: str) -> None:
    """``members`` in this order as a tar file in ``dialect`` (a key of TARFILE_FORMATS or ``gnutar-X``)."""
    if dialect in TARFILE_FORMATS:
        with tarfile.open(path, "w", format=TARFILE_FORMATS[dialect], encoding="utf-8") as tf:
            for name, data in members:
                info = tarfile.TarInfo(name)
                if data is None:
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tf.addfile(info)
                else:
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
        return
    if not HAVE_GNU_TAR:
        pytest.skip("GNU tar is not installed")
    src = path.parent / (path.name + ".src")
    for name, data in members:
        target = src / name
        if data is None:
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    fmt = dialect.removeprefix("gnutar-")
    cmd = ["tar", f"--format={fmt}", "--no-recursion", "--owner=0", "--group=0", "--numeric-owner"]
    cmd += ["--mtime=@0", "-C", str(src), "-cf", str(path), "--", *[n for n, _ in members]]
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "LC_ALL": "C.UTF-8"})
    shutil.rmtree(src)


def samples_of(members: Members) -> Samples:
    """The samples (key -> field -> bytes) of members named ``KEY.FIELD``, directories left out."""
    out: Samples = {}
    for name, data in members:
        if data is not None:
            folder, _, base = name.rpartition("/")
            stem, _, field = base.partition(".")
            out.setdefault(f"{folder}/{stem}" if folder else stem, {})[field] = data
    return out


def tarfile_sees(path: Path) -> Samples:
    """The samples Python's tarfile reads (regular members, grouped by key as WebDataset does)."""
    members: list[tuple[str, bytes | None]] = []
    with tarfile.open(path, "r:") as tf:
        for info in tf:
            if info.isreg():
                f = tf.extractfile(info)
                assert f is not None
                members.append((info.name, f.read()))
    return samples_of(members)


def webdataset_sees(path: Path) -> Samples:
    with open(path, "rb") as f:
        return {
            s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")}
            for s in group_by_keys({**m, "__url__": str(path)} for m in tar_file_iterator(f))
        }


@contextmanager
def reader(kind: str) -> Iterator[None]:
    """``"C"`` or ``"Python"``: which reader local direct reads use meanwhile."""
    saved = native.layout_run
    if kind == "C" and saved is None:
        pytest.skip("fastload._native is not built here (no C compiler at install time)")
    if kind == "Python":
        native.layout_run = None
    try:
        yield
    finally:
        native.layout_run = saved


def index_dict(root: Path) -> dict[str, Any]:
    """``index.json`` with each shard's per-sample columns attached from its sample table (the v1 form)."""
    import json

    raw = json.loads((root / "index.json").read_bytes())
    raw["shards"] = [s.to_dict() for s in formats.load_index(root, tables=True).shards]
    return raw


def dataset_sees(
    root: Path | list[str], kind: str, *, into: list[Any] | None = None, **options: Any
) -> list[tuple[str, dict[str, bytes]]]:
    """What ShardDataset delivers, in order, with reader ``kind`` (also appended to ``into`` as they come,
    so that a caller sees what came before an error)."""
    target = root if isinstance(root, list) else str(root)
    out = [] if into is None else into
    with reader(kind), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "[^ ]*: no index.json, so", UserWarning)
        for s in fastload.ShardDataset(target, decode=False, **options):
            out.append((s["__key__"], {k: v for k, v in s.items() if not k.startswith("__")}))
    return out


READS = [
    ("C", {"prefetch_bytes": 0}),
    ("Python", {"prefetch_bytes": 0}),
    ("Python", {"prefetch_bytes": 1 << 20}),
]


def check_every_path(tar: Path, expected: Samples) -> None:
    """``tar`` alone in a folder: ``fastload index`` writes an index listing ``expected``'s keys,
    ``fastload verify`` passes it and lints the tar clean, and ShardDataset (from the index, C and Python
    readers, direct and prefetched, and from the tar's path alone) delivers ``expected`` in order."""
    report = build_index(str(tar.parent), workers=1, force=True)
    assert report.ok, report.summary()
    assert report.index is not None and report.index.detached  # index v2: sample tables beside the tars
    indexed = formats.load_index(tar.parent, tables=True)
    assert [k for s in indexed.shards for k in s.keys] == list(expected)
    data = tar.read_bytes()
    (shard,) = indexed.shards
    assert shard.crcs == [crc32c(data[o : o + n]) for o, n in zip(shard.offsets, shard.sizes, strict=True)]
    checked = fastload.verify(tar.parent, workers=1)
    assert checked.ok and checked.samples == len(expected), checked.summary()
    linted = fastload.verify(tar, workers=1)
    assert linted.ok and linted.samples == len(expected), linted.summary()
    want = list(expected.items())
    for kind, options in READS:
        assert dataset_sees(tar.parent, kind, **options) == want, (kind, options)
    assert dataset_sees([str(tar)], "C" if native.layout_run else "Python", prefetch_bytes=0) == want
