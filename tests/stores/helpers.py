"""Helpers for the store tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_cli(
    *args: str | os.PathLike[str], check: int | None = 0, **env: str
) -> subprocess.CompletedProcess[str]:
    """``python -m fastload ARGS`` in a subprocess of this tree; asserts exit status ``check`` (None: any)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONWARNINGS", "COVERAGE"))}
    full.update({"PYTHONPATH": str(ROOT), "PYTHONIOENCODING": "utf-8", **env})
    cmd = [sys.executable, "-m", "fastload", *(os.fspath(a) for a in args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full, timeout=120)
    if check is not None:
        assert proc.returncode == check, f"{cmd} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc
