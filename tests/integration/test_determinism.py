"""Same input and options -> byte-identical shards and index.json, whatever --workers is."""

from __future__ import annotations

import os

import pytest

import fastload

from .helpers import read_index, run_cli, snapshot


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_packing_twice_and_with_different_worker_counts_is_byte_identical(rich_tree, tmp_path, fmt):
    opts = ("--format", fmt, "--shard-size", "8KiB")
    # Two CLI runs in processes with different hash seeds (nothing may depend on set or dict order), and two
    # in-process runs with other worker counts.
    run_cli(
        "pack",
        rich_tree.root,
        tmp_path / "w1",
        "--quiet",
        *opts,
        "--workers",
        "1",
        check=True,
        PYTHONHASHSEED="1",
    )
    run_cli(
        "pack",
        rich_tree.root,
        tmp_path / "w2",
        "--quiet",
        *opts,
        "--workers",
        "2",
        check=True,
        PYTHONHASHSEED="2",
    )
    for workers in (1, 4):
        fastload.pack(
            str(rich_tree.root),
            tmp_path / f"api-w{workers}",
            shard_format=fmt,
            shard_size_bytes=8192,
            workers=workers,
            progress=False,
        )
    first = snapshot(tmp_path / "w1")
    assert len([n for n in first if n != "index.json"]) > 5, "several shards, so workers run in parallel"
    for name in ("w2", "api-w1", "api-w4"):
        files = snapshot(tmp_path / name)
        assert sorted(files) == sorted(first), name
        for rel in first:
            assert files[rel] == first[rel], f"{name}: {rel} differs from the --workers 1 run"


def test_shuffle_is_deterministic_and_depends_on_the_seed(many_tree, tmp_path):
    def keys(dst):
        return [k for s in read_index(dst)["shards"] for k in s["keys"]]

    def pack(name, **options):
        fastload.pack(
            str(many_tree.root), tmp_path / name, shard_size_bytes=32 << 10, progress=False, **options
        )

    pack("sorted")
    pack("s3a", shuffle_seed=3, workers=1)
    run_cli(
        "pack",
        many_tree.root,
        tmp_path / "s3b",
        "--quiet",
        "--shard-size",
        "32KiB",
        "--shuffle",
        "--seed",
        "3",
        "--workers",
        "2",
        check=True,
        PYTHONHASHSEED="12345",
    )
    pack("s4", shuffle_seed=4)

    assert keys(tmp_path / "sorted") == sorted(many_tree.samples())
    assert sorted(keys(tmp_path / "s3a")) == sorted(many_tree.samples())
    assert keys(tmp_path / "s3a") != keys(tmp_path / "sorted")
    assert snapshot(tmp_path / "s3a") == snapshot(tmp_path / "s3b")
    assert keys(tmp_path / "s4") != keys(tmp_path / "s3a")
    assert sorted(keys(tmp_path / "s4")) == sorted(keys(tmp_path / "s3a"))


def test_recreated_tree_with_other_mtimes_gives_identical_shards(tree_files, make_tree, tmp_path):
    """Tar headers carry mtime 0 and index.json records names and sizes only, so file times must not leak
    into the output: shards and index are byte-identical."""
    a = make_tree(tree_files.rich(), name="a")
    b = make_tree(tree_files.rich(), name="b")
    for i, path in enumerate(p for p in b.root.rglob("*") if p.is_file()):
        os.utime(path, ns=(10**18 + i, 10**18 + i * 7919))
    for tree, out in ((a, "pa"), (b, "pb")):
        fastload.pack(str(tree.root), tmp_path / out, shard_size_bytes=16 << 10, progress=False)
    sa, sb = snapshot(tmp_path / "pa"), snapshot(tmp_path / "pb")
    assert sorted(sa) == sorted(sb)
    for rel in sa:
        assert sa[rel] == sb[rel], rel
