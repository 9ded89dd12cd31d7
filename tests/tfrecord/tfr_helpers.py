"""Helpers for the TFRecord tests: foreign files written by an independent writer (the ``tfrecord`` PyPI
package), a reference reader that checks both CRCs with that package's own masked CRC, and decoding with
the official protobuf ``Example`` class.

This folder has no ``__init__.py`` on purpose: a package named ``tfrecord`` here would shadow the
``tfrecord`` PyPI package the tests compare against.
"""

from __future__ import annotations

import gzip
import json
import random
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from dataset.helpers import Packed
from tfrecord import example_pb2
from tfrecord.writer import TFRecordWriter

from fastload import formats


def index_dict(root: Path) -> dict[str, Any]:
    """``index.json`` with each shard's per-sample columns (keys, offsets, sizes, ...) attached from its
    sample table, each shard in the v1 form."""
    raw = json.loads((root / "index.json").read_bytes())
    raw["shards"] = [s.to_dict() for s in formats.load_index(root, tables=True).shards]
    return raw


def write_index_dict(root: Path, index: dict[str, Any]) -> None:
    """Write ``index`` (the form :func:`index_dict` gives, perhaps edited) as index v2: sample tables, then
    ``index.json``."""
    from fastload.core.index import parse_index
    from fastload.packing.upgrade import write_v2

    parsed = parse_index(json.dumps({**index, "version": 1}).encode())
    write_v2(str(root), parsed, parsed.shards)


def reference_records(data: bytes) -> list[bytes]:
    """Payloads of a TFRecord file, read the way TensorFlow's record reader does: length, masked CRC of the
    length, payload, masked CRC of the payload, both CRCs checked (with the ``tfrecord`` package's mask)."""
    out = []
    pos = 0
    while pos < len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        assert data[pos + 8 : pos + 12] == TFRecordWriter.masked_crc(data[pos : pos + 8]), (
            f"length CRC at {pos}"
        )
        payload = data[pos + 12 : pos + 12 + length]
        assert len(payload) == length, f"record at {pos} is truncated"
        assert data[pos + 12 + length : pos + 16 + length] == TFRecordWriter.masked_crc(payload), (
            f"payload CRC at {pos}"
        )
        out.append(payload)
        pos += 16 + length
    return out


def protobuf_features(payload: bytes) -> dict[str, Any]:
    """An Example decoded by the official protobuf runtime: ``{name: list of values}``."""
    example = example_pb2.Example.FromString(payload)
    out: dict[str, Any] = {}
    for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        out[name] = [] if kind is None else list(getattr(feature, kind).value)
    return out


@dataclass(frozen=True)
class Foreign:
    """A folder of TFRecord files written by the ``tfrecord`` package, and what each record holds."""

    root: Path
    files: dict[str, int]  # relative name -> records
    expected: dict[str, dict[str, Any]]  # key -> field -> value as ShardDataset should give it (decode=False)

    def packed(self) -> Packed:
        """As a :class:`Packed` (after ``fastload index``), for the dataset contract tests."""
        return Packed(self.root, {}, index_dict(self.root))


def write_foreign(root: Path, layout: dict[str, tuple[int, bool]], *, seed: int = 0) -> Foreign:
    """Write TFRecord files ``name -> (records, with __key__)`` under ``root`` with the ``tfrecord``
    package's writer; names ending in ``.gz`` are gzip-compressed afterwards."""
    rng = random.Random(seed)
    expected: dict[str, dict[str, Any]] = {}
    files: dict[str, int] = {}
    for name, (records, with_key) in layout.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        plain = path.with_name(path.name[: -len(".gz")]) if name.endswith(".gz") else path
        writer = TFRecordWriter(str(plain))
        stem = name.split(".tfrec")[0]
        for i in range(records):
            key = f"{stem}-key-{i}" if with_key else f"{stem}/{i:06d}"
            image = rng.randbytes(rng.randrange(0, 5000))
            label = rng.randrange(-(2**40), 2**40)
            emb = [rng.uniform(-1, 1) for _ in range(3)]
            datum: dict[str, Any] = {
                "image": (image, "byte"),
                "label": (label, "int"),
                "emb": (emb, "float"),
                "tags": ([b"a", b"bc"], "byte"),
            }
            if with_key:
                datum["__key__"] = (key.encode(), "byte")
            writer.write(datum)
            expected[key] = {
                "image": image,
                "label": np.array([label], dtype=np.int64),
                "emb": np.array(emb, dtype=np.float32),
                "tags": [b"a", b"bc"],
            }
        writer.close()
        if plain != path:
            path.write_bytes(gzip.compress(plain.read_bytes(), mtime=0))
            plain.unlink()
        files[name] = records
    return Foreign(root, files, expected)


def same_value(got: Any, want: Any) -> bool:
    if isinstance(want, np.ndarray):
        return isinstance(got, np.ndarray) and got.dtype == want.dtype and np.array_equal(got, want)
    return type(got) is type(want) and got == want


def check_sample(sample: dict[str, Any], expected: dict[str, dict[str, Any]]) -> None:
    want = expected[sample["__key__"]]
    fields = {k: v for k, v in sample.items() if not k.startswith("__")}
    assert set(fields) == set(want), sample["__key__"]
    for name, value in want.items():
        assert same_value(fields[name], value), (sample["__key__"], name, fields[name], value)
