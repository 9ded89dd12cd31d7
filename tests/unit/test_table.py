"""Sample tables (``core.table``): keys decoded by the slice as one at a time, and damage the decoder's
whole-column checks must still catch."""

from __future__ import annotations

import json
import struct

import crc32c
import numpy as np
import pytest

from fastload.core.table import SampleTable, decode_table, encode_table
from fastload.errors import IndexFormatError

KEYS = ["a/0", "a/1", "b/10", "b/11", "c", "dd/ee/ff"]


def _table(keys: list[str]) -> SampleTable:
    n = len(keys)
    return SampleTable(
        samples=n,
        keys=keys,
        offsets=[1024 * i for i in range(n)],
        sizes=[1024] * n,
        crcs=list(range(n)),
        member_fields=["cls", "jpg"],
        member_sizes=[[1, 300 + i] for i in range(n)],
    )


@pytest.mark.parametrize("keys", [KEYS, ["é/0", "a/1", "ü/ü", "x"], []], ids=["ascii", "utf-8", "none"])
def test_key_slices_are_the_keys_one_by_one(keys: list[str]) -> None:
    got = decode_table(encode_table(_table(keys), crc=crc32c.crc32c), where="t")
    assert list(got.keys) == keys
    n = len(keys)
    for a in range(-1, n + 2):
        for b in range(-1, n + 2):
            assert got.keys[a:b] == keys[a:b]
    assert got.keys[::2] == keys[::2]
    assert got.member_sizes == [(1, 300 + i) for i in range(n)]  # rows as tuples


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
    with pytest.raises(IndexFormatError, match="member_sizes rows do not match fields"):
        decode_table(wider, where="t")
