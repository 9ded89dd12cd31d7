"""The dataset index (``index.json``): schema, serialisation and validation.

Layout (format version 1)::

    {"format": "fastload-index", "version": 1,
     "shard_format": "tar" | "parquet" | "tfrecord" | another registered format, "checksum": "crc32c",
     "fields": [...], "totals": {"shards", "samples", "bytes", "payload_bytes"},
     "options": {...}, "skipped": [{"path", "reason"}],
     "shards": [{"name", "bytes", "samples", "checksum", "partition",
                 "keys": [...],
                 "offsets": [...], "sizes": [...],          # tar/tfrecord: sample i: [offsets[i], +sizes[i])
                 "row_groups": [[offset, size, rows], ...]  # parquet: one entry per row group
                }]}

``checksum`` is CRC32C (Castagnoli, as S3's ``x-amz-checksum-crc32c``) of the whole shard file, as 8 hex
digits. A tar sample's byte range covers its members' headers and padded data, so one ranged read of
``[offset, offset + size)`` returns a self-contained tar fragment holding exactly that sample. A TFRecord
sample is one whole record (header, payload, footer); in a gzip shard (``.gz``) its offsets count bytes of
the decompressed stream, while ``bytes`` and ``checksum`` are the stored (compressed) file's.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fastload.errors import IndexFormatError

INDEX_NAME = "index.json"
FORMAT = "fastload-index"
VERSION = 1
CHECKSUM_ALGORITHM = "crc32c"


@dataclass
class ShardEntry:
    """What the index knows about one shard."""

    name: str
    bytes: int
    checksum: str
    keys: list[str]
    offsets: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    row_groups: list[tuple[int, int, int]] = field(default_factory=list)
    partition: str | None = None
    member_fields: list[str] = field(default_factory=list)
    member_sizes: list[list[int]] = field(default_factory=list)

    @property
    def samples(self) -> int:
        return len(self.keys)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "bytes": self.bytes,
            "samples": self.samples,
            "checksum": self.checksum,
            "partition": self.partition,
            "keys": self.keys,
        }
        if self.offsets or not self.row_groups:
            out["offsets"] = self.offsets
            out["sizes"] = self.sizes
        if self.row_groups:
            out["row_groups"] = [list(rg) for rg in self.row_groups]
        if self.member_fields:
            out["member_fields"] = self.member_fields
            out["member_sizes"] = self.member_sizes
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ShardEntry:
        if not isinstance(raw["keys"], list) or not all(isinstance(k, str) for k in raw["keys"]):
            raise ValueError(f"shard {raw.get('name')!r}: 'keys' must be a list of strings")
        for field_name in ("bytes", "samples"):
            if type(raw[field_name]) is not int:
                raise ValueError(f"shard {raw.get('name')!r}: {field_name!r} must be an integer")
        if raw.get("partition") is not None and not isinstance(raw["partition"], str):
            raise ValueError(f"shard {raw.get('name')!r}: 'partition' must be a string or null")
        entry = cls(
            name=str(raw["name"]),
            bytes=int(raw["bytes"]),
            checksum=str(raw["checksum"]),
            keys=[str(k) for k in raw["keys"]],
            offsets=[int(x) for x in raw.get("offsets", [])],
            sizes=[int(x) for x in raw.get("sizes", [])],
            row_groups=[(int(a), int(b), int(c)) for a, b, c in raw.get("row_groups", [])],
            partition=raw.get("partition"),
            member_fields=[str(f) for f in raw.get("member_fields", [])],
            member_sizes=[[int(x) for x in m] for m in raw.get("member_sizes", [])],
        )
        if int(raw["samples"]) != entry.samples:
            raise ValueError(f"shard {entry.name}: 'samples' {raw['samples']} != {entry.samples} keys")
        if entry.offsets and not (len(entry.offsets) == len(entry.sizes) == entry.samples):
            raise ValueError(f"shard {entry.name}: offsets/sizes do not have one entry per sample")
        if entry.row_groups and sum(rg[2] for rg in entry.row_groups) != entry.samples:
            raise ValueError(f"shard {entry.name}: row group rows do not add up to the sample count")
        if entry.member_fields or entry.member_sizes:
            problem = layout_problem(entry)
            if problem:
                raise ValueError(f"shard {entry.name}: member layout: {problem}")
        return entry


_TAR_BLOCK = 512  # the manifest checks its own tar layout fields; fastload.formats.tar owns the format


def plain_member_bytes(size: int) -> int:
    """Bytes a member of ``size`` data bytes takes in a tar shard with one plain 512-byte header."""
    return _TAR_BLOCK + -(-size // _TAR_BLOCK) * _TAR_BLOCK


def layout_problem(entry: ShardEntry) -> str | None:
    """Why ``entry``'s member layout cannot describe its tar shard, or None when it is consistent.

    The layout (``member_fields``: the fields every sample has, in member order; ``member_sizes``: each
    sample's data sizes in that order) is written only for shards whose members all carry one plain
    512-byte ustar header, so each sample's byte size must be the sum of its members' header + padded data.
    Readers use it to read members' bytes without parsing every header.
    """
    if not entry.member_fields:
        return "member_sizes without member_fields"
    if len(set(entry.member_fields)) != len(entry.member_fields):
        return "member_fields has duplicates"
    if not entry.offsets or len(entry.member_sizes) != entry.samples:
        return "needs offsets and one member_sizes row per sample"
    width = len(entry.member_fields)
    for i, (row, size) in enumerate(zip(entry.member_sizes, entry.sizes, strict=True)):
        if len(row) != width or sum(plain_member_bytes(s) for s in row) != size or min(row) < 0:
            return f"row {i} ({row}) does not add up to the sample's {size} bytes"
    return None


def set_layout(entry: ShardEntry, layouts: Sequence[tuple[Sequence[str], list[int]] | None]) -> None:
    """Record a tar shard's member layout in ``entry`` from each sample's ``(fields, data sizes)`` (None
    for a sample with a member that is not one plain 512-byte header + data), when every sample has the
    same fields in the same order and the layout adds up (:func:`layout_problem`); otherwise leave none."""
    entry.member_fields, entry.member_sizes = [], []
    if not layouts or len(layouts) != entry.samples:
        return
    first = layouts[0]
    if first is None or not first[0]:
        return
    fields = list(first[0])
    rows: list[list[int]] = []
    for lay in layouts:
        if lay is None or list(lay[0]) != fields:
            return
        rows.append(lay[1])
    entry.member_fields, entry.member_sizes = fields, rows
    if layout_problem(entry) is not None:
        entry.member_fields, entry.member_sizes = [], []


@dataclass
class DatasetIndex:
    """A packed dataset: its shards in order, the fields seen and what was left out."""

    shard_format: str
    fields: list[str]
    shards: list[ShardEntry]
    options: dict[str, Any] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)
    payload_bytes: int = 0

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "shard_format": self.shard_format,
            "checksum": CHECKSUM_ALGORITHM,
            "fields": self.fields,
            "totals": {
                "shards": len(self.shards),
                "samples": self.samples,
                "bytes": self.bytes,
                "payload_bytes": self.payload_bytes,
            },
            "options": self.options,
            "skipped": self.skipped,
            "shards": [s.to_dict() for s in self.shards],
        }

    def to_json(self) -> builtins.bytes:
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def parse_index(data: bytes, *, where: str = INDEX_NAME) -> DatasetIndex:
    """Parse and validate ``index.json`` bytes; raise :class:`IndexFormatError` naming ``where``."""
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise IndexFormatError(f"{where} is not valid JSON ({exc}); re-run `fastload pack`") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise IndexFormatError(f'{where} is not a fastload index (no "format": "{FORMAT}")')
    if type(raw.get("version")) is not int or raw.get("version") != VERSION:
        raise IndexFormatError(
            f"{where} has index version {raw.get('version')!r}; this fastload reads version {VERSION}: "
            "upgrade fastload or re-pack the dataset"
        )
    if raw.get("checksum") != CHECKSUM_ALGORITHM:
        raise IndexFormatError(f"{where} uses checksum {raw.get('checksum')!r}, expected crc32c")
    totals = raw.get("totals", {})
    if not isinstance(totals, dict):
        raise IndexFormatError(f"{where} is malformed: 'totals' is not an object; re-run `fastload pack`")
    try:
        index = DatasetIndex(
            shard_format=str(raw["shard_format"]),
            fields=[str(f) for f in raw["fields"]],
            shards=[ShardEntry.from_dict(s) for s in raw["shards"]],
            options=dict(raw.get("options", {})),
            skipped=list(raw.get("skipped", [])),
            payload_bytes=int(totals.get("payload_bytes", 0)),
        )
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise IndexFormatError(f"{where} is malformed: {exc!r}; re-run `fastload pack`") from None
    if not index.shard_format:
        raise IndexFormatError(f"{where}: shard_format is empty; re-run `fastload pack`")
    for shard in index.shards:  # which table a format needs is its own check (fastload.formats.check_index)
        if shard.samples and len(shard.offsets) != shard.samples and not shard.row_groups:
            raise IndexFormatError(
                f"{where}: {index.shard_format} shard {shard.name} lacks per-sample offsets; re-run "
                "`fastload pack` (or `fastload index` for TFRecord files)"
            )
    return index
