"""``fastload pack --engine ray`` on a local 2-CPU Ray cluster: the same bytes as the local engine, also when
a task's worker dies mid-shard or the driver is killed and the pack resumed."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from ray_helpers import ACCESS_KEY, REGION, SECRET_KEY, snapshot, uneven_files, write_files

import fastload
from fastload import cli
from fastload.core.plan import ShardPlan
from fastload.errors import ConfigError, PackError
from fastload.packing import ray_engine as rayengine
from fastload.packing.write import FileShard

HERE = Path(__file__).resolve().parent
TAR = {"shard_size_bytes": 64 << 10, "max_samples": 9, "shuffle_seed": 3, "partition_level": 0}
PARQUET = {"shard_format": "parquet", "shard_size_bytes": 64 << 10, "row_group_bytes": 16 << 10}
TFRECORD = {"shard_format": "tfrecord", "shard_size_bytes": 64 << 10}
TAR_CLI = ["--shard-size", "64KiB", "--max-samples", "9", "--shuffle", "--seed", "3", "--partition-by", "0"]
pytestmark = pytest.mark.usefixtures("ray_cluster")


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_files(tmp_path_factory.mktemp("ray-src") / "src", uneven_files())


@pytest.fixture(scope="module")
def local(src: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, bytes]]:
    """The local engine's output for each option set: relative path -> bytes."""
    base = tmp_path_factory.mktemp("ray-local")
    out = {}
    for name, options in (("tar", TAR), ("parquet", PARQUET), ("tfrecord", TFRECORD)):
        fastload.pack(src, base / name, progress=False, workers=2, **options)
        out[name] = snapshot(base / name)
    return out


def shard_names(files: dict[str, bytes]) -> list[str]:
    return sorted(n for n in files if n.endswith((".tar", ".parquet", ".tfrecord")))


def test_tar_via_cli_is_byte_identical_to_the_local_engine(src, local, tmp_path) -> None:
    dst = tmp_path / "dst"
    assert cli.main(["pack", os.fspath(src), os.fspath(dst), "--quiet", "--engine", "ray", *TAR_CLI]) == 0
    got = snapshot(dst)
    assert len(shard_names(got)) >= 10, "the tree must span many shards (and partitions) to mean anything"
    assert any(n.startswith("cats/") or n.startswith("level0=cats/") for n in got)
    assert got == local["tar"]


@pytest.mark.parametrize(("fmt", "options"), [("parquet", PARQUET), ("tfrecord", TFRECORD)])
def test_other_formats_are_byte_identical_to_the_local_engine(src, local, tmp_path, fmt, options) -> None:
    report = fastload.pack(src, tmp_path / "dst", progress=False, engine="ray", **options)
    assert snapshot(tmp_path / "dst") == local[fmt]
    assert report.shards_written == len(shard_names(local[fmt])) >= 5 and report.index.samples == 63


def test_killed_tasks_are_retried_and_spent_retries_fail_clearly(src, local, tmp_path, monkeypatch) -> None:
    """Shard 1's first attempt dies mid-shard and its retry succeeds; shard 3 dies on both of its attempts,
    so the pack fails naming it. ``--resume`` then writes what is missing: the output is the local one."""
    markers = tmp_path / "crashed"
    markers.mkdir()
    monkeypatch.setattr(rayengine, "MAX_RETRIES", 1)
    fault = rayengine._Fault(crash_dir=os.fspath(markers), crashes={1: 1, 3: 2})
    monkeypatch.setattr(rayengine, "_test_fault", fault)
    dst = tmp_path / "dst"
    with pytest.raises(PackError, match=r"shard-000003\.tar.*failed 2 times.*--resume"):
        fastload.pack(src, dst, progress=False, engine="ray", workers=1, **TAR)  # one shard at a time
    # Each marker is an attempt that wrote one sample and then lost its worker process (os._exit).
    assert sorted(p.name for p in markers.iterdir()) == ["000001.0", "000003.0", "000003.1"]
    assert not (dst / "index.json").exists()
    names = shard_names(local["tar"])
    published = shard_names(snapshot(dst))
    assert names[1] in published, "shard 1 was retried and published"
    assert names[3] not in published, "a shard never appears under its name unless whole"
    for name in published:
        assert (dst / name).read_bytes() == local["tar"][name]

    monkeypatch.setattr(rayengine, "_test_fault", None)
    report = fastload.pack(src, dst, progress=False, engine="ray", resume=True, **TAR)
    assert snapshot(dst) == local["tar"]
    assert report.shards_kept >= 2 and report.index.shards[1].samples >= 2, "the crash was inside a shard"


def journaled(dst: Path) -> int:
    done = dst / ".fastload-pack" / "done"
    return len(list(done.glob("*.json"))) if done.is_dir() else 0


def test_resume_after_the_driver_is_killed(src, local, tmp_path, ray_cluster) -> None:
    dst = tmp_path / "dst"
    address = ray_cluster.get_runtime_context().gcs_address
    cmd = [sys.executable, os.fspath(HERE / "kill_driver.py"), "0.25", "pack", os.fspath(src), os.fspath(dst)]
    cmd += ["--quiet", "--engine", "ray", "--ray-address", address, *TAR_CLI]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONWARNINGS", "RAY_ADDRESS"))}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline and journaled(dst) < 3:
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"the driver ended by itself:\n{err.decode(errors='replace')}"
    # Ray kills the dead driver's tasks; wait until their CPUs are free, so none is still writing below.
    deadline = time.monotonic() + 30
    while ray_cluster.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (dst / "index.json").exists()
    total = len(shard_names(local["tar"]))
    present = [dst / n for n in shard_names(snapshot(dst))]
    assert 3 <= len(present) < total
    for path in present:  # every shard under its final name is whole
        assert path.read_bytes() == local["tar"][path.relative_to(dst).as_posix()]
    identity = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in present}

    report = fastload.pack(src, dst, progress=False, engine="ray", resume=True, **TAR)
    assert snapshot(dst) == local["tar"]
    assert report.shards_kept >= 3 and report.shards_kept + report.shards_written == total
    kept = [p for p in present if (p.stat().st_ino, p.stat().st_mtime_ns) == identity[p]]
    assert len(kept) >= report.shards_kept, "--resume rewrote shards the journal said were finished"


@pytest.mark.usefixtures("s3_env")
def test_s3_source_and_destination(src, local, moto_url) -> None:
    """Tasks read their samples from S3 and upload their shard; the bytes are the local pack's."""
    client: Any = boto3.client(
        "s3",
        endpoint_url=moto_url,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(s3={"addressing_style": "path"}),
    )
    bucket = "fastload-ray-tests"
    client.create_bucket(Bucket=bucket)
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        key = f"src/{path.relative_to(src).as_posix()}"
        client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
    config = fastload.S3Config(endpoint_url=moto_url, addressing_style="path")
    fastload.pack(
        f"s3://{bucket}/src/", f"s3://{bucket}/ds", s3_config=config, progress=False, engine="ray", **TAR
    )
    got = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="ds/"):
        for obj in page.get("Contents", []):
            body = client.get_object(Bucket=bucket, Key=obj["Key"])["Body"]
            got[obj["Key"][len("ds/") :]] = body.read()
            body.close()
    client.close()
    assert got == local["tar"]


def test_a_local_destination_not_visible_on_the_node_is_refused(src, tmp_path) -> None:
    """A task on a node that does not see the destination folder says so (run here without Ray)."""
    shard = ShardPlan(0, 0, 1, "shard-000000.tar")
    job = FileShard(plan=shard, samples=[], fields=[], config=fastload.PackConfig())
    with pytest.raises(PackError, match=r"not visible on Ray node .*mounts at the same path"):
        rayengine.write_in_task(job, os.fspath(tmp_path / "elsewhere"), None)


def test_a_local_source_not_visible_on_the_node_is_refused(tmp_path) -> None:
    """The job names the local folders it reads; a task on a node without them says which (without Ray)."""
    from fastload.core.keys import Sample
    from fastload.packing.dest import LocalDestination
    from fastload.storage.inputs import Input
    from fastload.storage.listing import FileEntry, LocalSource

    gone = tmp_path / "gone"
    gone.mkdir()
    (gone / "a.txt").write_bytes(b"x")
    source = LocalSource(gone)
    entry = next(e for e in source.list() if isinstance(e, FileEntry))
    (gone / "a.txt").unlink()
    gone.rmdir()
    LocalDestination(os.fspath(tmp_path / "dst"), ".fastload-pack").prepare()
    job = FileShard(
        plan=ShardPlan(0, 0, 1, "shard-000000.tar"),
        samples=[Sample("a", (("txt", Input(source, entry)),))],
        fields=["txt"],
        config=fastload.PackConfig(),
    )
    assert job.local_folders() == {os.fspath(gone)}
    with pytest.raises(PackError, match=rf"the source {gone} is not visible on Ray node"):
        rayengine.write_in_task(job, os.fspath(tmp_path / "dst"), None)
    assert not list((tmp_path / "dst").glob("*.tar"))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"engine": "spark"}, "engine='spark'; choose 'local' or 'ray'"),
        ({"ray_address": "head:6379"}, "ray_address only applies with engine='ray'"),
    ],
)
def test_bad_engine_options(src, tmp_path, options, message) -> None:
    with pytest.raises(ConfigError, match=message):
        fastload.pack(src, tmp_path / "dst", progress=False, **options)
    assert not (tmp_path / "dst").exists()


def test_an_unreachable_cluster_fails_at_once(src, tmp_path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once the socket is closed
    began = time.monotonic()
    expected = rf"cannot reach the Ray cluster at 127\.0\.0\.1:{port} .*--ray-address"
    with pytest.raises(PackError, match=expected):
        fastload.pack(src, tmp_path / "dst", engine="ray", ray_address=f"127.0.0.1:{port}")
    assert time.monotonic() - began < 10, "Ray retries an unreachable cluster for minutes; fastload must not"
    assert not (tmp_path / "dst").exists()


def test_without_ray_the_engine_says_how_to_install_it(src, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'fastload\[ray\]'"):
        fastload.pack(src, tmp_path / "dst", engine="ray")
    assert cli.main(["pack", os.fspath(src), os.fspath(tmp_path / "dst"), "--engine", "ray"]) == 2
    assert "pip install 'fastload[ray]'" in capsys.readouterr().err
    assert not (tmp_path / "dst").exists()
