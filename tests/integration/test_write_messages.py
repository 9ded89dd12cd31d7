"""Messages of the write side name what failed: ``cp`` into a full disk names the file it was writing, and
a name holding a newline (or another control character) is printed escaped, never raw."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import Any

import boto3
import pytest

import fastload.copy  # noqa: F401 - (sys.modules: the package's `copy` attribute is the function)
from fastload.cli import main

from .helpers import run_cli


class _FullFile:
    """A buffered file over a disk with ``room`` bytes left: the write that meets the end writes what fits
    and raises ENOSPC (a buffered writer writes all or raises)."""

    def __init__(self, f: Any, room: int) -> None:
        self.f, self.room = f, room

    def write(self, data: Any) -> int:
        n = self.f.write(memoryview(data)[: max(0, self.room)])
        self.room -= n
        if n < len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return n

    def __enter__(self) -> _FullFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.f.close()


def test_cp_into_a_full_disk_names_the_file(
    moto_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    client = boto3.client("s3", endpoint_url=moto_env, region_name="us-east-1")
    client.create_bucket(Bucket="cpfull")
    client.put_object(Bucket="cpfull", Key="big.bin", Body=os.urandom(300_000))
    real = os.fdopen
    out = tmp_path / "out"
    out.mkdir()

    def fdopen(fd: int, *args: Any, **kwargs: Any) -> Any:
        f = real(fd, *args, **kwargs)
        return _FullFile(f, 100_000) if str(out) in os.readlink(f"/proc/self/fd/{fd}") else f

    monkeypatch.setattr(os, "fdopen", fdopen)
    assert main(["cp", "s3://cpfull/big.bin", str(out / "big.bin")]) == 1
    err = capsys.readouterr().err
    assert f"cannot write {out / 'big.bin'}: no space left on the device" in err, err
    assert "free some space" in err and not list(out.iterdir()), err


def test_a_newline_in_a_name_is_printed_escaped(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "good.bin").write_bytes(b"x" * 100)
    (src / "bad\nname.bin").symlink_to(tmp_path / "nowhere")  # a broken link: skipped, by name
    proc = run_cli("pack", src, tmp_path / "ds", "--quiet")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert repr(str(src / "bad\nname.bin")) in proc.stderr, proc.stderr
    assert not any(line.startswith("name.bin") for line in proc.stderr.splitlines()), proc.stderr


def test_an_os_error_without_a_name_has_no_dangling_colon(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(sys.modules["fastload.copy"], "copy", full)
    assert main(["cp", "s3://b/k", "out"]) == 1
    assert capsys.readouterr().err == "fastload cp: No space left on device\n"

    def named(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "out/bad\nname")

    monkeypatch.setattr(sys.modules["fastload.copy"], "copy", named)
    assert main(["cp", "s3://b/k", "out"]) == 1
    assert capsys.readouterr().err == "fastload cp: No space left on device: 'out/bad\\nname'\n"
