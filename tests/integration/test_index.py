"""index.json (v2) and the shards' sample tables: per-sample byte ranges and CRC32C, the whole files' CRC32C,
totals and shard sizing, checked against the shard files."""

from __future__ import annotations

import crc32c
import pytest

from .helpers import pack_cli, read_index, read_manifest, shard_paths, tar_members


def test_each_sample_byte_range_is_a_self_contained_tar_fragment(rich_tree, tmp_path):
    dst = tmp_path / "dst"
    pack_cli(rich_tree.root, dst, "--shard-size", "16KiB")
    index = read_index(dst)
    expected = rich_tree.samples()
    checked = 0
    for shard in index["shards"]:
        data = (dst / shard["name"]).read_bytes()
        assert len(shard["offsets"]) == len(shard["sizes"]) == len(shard["keys"]) == shard["samples"]
        assert len(shard["crcs"]) == shard["samples"]
        for key, offset, size, crc in zip(
            shard["keys"], shard["offsets"], shard["sizes"], shard["crcs"], strict=True
        ):
            assert offset % 512 == 0 and size % 512 == 0 and offset + size <= len(data) - 1024
            assert crc == crc32c.crc32c(data[offset : offset + size]), "the CRC32C of the sample's bytes"
            fragment = data[offset : offset + size] + bytes(1024)
            members = tar_members(fragment)
            assert [name for name, _ in members] == [f"{key}.{f}" for f in sorted(expected[key])]
            assert dict(members) == {f"{key}.{f}": b for f, b in expected[key].items()}
            checked += 1
        # Ranges tile the shard: nothing between samples, two zero blocks at the end.
        ends = [o + s for o, s in zip(shard["offsets"], shard["sizes"], strict=True)]
        assert shard["offsets"] == [0, *ends[:-1]]
        assert ends[-1] + 1024 == len(data) and data[ends[-1] :] == bytes(1024)
    assert checked == len(expected)


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_crc32c_and_totals_match_the_files(rich_tree, tmp_path, fmt):
    dst = tmp_path / "dst"
    pack_cli(rich_tree.root, dst, "--format", fmt, "--shard-size", "16KiB")
    index = read_index(dst)
    assert (index["format"], index["version"], index["checksum"], index["shard_format"]) == (
        "fastload-index",
        2,
        "crc32c",
        fmt,
    )
    tables = []
    for listed in read_manifest(dst)["shards"]:  # v2: shards only, each naming its sample table
        assert "keys" not in listed and "offsets" not in listed and listed["format"] == fmt
        table = (dst / listed["table"]["name"]).read_bytes()
        assert listed["table"] == {
            "name": ("_fastload/" if fmt == "parquet" else "") + listed["name"] + ".fltable",
            "bytes": len(table),
            "checksum": f"{crc32c.crc32c(table):08x}",
            "content": f"{crc32c.crc32c(table[:-4]):08x}",  # what tells this table from another
        }
        tables.append(listed["table"]["name"])
    total_bytes = 0
    for shard, path in zip(index["shards"], shard_paths(dst), strict=True):
        data = path.read_bytes()
        assert shard["bytes"] == len(data)
        assert shard["checksum"] == f"{crc32c.crc32c(data):08x}"
        assert shard["samples"] == len(shard["keys"])
        total_bytes += len(data)
    expected = rich_tree.samples()
    all_keys = [k for s in index["shards"] for k in s["keys"]]
    assert all_keys == sorted(expected)
    assert index["totals"] == {
        "shards": len(index["shards"]),
        "samples": len(expected),
        "bytes": total_bytes,
        "payload_bytes": rich_tree.payload_bytes,
    }
    assert index["fields"] == sorted({f for fs in expected.values() for f in fs})
    assert index["skipped"] == []
    names = {p.relative_to(dst).as_posix() for p in dst.rglob("*") if p.is_file()}
    manifest = "_fastload/index.json" if fmt == "parquet" else "index.json"
    assert names == {manifest, *(s["name"] for s in index["shards"]), *tables}, "stray files left in DST"


def test_tar_shard_size_is_respected_and_oversized_samples_get_their_own_shard(
    make_tree, tree_files, tmp_path
):
    files = tree_files.many(120, max_bytes=6000)
    files["part0/huge.bin"] = bytes(range(256)) * 400  # 100 KiB: over the 64 KiB target by itself
    tree = make_tree(files)
    dst = tmp_path / "dst"
    limit = 64 * 1024
    pack_cli(tree.root, dst, "--shard-size", "64KiB")
    index = read_index(dst)
    shards = index["shards"]
    assert len(shards) > 3
    for shard in shards:
        assert shard["bytes"] <= limit or shard["samples"] == 1, shard["name"]
    (huge,) = [s for s in shards if "part0/huge" in s["keys"]]
    assert huge["samples"] == 1 and huge["bytes"] > limit
    # Not trivially satisfied by one sample per shard: shards are filled.
    assert len(shards) < index["totals"]["samples"] / 4


def test_parquet_shard_size_is_respected(make_tree, tree_files, tmp_path):
    """docs/pack.md: ``--shard-size`` is the target shard size; only a single big sample may go over it."""
    tree = make_tree(tree_files.many(120, max_bytes=6000))
    dst = tmp_path / "dst"
    pack_cli(tree.root, dst, "--format", "parquet", "--shard-size", "64KiB")
    shards = read_index(dst)["shards"]
    assert len(shards) > 3
    over = [
        (s["name"], s["bytes"], s["samples"]) for s in shards if s["bytes"] > 64 * 1024 and s["samples"] > 1
    ]
    assert over == [], "Parquet shards larger than --shard-size 64KiB (65536 bytes)"


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_max_samples_is_respected(many_tree, tmp_path, fmt):
    dst = tmp_path / "dst"
    pack_cli(many_tree.root, dst, "--format", fmt, "--max-samples", "7")
    counts = [s["samples"] for s in read_index(dst)["shards"]]
    assert max(counts) == 7
    assert sum(counts) == 200
    assert counts == [7] * (200 // 7) + [200 % 7]
