"""index.json: round trip through JSON, validation of malformed input, and locating a sample's bytes."""

from __future__ import annotations

import contextlib
import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload.core.index import DatasetIndex, ShardEntry, parse_index
from fastload.errors import FastloadError, IndexFormatError

SETTINGS = settings(max_examples=120, deadline=None)
TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)
COUNT = st.integers(0, 2**40)
CHECKSUM = st.text(alphabet="0123456789abcdef", min_size=8, max_size=8)


@st.composite
def _tar_shard(draw: st.DrawFn) -> ShardEntry:
    keys = draw(st.lists(TEXT, max_size=6))
    n = len(keys)
    return ShardEntry(
        name=draw(TEXT),
        bytes=draw(COUNT),
        checksum=draw(CHECKSUM),
        keys=keys,
        offsets=draw(st.lists(COUNT, min_size=n, max_size=n)),
        sizes=draw(st.lists(COUNT, min_size=n, max_size=n)),
        partition=draw(st.none() | TEXT),
    )


@st.composite
def _parquet_shard(draw: st.DrawFn) -> ShardEntry:
    rows = draw(st.lists(st.integers(1, 4), max_size=4))
    groups = [(draw(COUNT), draw(COUNT), r) for r in rows]
    return ShardEntry(
        name=draw(TEXT),
        bytes=draw(COUNT),
        checksum=draw(CHECKSUM),
        keys=draw(st.lists(TEXT, min_size=sum(rows), max_size=sum(rows))),
        row_groups=groups,
        partition=draw(st.none() | TEXT),
    )


JSON_SCALARS = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | TEXT


@st.composite
def _indexes(draw: st.DrawFn) -> DatasetIndex:
    shard_format = draw(st.sampled_from(["tar", "parquet"]))
    shard = _tar_shard() if shard_format == "tar" else _parquet_shard()
    return DatasetIndex(
        shard_format=shard_format,
        fields=draw(st.lists(TEXT, max_size=4)),
        shards=draw(st.lists(shard, max_size=4)),
        options=draw(st.dictionaries(TEXT, JSON_SCALARS | st.lists(JSON_SCALARS, max_size=3), max_size=4)),
        skipped=draw(st.lists(st.fixed_dictionaries({"path": TEXT, "reason": TEXT}), max_size=3)),
        payload_bytes=draw(COUNT),
    )


def _valid() -> dict[str, Any]:
    index = DatasetIndex(
        shard_format="tar",
        fields=["cls", "jpg"],
        shards=[
            ShardEntry(
                "shard-000000.tar", 4096, "0a1b2c3d", ["a", "b", "c"], [0, 1024, 2048], [1024, 1024, 2048]
            ),
            ShardEntry("shard-000001.tar", 2048, "ffffffff", ["d"], [0], [1024]),
        ],
        payload_bytes=300,
    )
    return json.loads(index.to_json())


def _dump(raw: Any) -> bytes:
    return json.dumps(raw).encode()


# --- round trip ---------------------------------------------------------------------------------------


@SETTINGS
@given(_indexes())
def test_round_trip(index: DatasetIndex) -> None:
    data = index.to_json()
    parsed = parse_index(data)
    assert parsed == index
    assert parsed.to_json() == data  # stable bytes: re-serialising changes nothing


@SETTINGS
@given(_indexes())
def test_to_dict_layout(index: DatasetIndex) -> None:
    raw = json.loads(index.to_json())
    assert raw["format"] == "fastload-index"
    assert raw["version"] == (1 if index.shards else 2)  # attached shards: v1; none: v2 (nothing to list)
    assert raw["checksum"] == "crc32c"
    assert raw["shard_format"] == index.shard_format
    assert raw["totals"] == {
        "shards": len(index.shards),
        "samples": sum(len(s.keys) for s in index.shards),
        "bytes": sum(s.bytes for s in index.shards),
        "payload_bytes": index.payload_bytes,
    }
    for entry, shard in zip(raw["shards"], index.shards, strict=True):
        assert entry["samples"] == len(shard.keys)
        if index.shard_format == "tar":
            assert entry["offsets"] == shard.offsets and entry["sizes"] == shard.sizes
            assert "row_groups" not in entry
        elif shard.row_groups:
            assert entry["row_groups"] == [list(rg) for rg in shard.row_groups]
            assert "offsets" not in entry


def test_to_json_is_utf8_without_escapes() -> None:
    index = DatasetIndex("tar", ["jpg"], [ShardEntry("é/s.tar", 1, "00000000", ["日本"], [0], [1])])
    data = index.to_json()
    assert "日本".encode() in data and "é/s.tar".encode() in data
    assert parse_index(data).shards[0].keys == ["日本"]


# --- malformed input ----------------------------------------------------------------------------------


def _error(data: bytes, where: str = "s3://bucket/ds/index.json") -> str:
    with pytest.raises(IndexFormatError) as info:
        parse_index(data, where=where)
    assert isinstance(info.value, FastloadError) and isinstance(info.value, ValueError)
    message = str(info.value)
    assert where in message  # every message says which file
    return message


def test_not_json() -> None:
    assert "not valid JSON" in _error(b"{not json")
    assert "not valid JSON" in _error(b"")
    assert "not valid JSON" in _error(b'{"format": "\xff"}')  # not UTF-8


@pytest.mark.parametrize("raw", [[], "fastload-index", 1, None, {}, {"format": "webdataset"}])
def test_wrong_format_marker(raw: Any) -> None:
    assert "not a fastload index" in _error(_dump(raw))


@pytest.mark.parametrize("version", [0, 3, "1", None])
def test_wrong_version(version: Any) -> None:
    raw = _valid()
    raw["version"] = version
    message = _error(_dump(raw))
    assert f"version {version!r}" in message and "upgrade fastload or re-pack" in message


def test_wrong_checksum_algorithm() -> None:
    raw = _valid()
    raw["checksum"] = "md5"
    assert "'md5'" in _error(_dump(raw))


def test_samples_count_mismatch() -> None:
    raw = _valid()
    raw["shards"][1]["samples"] = 2
    message = _error(_dump(raw))
    assert "shard-000001.tar" in message and "samples" in message


@pytest.mark.parametrize(
    ("field", "value"),
    [("offsets", [0, 1024]), ("sizes", [1024, 1024]), ("offsets", [0, 1, 2, 3]), ("sizes", [1, 2, 3, 4])],
)
def test_offsets_or_sizes_length_mismatch(field: str, value: list[int]) -> None:
    raw = _valid()
    raw["shards"][0][field] = value
    message = _error(_dump(raw))
    assert "shard-000000.tar" in message and "offsets/sizes" in message


def test_tar_shard_without_offsets_is_rejected() -> None:
    """A tar index must give every sample its byte range (``fastload verify`` and ranged reads index
    ``offsets[i]``); a tar shard with samples but empty ``offsets``/``sizes`` is malformed."""
    raw = _valid()
    raw["shards"][0]["offsets"] = []
    raw["shards"][0]["sizes"] = []
    message = _error(_dump(raw))
    assert "shard-000000.tar" in message


def test_row_group_rows_mismatch() -> None:
    raw = _valid()
    raw["shard_format"] = "parquet"
    for shard in raw["shards"]:
        del shard["offsets"], shard["sizes"]
        shard["row_groups"] = [[4, 100, 1]]
    message = _error(_dump(raw))
    assert "row group" in message and "shard-000000.tar" in message


@pytest.mark.parametrize("missing", ["shard_format", "fields", "shards"])
def test_missing_top_level_key(missing: str) -> None:
    raw = _valid()
    del raw[missing]
    assert "malformed" in _error(_dump(raw))


@pytest.mark.parametrize("missing", ["name", "bytes", "checksum", "keys", "samples"])
def test_missing_shard_key(missing: str) -> None:
    raw = _valid()
    del raw["shards"][0][missing]
    assert "malformed" in _error(_dump(raw))


@pytest.mark.parametrize("totals", [[], None, "x", 5])
def test_malformed_totals(totals: Any) -> None:
    raw = _valid()
    raw["totals"] = totals
    _error(_dump(raw))


@pytest.mark.parametrize(
    "path",
    [
        ("totals", "payload_bytes"),
        ("shards", 0, "bytes"),
        ("shards", 0, "samples"),
        ("shards", 0, "offsets", 1),
    ],
)
def test_non_finite_numbers(path: tuple[Any, ...]) -> None:
    """Python's json reads ``Infinity`` and ``NaN``; where an integer is expected they are malformed input."""
    raw = _valid()
    target = raw
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = float("inf")
    assert b"Infinity" in _dump(raw)
    _error(_dump(raw))


def _paths(raw: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every location in a JSON value, as key/index paths."""
    out = [prefix]
    if isinstance(raw, dict):
        for k, v in raw.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(raw, list):
        for i, v in enumerate(raw):
            out += _paths(v, (*prefix, i))
    return out


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 2**70) | st.floats() | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=5,
)


@SETTINGS
@given(st.data(), JSON_VALUES)
def test_any_corruption_is_an_index_format_error(data: st.DataObject, value: Any) -> None:
    """Replace any part of a valid index with any JSON value: the parser accepts it or raises
    IndexFormatError, never another exception."""
    raw = _valid()
    path = data.draw(st.sampled_from(_paths(raw)[1:]))
    corrupt = copy.deepcopy(raw)
    target = corrupt
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    with contextlib.suppress(IndexFormatError):
        parse_index(_dump(corrupt))
