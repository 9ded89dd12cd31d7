"""A destination that fails writes (full, over quota, I/O errors) stops the pack naming the destination (for
S3, the local staging folder), never a source file; nothing inconsistent is published; ``--resume`` once
there is room again gives the bytes of an uninterrupted pack. Failures are injected in-process (a disk that
fills after so many bytes, with a partial last write, as a real one does) and, where this machine lets root
mount one, with a real small tmpfs."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import pyarrow.parquet as pq
import pytest

import fastload
from fastload.copy import copy
from fastload.errors import DestinationWriteError

from .helpers import snapshot

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"shard_size_bytes": 16 << 10, "workers": 1, "progress": False}


class FullDisk:
    """``os.write`` to files under ``folder`` takes room from ``room`` bytes: the write that meets the end
    writes what fits, the next raises ENOSPC (as a full file system does). Other files are untouched."""

    def __init__(self, folder: Path, room: int) -> None:
        self.folder = str(folder)
        self.room = room
        self.failed = 0
        self._write = os.write

    def __call__(self, fd: int, data: bytes | memoryview) -> int:
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            path = ""
        if not path.startswith(self.folder + os.sep):
            return self._write(fd, data)
        if self.room <= 0:
            self.failed += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = self._write(fd, memoryview(data)[: self.room])
        self.room -= n
        return n


@contextlib.contextmanager
def full_disk(monkeypatch: pytest.MonkeyPatch, folder: Path, room: int) -> Iterator[FullDisk]:
    disk = FullDisk(folder, room)
    with monkeypatch.context() as m:
        m.setattr(os, "write", disk)
        yield disk


@pytest.mark.parametrize("shard_format", ["tar", "tfrecord"])
@pytest.mark.parametrize("allow_skip", [False, True])
def test_a_full_destination_stops_the_pack_and_resume_finishes_it(
    many_tree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shard_format: str, allow_skip: bool
) -> None:
    options = {**SMALL, "shard_format": shard_format}
    clean = tmp_path / "clean"
    fastload.pack(many_tree.root, clean, **options)
    dst = tmp_path / "dst"
    disk_full = full_disk(monkeypatch, dst, room=40_000)  # two shards and a half
    with disk_full as disk, pytest.raises(DestinationWriteError) as info:
        fastload.pack(many_tree.root, dst, allow_skip=allow_skip, **options)
    assert disk.failed == 1  # the first failure stopped the pack
    error = info.value
    message = str(error)
    assert error.errno == errno.ENOSPC and isinstance(error, OSError)
    assert f"cannot write to {dst}: no space left on the device" in message, message
    assert "--resume" in message and str(many_tree.root) not in message, message
    assert not (dst / "index.json").exists()
    published = sorted(p.name for p in dst.iterdir() if not p.name.startswith("."))
    assert published, "the shards finished before the disk filled are kept"
    for name in published:  # each whole, as in an uninterrupted pack: no shard cut short or padded
        assert (dst / name).read_bytes() == (clean / name).read_bytes(), name
    assert not list((dst / ".fastload-pack" / "tmp").iterdir()), "the shard being written is removed"

    report = fastload.pack(many_tree.root, dst, resume=True, **options)
    assert report.shards_kept and not report.skipped
    assert snapshot(dst) == snapshot(clean)


def test_a_failing_parquet_write_names_the_destination(
    many_tree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyarrow writes Parquet itself: its OSError (EIO here) is the destination's, for pack, pack of tables
    and pack-tokens alike; resume then finishes to the bytes of an uninterrupted pack."""
    options = {**SMALL, "shard_format": "parquet", "row_group_bytes": 4096}
    clean = tmp_path / "clean"
    fastload.pack(many_tree.root, clean, **options)
    real = pq.ParquetWriter.write_table
    calls = [0]

    def failing(self: pq.ParquetWriter, *args: object, **kwargs: object) -> None:
        calls[0] += 1
        if calls[0] == 12:
            raise OSError(errno.EIO, "Input/output error")
        real(self, *args, **kwargs)

    dst = tmp_path / "dst"
    monkeypatch.setattr(pq.ParquetWriter, "write_table", failing)
    with pytest.raises(DestinationWriteError, match=rf"cannot write to {dst}: input/output error") as info:
        fastload.pack(many_tree.root, dst, **options)
    assert "--resume" in str(info.value)
    assert not (dst / "index.json").exists() and not (dst / "_fastload" / "index.json").exists()

    table = tmp_path / "rows.jsonl"
    table.write_text("".join(f'{{"id": {i}, "text": "{"x" * 50}"}}\n' for i in range(400)))
    calls[0] = 10
    with pytest.raises(DestinationWriteError, match=rf"cannot write to {tmp_path / 'rows'}: "):
        fastload.pack(table, tmp_path / "rows", **options)

    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(f'{{"input_ids": {list(range(i % 50 + 1))}}}\n' for i in range(400)))
    calls[0] = 10
    with pytest.raises(DestinationWriteError, match=rf"cannot write to {tmp_path / 'tokens'}: "):
        fastload.pack_tokens(docs, tmp_path / "tokens", shard_size_bytes=4096, row_group_bytes=1024)

    monkeypatch.undo()
    fastload.pack(many_tree.root, dst, resume=True, **options)
    assert snapshot(dst) == snapshot(clean)


@pytest.fixture
def moto_env(moto_env: str) -> str:
    """conftest's, with this file's bucket."""
    boto3.client("s3", endpoint_url=moto_env, region_name="us-east-1").create_bucket(Bucket="writefaults")
    return moto_env


def test_a_full_staging_folder_is_named_not_the_bucket(
    many_tree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto_env: str
) -> None:
    """A pack to S3 writes each shard in a local staging folder ($TMPDIR) first: when that is full, the
    message says so, and how to point it elsewhere, instead of blaming the bucket."""
    staging = tmp_path / "tmpdir"
    staging.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(staging))
    url = "s3://writefaults/full-staging"
    with full_disk(monkeypatch, staging, room=40_000), pytest.raises(DestinationWriteError) as info:
        fastload.pack(many_tree.root, url, allow_skip=True, **SMALL)
    message = str(info.value)
    assert f"cannot write to the local staging folder {staging}/fastload-pack-" in message, message
    assert f"of the pack to {url}/: no space left on the device" in message, message
    assert "TMPDIR" in message and "--resume" in message and str(many_tree.root) not in message, message
    assert info.value.staging is not None and info.value.staging.startswith(str(staging))
    assert not list(staging.iterdir()), "the staging folder is removed"
    clean = tmp_path / "clean"
    fastload.pack(many_tree.root, clean, **SMALL)
    fastload.pack(many_tree.root, url, resume=True, **SMALL)
    copy(f"{url}/", str(tmp_path / "back"), recursive=True, progress=False)
    assert snapshot(tmp_path / "back") == snapshot(clean)


def _can_unshare_mount() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=30).returncode == 0


# One big sample (2.4 MB) into a 1 MiB tmpfs: the shard's write fails part-way, after a partial write.
SMALL_TMPFS = """
set -u
mount -t tmpfs -o size=1m tmpfs "$MNT" || exit 90
"$PY" -m fastload pack "$SRC" "$MNT/ds" --quiet --allow-skip; echo "rc1=$?"
ls -A "$MNT/ds" | sed 's/^/LS /'
mount -o remount,size=20m "$MNT"
"$PY" -m fastload pack "$SRC" "$MNT/ds" --quiet --allow-skip --resume; echo "rc2=$?"
diff -r "$MNT/ds" "$CLEAN" && echo same
umount "$MNT"
mount -t tmpfs -o size=1m tmpfs "$MNT"
TMPDIR="$MNT" "$PY" -m fastload pack "$SRC" s3://writefaults/tmpfs-staging --quiet; echo "rc3=$?"
"$PY" -m fastload pack "$SRC" "$MNT/pq" --format parquet --quiet --allow-skip; echo "rc4=$?"
ls -A "$MNT/pq" | sed 's/^/PQ /'
umount "$MNT"
"""


@pytest.mark.skipif(not _can_unshare_mount(), reason="needs root and unshare -m (a small tmpfs)")
def test_a_real_full_file_system(tmp_path: Path, moto_env: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"{i:03d}.bin").write_bytes(os.urandom(800_000))
    clean = tmp_path / "clean"
    fastload.pack(src, clean, progress=False)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PY": sys.executable,
        "SRC": str(src),
        "MNT": str(mnt),
        "CLEAN": str(clean),
    }
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", SMALL_TMPFS], capture_output=True, text=True, env=env, timeout=300
    )
    out, err = proc.stdout, proc.stderr
    if proc.returncode == 90:
        pytest.skip(f"mounting a tmpfs is not permitted here: {err.strip()}")
    assert "rc1=1" in out, out + err  # not 0: --allow-skip is about sources, not a full destination
    assert f"cannot write to {mnt}/ds: no space left on the device" in err, err
    assert str(src) not in err and "Traceback" not in err, err
    listed = [line[3:] for line in out.splitlines() if line.startswith("LS ")]
    assert listed == [".fastload-pack"], listed  # no shard, no index.json
    assert "rc2=0" in out and "same" in out, out + err
    assert "rc3=1" in out, out + err
    assert f"cannot write to the local staging folder {mnt}/fastload-pack-" in err, err
    assert "point TMPDIR at a larger disk" in err, err
    assert "rc4=1" in out and f"cannot write to {mnt}/pq: no space left on the device" in err, out + err
    assert [line[3:] for line in out.splitlines() if line.startswith("PQ ")] == [".fastload-pack"], out


def test_the_errors_pickle_whole() -> None:
    """A Ray task's DestinationWriteError reaches the driver pickled: type, errno and message intact."""
    import pickle

    from fastload.errors import UnfinishedPackError, write_error

    error = write_error(OSError(errno.EDQUOT, "Disk quota exceeded"), "/stage/000001.part").at(
        destination="s3://b/p/", staging="/stage"
    )
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is DestinationWriteError and isinstance(back, OSError)
    assert (back.errno, back.staging, str(back)) == (errno.EDQUOT, "/stage", str(error))
    assert "the disk quota is used up" in str(back) and "TMPDIR" in str(back)
    unfinished = pickle.loads(pickle.dumps(UnfinishedPackError("s3://b/p")))
    assert unfinished.url == "s3://b/p" and "--resume" in str(unfinished)
