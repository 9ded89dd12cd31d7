"""``fastload pack-tokens`` on the pack pipeline: parallel writers give the same bytes as one, a killed run
continued with ``--resume`` gives the bytes of an uninterrupted one, and ``--resume`` refuses changed inputs
or options without touching the destination."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import fastload
from fastload.errors import PackError
from fastload.packing.token_docs import Chunk
from fastload.packing.token_shards import ShardCutter, TokenGroup

from .conftest import write_jsonl
from .helpers import documents, lognormal_lengths

OPTIONS = ("--shard-size", "4KiB", "--row-group-size", "1KiB")
STATE_DIR = ".fastload-pack"


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones included): relative path -> bytes."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def cli(*args: str | os.PathLike[str], check: int = 0) -> subprocess.CompletedProcess[str]:
    """``python -m fastload pack-tokens ARGS`` in a subprocess, asserting its exit status."""
    proc = subprocess.run(
        [sys.executable, "-m", "fastload", "pack-tokens", *(os.fspath(a) for a in args)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
        timeout=300,
    )
    assert proc.returncode == check, proc.stderr
    return proc


def shards(dst: Path) -> list[Path]:
    return sorted(dst.glob("shard-*.parquet"))


def kill_midway(src: Path, dst: Path, *, after_shards: int, attempts: int = 3) -> None:
    """Run pack-tokens with one writer and SIGKILL it once ``after_shards`` shards exist, before
    ``index.json`` does."""
    for _ in range(attempts):
        if dst.exists():
            shutil.rmtree(dst)
        proc = subprocess.Popen(
            [sys.executable, "-m", "fastload", "pack-tokens", src, dst, *OPTIONS, "--workers", "1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 120
            while proc.poll() is None and time.monotonic() < deadline:
                if dst.is_dir() and len(shards(dst)) >= after_shards:
                    proc.send_signal(signal.SIGKILL)
                    break
                time.sleep(0.0005)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if proc.returncode == -signal.SIGKILL and not (dst / "_fastload" / "index.json").exists():
            return
    pytest.fail(f"could not interrupt pack-tokens of {src} in {attempts} attempts (it finished too fast)")


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six JSONL files of 400 documents each: about 400 4 KiB shards."""
    root = tmp_path_factory.mktemp("tokens-resume") / "src"
    rng = np.random.default_rng(5)
    docs = [rng.integers(0, 50_000, n) for n in lognormal_lengths(2400, seed=5, median=50, cap=600)]
    for i in range(6):
        write_jsonl(root / f"part{i}.jsonl", docs[i * 400 : (i + 1) * 400])
    return root


@pytest.fixture(scope="module")
def clean(src: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """An uninterrupted run's output (one writer)."""
    dst = tmp_path_factory.mktemp("tokens-clean") / "dst"
    cli(src, dst, *OPTIONS, "--workers", "1")
    return snapshot(dst)


def test_one_writer_and_three_writers_give_the_same_bytes(
    src: Path, clean: dict[str, bytes], tmp_path
) -> None:
    cli(src, tmp_path / "3", *OPTIONS, "--workers", "3")
    three = snapshot(tmp_path / "3")
    assert len([n for n in clean if n.endswith(".parquet")]) > 100, (
        "many shards, or parallelism means nothing"
    )
    assert three == clean
    assert not (tmp_path / "3" / STATE_DIR).exists()
    assert fastload.verify(tmp_path / "3").ok


@pytest.mark.parametrize("after_shards", [3, 60])
def test_killed_run_resumed_gives_the_bytes_of_an_uninterrupted_run(
    src: Path, clean: dict[str, bytes], tmp_path: Path, after_shards: int
) -> None:
    dst = tmp_path / "dst"
    kill_midway(src, dst, after_shards=after_shards)
    present = shards(dst)
    total = len([n for n in clean if n.endswith(".parquet")])
    assert after_shards <= len(present) < total
    assert (dst / STATE_DIR).is_dir()
    for shard in present:  # published whole or not at all
        assert shard.read_bytes() == clean[shard.name], f"{shard.name} is partial"
    identity = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in present}

    proc = cli(src, dst, *OPTIONS, "--resume", "--workers", "3")
    assert "resumed: kept" in proc.stdout
    assert snapshot(dst) == clean
    # with one writer, at most the shard published just before the kill can be missing from the journal
    kept = [p for p in present if (p.stat().st_ino, p.stat().st_mtime_ns) == identity[p]]
    assert len(kept) >= len(present) - 1, f"--resume rewrote {len(present) - len(kept)} finished shards"


@pytest.fixture(scope="module")
def interrupted(src: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("tokens-interrupted") / "dst"
    kill_midway(src, dst, after_shards=3)
    return dst


def test_resume_refuses_changed_inputs(src: Path, interrupted: Path, tmp_path: Path) -> None:
    changed = tmp_path / "src"
    shutil.copytree(src, changed)
    with (changed / "part2.jsonl").open("a") as f:
        f.write(json.dumps({"input_ids": [1, 2, 3]}) + "\n")
    dst = tmp_path / "dst"
    shutil.copytree(interrupted, dst)
    before = snapshot(dst)
    proc = cli(changed, dst, *OPTIONS, "--resume", check=1)
    assert "changed" in proc.stderr and str(dst) in proc.stderr and "Traceback" not in proc.stderr
    assert snapshot(dst) == before, "a refused resume must not touch the destination"


def test_resume_refuses_changed_options(src: Path, interrupted: Path, tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    shutil.copytree(interrupted, dst)
    before = snapshot(dst)
    for other in (
        ("--shard-size", "8KiB", "--row-group-size", "1KiB"),
        (*OPTIONS, "--dtype", "int32", "--vocab-size", "1000000000"),
        (*OPTIONS, "--compression", "zstd"),
    ):
        proc = cli(src, dst, *other, "--resume", check=1)
        assert "changed" in proc.stderr and str(dst) in proc.stderr
    assert snapshot(dst) == before


def test_without_resume_an_interrupted_destination_is_refused_with_a_hint(
    src: Path, interrupted: Path, tmp_path: Path
) -> None:
    dst = tmp_path / "dst"
    shutil.copytree(interrupted, dst)
    proc = cli(src, dst, *OPTIONS, check=1)
    assert "not empty" in proc.stderr and "--resume" in proc.stderr


def test_resume_of_a_finished_pack_is_a_no_op_and_other_options_are_refused(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", documents([30] * 200))
    dst = tmp_path / "ds"
    fastload.pack_tokens(tmp_path / "a.jsonl", dst, shard_size_bytes=4096, row_group_bytes=1024)
    before = snapshot(dst)
    times = {p: p.stat().st_mtime_ns for p in dst.rglob("*")}
    report = fastload.pack_tokens(
        tmp_path / "a.jsonl", dst, shard_size_bytes=4096, row_group_bytes=1024, resume=True
    )
    assert report.already_complete and report.documents == 200 and "nothing to do" in report.summary()
    assert snapshot(dst) == before and {p: p.stat().st_mtime_ns for p in dst.rglob("*")} == times
    with pytest.raises(PackError, match="finished pack of other files or options"):
        fastload.pack_tokens(tmp_path / "a.jsonl", dst, shard_size_bytes=8192, resume=True)
    assert snapshot(dst) == before
    fresh = fastload.pack_tokens(tmp_path / "a.jsonl", tmp_path / "new", shard_size_bytes=4096, resume=True)
    assert not fresh.already_complete and fresh.documents == 200, "--resume into a new folder packs normally"


def test_shard_cuts_do_not_depend_on_how_documents_arrive_in_chunks() -> None:
    """Input chunk boundaries (files, 4,096-document reads) never move a row group or shard cut."""
    lengths = np.array(lognormal_lengths(700, seed=11, median=40, cap=900), dtype=np.int64)
    ids = np.arange(int(lengths.sum()), dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(lengths)))

    def cut(bounds: list[int]) -> list[tuple[int, list[list[str]], bytes]]:
        cutter = ShardCutter(dtype=np.dtype("<i4"), row_group_bytes=1000, shard_size_bytes=4096)
        groups = []
        for a, b in itertools.pairwise(bounds):
            chunk = Chunk(
                [f"d{i}" for i in range(a, b)], list(range(a, b)), ids[offsets[a] : offsets[b]], lengths[a:b]
            )
            groups += cutter.add(chunk)
        groups += cutter.finish()
        assert cutter.shards == groups[-1][0] + 1
        shards: dict[int, list[TokenGroup]] = {}
        for n, g in groups:
            shards.setdefault(n, []).append(g)
        return [
            (n, [g.keys for g in gs], b"".join(g.values.tobytes() for g in gs)) for n, gs in shards.items()
        ]

    whole = cut([0, 700])
    rng = np.random.default_rng(0)
    for _ in range(5):
        bounds = sorted({0, 700, *rng.integers(1, 700, 30).tolist()})
        assert cut(bounds) == whole
    assert cut(list(range(701))) == whole
    assert [n for n, _, _ in whole] == list(range(len(whole))) and len(whole) > 10
    keys = [k for _, groups, _ in whole for g in groups for k in g]
    assert keys == [f"d{i}" for i in range(700)], "every document once, in order"
    for _, groups, _ in whole:
        sizes = [4 * int(lengths[[int(k[1:]) for k in g]].sum()) for g in groups]
        assert all(s <= 1000 or len(g) == 1 for s, g in zip(sizes, groups, strict=True))
        assert sum(sizes) <= 4096 or len(groups) == 1


class _Stop(BaseException):
    """Not an Exception: passes every handler, as Ctrl-C would."""


def test_a_reader_failure_mid_shard_stops_the_writers_and_leaves_a_resumable_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tok.py").write_text(
        "calls = 0\n"
        "def encode(text):\n"
        "    global calls\n"
        "    calls += 1\n"
        "    if calls == 6000:\n"
        "        raise STOP\n"
        "    return [ord(c) for c in text]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tok", raising=False)
    import tok  # type: ignore[import-not-found]

    tok.STOP = _Stop()
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"text": "x" * 50}) + "\n" for _ in range(10_000)))
    dst = tmp_path / "ds"
    began = time.monotonic()
    with pytest.raises(_Stop):
        fastload.pack_tokens(
            tmp_path / "t.jsonl", dst, tokenizer=tok.encode, shard_size_bytes=16 << 10, row_group_bytes=2048
        )
    assert time.monotonic() - began < 30, "the writers must not wait for row groups that never come"
    assert (dst / STATE_DIR).is_dir() and not (dst / "_fastload" / "index.json").exists()
    assert not list((dst / STATE_DIR / "tmp").glob("*")), "no temporary file is left behind"
    present = len(shards(dst))  # the first 4,096 documents (one read chunk) were handed on
    tok.calls = -(10**9)  # the tokenizer works again: resume finishes the pack
    report = fastload.pack_tokens(
        tmp_path / "t.jsonl",
        dst,
        tokenizer=tok.encode,
        shard_size_bytes=16 << 10,
        row_group_bytes=2048,
        resume=True,
    )
    assert report.shards_kept > 0 and report.documents == 10_000
    fresh = fastload.pack_tokens(
        tmp_path / "t.jsonl",
        tmp_path / "fresh",
        tokenizer=tok.encode,
        shard_size_bytes=16 << 10,
        row_group_bytes=2048,
    )
    assert snapshot(dst) == snapshot(tmp_path / "fresh") and fresh.documents == 10_000
    assert 0 < present < len(fresh.index.shards)


def test_a_publisher_failure_is_raised_and_stops_the_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastload.formats.parquet import writer

    real = writer.finish_entry
    finished: list[str] = []

    def failing(entry, tmp_path, rows_per_group):  # type: ignore[no-untyped-def]
        if entry.name.endswith("000002.parquet"):
            raise OSError(28, "No space left on device")
        finished.append(entry.name)
        return real(entry, tmp_path, rows_per_group)

    monkeypatch.setattr(writer, "finish_entry", failing)
    write_jsonl(tmp_path / "a.jsonl", documents([100] * 400))
    with pytest.raises(PackError, match="no space left on the device") as info:
        fastload.pack_tokens(
            tmp_path / "a.jsonl", tmp_path / "ds", shard_size_bytes=4096, row_group_bytes=1000, workers=2
        )
    # named as fastload.pack names it (one driver): the destination, and --resume to finish it
    assert f"cannot write to {tmp_path / 'ds'}: " in str(info.value) and "--resume" in str(info.value)
    assert isinstance(info.value.__cause__, OSError) and "No space left" in str(info.value.__cause__)
    assert len(finished) < 39, "the reader stops soon after a shard fails (40 shards in all)"
    assert not (tmp_path / "ds" / "shard-000002.parquet").exists()
    assert not (tmp_path / "ds" / "_fastload" / "index.json").exists()
