"""fastload.ShardWriter on S3 (moto) and as several writers of one dataset (real processes), merged."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import boto3
import pytest

import fastload
from fastload.errors import PackError, UnfinishedPackError

from .test_shardwriter import encoded, read_back
from .writer_samples import samples

PART_SCRIPT = textwrap.dedent(
    """
    import sys, fastload
    from tests.integration.writer_samples import samples
    dst, fmt, part, parts, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    given = samples(n * parts)[part::parts]  # (this process's share: its own keys)
    with fastload.ShardWriter(dst, format=fmt, part=part, parts=parts, shard_size_bytes=16 << 10) as w:
        for s in given:
            w.write(s)
    print(w.report.summary())
    """
)


def write_parts_here(dst: str, fmt: str, parts: int, n: int, *, only: list[int] | None = None) -> None:
    """What :func:`write_parts` does, in this process, one part after another."""
    for part in range(parts) if only is None else only:
        with fastload.ShardWriter(dst, format=fmt, part=part, parts=parts, shard_size_bytes=16 << 10) as w:
            for s in samples(n * parts)[part::parts]:
                w.write(s)


def write_parts(dst: str, fmt: str, parts: int, n: int) -> None:
    """Writer ``part`` of ``parts`` in a process of its own, all at once."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PART_SCRIPT, dst, fmt, str(p), str(parts), str(n)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for p in range(parts)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert "merge the parts" in out


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_parts_from_processes_merge_into_one_dataset(tmp_path: Path, fmt: str) -> None:
    dst = str(tmp_path / "ds")
    if fmt == "tar":
        write_parts(dst, fmt, parts=3, n=20)  # (real processes, writing at once)
    else:
        write_parts_here(dst, fmt, parts=3, n=20)
    with pytest.raises(UnfinishedPackError):  # not a dataset until merged
        fastload.ShardDataset(dst, decode=False)
    report = fastload.ShardWriter.merge(dst)
    assert "merged 3 part(s)" in report.summary() and report.samples == 60
    assert read_back(dst) == {s["__key__"]: encoded(s) for s in samples(60)}
    assert fastload.verify(dst).ok
    names = [s.name for s in report.index.shards]
    assert names == sorted(names) and names[0].startswith("shard-p00000-")
    assert not (tmp_path / "ds" / ".fastload-pack").exists()


def test_merge_refuses_a_missing_part_and_a_key_in_two_parts(tmp_path: Path) -> None:
    dst = str(tmp_path / "ds")
    write_parts_here(dst, "tar", parts=3, n=5, only=[0, 2])
    with pytest.raises(PackError, match=r"part\(s\) 1 of 3 are not finished"):
        fastload.ShardWriter.merge(dst)
    with fastload.ShardWriter(dst, part=1, parts=3) as w:
        w.write({"__key__": samples(1)[0]["__key__"], "txt": "again"})  # part 0 wrote this key
    with pytest.raises(PackError, match="two parts wrote it"):
        fastload.ShardWriter.merge(dst)
    assert not (tmp_path / "ds" / "index.json").exists()


def test_a_part_written_twice_is_refused_and_an_interrupted_one_begun_again(tmp_path: Path) -> None:
    dst = tmp_path / "ds"
    with fastload.ShardWriter(dst, part=0, parts=2) as w:
        w.write({"__key__": "a", "txt": "x"})
    with pytest.raises(PackError, match="written already"):
        fastload.ShardWriter(dst, part=0, parts=2)
    w = fastload.ShardWriter(dst, part=1, parts=2, shard_size_bytes=4096)
    for s in samples(10):
        w.write(s)
    w._writer.abort(remove=False)  # (as if killed: its shards and journal stay)
    with fastload.ShardWriter(dst, part=1, parts=2, shard_size_bytes=4096) as w:
        for s in samples(3):
            w.write(s)
    fastload.ShardWriter.merge(dst)
    assert sorted(read_back(dst)) == ["a", *[s["__key__"] for s in samples(3)]]
    assert fastload.verify(str(dst)).ok


@pytest.mark.parametrize("fmt", ["tar", "parquet", "tfrecord"])
def test_round_trip_on_s3(moto_env: str, fmt: str) -> None:
    bucket = f"writer-{fmt}"
    boto3.client("s3", endpoint_url=moto_env, region_name="us-east-1").create_bucket(Bucket=bucket)
    given = samples(60)
    dst = f"s3://{bucket}/ds/"
    with fastload.ShardWriter(dst, format=fmt, shard_size_bytes=32 << 10, workers=2) as w:
        for s in given:
            w.write(s)
    assert w.report.shards > 2
    assert read_back(dst) == {s["__key__"]: encoded(s) for s in given}
    assert fastload.verify(dst).ok


def test_parts_and_abort_on_s3(moto_env: str) -> None:
    s3 = boto3.client("s3", endpoint_url=moto_env, region_name="us-east-1")
    s3.create_bucket(Bucket="writer-parts")
    dst = "s3://writer-parts/ds/"
    write_parts(dst, "tar", parts=2, n=15)  # (two processes uploading at once: neither aborts the other's)
    fastload.ShardWriter.merge(dst)
    assert read_back(dst) == {s["__key__"]: encoded(s) for s in samples(30)}
    with pytest.raises(KeyError), fastload.ShardWriter("s3://writer-parts/gone/", shard_size_bytes=4096) as w:
        for s in samples(20):
            w.write(s)
        raise KeyError("stop")
    assert s3.list_objects_v2(Bucket="writer-parts", Prefix="gone/").get("KeyCount", 0) == 0


def test_a_part_on_s3_leaves_the_other_parts_uploads_open(moto_env: str) -> None:
    s3 = boto3.client("s3", endpoint_url=moto_env, region_name="us-east-1")
    s3.create_bucket(Bucket="writer-uploads")
    other = s3.create_multipart_upload(Bucket="writer-uploads", Key="ds/shard-p00001-000000.tar")
    stale = s3.create_multipart_upload(Bucket="writer-uploads", Key="ds/shard-p00000-000003.tar")
    with fastload.ShardWriter("s3://writer-uploads/ds/", part=0, parts=2) as w:
        w.write({"__key__": "a", "txt": "x"})
    open_ids = {u["UploadId"] for u in s3.list_multipart_uploads(Bucket="writer-uploads").get("Uploads", [])}
    assert other["UploadId"] in open_ids  # part 1 may be uploading it right now
    assert stale["UploadId"] not in open_ids  # part 0's own leftover (a killed attempt) is aborted


def test_merge_from_the_command_line(tmp_path: Path) -> None:
    from .helpers import run_cli

    dst = tmp_path / "ds"
    write_parts_here(str(dst), "tar", parts=2, n=5, only=[1])
    proc = run_cli("merge", dst, check=1)
    assert "part(s) 0 of 2 are not finished" in proc.stderr
    write_parts_here(str(dst), "tar", parts=2, n=5, only=[0])
    proc = run_cli("merge", dst, check=True)
    assert "merged 2 part(s)" in proc.stdout and (dst / "index.json").exists()


KILLED_SCRIPT = textwrap.dedent(
    """
    import sys, fastload
    from tests.integration.writer_samples import samples
    w = fastload.ShardWriter(sys.argv[1], shard_size_bytes=8192)
    for s in samples(400):
        w.write(s)
    print("written", flush=True)
    sys.stdin.read()  # (killed here, before close)
    """
)


def test_a_killed_writer_leaves_no_dataset_and_a_clear_message(tmp_path: Path) -> None:
    import signal

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    dst = tmp_path / "ds"
    with subprocess.Popen(
        [sys.executable, "-c", KILLED_SCRIPT, str(dst)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "written"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    assert list(dst.glob("*.tar")) and not (dst / "index.json").exists()
    with pytest.raises(UnfinishedPackError):
        fastload.ShardDataset(str(dst), decode=False)
    with pytest.raises(PackError, match="holds an interrupted write"):
        fastload.ShardWriter(dst)
