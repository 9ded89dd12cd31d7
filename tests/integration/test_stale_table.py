"""A sample table is identified by its content, not only checked for damage: ``index.json`` records each
table's content checksum (the CRC32C of its bytes before its trailing CRC; the CRC32C of a whole intact table
is the CRC residue, the same for every table). A stale table of the same size, from another pack of the same
names and sizes, is refused as the table's fault (read, verify), never reported as damaged samples of an
intact shard; an index written before the content checksum existed still reads, verify blames the table when
the shard's whole-file CRC32C is intact, and `fastload index --upgrade` rebuilds and records the tables."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import crc32c
import pytest

import fastload
from fastload.core.table import content_crc
from fastload.errors import IndexFormatError, VerifyError

from .helpers import read_manifest, run_cli

RESIDUE = "48674bc7"  # CRC32C of any message followed by its own CRC32C (little-endian)


def _files(fill: int) -> dict[str, bytes]:
    """Twelve samples whose names and sizes do not depend on ``fill``; their bytes do."""
    return {
        f"a/{i:03d}.{f}": bytes([(fill + i) % 256]) * n
        for i in range(12)
        for f, n in (("bin", 900), ("txt", 7))
    }


@pytest.fixture
def two_packs(make_tree, tmp_path) -> tuple[Path, Path]:
    """Two packs of the same names and sizes, different bytes."""
    out = []
    for fill in (1, 2):
        dst = tmp_path / f"pack{fill}"
        fastload.pack(
            make_tree(_files(fill), name=f"src{fill}").root, dst, shard_size_bytes=8 << 10, progress=False
        )
        out.append(dst)
    return out[0], out[1]


def _swap_table(good: Path, other: Path, shard: int = 1) -> tuple[str, str]:
    """Copy shard ``shard``'s sample table from ``other`` over ``good``'s; ``(shard name, table name)``."""
    entry = read_manifest(good)["shards"][shard]
    table = entry["table"]["name"]
    assert (good / table).stat().st_size == (other / table).stat().st_size  # same size: only content tells
    assert (good / table).read_bytes() != (other / table).read_bytes()
    shutil.copy(other / table, good / table)
    return entry["name"], table


def _legacy(dst: Path) -> None:
    """``index.json`` as fastload wrote it before tables had a content checksum."""
    raw = read_manifest(dst)
    for s in raw["shards"]:
        del s["table"]["content"]
    (dst / "index.json").write_bytes(json.dumps(raw, separators=(",", ":")).encode())


def test_the_manifest_records_each_tables_content(two_packs):
    for dst in two_packs:
        for s in read_manifest(dst)["shards"]:
            data = (dst / s["table"]["name"]).read_bytes()
            assert s["table"]["checksum"] == f"{crc32c.crc32c(data):08x}" == RESIDUE  # identifies nothing
            assert s["table"]["content"] == f"{crc32c.crc32c(data[:-4]):08x}" == f"{content_crc(data):08x}"
    first, second = (read_manifest(d)["shards"][1]["table"]["content"] for d in two_packs)
    assert first != second


def test_a_stale_table_of_the_same_size_is_refused_as_the_tables_fault(two_packs):
    good, other = two_packs
    expected = sorted((s["__key__"], s["bin"]) for s in fastload.ShardDataset(good, decode=False))
    shard, table = _swap_table(good, other)
    with pytest.raises(IndexFormatError, match="stale sample table") as info:
        list(fastload.ShardDataset(good, decode=False))
    assert table in str(info.value) and "fastload index --upgrade" in str(info.value)
    out = run_cli("verify", good, check=1).stdout
    assert "stale sample table" in out and table in out and "re-download" not in out, out
    assert [p.shard for p in fastload.verify(good).problems] == [shard]  # one problem: the table
    assert "rebuilt 1 sample table" in run_cli("index", "--upgrade", good, check=0).stdout
    assert fastload.verify(good).ok
    assert sorted((s["__key__"], s["bin"]) for s in fastload.ShardDataset(good, decode=False)) == expected


def test_an_index_written_before_content_checksums_still_reads_and_upgrade_records_them(two_packs):
    good, other = two_packs
    expected = sorted((s["__key__"], s["bin"]) for s in fastload.ShardDataset(good, decode=False))
    _legacy(good)
    assert sorted((s["__key__"], s["bin"]) for s in fastload.ShardDataset(good, decode=False)) == expected
    assert fastload.verify(good).ok
    # a stale table cannot be told at fetch in such an index; verify still blames the table, not the shard
    shard, table = _swap_table(good, other)
    with pytest.raises(VerifyError):
        list(fastload.ShardDataset(good, decode=False))
    problems = fastload.verify(good).problems
    assert len(problems) == 1 and problems[0].shard == shard and problems[0].key is None
    assert "stale or damaged sample table" in str(problems[0]) and "shard is intact" in str(problems[0])
    assert "fastload index --upgrade" in str(problems[0]) and table in str(problems[0])
    out = run_cli("index", "--upgrade", good, check=0).stdout
    assert "rebuilt" in out, out
    assert all("content" in s["table"] for s in read_manifest(good)["shards"])
    assert fastload.verify(good).ok
    assert sorted((s["__key__"], s["bin"]) for s in fastload.ShardDataset(good, decode=False)) == expected
    assert "nothing to upgrade" in run_cli("index", "--upgrade", good, check=0).stdout


def test_upgrade_refuses_to_rebuild_a_table_for_a_changed_shard(two_packs):
    good, other = two_packs
    shard, _ = _swap_table(good, other)
    shutil.copy(other / shard, good / shard)  # the shard changed too: nothing to rebuild from
    before = (good / "index.json").read_bytes()
    proc = run_cli("index", "--upgrade", good, check=1)
    assert shard in proc.stderr and "changed since it was packed" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert (good / "index.json").read_bytes() == before
