"""``fastload top``: the table of a job's telemetry JSON lines (written by a real loader, plus a second
rank's file naming a straggler), ``--plot``, and a clear message for a folder that is not one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import fastload

from .helpers import SUBPROCESS_TIMEOUT_S, Packed, child_env


def top(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "fastload", "top", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=SUBPROCESS_TIMEOUT_S)


def test_top_once_shows_each_rank_and_names_a_straggler(small: Packed, tmp_path: Path) -> None:
    folder = tmp_path / "tel"
    ld = fastload.loader(small.root, batch_size=3, num_workers=0, telemetry=folder, telemetry_every=5)
    assert sum(1 for _ in ld) == 10
    lines = (folder / "telemetry-rank0.jsonl").read_text().splitlines()
    other = json.loads(lines[-1])
    other.update(rank=1, wait_share=0.9, stragglers=[{"rank": 1, "cause": "throttling: 9 S3 503/SlowDown"}])
    (folder / "telemetry-rank1.jsonl").write_text(json.dumps(other) + "\n{half a line")
    proc = top(str(folder), "--once")
    assert proc.returncode == 0, proc.stderr
    rows = proc.stdout.splitlines()
    assert rows[0].split()[:4] == ["rank", "step", "samples/s", "wait"]
    assert rows[1].split()[:2] == ["0", "10"]
    assert rows[2].split()[:2] == ["1", "10"] and "90%" in rows[2]
    assert rows[3] == "rank 1 is a straggler at step 10: throttling: 9 S3 503/SlowDown"
    png = tmp_path / "top.png"
    proc = top(str(folder), "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_top_of_a_missing_folder_says_what_to_pass(tmp_path: Path) -> None:
    proc = top(str(tmp_path / "nowhere"), "--once")
    assert proc.returncode == 2
    assert "not a folder of telemetry files" in proc.stderr and "Traceback" not in proc.stderr
