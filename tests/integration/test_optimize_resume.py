"""``fastload.optimize(resume=True)``: after a SIGKILL of the whole process group mid-run, or from a shard
that ends inside one input's samples, the run finishes to the bytes of an uninterrupted one."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fastload
from fastload.errors import PackError, UnfinishedPackError
from fastload.packing.optimize_journal import FOLDER

from . import optimize_fns
from .helpers import cli_env, run_cli, snapshot

INPUTS = 240
SHARD = 16 << 10

SCRIPT = """
import sys
import fastload
from tests.integration import optimize_fns
fastload.optimize(optimize_fns.slow, range({inputs}), sys.argv[1], workers=2, shard_size_bytes={shard},
                  progress=False, chunk_size=2)
"""


def records(dst: Path) -> list[dict]:  # type: ignore[type-arg]
    folder = dst / FOLDER
    if not folder.is_dir():
        return []
    out = []
    for p in sorted(folder.glob("0*.json")):
        try:
            out.append(json.loads(p.read_bytes()))
        except ValueError:
            continue
    return out


def test_sigkill_mid_run_then_resume_gives_the_bytes_of_one_run(tmp_path: Path) -> None:
    fastload.optimize(optimize_fns.slow, range(INPUTS), tmp_path / "whole", workers=2, shard_size_bytes=SHARD)
    dst = tmp_path / "ds"
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT.format(inputs=INPUTS, shard=SHARD), str(dst)],
        cwd=root,
        env=cli_env(PYTHONPATH=str(root)),
        start_new_session=True,  # its worker processes too are killed, as by the OOM killer or a node loss
    )
    try:
        deadline = time.monotonic() + 60
        while len(records(dst)) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before it could be killed: make it longer"
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not (dst / "index.json").exists()
    before = len(records(dst))
    report = fastload.optimize(
        optimize_fns.slow, range(INPUTS), dst, workers=3, shard_size_bytes=SHARD, resume=True
    )
    assert report.shards_kept >= before >= 3
    assert snapshot(dst) == snapshot(tmp_path / "whole")


def test_resume_inside_an_input_fan_out_and_past_kept_shards(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A resume point inside an input's samples (the input run again, its first samples dropped), and
    shards already published past the resume point (cut again, not rewritten, and journaled)."""
    options = {"workers": 2, "shard_size_bytes": 8 << 10, "progress": False}
    fastload.optimize(optimize_fns.fail_on_env, range(60), tmp_path / "whole", **options)
    dst = tmp_path / "ds"
    monkeypatch.setenv("OPTIMIZE_FAIL_AT", "50")
    with contextlib.suppress(fastload.errors.InputFailedError):
        fastload.optimize(optimize_fns.fail_on_env, range(60), dst, **options)
    monkeypatch.delenv("OPTIMIZE_FAIL_AT")
    ends = records(dst)
    inside = [r for r in ends if r["end"]["offset"] > 0 and r["number"] < len(ends) - 2]
    assert inside, "no shard ended inside an input's samples: change the sizes"
    resume_at = inside[0]["number"]
    for r in ends[resume_at + 1 :]:  # as if killed before these shards' ends were journaled
        (dst / FOLDER / f"{r['number']:06d}.json").unlink()
    report = fastload.optimize(optimize_fns.fail_on_env, range(60), dst, resume=True, **options)
    assert report.shards_kept == len(ends)
    assert snapshot(dst) == snapshot(tmp_path / "whole")


def test_inputs_skipped_before_an_interruption_stay_listed(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """on_error="skip", interrupted (Ctrl-C), resumed: the failures of the kept shards' inputs are in the
    report and index.json as in one run."""
    options = {"shard_size_bytes": 8 << 10, "progress": False, "on_error": "skip"}
    whole = fastload.optimize(
        optimize_fns.fives_or_interrupt, range(60), tmp_path / "whole", workers=1, **options
    )
    dst = tmp_path / "ds"
    monkeypatch.setenv("OPTIMIZE_FAIL_AT", "47")
    with contextlib.suppress(KeyboardInterrupt):
        fastload.optimize(optimize_fns.fives_or_interrupt, range(60), dst, workers=1, **options)
    monkeypatch.delenv("OPTIMIZE_FAIL_AT")
    assert len(records(dst)) > 3
    report = fastload.optimize(
        optimize_fns.fives_or_interrupt, range(60), dst, workers=2, resume=True, **options
    )
    assert report.shards_kept > 3
    assert [f.number for f in report.failures] == [f.number for f in whole.failures] == list(range(0, 60, 5))
    assert snapshot(dst) == snapshot(tmp_path / "whole")


def test_killed_before_its_own_state_was_written_resumes_from_the_start(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The writer's journal is made first, optimize's state just after: a kill between the two leaves no
    shard, and a resume starts over instead of refusing the folder."""
    whole = tmp_path / "whole"
    options = {"shard_size_bytes": SHARD, "progress": False}
    fastload.optimize(optimize_fns.fail_on_env, range(30), whole, workers=1, **options)
    dst = tmp_path / "ds"
    monkeypatch.setenv("OPTIMIZE_FAIL_AT", "0")
    with contextlib.suppress(fastload.errors.InputFailedError):
        fastload.optimize(optimize_fns.fail_on_env, range(30), dst, workers=1, **options)
    monkeypatch.delenv("OPTIMIZE_FAIL_AT")
    (dst / FOLDER / "state.json").unlink()
    fastload.optimize(optimize_fns.fail_on_env, range(30), dst, workers=1, resume=True, **options)
    assert snapshot(dst) == snapshot(whole)


def test_keys_of_the_shards_kept_count_on_resume(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Input 50 repeats a key of input 4: one run refuses it, and so does a run stopped at input 45 and
    resumed (the kept shards' keys are read back from their sample tables, not forgotten)."""
    options = {"shard_size_bytes": 8 << 10, "progress": False, "workers": 2}
    with pytest.raises(PackError, match=r"input #50: .*'00004-0' was written already"):
        fastload.optimize(optimize_fns.repeat_a_key, range(60), tmp_path / "whole", **options)
    dst = tmp_path / "ds"
    monkeypatch.setenv("OPTIMIZE_FAIL_AT", "45")
    with pytest.raises(fastload.errors.InputFailedError):
        fastload.optimize(optimize_fns.repeat_a_key, range(60), dst, **options)
    monkeypatch.delenv("OPTIMIZE_FAIL_AT")
    assert len(records(dst)) > 3
    with pytest.raises(PackError, match=r"input #50: .*'00004-0' was written already"):
        fastload.optimize(optimize_fns.repeat_a_key, range(60), dst, resume=True, **options)
    assert not (dst / "index.json").exists()


def test_a_folder_optimize_left_unfinished_is_named_with_how_to_finish(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    dst = tmp_path / "ds"
    monkeypatch.setenv("OPTIMIZE_FAIL_AT", "40")
    with pytest.raises(fastload.errors.InputFailedError):
        fastload.optimize(optimize_fns.fail_on_env, range(60), dst, workers=1, shard_size_bytes=SHARD)
    monkeypatch.delenv("OPTIMIZE_FAIL_AT")
    how = r"fastload\.optimize left it .*resume=True.*delete the folder and run optimize again"
    with pytest.raises(UnfinishedPackError, match=f"cannot be read as a dataset; {how}"):
        fastload.ShardDataset(dst)
    with pytest.raises(UnfinishedPackError, match=f"cannot be written to as a dataset; {how}"):
        fastload.ShardWriter(dst)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a")
    proc = run_cli("pack", src, dst)
    assert proc.returncode != 0 and "is not empty; fastload.optimize left it" in proc.stderr, proc.stderr
    proc = run_cli("verify", dst)
    assert proc.returncode != 0 and "fastload.optimize left it" in proc.stderr, proc.stderr
