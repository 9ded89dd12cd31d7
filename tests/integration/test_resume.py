"""Killing a pack at any moment leaves no partial shard under a final name, and --resume finishes it into
exactly the bytes of an uninterrupted run."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from .helpers import cli_env, pack_cli, read_index, snapshot

PACK_OPTIONS = ("--workers", "1", "--shard-size", "64KiB")
STATE_DIR = ".fastload-pack"


def final_shards(dst: Path) -> list[Path]:
    return sorted(p for p in dst.glob("shard-*.tar"))


def kill_pack_midway(src: Path, dst: Path, *, after_shards: int, attempts: int = 3) -> None:
    """Run ``fastload pack`` in a subprocess and SIGKILL it once ``after_shards`` final shards exist but
    before ``index.json`` does."""
    for _ in range(attempts):
        if dst.exists():
            shutil.rmtree(dst)
        proc = subprocess.Popen(
            [sys.executable, "-m", "fastload", "pack", src, dst, "--quiet", *PACK_OPTIONS],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=cli_env(),
        )
        try:
            deadline = time.monotonic() + 60
            while proc.poll() is None and time.monotonic() < deadline:
                if dst.is_dir() and len(final_shards(dst)) >= after_shards:
                    proc.send_signal(signal.SIGKILL)
                    break
                time.sleep(0.0005)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()
        if proc.returncode == -signal.SIGKILL and not (dst / "index.json").exists():
            return
    pytest.fail(f"could not interrupt the pack of {src} in {attempts} attempts (it finished too fast)")


@pytest.fixture(scope="module")
def resume_setup(thousands_tree, tmp_path_factory):
    """The tree, its clean pack, and an interrupted pack of it (tests copy it before touching it)."""
    base = tmp_path_factory.mktemp("resume")
    tree = thousands_tree
    clean = base / "clean"
    pack_cli(tree.root, clean, *PACK_OPTIONS)
    interrupted = base / "interrupted"
    kill_pack_midway(tree.root, interrupted, after_shards=1)
    return tree, clean, interrupted


def copy_interrupted(interrupted: Path, to: Path) -> Path:
    shutil.copytree(interrupted, to, symlinks=True)
    return to


def linked_copy(src: Path, to: Path, *, real: str | None = None) -> Path:
    """The same tree at another place, cheaply: its top folders as symlinks (followed by the lister), except
    ``real``, copied with its files' sizes and times so that it can be changed."""
    to.mkdir()
    for child in src.iterdir():
        if child.name == real:
            shutil.copytree(child, to / child.name)
        else:
            (to / child.name).symlink_to(child)
    return to


@pytest.mark.parametrize("after_shards", [2, 60])
def test_killed_pack_leaves_only_complete_shards_and_resume_matches_clean_run(
    resume_setup, tmp_path, after_shards
):
    tree, clean, _ = resume_setup
    clean_files = snapshot(clean)
    total = len(read_index(clean)["shards"])
    assert total > after_shards + 20, "the tree must span many shards for the kill to land midway"

    dst = tmp_path / "dst"
    kill_pack_midway(tree.root, dst, after_shards=after_shards)
    present = final_shards(dst)
    assert after_shards <= len(present) < total
    assert (dst / STATE_DIR).is_dir()
    for shard in present:
        rel = shard.relative_to(dst).as_posix()
        assert shard.stat().st_size == len(clean_files[rel]), f"{rel} is partial"
        with tarfile.open(shard) as tf:
            members = tf.getmembers()  # reads to the end-of-archive blocks; raises on a truncated archive
        assert members
        assert shard.read_bytes() == clean_files[rel]

    identity = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in present}

    pack_cli(tree.root, dst, *PACK_OPTIONS, "--resume")
    assert snapshot(dst) == clean_files
    # docs/pack.md: "finished shards are kept". With one worker, at most the shard published just before the
    # kill can be missing from the journal; every other shard on disk must be kept, not rewritten.
    kept = [p for p in present if (p.stat().st_ino, p.stat().st_mtime_ns) == identity[p]]
    assert len(kept) >= len(present) - 1, (
        f"--resume rewrote {len(present) - len(kept)} of the {len(present)} shards finished before the kill"
    )


def test_resume_checks_the_sample_tables_of_kept_shards(resume_setup, tmp_path):
    """A journaled shard whose sample table is missing or damaged is written again (shard and table); the
    others are kept as they are; the result is the clean run's bytes."""
    tree, clean, _ = resume_setup
    dst = tmp_path / "dst"
    kill_pack_midway(tree.root, dst, after_shards=6)
    journaled = sorted(
        # a kill can leave atomic_write's hidden temporary file next to the records: not a record
        json.loads(p.read_bytes())["entry"]["name"]
        for p in (dst / STATE_DIR / "done").glob("[0-9]*.json")
    )
    assert len(journaled) >= 2
    missing, damaged, *others = [dst / name for name in journaled]
    Path(f"{missing}.fltable").unlink()
    table = Path(f"{damaged}.fltable")
    table.write_bytes(table.read_bytes()[:-1] + bytes([table.read_bytes()[-1] ^ 1]))
    identity = {p: p.stat().st_mtime_ns for p in [missing, damaged, *others]}
    pack_cli(tree.root, dst, *PACK_OPTIONS, "--resume")
    assert snapshot(dst) == snapshot(clean)
    assert missing.stat().st_mtime_ns != identity[missing] and damaged.stat().st_mtime_ns != identity[damaged]
    assert all(p.stat().st_mtime_ns == identity[p] for p in others), "shards with whole tables are kept"


def test_resume_refuses_when_the_source_changed(resume_setup, tmp_path):
    tree, _, interrupted = resume_setup
    src = linked_copy(tree.root, tmp_path / "src", real="part3")
    dst = copy_interrupted(interrupted, tmp_path / "dst")
    changed = src / "part3" / "000003.bin"
    changed.write_bytes(changed.read_bytes() + b"more")
    before = snapshot(dst)

    proc = pack_cli(src, dst, *PACK_OPTIONS, "--resume", check=1)
    assert "Traceback" not in proc.stderr
    assert str(dst) in proc.stderr and "changed" in proc.stderr
    assert snapshot(dst) == before, "a refused resume must not touch the destination"


def test_resume_refuses_when_the_options_changed(resume_setup, tmp_path):
    tree, _, interrupted = resume_setup
    dst = copy_interrupted(interrupted, tmp_path / "dst")
    proc = pack_cli(tree.root, dst, "--workers", "1", "--shard-size", "128KiB", "--resume", check=1)
    assert "changed" in proc.stderr and str(dst) in proc.stderr
    assert not (dst / "index.json").exists()


def test_resume_from_an_unchanged_copy_of_the_source_succeeds(resume_setup, tmp_path):
    """Only content, names, sizes and times matter, not where the source folder lives."""
    tree, clean, interrupted = resume_setup
    src = linked_copy(tree.root, tmp_path / "src", real="part3")  # the control for the test above
    dst = copy_interrupted(interrupted, tmp_path / "dst")
    pack_cli(src, dst, *PACK_OPTIONS, "--resume")
    assert snapshot(dst) == snapshot(clean)


def test_pack_into_interrupted_folder_without_resume_is_refused_with_a_hint(resume_setup, tmp_path):
    tree, _, interrupted = resume_setup
    dst = copy_interrupted(interrupted, tmp_path / "dst")
    before = snapshot(dst)
    proc = pack_cli(tree.root, dst, *PACK_OPTIONS, check=1)
    assert "not empty" in proc.stderr and "--resume" in proc.stderr and str(dst) in proc.stderr
    assert "Traceback" not in proc.stderr
    assert snapshot(dst) == before


def test_pack_into_unrelated_non_empty_folder_is_refused_without_resume_hint(rich_tree, tmp_path):
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "notes.txt").write_text("keep me")
    proc = pack_cli(rich_tree.root, dst, check=1)
    assert "not empty" in proc.stderr and str(dst) in proc.stderr
    assert "--resume" not in proc.stderr
    assert snapshot(dst) == {"notes.txt": b"keep me"}


def test_resume_on_a_completed_pack_is_a_no_op(rich_tree, tmp_path):
    dst = tmp_path / "dst"
    pack_cli(rich_tree.root, dst, "--shard-size", "16KiB")
    before = snapshot(dst)
    times = {p: p.stat().st_mtime_ns for p in dst.rglob("*")}
    proc = pack_cli(rich_tree.root, dst, "--shard-size", "16KiB", "--resume")
    assert proc.returncode == 0
    assert snapshot(dst) == before
    assert {p: p.stat().st_mtime_ns for p in dst.rglob("*")} == times, "nothing may be rewritten"


def test_resume_on_a_completed_pack_of_other_options_is_refused(rich_tree, tmp_path):
    dst = tmp_path / "dst"
    pack_cli(rich_tree.root, dst, "--shard-size", "16KiB")
    before = snapshot(dst)
    proc = pack_cli(rich_tree.root, dst, "--shard-size", "32KiB", "--resume", check=1)
    assert str(dst) in proc.stderr
    assert snapshot(dst) == before


def test_resume_into_a_new_folder_packs_normally(rich_tree, tmp_path):
    pack_cli(rich_tree.root, tmp_path / "a", "--resume")
    pack_cli(rich_tree.root, tmp_path / "b")
    assert snapshot(tmp_path / "a") == snapshot(tmp_path / "b")


class _Job:
    """A stand-in shard job: writes a few bytes after a short pause; job ``fail`` raises instead."""

    shard_format = "tar"

    def __init__(self, number: int, fail: int, written: list[int]) -> None:
        self.number, self.name, self.fail, self.written = number, f"s-{number:06d}.bin", fail, written

    def write(self, tmp_path: str, *, on_sample, open_threads: int):
        from fastload.core.index import ShardEntry
        from fastload.formats.shard import ShardResult

        time.sleep(0.01)
        if self.number == self.fail:
            raise OSError(f"job {self.number} failed")
        Path(tmp_path).write_bytes(b"x" * (self.number + 1))
        self.written.append(self.number)
        return ShardResult(ShardEntry(name=self.name, bytes=self.number + 1, checksum="", keys=[]))

    def local_folders(self) -> set[str]:
        return set()


def test_local_engine_stops_at_a_writer_error_and_holds_few_jobs_ahead(tmp_path):
    from fastload.packing.dest import LocalDestination
    from fastload.packing.engine import LocalEngine
    from fastload.packing.journal import PackJournal

    dest = LocalDestination(str(tmp_path / "dst"), STATE_DIR)
    dest.prepare()
    journal = PackJournal(dest)
    journal.start("fingerprint", None)
    written: list[int] = []
    unfinished_at_make: list[int] = []
    made = 0

    def jobs():
        nonlocal made
        for n in range(40):
            unfinished_at_make.append(made - len(written))
            made += 1
            yield _Job(n, 6, written)

    done: dict[int, object] = {}
    with pytest.raises(OSError, match="job 6 failed"):
        LocalEngine(dest, journal, workers=3).write(jobs(), advance=lambda b, f: None, done=done.__setitem__)
    assert made < 40, "no job is taken after a writer failed"
    assert max(unfinished_at_make) <= 3, "at most `workers` jobs exist at once (one being made)"
    assert set(done) <= set(written) and 6 not in written
    assert set(journal.finished()) == set(written), "every published shard is journaled, nothing else"
    for n in written:
        assert (tmp_path / "dst" / f"s-{n:06d}.bin").read_bytes() == b"x" * (n + 1)
        assert (tmp_path / "dst" / f"s-{n:06d}.bin.fltable").is_file(), "each shard's sample table beside it"
