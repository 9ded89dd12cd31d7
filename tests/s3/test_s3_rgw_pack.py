"""``fastload pack``, ``verify``, ``inspect`` and ``cp -r`` with ``s3://`` sources and destinations on RGW.

A local tree (a few hundred small files, several fields, names over 100 bytes and non-ASCII names) is uploaded
with ``fastload cp -r``; packing it from S3 to S3 must give the same bytes as packing the local tree locally,
in any mix of the two. A pack killed with SIGKILL continues with ``--resume`` to the uninterrupted result.
"""

from __future__ import annotations

import io
import json
import random
import re
import signal
import subprocess
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from s3util import (
    KIB,
    MIB,
    etags_under,
    fastload_argv,
    keys_under,
    objects_under,
    open_uploads,
    run_cli,
    s3_env,
    snapshot,
    subprocess_env,
)

from fastload.testing.faultproxy import Fault, Rule

SHARD_SIZE = "256KiB"
# A member path over 100 bytes (the ustar name field) needs a pax header; so do the non-ASCII names.
LONG_DIR = "a-folder-with-a-name-long-enough-for-pax-" + "x" * 70
LONG_STEM = "and-a-long-file-stem-" + "y" * 30


def pack_tree_files(seed: int = 0) -> dict[str, bytes]:
    """About 290 files in 110 samples: up to four fields each, uneven sizes, long and non-ASCII names."""
    rng = random.Random(seed)
    folders = ["cats", "dogs/small", "日本/猫", "v1.2/data", LONG_DIR, "ñandú/über"]
    files: dict[str, bytes] = {}
    for i in range(110):
        key = f"{folders[i % len(folders)]}/{i:04d}"
        files[f"{key}.jpg"] = rng.randbytes(rng.choice([1, 511, 512, 513, rng.randrange(1, 14_000)]))
        files[f"{key}.cls"] = str(i % 5).encode()
        if i % 2 == 0:
            files[f"{key}.seg.png"] = rng.randbytes(rng.randrange(1, 3000))
        if i % 3 == 0:
            files[f"{key}.json"] = json.dumps({"id": i, "note": "café"}).encode()
    files[f"{LONG_DIR}/{LONG_STEM}.jpg"] = rng.randbytes(2100)
    files[f"{LONG_DIR}/{LONG_STEM}.cls"] = b"4"
    files["日本/こんにちは.txt"] = "こんにちは".encode()
    files["top-level.jpg"] = rng.randbytes(300)
    return files


def write_tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def pack_args(*args: str | Path) -> list[str | Path]:
    return ["pack", *args, "--shard-size", SHARD_SIZE, "--quiet"]


def shard_names(files: dict[str, bytes]) -> list[str]:
    return [s["name"] for s in json.loads(files["index.json"])["shards"]]


def same_pack(got: dict[str, bytes], want: dict[str, bytes]) -> None:
    """Byte-identical shards and index.json."""
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], f"{name} differs"


@pytest.fixture(scope="module")
def packed(
    rgw: Any, rgw_client: Any, module_bucket: Callable[..., str], tmp_path_factory: pytest.TempPathFactory
) -> SimpleNamespace:
    """The tree uploaded to ``raw/``, packed S3 -> S3 into ``packed/`` and locally into ``local``; the S3
    pack downloaded into ``downloaded`` with ``fastload cp -r``."""
    work = tmp_path_factory.mktemp("s3pack")
    files = pack_tree_files()
    tree = write_tree(work / "tree", files)
    name = module_bucket(rgw)
    env = s3_env(rgw)
    run_cli("cp", "-r", f"{tree}/", f"s3://{name}/raw/", env=env)
    run_cli(*pack_args(f"s3://{name}/raw", f"s3://{name}/packed"), env=env)
    run_cli(*pack_args(tree, work / "local"), env=env)
    run_cli("cp", "-r", f"s3://{name}/packed/", work / "downloaded", env=env)
    return SimpleNamespace(
        bucket=name,
        env=env,
        tree=tree,
        files=files,
        work=work,
        local=snapshot(work / "local"),
        downloaded=snapshot(work / "downloaded"),
    )


def test_cp_r_uploads_the_tree_as_it_is(rgw_client: Any, packed: SimpleNamespace) -> None:
    assert objects_under(rgw_client, packed.bucket, "raw/") == packed.files


def test_s3_to_s3_pack_equals_the_local_pack(packed: SimpleNamespace) -> None:
    names = shard_names(packed.local)
    assert len(names) >= 3, "several shards"
    same_pack(packed.downloaded, packed.local)
    for name in names:  # and the shards are tars that hold the tree's bytes
        with tarfile.open(fileobj=io.BytesIO(packed.local[name])) as tar:
            for member in tar:
                rel = member.name
                data = tar.extractfile(member).read()  # type: ignore[union-attr]
                assert data == packed.files[rel], rel
    long_names = [n for n in packed.files if len(n.encode()) > 100]
    assert long_names and any(not n.isascii() for n in packed.files)


def test_verify_passes_then_names_a_shard_with_a_flipped_byte(
    rgw_client: Any, packed: SimpleNamespace
) -> None:
    name, env = packed.bucket, packed.env
    ok = run_cli("verify", f"s3://{name}/packed", env=env)
    assert ok.stdout.startswith("OK: "), ok.stdout

    for key in keys_under(rgw_client, name, "packed/"):  # a copy to spoil, leaving packed/ intact
        copy = "spoiled/" + key[len("packed/") :]
        rgw_client.copy_object(Bucket=name, Key=copy, CopySource={"Bucket": name, "Key": key})
    victim = shard_names(packed.local)[1]
    data = bytearray(packed.local[victim])
    data[len(data) // 3] ^= 0x20
    rgw_client.put_object(Bucket=name, Key=f"spoiled/{victim}", Body=bytes(data))

    bad = run_cli("verify", f"s3://{name}/spoiled", env=env, check=1)
    assert bad.stdout.startswith("FAILED: "), bad.stdout
    assert victim in bad.stdout
    others = [n for n in shard_names(packed.local) if n != victim]
    assert not any(n in bad.stdout for n in others), bad.stdout


def test_index_upgrade_of_an_s3_dataset_gives_the_v2_pack(rgw_client: Any, packed: SimpleNamespace) -> None:
    """A v1 dataset on S3 (every sample in index.json, no per-sample CRC32C, no sample tables: as an older
    fastload wrote it) upgraded in place: exactly the objects a v2 pack writes."""
    from dataclasses import replace

    from fastload import formats

    index = formats.load_index(packed.work / "local", tables=True)
    v1 = replace(index, shards=[replace(s, table=None, format=None, crcs=[]) for s in index.shards])
    prefix = "v1/"
    for name in shard_names(packed.local):
        rgw_client.put_object(Bucket=packed.bucket, Key=prefix + name, Body=packed.local[name])
    rgw_client.put_object(Bucket=packed.bucket, Key=f"{prefix}index.json", Body=v1.to_json())
    url = f"s3://{packed.bucket}/{prefix}"
    assert "upgraded" in run_cli("index", "--upgrade", url, env=packed.env).stdout
    assert objects_under(rgw_client, packed.bucket, prefix) == packed.local
    assert "nothing to upgrade" in run_cli("index", "--upgrade", url, env=packed.env).stdout
    assert run_cli("verify", url, env=packed.env).stdout.startswith("OK")


def test_inspect_prints_the_totals(packed: SimpleNamespace) -> None:
    proc = run_cli("inspect", f"s3://{packed.bucket}/packed", env=packed.env)
    index = json.loads(packed.local["index.json"])
    totals = index["totals"]
    assert re.search(rf"^shards:\s+{totals['shards']}$", proc.stdout, re.M), proc.stdout
    assert re.search(rf"^samples:\s+{totals['samples']}$", proc.stdout, re.M), proc.stdout
    assert f"({totals['bytes']:,})" in proc.stdout
    assert "fields:   cls, jpg, json, seg.png, txt" in proc.stdout


def test_mixed_local_and_s3_ends_give_the_same_pack(rgw_client: Any, packed: SimpleNamespace) -> None:
    name, env = packed.bucket, packed.env
    run_cli(*pack_args(f"s3://{name}/raw/", packed.work / "from-s3"), env=env)
    same_pack(snapshot(packed.work / "from-s3"), packed.local)

    # "pack/" is a string prefix of the existing "packed/" keys but another prefix: it counts as empty.
    run_cli(*pack_args(packed.tree, f"s3://{name}/pack"), env=env)
    assert objects_under(rgw_client, name, "pack/") == packed.local  # same source files: same fingerprint


def test_pack_into_a_non_empty_prefix_is_refused(rgw_client: Any, packed: SimpleNamespace) -> None:
    name, env = packed.bucket, packed.env
    rgw_client.put_object(Bucket=name, Key="occupied/readme.txt", Body=b"someone else's")
    before = etags_under(rgw_client, name)
    for dst in ("occupied", "packed/"):
        proc = run_cli(*pack_args(packed.tree, f"s3://{name}/{dst}"), env=env, check=1)
        assert "is not empty" in proc.stderr, proc.stderr
    after = etags_under(rgw_client, name)
    assert after == before, "nothing written, nothing removed"
    assert open_uploads(rgw_client, name) == []


# -- resume after SIGKILL --------------------------------------------------------------------------------


def small_files_tree(root: Path, count: int, seed: int) -> Path:
    rng = random.Random(seed)
    return write_tree(
        root, {f"part{i % 6}/{i:05d}.bin": rng.randbytes(rng.randrange(1, 6000)) for i in range(count)}
    )


def start_pack(argv: list[str], env: dict[str, str], tmp_dir: Path, stderr: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv,
        env=subprocess_env(env, tmp_dir),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
    )


def wait_then_kill(
    proc: subprocess.Popen[bytes], ready: Callable[[], bool], *, timeout_s: float = 40
) -> None:
    """Poll ``ready()`` every 20 ms; SIGKILL the process as soon as it holds. Fails if the process ends
    first or the wait times out; the process is killed whatever happens."""
    deadline = time.monotonic() + timeout_s
    try:
        while not ready():
            assert proc.poll() is None, f"the pack ended (exit {proc.returncode}) before it could be killed"
            assert time.monotonic() < deadline, "timed out waiting for the pack to get far enough"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def read_tar_fully(data: bytes) -> int:
    """Read every member of a tar to its end; return the member count (tarfile raises if it is cut)."""
    count = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar:
            got = tar.extractfile(member).read()  # type: ignore[union-attr]
            assert len(got) == member.size
            count += 1
    return count


@pytest.fixture(scope="module")
def resume_setup(
    rgw: Any, rgw_client: Any, module_bucket: Callable[..., str], tmp_path_factory: pytest.TempPathFactory
) -> SimpleNamespace:
    """A tree of 700 small files and its uninterrupted pack into ``clean/`` (64 KiB shards, ~35 of them)."""
    work = tmp_path_factory.mktemp("resume")
    tree = small_files_tree(work / "tree", 700, seed=9)
    name = module_bucket(rgw)
    options = ["--workers", "1", "--shard-size", "64KiB", "--quiet"]
    run_cli("pack", tree, f"s3://{name}/clean", *options, env=s3_env(rgw))
    clean = objects_under(rgw_client, name, "clean/")
    return SimpleNamespace(bucket=name, tree=tree, options=options, clean=clean)


@pytest.mark.parametrize("kill_at_shard", [1, 3])
def test_pack_killed_mid_run_resumes_to_the_uninterrupted_result(
    kill_at_shard: int,
    rgw: Any,
    rgw_client: Any,
    rgw_proxy: Callable[..., Any],
    resume_setup: SimpleNamespace,
    tmp_path: Path,
) -> None:
    """Killed once its ``kill_at_shard``-th shard object exists: each shard PUT is held 0.3 s after the
    object is stored (so the kill lands between publishing a shard and journaling it), the earlier shards
    are journaled, the later ones not written."""
    setup = resume_setup
    name, prefix = setup.bucket, f"p{kill_at_shard}/"
    assert len(setup.clean) > 20
    proxy = rgw_proxy()
    proxy.add(Rule(Fault.latency(delay_s=0.3), method="PUT", key=f"/{prefix}shard-"))
    argv = fastload_argv("pack", setup.tree, f"s3://{name}/{prefix}", *setup.options)

    def shards_present() -> list[str]:
        keys = keys_under(rgw_client, name, prefix)  # shards, not their sample tables (.fltable)
        return [k for k in keys if k.startswith(f"{prefix}shard-") and k.endswith(".tar")]

    with (tmp_path / "killed-pack.stderr").open("wb") as stderr:
        proc = start_pack(argv, s3_env(rgw, endpoint_url=proxy.endpoint_url), tmp_path, stderr)
        wait_then_kill(proc, lambda: len(shards_present()) >= kill_at_shard)

    present = shards_present()
    assert len(present) >= kill_at_shard
    left = keys_under(rgw_client, name, prefix)
    assert f"{prefix}index.json" not in left, "the kill came before the end"
    assert f"{prefix}.fastload-pack/state.json" in left, "the resume journal is there"
    for key in present:  # whatever sits under a final shard name is a complete shard
        data = rgw_client.get_object(Bucket=name, Key=key)["Body"].read()
        assert read_tar_fully(data) > 0, key
        assert data == setup.clean[key[len(prefix) :]], key

    resumed = run_cli(
        "pack", setup.tree, f"s3://{name}/{prefix}", *setup.options, "--resume", env=s3_env(rgw)
    )
    if kill_at_shard > 1:
        found = re.search(r"resumed: kept (\d+) finished shard", resumed.stdout)
        assert found is not None, resumed.stdout
        assert len(present) - 1 <= int(found.group(1)) <= len(present), resumed.stdout

    assert objects_under(rgw_client, name, prefix) == setup.clean
    assert open_uploads(rgw_client, name, prefix) == []


def test_pack_killed_during_a_multipart_shard_upload_leaves_no_open_upload_after_resume(
    rgw: Any,
    rgw_env: dict[str, str],
    rgw_client: Any,
    rgw_proxy: Callable[..., Any],
    bucket: Callable[..., str],
    tmp_path: Path,
) -> None:
    """Shards over 8 MiB go up as multipart uploads. Killed while part 2 of the first shard hangs, the pack
    leaves an open upload no process will abort; ``--resume`` must not leave it behind (docs/s3.md: "a failed
    multipart upload is aborted (no orphaned parts)")."""
    import fastload

    rng = random.Random(12)
    tree = write_tree(tmp_path / "tree", {f"big/{i:03d}.bin": rng.randbytes(1100 * KIB) for i in range(20)})
    name = bucket(rgw)
    dst = f"s3://{name}/mp"
    options = ["--workers", "1", "--shard-size", "9MiB", "--quiet"]
    proxy = rgw_proxy()
    hang = proxy.add(
        Rule(Fault.hang(duration_s=30), method="PUT", where=lambda r: "partNumber=2" in r.target, times=1)
    )
    argv = fastload_argv("pack", tree, dst, *options)
    with (tmp_path / "killed-pack.stderr").open("wb") as stderr:
        proc = start_pack(argv, s3_env(rgw, endpoint_url=proxy.endpoint_url), tmp_path, stderr)
        wait_then_kill(proc, lambda: hang.fired == 1 and bool(open_uploads(rgw_client, name, "mp/")))

    assert [u["Key"] for u in open_uploads(rgw_client, name, "mp/")] == ["mp/shard-000000.tar"]
    assert not [k for k in keys_under(rgw_client, name, "mp/") if "/shard-" in k], "no partial shard"

    run_cli("pack", tree, dst, *options, "--resume", env=s3_env(rgw))
    report = fastload.verify(dst)
    assert report.ok and report.shards == 3, report.summary()
    sizes = [o["Size"] for o in rgw_client.list_objects_v2(Bucket=name, Prefix="mp/shard-")["Contents"]]
    assert sum(size > 8 * MIB for size in sizes) == 2, f"two shards went up as multipart uploads: {sizes}"
    assert open_uploads(rgw_client, name, "mp/") == [], "the killed run's multipart upload is still open"
