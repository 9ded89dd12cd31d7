"""``fastload.optimize(..., mode="append")``: the samples join a dataset as a new version (the stream of the
two runs is the stream of one run over all the inputs, the pre-append version still readable as it was),
the same bytes for any ``workers``, refusals that name what differs, and a SIGKILL mid-append resumed to
the bytes of an uninterrupted append."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import fastload
from fastload.errors import ConfigError, InputFailedError, PackError, ResumeMismatchError

from . import optimize_fns
from .helpers import cli_env, read_manifest, run_cli, snapshot

OPTIONS: dict[str, Any] = {"shard_size_bytes": 8 << 10, "progress": False}


def stream(dst: Path, **kwargs: Any) -> list[tuple[str, bytes, bytes]]:
    ds = fastload.ShardDataset(dst, decode=False, **kwargs)
    return [(s["__key__"], s["txt"], s["npy"]) for s in ds]


def appended_bytes(dst: Path, first: int) -> list[bytes]:
    """The bytes of the shards after the first ``first``, in index order (names differ by their tag)."""
    return [(dst / s["name"]).read_bytes() for s in read_manifest(dst)["shards"][first:]]


def test_an_append_continues_the_stream_of_one_run_for_any_workers(tmp_path: Path) -> None:
    whole = tmp_path / "whole"
    fastload.optimize(optimize_fns.make, range(60), whole, workers=2, **OPTIONS)
    dsts = []
    for workers in (1, 3):
        dst = tmp_path / f"w{workers}"
        fastload.optimize(optimize_fns.make, range(30), dst, workers=2, **OPTIONS)
        before, old = snapshot(dst), stream(dst)
        report = fastload.optimize(
            optimize_fns.make, range(30, 60), dst, workers=workers, mode="append", chunk_size=4, **OPTIONS
        )
        assert report.inputs == 30 and report.samples == sum(
            len(optimize_fns.make(n) or []) for n in range(30, 60)
        )
        assert all(snapshot(dst)[n] == d for n, d in before.items() if n != "index.json")
        assert stream(dst, version=1) == old
        assert stream(dst) == stream(whole)  # version 2 = one run over every input, in order
        versions = read_manifest(dst)["versions"]
        assert [v["version"] for v in versions] == [1, 2] and len(versions[1]["fingerprint"]) == 32
        assert not (dst / ".fastload-pack").exists()
        run_cli("verify", dst, check=True)
        dsts.append((dst, len(before) // 2))
    (a, n), (b, _) = dsts
    assert appended_bytes(a, n) == appended_bytes(b, n)  # the same bytes for workers=1 and 3


def test_the_same_inputs_again_another_format_or_a_bad_mode_are_refused(tmp_path: Path) -> None:
    dst = tmp_path / "ds"
    fastload.optimize(optimize_fns.make, range(20), dst, workers=1, **OPTIONS)
    before = snapshot(dst)
    with pytest.raises(PackError, match=r"input #0: .*'00000-0' was written already.*dataset appended to"):
        fastload.optimize(optimize_fns.make, range(20), dst, workers=1, mode="append", **OPTIONS)
    with pytest.raises(ConfigError, match=r"shard_format: the dataset is tar.*format='tar'"):
        fastload.optimize(optimize_fns.make, range(20, 30), dst, format="parquet", mode="append", **OPTIONS)
    with pytest.raises(ConfigError, match=r"mode='grow'; choose 'create'"):
        fastload.optimize(optimize_fns.make, range(20, 30), dst, mode="grow", **OPTIONS)
    with pytest.raises(PackError, match=r"holds a dataset \(index\.json\); pass mode='append'"):
        fastload.optimize(optimize_fns.make, range(20, 30), dst, workers=1, **OPTIONS)
    after = snapshot(dst)
    assert {n: d for n, d in after.items() if not n.startswith(".fastload-pack")} == before


def test_an_append_stopped_by_an_error_resumes_or_names_its_leftovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dst, ref = tmp_path / "ds", tmp_path / "ref"
    for d in (dst, ref):
        fastload.optimize(optimize_fns.make, range(10), d, workers=1, **OPTIONS)
    fastload.optimize(optimize_fns.fail_on_env, range(10, 60), ref, workers=2, mode="append", **OPTIONS)
    monkeypatch.setenv("OPTIMIZE_FAIL_AT", "45")
    with pytest.raises(InputFailedError, match="input #35"):  # (numbered in this run's inputs)
        fastload.optimize(optimize_fns.fail_on_env, range(10, 60), dst, workers=2, mode="append", **OPTIONS)
    assert fastload.ShardDataset(dst).index.samples == fastload.ShardDataset(ref, version=1).index.samples
    with pytest.raises(ResumeMismatchError, match=r"a new append; delete \.fastload-pack/append-\w{8}/"):
        fastload.optimize(optimize_fns.make, range(10, 60), dst, mode="append", resume=True, **OPTIONS)
    monkeypatch.delenv("OPTIMIZE_FAIL_AT")
    report = fastload.optimize(
        optimize_fns.fail_on_env, range(10, 60), dst, workers=3, mode="append", resume=True, **OPTIONS
    )
    assert report.shards_kept > 0
    assert stream(dst) == stream(ref)
    assert appended_bytes(dst, 10) == appended_bytes(ref, 10) and not (dst / ".fastload-pack").exists()


SCRIPT = """
import sys
import fastload
from tests.integration import optimize_fns
fastload.optimize(optimize_fns.slow, range(30, 150), sys.argv[1], workers=2, shard_size_bytes=8 << 10,
                  progress=False, chunk_size=2, mode="append")
"""


def records(dst: Path) -> int:
    return len(list((dst / ".fastload-pack").glob("append-*/optimize/0*.json")))


def test_sigkill_mid_append_then_resume_gives_the_bytes_of_one_append(tmp_path: Path) -> None:
    dst, ref = tmp_path / "ds", tmp_path / "ref"
    for d in (dst, ref):
        fastload.optimize(optimize_fns.make, range(30), d, workers=1, **OPTIONS)
    first = len(read_manifest(dst)["shards"])
    fastload.optimize(optimize_fns.slow, range(30, 150), ref, workers=2, mode="append", **OPTIONS)
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(dst)],
        cwd=root,
        env=cli_env(PYTHONPATH=str(root)),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while records(dst) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before it could be killed: make it longer"
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert len(read_manifest(dst)["shards"]) == first  # the dataset as it was: readers see version 1
    assert [k for k, *_ in stream(dst)] == [k for k, *_ in stream(ref, version=1)]
    report = fastload.optimize(
        optimize_fns.slow, range(30, 150), dst, workers=3, mode="append", resume=True, **OPTIONS
    )
    assert report.shards_kept >= 3
    assert stream(dst) == stream(ref)
    assert appended_bytes(dst, first) == appended_bytes(ref, first)
    assert [v["version"] for v in read_manifest(dst)["versions"]] == [1, 2]
    assert not (dst / ".fastload-pack").exists()
    again = fastload.optimize(
        optimize_fns.slow, range(30, 150), dst, workers=2, mode="append", resume=True, **OPTIONS
    )
    assert again.already_complete  # (the inputs, a range, digested and found as version 2)
    assert json.loads((dst / "index.json").read_bytes())["totals"]["samples"] == len(stream(ref))


def test_the_command_appends_with_append(tmp_path: Path) -> None:
    lines = tmp_path / "inputs.txt"
    spec = "tests.integration.optimize_fns:make_from_text"
    dst = tmp_path / "ds"
    for first, flags in ((0, ()), (20, ("--append",))):
        lines.write_text("".join(f"{n}\n" for n in range(first, first + 20)))
        proc = run_cli("optimize", spec, "--inputs", lines, dst, "--shard-size", "8KiB", "--quiet", *flags)
        assert proc.returncode == 0, proc.stderr
    assert [v["version"] for v in read_manifest(dst)["versions"]] == [1, 2]
    whole = tmp_path / "whole"
    fastload.optimize(optimize_fns.make, range(40), whole, workers=1, **OPTIONS)
    assert stream(dst) == stream(whole)
    proc = run_cli("optimize", spec, "--inputs", lines, dst, "--shard-size", "8KiB", "--append", "--resume")
    assert proc.returncode == 0 and "nothing to do" in proc.stdout, proc.stderr
