"""A source file rewritten in place while pack reads it is never packed torn (part old, part new bytes):
pack notices (its size, mtime or ctime moved between open and the end of the read, as GNU tar checks) and
reads the sample again; a file that keeps changing is left out by name ("file changed as we read it") and the
pack fails unless skips are allowed. The rewrite is made deterministic by a hook in the read: the file is
rewritten, same size, after the first half of it was read."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import BinaryIO

import pytest

import fastload
from fastload.errors import PackError, SkippedInputError
from fastload.storage.listing import FileEntry, LocalSource

from .helpers import CLI_TIMEOUT_S, cli_env

OLD = b"o" * 300_000
NEW = b"N" * 300_000
PARQUET = {"shard_format": "parquet"}


class RewrittenMidRead(io.FileIO):
    """A local file that, at its first read, gives half of what was asked, then has the file rewritten in
    place by someone else (same size, new bytes): the rest of the read sees the new version."""

    rewrites: dict[str, int]  # path -> rewrites left

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        path = str(self.name)
        if self.rewrites.get(path, 0) > 0 and self.tell() == 0 and len(buffer) > 1:
            n = super().readinto(memoryview(buffer)[: len(buffer) // 2])
            self.rewrites[path] -= 1
            with open(path, "r+b") as other:
                other.write(NEW if self.rewrites[path] % 2 == 0 else OLD)
            return n or 0
        return super().readinto(buffer) or 0

    def readall(self) -> bytes:
        path = str(self.name)
        if self.rewrites.get(path, 0) > 0 and self.tell() == 0:
            first = os.read(self.fileno(), os.fstat(self.fileno()).st_size // 2)
            self.rewrites[path] -= 1
            with open(path, "r+b") as other:
                other.write(NEW if self.rewrites[path] % 2 == 0 else OLD)
            return first + super().readall()
        return super().readall()


@pytest.fixture
def rewritten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, int]]:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        (src / f"{i:02d}.bin").write_bytes(bytes([65 + i]) * 1000)
    target = src / "02b.bin"
    target.write_bytes(OLD)
    os.utime(target, ns=(10**18, 10**18))  # written long ago: a write now moves its mtime
    rewrites: dict[str, int] = {}

    def open_rewriting(self: LocalSource, entry: FileEntry) -> tuple[BinaryIO, int]:
        f = RewrittenMidRead(entry.path, "rb")
        f.rewrites = rewrites
        return f, os.fstat(f.fileno()).st_size  # type: ignore[return-value]

    monkeypatch.setattr(LocalSource, "open", open_rewriting)
    return src, rewrites


@pytest.mark.parametrize("shard_format", ["tar", "tfrecord", "parquet"])
def test_a_file_rewritten_while_read_is_read_again_whole(
    rewritten: tuple[Path, dict[str, int]], tmp_path: Path, shard_format: str
) -> None:
    src, rewrites = rewritten
    rewrites[str(src / "02b.bin")] = 1
    report = fastload.pack(src, tmp_path / "ds", shard_format=shard_format, workers=1, progress=False)
    assert not report.skipped and rewrites[str(src / "02b.bin")] == 0
    ds = fastload.MapDataset(tmp_path / "ds")
    samples = {s["__key__"]: s for s in (ds[i] for i in range(len(ds)))}
    assert bytes(samples["02b"]["bin"]) == NEW  # the new version, whole: not half of each


@pytest.mark.parametrize("shard_format", ["tar", "parquet"])
def test_a_file_that_keeps_changing_is_left_out_by_name(
    rewritten: tuple[Path, dict[str, int]], tmp_path: Path, shard_format: str
) -> None:
    src, rewrites = rewritten
    rewrites[str(src / "02b.bin")] = 100
    with pytest.raises(SkippedInputError) as info:
        fastload.pack(src, tmp_path / "ds", shard_format=shard_format, workers=1, progress=False)
    (skip,) = info.value.skipped
    assert skip.path == str(src / "02b.bin") and "file changed as we read it" in skip.reason, skip
    ds = fastload.MapDataset(tmp_path / "ds")
    assert sorted(ds[i]["__key__"] for i in range(len(ds))) == ["00", "01", "02", "03"]


def test_a_table_packs_file_column_is_read_again_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pack of a table reads each file column's file whole: checked the same way."""
    from fastload.storage import inputs

    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "a.bin").write_bytes(OLD)
    os.utime(folder / "a.bin", ns=(10**18, 10**18))
    (folder / "b.bin").write_bytes(b"b" * 10)
    (folder / "rows.jsonl").write_text('{"path": "a.bin"}\n{"path": "b.bin"}\n')
    rewrites = {str(folder / "a.bin"): 1}

    def open_rewriting(path: str, mode: str = "r", buffering: int = -1) -> RewrittenMidRead:
        f = RewrittenMidRead(path, mode.replace("b", ""))
        f.rewrites = rewrites
        return f

    monkeypatch.setattr(inputs, "open", open_rewriting, raising=False)
    fastload.pack(
        folder / "rows.jsonl", tmp_path / "ds", file_columns=["path=bin"], progress=False, **PARQUET
    )
    assert rewrites[str(folder / "a.bin")] == 0
    ds = fastload.MapDataset(tmp_path / "ds")
    values = sorted(bytes(ds[i]["bin"]) for i in range(len(ds)))
    assert values == sorted([b"b" * 10, NEW])
    rewrites[str(folder / "a.bin")] = 100
    with pytest.raises(SkippedInputError, match="file changed as we read it"):
        fastload.pack(
            folder / "rows.jsonl", tmp_path / "ds2", file_columns=["path=bin"], progress=False, **PARQUET
        )


def test_pack_tokens_stops_when_an_input_changes_while_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pack-tokens writes documents into shards as it reads them, so it cannot read a file again: a file
    that changed while read stops the pack, named."""
    from fastload.packing import token_inputs

    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(f'{{"input_ids": [{i}, {i + 1}]}}\n' for i in range(100)))
    os.utime(docs, ns=(10**18, 10**18))

    class Touched(io.FileIO):
        """Written to by someone else (its mtime moves) just after its first read."""

        touched = False

        def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
            n = super().readinto(buffer) or 0
            if not self.touched:
                self.touched = True
                os.utime(docs)
            return n

    def open_touching(path: str, mode: str = "r", buffering: int = -1) -> io.BufferedReader:
        return io.BufferedReader(Touched(path, "r"), 1 << 20)

    monkeypatch.setattr(token_inputs, "open", open_touching, raising=False)
    with pytest.raises(PackError, match=rf"{docs}: file changed as we read it"):
        fastload.pack_tokens(docs, tmp_path / "ds")


# The CLI run with one hook: each time pack has opened big.bin and asks for its first bytes, it asks a writer
# (another process, over two FIFOs) to rewrite the file in place and waits until it has; then it reads on.
CLI_WITH_HOOK = """
import io, runpy, sys
import fastload.storage.listing as listing

big, req, ack = sys.argv[1:4]
to_writer, from_writer = open(req, "wb", buffering=0), open(ack, "rb", buffering=0)

class Hooked(io.FileIO):
    asked = False

    def readinto(self, buffer):
        if self.name == big and not self.asked:
            self.asked = True
            to_writer.write(b"w")
            assert from_writer.read(1) == b"k", "the writer is gone"
        return super().readinto(buffer)

listing.open = lambda path, mode="r", buffering=-1: Hooked(path, "r")
sys.argv = ["fastload", *sys.argv[4:]]
runpy.run_module("fastload", run_name="__main__", alter_sys=True)
"""
WRITER = """
import os, sys
big, req, ack = sys.argv[1:4]
fd = os.open(big, os.O_WRONLY)
with open(req, "rb", buffering=0) as asks, open(ack, "wb", buffering=0) as answers:
    i = 0
    while asks.read(1):
        os.pwrite(fd, bytes([i % 256]) * 65536, (i * 65536) % (1 << 20)); i += 1
        answers.write(b"k")
"""


def test_the_cli_exits_non_zero_for_a_file_changing_while_packed(tmp_path: Path) -> None:
    """A real writer, in another process, rewriting a file in place each time pack has opened it and begun
    to read it (a hook in the CLI's process waits for the write: no race with the scheduler): every read
    sees a change, the file is left out by name and the pack exits 1."""
    import subprocess
    import sys

    src = tmp_path / "src"
    src.mkdir()
    big = src / "big.bin"
    big.write_bytes(os.urandom(1 << 20))
    req, ack = tmp_path / "req", tmp_path / "ack"
    os.mkfifo(req)
    os.mkfifo(ack)
    fifos = [str(big), str(req), str(ack)]
    writer = subprocess.Popen([sys.executable, "-c", WRITER, *fifos])
    try:
        cmd = [sys.executable, "-c", CLI_WITH_HOOK, *fifos, "pack", str(src), str(tmp_path / "ds"), "--quiet"]
        out = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            encoding="utf-8",
            env=cli_env(),
            timeout=CLI_TIMEOUT_S,
            check=False,
        )
    finally:
        writer.kill()
        writer.wait()
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"{big}: file changed as we read it" in out.stderr, out.stderr
