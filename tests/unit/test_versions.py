"""The versions of a growing dataset in ``index.json`` (``core.versions``): parsed and checked, a version read
as a prefix of the shard list, older indexes as version 1, appended shard names."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastload.core.index import DatasetIndex, ShardEntry, TableRef, parse_index
from fastload.core.versions import Version, appended_name, at_version, parse_versions, versions_of
from fastload.errors import ConfigError, IndexFormatError


def entry(i: int, samples: int = 2) -> ShardEntry:
    name = f"shard-{i:06d}.tar"
    return ShardEntry(
        name=name,
        bytes=1024 * (i + 1),
        checksum="00000000",
        keys=[],
        count=samples,
        table=TableRef(f"{name}.fltable", 100, "00000000"),
        format="tar",
    )


def grown(adds: list[int]) -> DatasetIndex:
    shards: list[ShardEntry] = []
    versions: list[Version] = []
    for n, added in enumerate(adds, 1):
        shards += [entry(len(shards) + k) for k in range(added)]
        versions.append(
            Version(
                version=n,
                created=f"2026-01-0{n}T00:00:00Z",
                shards=len(shards),
                samples=sum(s.samples for s in shards),
                bytes=sum(s.bytes for s in shards),
                added=added,
                fingerprint=f"{n:032x}",
            )
        )
    return DatasetIndex("tar", ["txt"], shards, {"layout": "L"}, [], 0, versions)


def test_versions_round_trip_and_a_version_is_a_prefix() -> None:
    index = grown([3, 2, 1])
    back = parse_index(index.to_json())
    assert back.versions == index.versions
    v2 = at_version(back, 2, where="x")
    assert [s.name for s in v2.shards] == [s.name for s in back.shards[:5]]
    assert versions_of(v2)[-1].version == 2 and len(v2.versions) == 2
    assert at_version(back, None, where="x") is back and at_version(back, 3, where="x") is back
    with pytest.raises(ConfigError, match=r"version\(s\) 1\.\.3"):
        at_version(back, 4, where="x")
    with pytest.raises(ConfigError):
        at_version(back, 0, where="x")


def test_an_index_without_versions_is_version_one_and_writes_none() -> None:
    index = DatasetIndex("tar", ["txt"], [entry(0), entry(1)], {"layout": "L"})
    assert "versions" not in json.loads(index.to_json())  # byte-identical to what it always wrote
    (v,) = versions_of(index)
    assert (v.version, v.shards, v.samples, v.added, v.created, v.layout) == (1, 2, 4, 2, None, "L")
    with pytest.raises(ConfigError):
        at_version(index, 2, where="x")


def test_an_older_reader_ignores_versions() -> None:
    """What the previous release's parser reads: it takes the keys it knows and ignores the rest."""
    raw = json.loads(grown([1, 1]).to_json())
    assert set(raw) - {"versions"} == {
        "format",
        "version",
        "shard_format",
        "checksum",
        "fields",
        "totals",
        "options",
        "skipped",
        "shards",
    }


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda v: v[1].update(version=3), "numbered 3"),
        (lambda v: v[1].update(added=5), "added"),
        (lambda v: v[1].update(shards=9), "added"),
        (lambda v: v.pop(), "last version has"),
        (lambda v: v[0].update(samples=-1), "samples must be"),
        (lambda v: v.append("x"), "must be an object"),
    ],
)
def test_a_malformed_versions_list_is_refused_naming_what(change, words) -> None:  # type: ignore[no-untyped-def]
    raw = json.loads(grown([2, 1]).to_json())
    change(raw["versions"])
    with pytest.raises(IndexFormatError, match=words):
        parse_index(json.dumps(raw).encode(), where="ds/index.json")


def test_appended_names() -> None:
    assert appended_name("shard-000002.tar", 7, "1a2b3c4d") == "shard-000007-1a2b3c4d.tar"
    assert (
        appended_name("day=3/my-prefix-000000.tfrecord.gz", 12, "ab")
        == "day=3/my-prefix-000012-ab.tfrecord.gz"
    )
    assert appended_name("shard-000000.parquet", 1_234_567, "t") == "shard-1234567-t.parquet"
    assert appended_name("odd.tar", 3, "t") == "odd-000003-t.tar"


@given(st.lists(st.integers(min_value=0, max_value=4), min_size=1, max_size=6))
def test_parse_accepts_every_grown_index(adds: list[int]) -> None:
    index = grown(adds)
    assert parse_versions([v.to_dict() for v in index.versions], shards=len(index.shards)) == index.versions
    for v in index.versions:
        assert len(at_version(index, v.version, where="x").shards) == v.shards
