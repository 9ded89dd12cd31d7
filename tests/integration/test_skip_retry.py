"""A pack that ended with skipped inputs is not complete: ``--resume`` retries them once they are fixed
(writing again only the shards they belong to) and gives, byte for byte, what a fresh pack of today's
files gives; while skips remain the exit status stays 1 unless ``--allow-skip``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import fastload
from fastload.errors import PackError, SkippedInputError
from fastload.storage import listing

from .helpers import cli_env, snapshot

FILES = {
    f"s/{i:04d}.{f}": (b"%s-%d-" % (f.encode(), i)) * (i * 53 + 1) for i in range(24) for f in ("cls", "jpg")
}
SMALL = ("--quiet", "--shard-size", "8192")
OPTIONS = {"workers": 2, "shard_size_bytes": 8192, "progress": False}


def _tree(root: Path) -> Path:
    for rel, data in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


def _shards_changed(before: dict[str, bytes], after: dict[str, bytes]) -> set[str]:
    return {n for n in after if n.endswith((".tar", ".parquet")) and before.get(n) != after[n]}


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_resume_retries_a_sample_skipped_while_writing_once_its_file_is_back(tmp_path, monkeypatch, fmt):
    root = _tree(tmp_path / "src")
    bad = root / "s/0011.jpg"
    away = tmp_path / "away.jpg"
    original_open = listing.LocalSource.open

    def vanishing_open(self, entry):  # the file is moved away after it was listed (a real ENOENT)
        if entry.path == str(bad) and bad.exists():
            os.rename(bad, away)
        return original_open(self, entry)

    dst = tmp_path / "dst"
    options = {**OPTIONS, "shard_format": fmt}
    monkeypatch.setattr(listing.LocalSource, "open", vanishing_open)
    with pytest.raises(SkippedInputError) as info:
        fastload.pack(str(root), dst, **options)
    monkeypatch.undo()
    assert info.value.written is True and [s.path for s in info.value.skipped] == [str(bad)]
    first = snapshot(dst)

    # Still gone: resuming cannot complete it; it says so and keeps exit-1 semantics (the plan changed).
    with pytest.raises(PackError, match="left out 1 input"):
        fastload.pack(str(root), dst, resume=True, **options)

    os.rename(away, bad)  # fixed (rename keeps the mtime: the same file as planned)
    report = fastload.pack(str(root), dst, resume=True, **options)
    assert report.skipped == [] and not report.already_complete
    assert report.shards_written == 1 and report.shards_kept == len(report.index.shards) - 1
    fresh = tmp_path / "fresh"
    fastload.pack(str(root), fresh, **options)
    assert snapshot(dst) == snapshot(fresh), "a resumed pack must equal a fresh pack of today's files"
    assert len(_shards_changed(first, snapshot(dst))) == 1, "only the skipped file's shard is written again"
    assert fastload.verify(dst).ok
    # and now it is complete
    assert fastload.pack(str(root), dst, resume=True, **options).already_complete


def test_a_killed_retry_resumes_like_any_interrupted_pack(tmp_path, monkeypatch):
    root = _tree(tmp_path / "src")
    bad = root / "s/0003.cls"
    original_open = listing.LocalSource.open

    def failing_open(self, entry):
        if entry.path == str(bad):
            raise PermissionError(13, "Permission denied", entry.path)
        return original_open(self, entry)

    dst = tmp_path / "dst"
    monkeypatch.setattr(listing.LocalSource, "open", failing_open)
    fastload.pack(str(root), dst, allow_skip=True, **OPTIONS)
    monkeypatch.undo()

    class Killed(Exception):
        pass

    def killed_open(self, entry):
        raise Killed

    monkeypatch.setattr(listing.LocalSource, "open", killed_open)
    with pytest.raises(Killed):
        fastload.pack(str(root), dst, resume=True, **OPTIONS)
    monkeypatch.undo()
    assert not (dst / "index.json").exists(), "no index may describe shards that are being replaced"
    fastload.pack(str(root), dst, resume=True, **OPTIONS)
    fresh = tmp_path / "fresh"
    fastload.pack(str(root), fresh, **OPTIONS)
    assert snapshot(dst) == snapshot(fresh)


# --- as the issue found it: a file of mode 0, packed by a process that may not read it --------------------
# As root, `setpriv` drops the capabilities that bypass file permissions (see test_bad_input.py).


def _fastload(*args: str | Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "fastload", *(os.fspath(a) for a in args)]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv (util-linux): cannot make a file unreadable")
        cmd = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, env=cli_env(), timeout=120)


def test_unreadable_file_reported_before_writing_and_retried_by_resume_once_fixed(tmp_path):
    root = _tree(tmp_path / "src")
    (root / "t").mkdir()
    (root / "t/0001.jpg").write_bytes(b"a")
    (root / "t/0001.jpg").chmod(0)
    (root / "t/0002").write_bytes(b"no extension")  # other problems: all are named in one run
    (root / "t/.DS_Store").write_bytes(b"finder")  # (a problem only with --include-hidden)
    bad = f"{root}/s/0007.jpg"
    os.chmod(bad, 0)
    dst = tmp_path / "dst"

    strict = _fastload("pack", root, dst, *SMALL, "--include-hidden")
    assert strict.returncode == 1, strict.stdout + strict.stderr
    for problem in (bad, f"{root}/t/0001.jpg", f"{root}/t/0002", f"{root}/t/.DS_Store"):
        assert problem in strict.stderr
    assert "permission denied" in strict.stderr and "nothing was written" in strict.stderr
    assert not dst.exists() or not any(dst.iterdir())

    os.chmod(root / "t/0001.jpg", 0o644)
    (root / "t/0002").unlink()
    allowed = _fastload("pack", root, dst, *SMALL, "--allow-skip")
    assert allowed.returncode == 0, allowed.stderr
    assert bad in allowed.stdout
    # without --resume the destination is not empty: the message says what --resume would do
    plain = _fastload("pack", root, dst, *SMALL, "--allow-skip")
    assert plain.returncode == 1 and "left out 1 input(s): pass --resume to retry" in plain.stderr
    # still unreadable: --resume refuses (exit 1) naming it; with --allow-skip it is accepted
    again = _fastload("pack", root, dst, *SMALL, "--resume")
    assert again.returncode == 1 and bad in again.stderr, again.stdout + again.stderr
    accepted = _fastload("pack", root, dst, *SMALL, "--resume", "--allow-skip")
    assert accepted.returncode == 0, accepted.stderr
    assert bad in accepted.stdout

    os.chmod(bad, 0o644)
    fixed = _fastload("pack", root, dst, *SMALL, "--resume")
    assert fixed.returncode == 0, fixed.stderr
    assert "skipped nothing" in fixed.stdout and "resumed: kept" in fixed.stdout
    fresh = tmp_path / "fresh"
    assert _fastload("pack", root, fresh, *SMALL).returncode == 0
    assert snapshot(dst) == snapshot(fresh)
