"""Per-shard sample tables: what index v2 keeps out of ``index.json``, in a compact binary, columnar form.

A table holds, for one shard, each sample's byte offset and size, the CRC32C of its bytes, its sample
groups (Parquet's row groups), the keys, and the shard format's own columns (tar's member layout, Parquet's
footer: core carries them, the format reads them); one table per shard, in a sidecar object next to the shard
(``<shard>.fltable``), fetched with one ranged read by the process that reads that shard and freed when the
shard is done. ``index.json`` v2 lists shards only (:mod:`fastload.core.index`), so the manifest grows with
shards, not samples.

Layout (little-endian; ``docs/INDEX-FORMAT.md`` says why each field is there)::

    b"FLST" | u32 version (1) | u32 header length H | H bytes of JSON header | columns ... | u32 CRC32C

The JSON header: ``{"samples": n, <the format's keys>, "columns": {name: [dtype, shape, at, nbytes]}}``
where ``at`` counts from the first byte after the header and each column starts 8-byte aligned. Core's
columns: ``offsets`` and ``sizes`` (u64, tar/TFRecord: sample i is ``[offsets[i], +sizes[i])``), ``crcs``
(u32, CRC32C of those bytes), ``row_groups`` (u64, g x 3: ``offset, size, rows`` of each group of samples
read as one range: Parquet's row groups), ``key_ends`` (u64) and ``key_blob`` (u8: the keys, UTF-8,
concatenated). Any other header key or column is the shard format's (:attr:`SampleTable.header`,
:attr:`SampleTable.columns`: tar's ``fields`` and ``member_sizes``, Parquet's ``footer``), written after
core's groups and before the keys, read back as numpy arrays and handed to the format unparsed. The trailing
CRC32C covers every byte before it (the ``crc`` argument computes it: this module does no I/O and imports no
CRC library).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np

from fastload.errors import IndexFormatError

MAGIC = b"FLST"
VERSION = 1
SUFFIX = ".fltable"  # the sidecar's name: the shard's name + SUFFIX

CORE_COLUMNS = frozenset({"offsets", "sizes", "crcs", "row_groups", "key_ends", "key_blob"})
CORE_HEADER = frozenset({"samples", "columns"})

_PREFIX = struct.Struct("<4sII")
_DTYPES: dict[str, np.dtype[Any]] = {"u8": np.dtype("<u8"), "u4": np.dtype("<u4"), "u1": np.dtype("u1")}


def content_crc(data: bytes) -> int:
    """A table's content checksum: its trailing u32, the CRC32C of every byte before it (what
    ``index.json`` records as the table's ``content``). The CRC32C of the whole table, trailing CRC included,
    is the same constant (the CRC residue) for every well-formed table, so it identifies nothing."""
    if len(data) < 4:
        return -1
    (value,) = struct.unpack_from("<I", data, len(data) - 4)
    return int(value)


def table_name(shard_name: str) -> str:
    """The sidecar name of a shard's sample table, relative to the dataset's folder."""
    return shard_name + SUFFIX


class Keys(Sequence[str]):
    """Sample keys decoded one at a time from the table's key blob (a shard's keys are read when asked for,
    not all materialised when the table loads). Compares equal to a list of the same keys."""

    __slots__ = ("_blob", "_ends")

    def __init__(self, blob: bytes, ends: list[int]) -> None:
        self._blob, self._ends = blob, ends

    def __len__(self) -> int:
        return len(self._ends)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            a, b, step = i.indices(len(self))
            if step != 1:
                return [self[j] for j in range(a, b, step)]
            return self._run(a, b)
        n = len(self._ends)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"key {i} of {n}")
        start = self._ends[i - 1] if i else 0
        return self._blob[start : self._ends[i]].decode("utf-8")

    def parts(self) -> tuple[bytes, list[int]]:
        """``(blob, ends)``: the keys' UTF-8 bytes concatenated and where each ends (what the C reader
        takes, making each key's ``str`` only when its sample is made)."""
        return self._blob, self._ends

    def _run(self, a: int, b: int) -> list[str]:
        """Keys ``a..b-1``: their bytes decoded at once (ASCII keys: cut by byte offsets)."""
        if b <= a:
            return []
        ends = self._ends
        base = ends[a - 1] if a else 0
        chunk = self._blob[base : ends[b - 1]]
        if not chunk.isascii():
            return [self[j] for j in range(a, b)]
        text = chunk.decode("ascii")
        cuts = [e - base for e in ends[a:b]]
        return [text[x:y] for x, y in zip([0, *cuts[:-1]], cuts, strict=True)]

    def take(self, positions: Iterable[int]) -> list[str]:
        """The keys at ``positions`` (each in ``range(len(self))``), decoded in one loop."""
        blob, ends = self._blob, self._ends
        return [blob[ends[i - 1] if i else 0 : ends[i]].decode("utf-8") for i in positions]

    def __iter__(self) -> Iterator[str]:
        blob, start = self._blob, 0
        for end in self._ends:
            yield blob[start:end].decode("utf-8")
            start = end

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Keys, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __hash__(self) -> int:  # pragma: no cover - unhashable like a list
        raise TypeError("unhashable type: 'Keys'")

    def __repr__(self) -> str:
        return f"Keys({len(self)} keys)"


@dataclass
class SampleTable:
    """One shard's per-sample columns (lists, ready for the read path's per-sample indexing), and the shard
    format's own header keys and columns, which core carries without reading them."""

    samples: int
    keys: Sequence[str]
    offsets: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    crcs: list[int] = field(default_factory=list)
    row_groups: list[tuple[int, int, int]] = field(default_factory=list)
    header: dict[str, Any] = field(default_factory=dict)  # the format's header keys (JSON values)
    columns: dict[str, np.ndarray] = field(default_factory=dict, repr=False)  # the format's columns
    # core's columns as decoded (numpy), for a format's whole-column checks without a Python loop per sample
    arrays: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)


def _column(name: str, values: Any, dtype: str) -> tuple[str, np.ndarray]:
    arr = np.asarray(values, dtype=_DTYPES[dtype])
    return name, arr


def encode_table(table: SampleTable, *, crc: Callable[[bytes], int]) -> bytes:
    """The binary form of ``table`` (see the module docstring); ``crc`` is CRC32C of a bytes object."""
    n = table.samples
    keys = [k.encode("utf-8") for k in table.keys]
    if len(keys) != n:
        raise ValueError(f"{len(keys)} keys for {n} samples")
    ends = np.cumsum([len(k) for k in keys], dtype=np.uint64) if keys else np.zeros(0, np.uint64)
    cols: list[tuple[str, np.ndarray]] = []
    for name, values, width in (
        ("offsets", table.offsets, n),
        ("sizes", table.sizes, n),
        ("crcs", table.crcs, n),
    ):
        if values:
            if len(values) != width:
                raise ValueError(f"{name} has {len(values)} entries for {n} samples")
            cols.append(_column(name, values, "u4" if name == "crcs" else "u8"))
    if table.row_groups:
        cols.append(_column("row_groups", [list(rg) for rg in table.row_groups], "u8"))
    for name, arr in table.columns.items():
        if name in CORE_COLUMNS or arr.dtype.itemsize not in (1, 4, 8) or arr.dtype.kind != "u":
            raise ValueError(f"format column {name!r}: a name core does not use, dtype u1, u4 or u8")
        cols.append((name, arr.astype(arr.dtype.newbyteorder("<"), copy=False)))
    cols.append(("key_ends", ends.astype("<u8")))
    cols.append(("key_blob", np.frombuffer(b"".join(keys), dtype=np.uint8)))
    if CORE_HEADER & table.header.keys():
        raise ValueError(f"format header keys {sorted(table.header)} use core's names {sorted(CORE_HEADER)}")
    meta: dict[str, Any] = {"samples": n, **table.header, "columns": {}}
    body = bytearray()
    for name, arr in cols:
        body.extend(b"\0" * (-len(body) % 8))
        kind = "u1" if arr.dtype.itemsize == 1 else ("u4" if arr.dtype.itemsize == 4 else "u8")
        meta["columns"][name] = [kind, list(arr.shape), len(body), arr.nbytes]
        body.extend(arr.tobytes())
    header = json.dumps(meta, separators=(",", ":")).encode("utf-8")
    out = bytearray(_PREFIX.pack(MAGIC, VERSION, len(header)))
    out.extend(header)
    out.extend(body)
    out.extend(struct.pack("<I", crc(bytes(out))))
    return bytes(out)


def decode_table(data: bytes, *, where: str, crc: Callable[[bytes], int] | None = None) -> SampleTable:
    """Parse a table written by :func:`encode_table`; :class:`IndexFormatError` naming ``where`` if it is
    not one, damaged (``crc``: check its trailing CRC32C) or inconsistent."""
    view = memoryview(data)

    def bad(why: str) -> IndexFormatError:
        why = f"not a valid fastload sample table ({why}); re-run `fastload index`"
        return IndexFormatError(f"{where}: {why}")

    if len(view) < _PREFIX.size + 4:
        raise bad(f"{len(view)} bytes")
    magic, version, hlen = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise bad("wrong magic")
    if version != VERSION:
        raise IndexFormatError(
            f"{where}: sample table version {version}; this fastload reads version {VERSION}: "
            "upgrade fastload"
        )
    if crc is not None:
        (want,) = struct.unpack_from("<I", view, len(view) - 4)
        if crc(bytes(view[:-4])) != want:
            raise bad("its CRC32C does not match: damaged in storage or in transit")
    start = _PREFIX.size + hlen
    try:
        meta = json.loads(bytes(view[_PREFIX.size : start]))
        n = int(meta["samples"])
        header = {k: v for k, v in meta.items() if k not in CORE_HEADER}
        arrays: dict[str, np.ndarray] = {}
        for name, (kind, shape, at, nbytes) in meta["columns"].items():
            a, b = start + int(at), start + int(at) + int(nbytes)
            if b > len(view) - 4:
                raise ValueError(f"column {name} runs past the end")
            arrays[name] = np.frombuffer(view[a:b], dtype=_DTYPES[kind]).reshape([int(s) for s in shape])
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as exc:
        raise bad(repr(exc)) from None
    for name in ("offsets", "sizes", "crcs", "key_ends"):
        if name in arrays and len(arrays[name]) != n:
            raise bad(f"column {name} has {len(arrays[name])} rows for {n} samples")
    if "key_ends" not in arrays or "key_blob" not in arrays:
        raise bad("no keys")
    key_ends = arrays["key_ends"]
    blob = arrays["key_blob"].tobytes()
    if len(key_ends) and (
        int(key_ends[-1]) != len(blob) or bool(np.any(np.diff(key_ends.astype(np.int64)) < 0))
    ):
        raise bad("key ends do not fit the key blob")
    table = SampleTable(
        samples=n,
        keys=Keys(blob, key_ends.tolist()),
        offsets=arrays["offsets"].tolist() if "offsets" in arrays else [],
        sizes=arrays["sizes"].tolist() if "sizes" in arrays else [],
        crcs=arrays["crcs"].tolist() if "crcs" in arrays else [],
        row_groups=[(a, b, c) for a, b, c in arrays["row_groups"].tolist()] if "row_groups" in arrays else [],
        header=header,
        columns={k: v for k, v in arrays.items() if k not in CORE_COLUMNS},
        arrays={k: v for k, v in arrays.items() if k == "sizes"},
    )
    if table.row_groups and sum(rg[2] for rg in table.row_groups) != n:
        raise bad("row group rows do not add up to the sample count")
    return table
