"""``fastload top``: the table of a job's telemetry JSON lines (written by a real loader, plus a second
rank's file naming a straggler), ``--plot``, and a clear message for a folder that is not one; the same
table from the ranks' Prometheus endpoints. (Stores: test_top_store.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import fastload
from fastload import topprom
from fastload.top import table as top_table
from fastload.train.exporters import JsonLines, Prometheus

from .helpers import SUBPROCESS_TIMEOUT_S, Packed, child_env
from .test_telemetry_export import free_port


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


def test_top_of_prometheus_endpoints_rebuilds_each_ranks_row(small: Packed, tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    ports = [free_port(), free_port()]
    endpoints = [Prometheus(port=port, addr="127.0.0.1") for port in ports]
    try:
        folder = tmp_path / "tel"
        telemetry = [endpoints[0], JsonLines(folder)]
        ld = fastload.loader(small.root, batch_size=3, num_workers=0, telemetry=telemetry, telemetry_every=4)
        assert sum(1 for _ in ld) == 10
        last = json.loads((folder / "telemetry-rank0.jsonl").read_text().splitlines()[-1])
        other = dict(last, rank=1, wait_share=0.9, stragglers=[{"rank": 1, "cause": "throttling"}])
        endpoints[1].export(other)  # rank 1 of the job, on its own machine
        urls = ",".join(f"http://127.0.0.1:{port}/metrics" for port in ports)
        proc = top(urls, "--once")
        assert proc.returncode == 0, proc.stderr
        rows = proc.stdout.splitlines()
        assert rows[0].split()[:4] == ["rank", "step", "samples/s", "wait"]
        slowest = last["total"]["slowest_stage"]  # (of the run: --once reads the endpoints once)
        assert rows[1].split()[:2] == ["0", "8"] and rows[1].split()[4] == slowest, proc.stdout
        assert rows[2].split()[:4] == ["1", "8", rows[1].split()[2], "90%"], proc.stdout
        assert rows[3].startswith("rank 1 is a straggler at step 8: its cause is in the rank's log")
        proc = top(urls, "--plot", str(tmp_path / "top.png"))
        assert proc.returncode == 2 and "--plot draws the history that JSON lines keep" in proc.stderr
    finally:
        for endpoint in endpoints:
            endpoint.close()
    proc = top(f"http://127.0.0.1:{ports[0]}/metrics", "--once")  # closed: nothing answers
    assert proc.returncode == 1 and f"cannot read http://127.0.0.1:{ports[0]}/metrics" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_slowest_stage_of_prometheus_gauges_is_that_of_the_time_since_the_last_read() -> None:
    text = (
        '# TYPE fastload_step gauge\nfastload_step{rank="3"} 40.0\n'
        'fastload_stage_seconds_total{rank="3",stage="fetch"} 9.0\n'
        'fastload_stage_seconds_total{rank="3",stage="decode"} 5.0\n'
        'fastload_stage_seconds_total{rank="3",stage="wait"} 99.0\n'
        'fastload_s3_retries_total{rank="3"} 2.0\nfastload_s3_failures_total{rank="3"} 1.0\n'
    )
    now = topprom.parse(text)[3]
    before = {"stage_seconds_total": {"fetch": 8.5, "decode": 1.0, "wait": 1.0}}
    assert topprom.record(3, now, {}, 0.0)["slowest_stage"] == "fetch"  # the run's (wait is the loop's)
    again = topprom.record(3, now, before, 0.0)
    assert again["slowest_stage"] == "decode" and again["step"] == 40  # 4.0 s against 0.5 s since then
    assert top_table({3: [again]}, now=0.0).splitlines()[1].split()[5:7] == ["0", "3"]
