"""The command line starts without the heavy libraries its command does not need: torch (about 2 s of CPU to
import) for none of help, pack, verify and inspect; no cloud SDK or pyarrow for ``--help``; no cloud SDK for a
local pack. A slow start costs every CLI call a user makes (and every CLI test here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import CLI_TIMEOUT_S, cli_env

# the real CLI (``python -m fastload``), with the heavy modules loaded by the end printed as JSON on stderr
PROBE = """
import atexit, json, runpy, sys
HEAVY = ("torch", "pyarrow", "boto3", "botocore", "pandas", "ray")
atexit.register(lambda: print(json.dumps(sorted(m for m in HEAVY if m in sys.modules)), file=sys.stderr))
sys.argv = ["fastload", *sys.argv[1:]]
runpy.run_module("fastload", run_name="__main__", alter_sys=True)
"""


def loaded(*args: str | Path) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *(str(a) for a in args)],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=cli_env(),
        timeout=CLI_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return list(json.loads(proc.stderr.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A small folder packed by the CLI, and what that pack loaded."""
    base = tmp_path_factory.mktemp("cli-imports")
    for i in range(3):
        (base / "src" / f"{i}.txt").parent.mkdir(exist_ok=True)
        (base / "src" / f"{i}.txt").write_text(f"sample {i}")
    return base / "ds", loaded("pack", base / "src", base / "ds", "--quiet")


def test_help_loads_no_torch_cloud_sdk_or_pyarrow() -> None:
    assert loaded("--help") == []


def test_a_local_pack_loads_no_torch_and_no_cloud_sdk(packed: tuple[Path, list[str]]) -> None:
    ds, modules = packed
    assert (ds / "_fastload" / "index.json").is_file() or (ds / "index.json").is_file()
    assert not {"torch", "boto3", "botocore"} & set(modules), modules


@pytest.mark.parametrize("command", ["verify", "inspect"])
def test_verify_and_inspect_load_no_torch(packed: tuple[Path, list[str]], command: str) -> None:
    ds, _ = packed
    assert "torch" not in loaded(command, ds)
