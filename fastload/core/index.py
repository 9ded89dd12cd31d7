"""The dataset index (``index.json``): schema, serialisation and validation.

Version 2 (written by this fastload) lists shards only, so it grows with shards, not samples::

    {"format": "fastload-index", "version": 2,
     "shard_format": "tar" | "parquet" | "tfrecord" | another registered format, "checksum": "crc32c",
     "fields": [...], "totals": {"shards", "samples", "bytes", "payload_bytes"},
     "options": {...}, "skipped": [{"path", "reason"}],
     "versions": [{"version", "created", "shards", "samples", "bytes", "added", "fingerprint", "layout"}],
     "shards": [{"name", "format", "bytes", "samples", "checksum", "partition",
                 ...,                                                # the format's keys (tar: "fields")
                 "table": {"name", "bytes", "checksum", "content"}}]} # the shard's sample table (sidecar)

Core knows what every format's shards have; a shard format's own fields (tar's member layout, Parquet's
footer and stats) are kept here as stored (:attr:`ShardEntry.extra`, :attr:`ShardEntry.table_extra`) and
read by the format into :attr:`ShardEntry.payload` (:class:`ShardPayload`), which writes them back.
Each shard's per-sample columns (offsets, sizes, tar samples' CRC32C, sample groups, keys, and the format's)
live in its sample table (:mod:`fastload.core.table`), a sidecar the process reading the shard fetches with
one read. A manifest entry without them is *detached*; :func:`attach` makes the full entry the read path
uses. ``docs/INDEX-FORMAT.md``: both parts byte by byte, why each field is there, upgrading v1.

Version 1 (still read) listed every sample in the manifest::

     "shards": [{"name", "bytes", "samples", "checksum", "partition",
                 "keys": [...],
                 "offsets": [...], "sizes": [...],          # tar/tfrecord: sample i: [offsets[i], +sizes[i])
                 "row_groups": [[offset, size, rows], ...]  # parquet: one entry per row group
                 ...}]                                       # the format's keys (tar: "member_fields", ...)

``checksum`` is CRC32C (Castagnoli, as S3's ``x-amz-checksum-crc32c``) of the whole shard file, as 8 hex
digits. A tar sample's byte range covers its members' headers and padded data, so one ranged read of
``[offset, offset + size)`` returns a self-contained tar fragment holding exactly that sample. A TFRecord
sample is one whole record (header, payload, footer); in a gzip shard (``.gz``) its offsets count bytes of
the decompressed stream, while ``bytes`` and ``checksum`` are the stored (compressed) file's.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastload.core.payload import NO_EXTRA, V1_KEYS, V2_KEYS, ShardPayload, TableExtra
from fastload.core.table import SampleTable
from fastload.core.versions import Version, parse_versions
from fastload.errors import IndexFormatError

INDEX_NAME = "index.json"
# Where datasets of formats other tools read as a folder (Parquet) keep fastload's own files (index.json,
# sample tables): those tools (pandas, pyarrow.dataset, Spark, DuckDB globs) skip names starting with "_" or
# "." and fail on other files that are not Parquet (fastload.formats.sidecar_prefix decides, by format).
SIDECAR_DIR = "_fastload"
INDEX_NAMES = (INDEX_NAME, f"{SIDECAR_DIR}/{INDEX_NAME}")  # where readers look for the manifest, in order
FORMAT = "fastload-index"
VERSION = 2  # what this fastload writes
VERSIONS = (1, 2)  # what it reads
CHECKSUM_ALGORITHM = "crc32c"


@dataclass(frozen=True)
class TableRef:
    """Where a shard's sample table lives: a sidecar ``name`` (relative to the dataset folder), its size,
    the CRC32C of its whole file (``checksum``: for every intact table the CRC residue, kept for fastload
    before ``content`` existed) and ``content``, the CRC32C of its bytes before its trailing CRC
    (:func:`fastload.core.table.content_crc`), which tells this table from a stale one of the same size.
    ``content`` is None in indexes written before it was recorded (``fastload index --upgrade`` adds it)."""

    name: str
    bytes: int
    checksum: str
    content: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "bytes": self.bytes, "checksum": self.checksum}
        if self.content is not None:
            out["content"] = self.content
        return out


@dataclass
class ShardEntry:
    """What the index knows about one shard: always its name, size, checksum and sample count; the
    per-sample columns (``keys``, ``offsets``, ``sizes``, ``crcs``, ``row_groups``) only when attached (a v1
    manifest, an in-memory index, or :func:`attach` of its sample table). What only its format knows is
    the format's: ``payload`` once the format has read it (:meth:`fastload.formats.ShardFormat.read_payload`
    makes it from ``extra`` and ``table_extra``, as stored), or as a writer made it."""

    name: str
    bytes: int
    checksum: str
    keys: Sequence[str]
    offsets: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    # groups of samples stored together and read as one range (Parquet's row groups): (offset, size, rows)
    row_groups: list[tuple[int, int, int]] = field(default_factory=list)
    partition: str | None = None
    crcs: list[int] = field(default_factory=list)  # CRC32C of each sample's bytes (tar/TFRecord ranges)
    count: int | None = None  # the sample count of a detached entry (per-sample columns not loaded)
    table: TableRef | None = None  # where the sample table lives (index v2)
    format: str | None = None  # the shard's format, as the v2 manifest records it
    payload: ShardPayload | None = None  # the format's own per-shard data, read (or made by its writer)
    # the format's keys in this shard's index.json object, as read
    extra: Mapping[str, Any] = field(default_factory=lambda: NO_EXTRA)
    table_extra: TableExtra | None = None  # the format's part of the sample table, as read (attached)

    @property
    def samples(self) -> int:
        return self.count if self.count is not None else len(self.keys)

    @property
    def detached(self) -> bool:
        """Whether the per-sample columns are not loaded (a v2 manifest entry): :func:`attach` its table."""
        return self.count is not None

    def sample_table(self) -> SampleTable:
        """The per-sample columns of an attached entry, as a table (what :func:`detach` stores), with its
        format's header keys and columns (from its payload, else as read)."""
        if self.detached:
            raise ValueError(f"shard {self.name}: its sample table is not loaded")
        if self.payload is not None:
            header, columns = self.payload.table()
        elif self.table_extra is not None:
            header, columns = self.table_extra.header, self.table_extra.columns
        else:
            header, columns = {}, {}
        return SampleTable(
            samples=self.samples,
            keys=self.keys,
            offsets=list(self.offsets),
            sizes=list(self.sizes),
            crcs=list(self.crcs),
            row_groups=list(self.row_groups),
            header=header,
            columns=columns,
        )

    def format_fields(self, *, listed: bool) -> dict[str, Any]:
        """The format's keys of this shard's ``index.json`` object: its payload's, else as read."""
        if self.payload is not None:
            return self.payload.manifest(listed=listed)
        if listed:
            return {k: v for k, v in self.extra.items() if k not in V1_KEYS}
        return {k: v for k, v in self.extra.items() if k not in V2_KEYS}

    def manifest_dict(self) -> dict[str, Any]:
        """This shard's entry in a v2 ``index.json`` (needs :attr:`table`)."""
        if self.table is None:
            raise ValueError(f"shard {self.name}: no sample table recorded; write it first (detach)")
        return {
            "name": self.name,
            "format": self.format,
            "bytes": self.bytes,
            "samples": self.samples,
            "checksum": self.checksum,
            "partition": self.partition,
            **self.format_fields(listed=False),
            "table": self.table.to_dict(),
        }

    @classmethod
    def from_manifest(cls, raw: dict[str, Any]) -> ShardEntry:
        """A detached entry from a v2 ``index.json`` shard object (the format's keys kept as read)."""
        for field_name in ("bytes", "samples"):
            if type(raw[field_name]) is not int or raw[field_name] < 0:
                raise ValueError(f"shard {raw.get('name')!r}: {field_name!r} must be an integer >= 0")
        if raw.get("partition") is not None and not isinstance(raw["partition"], str):
            raise ValueError(f"shard {raw.get('name')!r}: 'partition' must be a string or null")
        table = raw["table"]
        if not isinstance(table, dict) or type(table.get("bytes")) is not int:
            raise ValueError(f"shard {raw.get('name')!r}: 'table' must be an object: name, bytes, checksum")
        extra = {k: v for k, v in raw.items() if k not in V2_KEYS}
        return cls(
            name=str(raw["name"]),
            bytes=int(raw["bytes"]),
            checksum=str(raw["checksum"]),
            keys=[],
            partition=raw.get("partition"),
            count=int(raw["samples"]),
            table=TableRef(
                str(table["name"]),
                int(table["bytes"]),
                str(table["checksum"]),
                None if table.get("content") is None else str(table["content"]),
            ),
            format=None if raw.get("format") is None else str(raw["format"]),
            extra=extra or NO_EXTRA,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "bytes": self.bytes,
            "samples": self.samples,
            "checksum": self.checksum,
            "partition": self.partition,
            "keys": list(self.keys),
        }
        if self.offsets or not self.row_groups:
            out["offsets"] = self.offsets
            out["sizes"] = self.sizes
        if self.row_groups:
            out["row_groups"] = [list(rg) for rg in self.row_groups]
        out.update(self.format_fields(listed=True))
        if self.crcs:
            out["crcs"] = self.crcs
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ShardEntry:
        """An attached entry from a v1 ``index.json`` shard object (the format's keys kept as read)."""
        if not isinstance(raw["keys"], list) or not all(isinstance(k, str) for k in raw["keys"]):
            raise ValueError(f"shard {raw.get('name')!r}: 'keys' must be a list of strings")
        for field_name in ("bytes", "samples"):
            if type(raw[field_name]) is not int:
                raise ValueError(f"shard {raw.get('name')!r}: {field_name!r} must be an integer")
        if raw.get("partition") is not None and not isinstance(raw["partition"], str):
            raise ValueError(f"shard {raw.get('name')!r}: 'partition' must be a string or null")
        extra = {k: v for k, v in raw.items() if k not in V1_KEYS}
        entry = cls(
            name=str(raw["name"]),
            bytes=int(raw["bytes"]),
            checksum=str(raw["checksum"]),
            keys=[str(k) for k in raw["keys"]],
            offsets=[int(x) for x in raw.get("offsets", [])],
            sizes=[int(x) for x in raw.get("sizes", [])],
            row_groups=[(int(a), int(b), int(c)) for a, b, c in raw.get("row_groups", [])],
            partition=raw.get("partition"),
            crcs=[int(x) for x in raw.get("crcs", [])],
            extra=extra or NO_EXTRA,
        )
        if entry.crcs and len(entry.crcs) != entry.samples:
            raise ValueError(f"shard {entry.name}: crcs do not have one entry per sample")
        if int(raw["samples"]) != entry.samples:
            raise ValueError(f"shard {entry.name}: 'samples' {raw['samples']} != {entry.samples} keys")
        if entry.offsets and not (len(entry.offsets) == len(entry.sizes) == entry.samples):
            raise ValueError(f"shard {entry.name}: offsets/sizes do not have one entry per sample")
        if entry.row_groups and sum(rg[2] for rg in entry.row_groups) != entry.samples:
            raise ValueError(f"shard {entry.name}: row group rows do not add up to the sample count")
        return entry


def attach(entry: ShardEntry, table: SampleTable, *, where: str) -> ShardEntry:
    """The full entry: ``entry`` (detached, from a v2 manifest) with its sample table's columns, and the
    table's format part kept for the format to read (:class:`TableExtra`); raises
    :class:`IndexFormatError` naming ``where`` when the table does not describe the shard."""
    if table.samples != entry.samples:
        raise IndexFormatError(
            f"{where}: the sample table has {table.samples} samples, index.json says {entry.samples} for "
            f"shard {entry.name}; re-run `fastload index --upgrade` (or re-pack)"
        )
    return ShardEntry(
        name=entry.name,
        bytes=entry.bytes,
        checksum=entry.checksum,
        keys=table.keys,
        offsets=table.offsets,
        sizes=table.sizes,
        row_groups=table.row_groups,
        partition=entry.partition,
        crcs=table.crcs,
        table=entry.table,
        format=entry.format,
        extra=entry.extra,
        table_extra=TableExtra(table.header, table.columns, table.arrays)
        if table.header or table.columns
        else None,
    )


def detach(entry: ShardEntry, table: TableRef, *, shard_format: str) -> ShardEntry:
    """The manifest-only (v2) form of an attached entry, once its table was written as ``table`` (the
    format's keys of the manifest kept, as its payload gives them)."""
    return ShardEntry(
        name=entry.name,
        bytes=entry.bytes,
        checksum=entry.checksum,
        keys=[],
        partition=entry.partition,
        count=entry.samples,
        table=table,
        format=shard_format,
        extra=entry.format_fields(listed=False) or NO_EXTRA,
    )


@dataclass
class DatasetIndex:
    """A packed dataset: its shards in order, the fields seen and what was left out."""

    shard_format: str
    fields: list[str]
    shards: list[ShardEntry]
    options: dict[str, Any] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)
    payload_bytes: int = 0
    versions: list[Version] = field(default_factory=list)  # empty: version 1 of every shard (core.versions)

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    @property
    def detached(self) -> bool:
        """Whether this is a v2 manifest (shards listed, sample tables in sidecars)."""
        return any(s.detached for s in self.shards)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: v2 when every shard is detached (has a table written), else v1 (every sample
        listed: in-memory indexes, and what older fastload reads)."""
        v2 = all(s.table is not None for s in self.shards)  # (no shards: nothing per sample either way)
        if not v2 and self.detached:
            raise ValueError("a manifest mixing detached and attached shards cannot be written")
        return {
            "format": FORMAT,
            "version": 2 if v2 else 1,
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
            **({"versions": [v.to_dict() for v in self.versions]} if self.versions else {}),
            "shards": [s.manifest_dict() if v2 else s.to_dict() for s in self.shards],
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
    version = raw.get("version")
    if type(version) is not int or version not in VERSIONS:
        raise IndexFormatError(
            f"{where} has index version {version!r}; this fastload reads versions "
            f"{', '.join(map(str, VERSIONS))}: upgrade fastload or re-pack the dataset"
        )
    if raw.get("checksum") != CHECKSUM_ALGORITHM:
        raise IndexFormatError(f"{where} uses checksum {raw.get('checksum')!r}, expected crc32c")
    totals = raw.get("totals", {})
    if not isinstance(totals, dict):
        raise IndexFormatError(f"{where} is malformed: 'totals' is not an object; re-run `fastload pack`")
    try:
        shards = raw["shards"]
        index = DatasetIndex(
            shard_format=str(raw["shard_format"]),
            fields=[str(f) for f in raw["fields"]],
            shards=[(ShardEntry.from_manifest if version == 2 else ShardEntry.from_dict)(s) for s in shards],
            options=dict(raw.get("options", {})),
            skipped=list(raw.get("skipped", [])),
            payload_bytes=int(totals.get("payload_bytes", 0)),
        )
        if "versions" in raw:
            index.versions = parse_versions(raw["versions"], shards=len(index.shards))
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise IndexFormatError(f"{where} is malformed: {exc!r}; re-run `fastload pack`") from None
    if not index.shard_format:
        raise IndexFormatError(f"{where}: shard_format is empty; re-run `fastload pack`")
    if version == 2:
        names = [s.table.name for s in index.shards if s.table is not None]
        if len(set(names)) != len(names):
            raise IndexFormatError(f"{where}: two shards share a sample table; re-run `fastload index`")
        return index
    for shard in index.shards:  # which table a format needs is its own check (fastload.formats.check_index)
        if shard.samples and len(shard.offsets) != shard.samples and not shard.row_groups:
            raise IndexFormatError(
                f"{where}: {index.shard_format} shard {shard.name} lacks per-sample offsets; re-run "
                "`fastload pack` (or `fastload index` for TFRecord files)"
            )
    return index
