"""`fastload index --upgrade`: a v1 dataset (every sample in index.json) turned into v2 in place, with the
same samples, each tar sample's CRC32C computed from the shard; refused when a shard changed. And
`fastload index` of foreign tars writes v2; `--force` leaves no stale sample table behind."""

from __future__ import annotations

import shutil
from pathlib import Path

import crc32c
import pytest

import fastload
from fastload import formats
from fastload.core.table import SUFFIX
from fastload.packing.upgrade import upgrade_index

from .helpers import make_v1, read_index, read_manifest, run_cli, snapshot


@pytest.fixture(params=["tar", "parquet", "tfrecord"])
def v1(request, rich_tree, tmp_path) -> tuple[Path, dict]:
    """A v1 dataset (no per-sample CRCs, as older fastload wrote) and its samples as packed (attached)."""
    dst = tmp_path / "dst"
    fastload.pack(rich_tree.root, dst, shard_format=request.param, shard_size_bytes=16 << 10, progress=False)
    packed = read_index(dst)
    make_v1(dst)
    return dst, packed


def test_upgrade_round_trip(v1):
    dst, packed = v1
    assert not list(dst.glob(f"*{SUFFIX}"))
    proc = run_cli("index", "--upgrade", dst, check=0)
    assert "upgraded" in proc.stdout and "index v2" in proc.stdout
    manifest = read_manifest(dst)
    assert manifest["version"] == 2 and all("keys" not in s for s in manifest["shards"])
    upgraded = read_index(dst)
    for before, after in zip(packed["shards"], upgraded["shards"], strict=True):
        assert {k: v for k, v in after.items() if k != "crcs"} == {
            k: v for k, v in before.items() if k != "crcs"
        }, "the same samples, byte ranges and layout"
        data = (dst / after["name"]).read_bytes()
        if packed["shard_format"] == "tar":  # each sample's CRC32C, from the shard's bytes
            assert (
                after["crcs"]
                == before["crcs"]
                == [
                    crc32c.crc32c(data[o : o + n])
                    for o, n in zip(after["offsets"], after["sizes"], strict=True)
                ]
            )
        else:  # Parquet pages and TFRecord records carry their own checksums
            assert after.get("crcs", []) == []
    assert fastload.verify(dst).ok
    again = run_cli("index", "--upgrade", dst, check=0)
    assert "index v2 already; nothing to upgrade" in again.stdout


@pytest.mark.parametrize("v1", ["tar"], indirect=True)  # tar shards are read (their samples' CRC32C)
def test_upgrade_refuses_a_shard_that_changed(v1):
    dst, packed = v1
    before = snapshot(dst)
    shard = packed["shards"][1]
    path = dst / shard["name"]
    data = bytearray(path.read_bytes())
    data[shard["offsets"][0] + 600] ^= 0x10
    path.write_bytes(bytes(data))
    proc = run_cli("index", "--upgrade", dst, check=1)
    assert shard["name"] in proc.stderr and "changed since it was indexed" in proc.stderr
    assert "Traceback" not in proc.stderr
    after = snapshot(dst)
    assert {k: v for k, v in after.items() if k != shard["name"]} == {
        k: v for k, v in before.items() if k != shard["name"]
    }, "nothing written: still v1, no sample tables"


def test_index_of_foreign_tars_writes_v2_and_force_drops_stale_tables(rich_tree, tmp_path):
    folder = tmp_path / "tars"
    fastload.pack(rich_tree.root, tmp_path / "p", shard_size_bytes=16 << 10, progress=False)
    folder.mkdir()
    names = [s["name"] for s in read_manifest(tmp_path / "p")["shards"]]
    for name in names:
        shutil.copy(tmp_path / "p" / name, folder / name)
    run_cli("index", folder, check=0)
    index = formats.load_index(folder, tables=True)
    assert read_manifest(folder)["version"] == 2 and len(index.shards) == len(names) > 2
    assert all(s.crcs and len(s.crcs) == s.samples for s in index.shards)
    assert sorted(p.name for p in folder.glob(f"*{SUFFIX}")) == sorted(n + SUFFIX for n in names)
    assert fastload.verify(folder).ok
    (folder / names[-1]).unlink()
    assert "--force" in run_cli("index", folder, check=2).stderr
    run_cli("index", "--force", folder, check=0)
    assert sorted(p.name for p in folder.glob(f"*{SUFFIX}")) == sorted(n + SUFFIX for n in names[:-1])
    assert [s.name for s in formats.load_index(folder).shards] == names[:-1]
    assert fastload.verify(folder).ok


def _grow_while_upgrading(
    monkeypatch: pytest.MonkeyPatch, extra: Path, dst: str, **pack_options: object
) -> None:
    """Make ``fastload index --upgrade`` meet an append: one is packed into ``dst`` as soon as the upgrade
    has rebuilt its tables (before it writes index.json again)."""
    from fastload.packing import upgrade

    real = upgrade.refresh_tables

    def then_append(*args, **kwargs):  # type: ignore[no-untyped-def]
        got = real(*args, **kwargs)
        fastload.pack(extra, dst, max_samples=3, append=True, progress=False, **pack_options)  # type: ignore[arg-type]
        return got

    monkeypatch.setattr(upgrade, "refresh_tables", then_append)


def _extra(tmp_path: Path) -> Path:
    extra = tmp_path / "extra"
    extra.mkdir()
    for i in range(7):
        (extra / f"new{i}.txt").write_bytes(f"appended {i}".encode())
    return extra


def test_an_append_published_during_an_upgrade_is_not_lost(rich_tree, tmp_path, monkeypatch):
    """The upgrade rewrites index.json from what it read: an append that published meanwhile refuses the
    write (nothing is written, the append's version stays), and the upgrade run again repairs."""
    from fastload.errors import AppendConflictError

    dst = tmp_path / "ds"
    fastload.pack(rich_tree.root, dst, shard_size_bytes=16 << 10, progress=False)
    first = sorted(dst.glob(f"*{SUFFIX}"))[0]
    first.unlink()  # a missing table: the upgrade rebuilds it, then writes index.json again
    _grow_while_upgrading(monkeypatch, _extra(tmp_path), str(dst))
    with pytest.raises(AppendConflictError, match=r"changed while `fastload index --upgrade` ran"):
        upgrade_index(dst)
    monkeypatch.undo()
    manifest = read_manifest(dst)
    assert [v["version"] for v in manifest["versions"]] == [1, 2]  # the append's version is kept
    assert not (dst / ".fastload-pack").exists()
    upgrade_index(dst)
    assert [v["version"] for v in read_manifest(dst)["versions"]] == [1, 2]
    assert fastload.verify(dst).ok


def test_an_append_published_during_an_upgrade_on_s3_is_not_lost(rich_tree, tmp_path, monkeypatch, moto_url):
    """The same on S3 (moto): the rewrite is a PUT conditional on the ETag of the index as checked."""
    import boto3

    from fastload.errors import AppendConflictError

    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(name, value)
    config = fastload.S3Config(endpoint_url=moto_url, region="us-east-1", addressing_style="path")
    boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1").create_bucket(Bucket="upgrade-race")
    dst = "s3://upgrade-race/ds"
    fastload.pack(rich_tree.root, dst, shard_size_bytes=16 << 10, progress=False, s3_config=config)
    s3 = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1")
    tables = [
        o["Key"] for o in s3.list_objects_v2(Bucket="upgrade-race")["Contents"] if o["Key"].endswith(SUFFIX)
    ]
    s3.delete_object(Bucket="upgrade-race", Key=sorted(tables)[0])
    with monkeypatch.context() as patched:
        _grow_while_upgrading(patched, _extra(tmp_path), dst, s3_config=config)
        with pytest.raises(AppendConflictError, match="changed while"):
            upgrade_index(dst, s3_config=config)
    ds = fastload.ShardDataset(dst, s3_config=config, decode=False)
    assert ds.view.version == 2
    upgrade_index(dst, s3_config=config)
    assert fastload.ShardDataset(dst, s3_config=config, decode=False).view.version == 2
