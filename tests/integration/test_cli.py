"""The command line: help, inspect, the quick start of docs/pack.md, and one-line errors (never a
traceback) for bad usage."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import fastload

from .helpers import cli_env, read_index, run_cli


def console_script() -> str:
    """The installed ``fastload`` entry point (next to the interpreter, or on PATH)."""
    here = Path(sys.executable).with_name("fastload")
    found = str(here) if here.exists() else shutil.which("fastload")
    assert found, "the `fastload` console script is not installed (pip install -e .)"
    return found


def run_script(*args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [console_script(), *(os.fspath(a) for a in args)],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=120,
    )


def test_help_lists_the_commands():
    proc = run_cli("--help", check=0)
    for command in ("pack", "verify", "inspect", "demo-data"):
        assert command in proc.stdout
    pack_help = run_cli("pack", "--help", check=0).stdout
    for option in (
        "--format",
        "--shard-size",
        "--max-samples",
        "--shuffle",
        "--seed",
        "--workers",
        "--resume",
        "--allow-skip",
        "--partition-by",
        "--row-group-size",
    ):
        assert option in pack_help


@pytest.fixture
def packed(rich_tree, tmp_path) -> Path:
    dst = tmp_path / "dst"
    fastload.pack(str(rich_tree.root), dst, shard_size_bytes=16 << 10, progress=False)
    return dst


def test_inspect_shows_totals_and_fields(packed):
    index = read_index(packed)
    proc = run_script("inspect", packed)
    assert proc.returncode == 0, proc.stderr
    lines = {
        line.split(":", 1)[0].strip(): line.split(":", 1)[1]
        for line in proc.stdout.splitlines()
        if ":" in line
    }
    assert lines["shards"].strip() == str(index["totals"]["shards"])
    assert lines["samples"].strip() == str(index["totals"]["samples"])
    assert f"{index['totals']['bytes']:,}" in lines["bytes"]
    assert [f.strip() for f in lines["fields"].split(",")] == index["fields"]
    assert lines["index"].strip().startswith("v2 (shards listed; each shard's sample table in")


@pytest.mark.parametrize("which", ["number", "name"])
def test_inspect_one_shard_lists_its_keys_with_offsets(packed, which):
    first, shard = read_index(packed)["shards"][:2]
    (packed / f"{first['name']}.fltable").unlink()  # only the shown shard's sample table is read
    proc = run_script(
        "inspect", packed, "--shard", "1" if which == "number" else shard["name"], "--limit", "0"
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()[1:]]
    assert [r[1] for r in rows] == shard["keys"]
    assert [int(r[3]) for r in rows] == shard["offsets"]
    assert [int(r[5]) for r in rows] == shard["sizes"]
    assert [r[7] for r in rows] == [f"{c:08x}" for c in shard["crcs"]]
    assert shard["name"] in proc.stdout.splitlines()[0]


def test_inspect_limit_truncates_the_listing(packed):
    shard = read_index(packed)["shards"][0]
    assert shard["samples"] > 2
    proc = run_script("inspect", packed, "--shard", "0", "--limit", "2")
    assert proc.returncode == 0
    assert shard["keys"][0] in proc.stdout and shard["keys"][1] in proc.stdout
    assert shard["keys"][2] not in proc.stdout
    assert f"{shard['samples'] - 2} more" in proc.stdout


def test_readme_quick_start_runs(tmp_path):
    """demo-data -> pack -> verify -> inspect, as in docs/pack.md (a smaller tree)."""
    src, dst = tmp_path / "src", tmp_path / "shards"
    run_cli("demo-data", src, "--samples", "60", check=0)
    files = sorted(p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file())
    assert len(files) == 180 and {p.split("/")[0] for p in files} == {"train", "val"}
    run_cli("pack", src, dst, "--quiet", check=0)
    assert run_cli("verify", dst, check=0).stdout.startswith("OK")
    out = run_cli("inspect", dst, check=0).stdout
    assert "samples:  60" in out and "cls, json, npy" in out


# --- bad usage: exit 2 (options) or 1 (data), one line, no traceback ---------------------------------------


def _one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("fastload")]
    assert len(errors) == 1, f"expected one error line starting with 'fastload', got:\n{proc.stderr}"
    for needle in needles:
        assert needle in errors[0], f"{needle!r} not in {errors[0]!r}"
    assert proc.stdout == ""
    return errors[0]


@pytest.mark.parametrize(
    ("args", "code", "needles"),
    [
        (["--shard-size", "12XB"], 2, ["--shard-size", "12XB"]),
        (["--format", "zip"], 2, ["--format", "zip"]),
        (["--shuffle"], 2, ["--seed"]),
        (["--seed", "3"], 2, ["--shuffle"]),
        (["--workers", "0"], 2, ["workers"]),
        (["--max-samples", "0"], 2, ["max_samples"]),
        (["--shard-size", "100"], 2, ["100"]),
        (["--partition-by", "top"], 2, ["--partition-by", "top"]),
        (["--compression", "rar"], 2, ["--compression", "rar"]),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_bad_pack_options_exit_2_with_one_line(rich_tree, tmp_path, args, code, needles):
    dst = tmp_path / "dst"
    proc = run_cli("pack", rich_tree.root, dst, *args)
    assert proc.returncode == code, proc.stderr
    _one_line_error(proc, *needles)
    assert not dst.exists()


def test_missing_source_exits_1_naming_it(tmp_path):
    missing = tmp_path / "no-such-folder"
    proc = run_cli("pack", missing, tmp_path / "dst")
    assert proc.returncode == 1
    _one_line_error(proc, str(missing))
    assert not (tmp_path / "dst").exists()


def test_source_that_is_a_file_exits_1_naming_it(tmp_path):
    src = tmp_path / "file.jpg"
    src.write_bytes(b"x")
    proc = run_cli("pack", src, tmp_path / "dst")
    assert proc.returncode == 1
    _one_line_error(proc, str(src))


def test_destination_that_cannot_be_created_exits_1_without_traceback(rich_tree, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"not a folder")
    dst = blocker / "dst"
    proc = run_cli("pack", rich_tree.root, dst, "--quiet")
    assert proc.returncode == 1, proc.stderr
    _one_line_error(proc, str(dst))


def test_source_without_samples_exits_1(tmp_path):
    src = tmp_path / "empty"
    src.mkdir()
    proc = run_cli("pack", src, tmp_path / "dst")
    assert proc.returncode == 1
    _one_line_error(proc, str(src))


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_inspect_and_verify_of_a_missing_folder_exit_1(tmp_path, command):
    missing = tmp_path / "nothing-here"
    proc = run_cli(command, missing)
    assert proc.returncode == 1
    _one_line_error(proc, str(missing))


def test_inspect_of_an_unknown_shard_exits_2(packed):
    proc = run_cli("inspect", packed, "--shard", "999")
    assert proc.returncode == 2
    _one_line_error(proc, "999")


def test_inspect_of_a_corrupt_index_exits_1(packed):
    (packed / "index.json").write_text('{"format": "fastload-index", "version": 1')
    proc = run_cli("inspect", packed)
    assert proc.returncode == 1
    _one_line_error(proc, "index.json")


def test_destination_inside_the_source_is_refused_before_writing(rich_tree):
    dst = rich_tree.root / "packed"
    before = sorted(p.relative_to(rich_tree.root) for p in rich_tree.root.rglob("*"))
    proc = run_cli("pack", rich_tree.root, dst, "--quiet")
    assert proc.returncode == 2, proc.stderr
    _one_line_error(proc, str(dst))
    assert "inside the source" in proc.stderr
    assert sorted(p.relative_to(rich_tree.root) for p in rich_tree.root.rglob("*")) == before
