"""Sample tables (``core.table``): keys decoded by the slice as one at a time, and damage the decoder's
whole-column checks must still catch."""

from __future__ import annotations

import json
import struct

import crc32c
import numpy as np
import pytest

from fastload import formats
from fastload.core.index import ShardEntry, attach
from fastload.core.table import SampleTable, decode_table, encode_table
from fastload.errors import IndexFormatError
from fastload.formats.tar.layout import TarLayout, layout_of

KEYS = ["a/0", "a/1", "b/10", "b/11", "c", "dd/ee/ff"]


def _table(keys: list[str]) -> SampleTable:
    n = len(keys)
    return SampleTable(
        samples=n,
        keys=keys,
        offsets=[2048 * i for i in range(n)],
        sizes=[2048] * n,  # (each sample: two members of one header and one block of data)
        crcs=list(range(n)),
        header={"fields": ["cls", "jpg"]} if n else {},  # (tar writes a layout for samples only)
        columns={"member_sizes": np.asarray([[1, 300 + i] for i in range(n)], "<u8")} if n else {},
    )


def _layout(table: SampleTable, *, fields: list[str]) -> TarLayout | None:
    """The tar format's reading of ``table`` attached to a manifest entry listing ``fields``."""
    entry = ShardEntry("s.tar", 0, "0", [], count=table.samples, extra={"fields": fields})
    full = formats.read_payload(formats.by_name("tar"), attach(entry, table, where="t"), where="t")
    return layout_of(full)


@pytest.mark.parametrize("keys", [KEYS, ["é/0", "a/1", "ü/ü", "x"], []], ids=["ascii", "utf-8", "none"])
def test_key_slices_are_the_keys_one_by_one(keys: list[str]) -> None:
    got = decode_table(encode_table(_table(keys), crc=crc32c.crc32c), where="t")
    assert list(got.keys) == keys
    n = len(keys)
    for a in range(-1, n + 2):
        for b in range(-1, n + 2):
            assert got.keys[a:b] == keys[a:b]
    assert got.keys[::2] == keys[::2]
    layout = _layout(got, fields=["cls", "jpg"] if n else [])  # the format's part: core carries, tar reads
    assert layout is None if not n else layout.fields == ["cls", "jpg"]
    assert n == 0 or (layout is not None and layout.sizes == [(1, 300 + i) for i in range(n)])  # as tuples


def _patched(data: bytes, column: str, values: np.ndarray) -> bytes:
    """``data`` with the bytes of ``column`` replaced by ``values`` (same size; trailing CRC not redone)."""
    (hlen,) = struct.unpack_from("<I", data, 8)
    start = 12 + hlen
    _, _, at, nbytes = json.loads(data[12:start])["columns"][column]
    raw = values.tobytes()
    assert len(raw) == nbytes
    return data[: start + at] + raw + data[start + at + nbytes :]


def test_damage_the_column_checks_catch() -> None:
    data = encode_table(_table(KEYS), crc=crc32c.crc32c)
    ends = np.cumsum([len(k) for k in KEYS]).astype("<u8")
    backwards = ends.copy()
    backwards[1], backwards[2] = backwards[2], backwards[1]
    with pytest.raises(IndexFormatError, match="key ends do not fit"):
        decode_table(_patched(data, "key_ends", backwards), where="t")
    short = ends.copy()
    short[-1] -= 1
    with pytest.raises(IndexFormatError, match="key ends do not fit"):
        decode_table(_patched(data, "key_ends", short), where="t")
    (hlen,) = struct.unpack_from("<I", data, 8)
    meta = json.loads(data[12 : 12 + hlen])
    meta["fields"] = ["cls", "jpg", "txt"]  # rows of 2 sizes for 3 fields
    header = json.dumps(meta, separators=(",", ":")).encode()
    wider = data[:8] + struct.pack("<I", len(header)) + header + data[12 + hlen :]
    table = decode_table(wider, where="t")  # (core does not read the format's columns: tar does)
    with pytest.raises(IndexFormatError, match="member_sizes rows do not match fields"):
        _layout(table, fields=["cls", "jpg", "txt"])
    with pytest.raises(IndexFormatError, match=r"fields .* differ from index.json's"):
        _layout(decode_table(data, where="t"), fields=["cls"])
