"""Telemetry to an ``s3://`` prefix (moto over loopback) and ``fastload top`` reading it: a real loader with
DataLoader workers, and a torchrun job of 2 ranks, write their records as segment objects (the last ones at
close or at the process's exit); ``top`` shows each rank's row, follows a running job and plots. A store
that refuses or stalls never stops or slows the loop and is written again when it comes back; a restarted
job adds segments instead of overwriting them."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

import fastload
from fastload.config import S3Config
from fastload.errors import ConfigError
from fastload.topread import read_records
from fastload.train.exporters import JsonLines

from .conftest import REGION
from .helpers import SUBPROCESS_TIMEOUT_S, Packed, child_env
from .test_torchrun import CANNOT_START, loopback_available

JOB = Path(__file__).resolve().parent / "scripts" / "telemetry_job.py"


def run(*cmd: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *cmd],
        capture_output=True,
        text=True,
        env=child_env(**env),
        timeout=SUBPROCESS_TIMEOUT_S,
    )


@pytest.fixture
def bucket(moto_url: str, s3_env: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh bucket on moto, named by AWS_ENDPOINT_URL for this process and its children."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)
    name = f"tel-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=moto_url, region_name=REGION)
    client.create_bucket(Bucket=name)
    client.close()
    yield name


def keys(moto_url: str, bucket: str) -> list[str]:
    client = boto3.client("s3", endpoint_url=moto_url, region_name=REGION)
    listed = client.list_objects_v2(Bucket=bucket).get("Contents", [])
    client.close()
    return [o["Key"] for o in listed]


def record(step: int) -> dict[str, object]:
    return {"time": time.time(), "rank": 0, "step": step, "samples_per_s": 100.0, "wait_share": 0.25}


def test_a_loader_with_workers_writes_to_s3_and_top_shows_it(
    small: Packed, bucket: str, moto_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"s3://{bucket}/runs/42"
    with fastload.loader(small.root, batch_size=3, num_workers=2, telemetry=url, telemetry_every=5) as ld:
        assert sum(1 for _ in ld) == 10
    # closed: its records written (else at exit: the torchrun test below)
    assert keys(moto_url, bucket) == ["runs/42/telemetry-rank0/00000000.jsonl"]
    monkeypatch.delenv("AWS_ENDPOINT_URL")  # top finds the store by --endpoint-url
    proc = run("-m", "fastload", "top", url, "--once", "--endpoint-url", moto_url)
    assert proc.returncode == 0, proc.stderr
    rows = proc.stdout.splitlines()
    assert rows[0].split()[:4] == ["rank", "step", "samples/s", "wait"]
    assert rows[1].split()[:2] == ["0", "10"] and len(rows) == 2
    png = tmp_path / "top.png"
    proc = run("-m", "fastload", "top", url + "/", "--plot", str(png), "--endpoint-url", moto_url)
    assert proc.returncode == 0, proc.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)
    steps = [r["step"] for r in read_records(url)[0]]
    assert steps == [5, 10]


def test_the_ranks_of_a_torchrun_job_share_one_prefix_and_top_shows_each(
    small: Packed, bucket: str, moto_url: str
) -> None:
    why = loopback_available()
    if why:
        pytest.skip(f"torchrun needs a TCP listener on loopback; {why}")
    url = f"s3://{bucket}/job"
    cmd = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += [str(JOB), str(small.root), url]
    proc = run(*cmd, MASTER_ADDR="127.0.0.1")
    output = proc.stdout[-4000:] + proc.stderr[-4000:]
    if proc.returncode != 0 and any(marker in output for marker in CANNOT_START):
        pytest.skip(f"torchrun could not start a rendezvous on loopback:\n{output}")
    assert proc.returncode == 0, output
    assert sorted(keys(moto_url, bucket)) == [f"job/telemetry-rank{r}/00000000.jsonl" for r in range(2)]
    records = read_records(url)
    assert sorted(records) == [0, 1]
    for rank, mine in records.items():
        assert {r["world"] for r in mine} == {2} and {r["rank"] for r in mine} == {rank}
    last = records[0][-1]["step"]
    assert last >= 6 and records[1][-1]["step"] == last  # (the ranks take the same steps)
    proc = run("-m", "fastload", "top", url, "--once")
    assert proc.returncode == 0, proc.stderr
    rows = [row.split()[:2] for row in proc.stdout.splitlines()[1:]]
    assert rows == [["0", str(last)], ["1", str(last)]], proc.stdout


def test_top_of_an_empty_prefix_or_an_unreadable_url_says_what_to_pass(bucket: str) -> None:
    proc = run("-m", "fastload", "top", f"s3://{bucket}/nothing", "--once")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"s3://{bucket}/nothing holds no telemetry" in proc.stderr and "telemetry=" in proc.stderr
    proc = run("-m", "fastload", "top", "hf://datasets/org/name", "--once")
    assert proc.returncode == 2 and "reads a local folder or an s3://, gs:// or az:// URL" in proc.stderr
    proc = run("-m", "fastload", "top", f"s3://{bucket}/x", "--once", "--endpoint-url", "http://127.0.0.1:9")
    assert proc.returncode == 1 and "cannot connect to http://127.0.0.1:9" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_refusing_store_neither_stops_the_loop_nor_raises(
    small: Packed,
    s3_env: None,
    moto_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)
    url = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/run"
    with caplog.at_level(logging.WARNING, logger="fastload.telemetry"):
        ld = fastload.loader(small.root, batch_size=3, num_workers=0, telemetry=url, telemetry_every=2)
        assert sum(1 for _ in ld) == 10
        assert ld.publisher is not None and ld.publisher.records == 5
        exporter = ld.publisher.exporters[0]
        assert isinstance(exporter, JsonLines)
        ld.publisher.close()
    assert exporter.failures >= 2 and exporter.dropped == 5  # the first try, and the last at close
    warnings = [r.getMessage() for r in caplog.records]
    assert len([w for w in warnings if "failed (S3NotFoundError" in w]) == 1, warnings  # logged once
    assert any(w.startswith(f"fastload telemetry: 5 record(s) not written to {url}/") for w in warnings)


def test_a_stalled_store_costs_the_loop_no_time(small: Packed, s3_env: None) -> None:
    with socket.socket() as stalled:  # accepts connections (the backlog), never answers
        stalled.bind(("127.0.0.1", 0))
        stalled.listen(16)
        endpoint = f"http://127.0.0.1:{stalled.getsockname()[1]}"
        config = S3Config(endpoint_url=endpoint, read_timeout_s=1.0, max_attempts=1, deadline_s=1.0)
        exporter = JsonLines("s3://b/run", config=config)
        ld = fastload.loader(small.root, batch_size=3, num_workers=0, telemetry=exporter, telemetry_every=2)
        assert sum(1 for _ in ld) == 10
        assert ld.publisher is not None and ld.publisher.records == 5
        assert ld.publisher.spent_s < 0.5  # a PUT on the loop's thread would wait >= 1 s per record
        began = time.monotonic()
        exporter.close()
        assert time.monotonic() - began < 11  # close waits at most close_timeout_s (10 s)
    assert exporter.dropped == 5 and exporter.failures >= 1


def test_writes_resume_when_the_store_comes_back(
    bucket: str, moto_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = boto3.client("s3", endpoint_url=moto_url, region_name=REGION)
    later = f"{bucket}-later"
    exporter = JsonLines(f"s3://{later}/run", interval_s=0.05)
    with caplog.at_level(logging.WARNING, logger="fastload.telemetry"):
        exporter.export(record(1))
        deadline = time.monotonic() + 30
        while exporter.failures < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        client.create_bucket(Bucket=later)
        exporter.export(record(2))
        exporter.close()
    assert exporter.failures >= 2 and exporter.dropped == 0
    body = client.get_object(Bucket=later, Key="run/telemetry-rank0/00000000.jsonl")["Body"].read()
    assert [json.loads(line)["step"] for line in body.splitlines()] == [1, 2]
    assert any("works again" in r.getMessage() for r in caplog.records)
    client.close()


def test_a_restarted_job_adds_segments_and_top_reads_the_newest(
    bucket: str, moto_url: str, tmp_path: Path
) -> None:
    url = f"s3://{bucket}/run"
    for steps in ([1, 2], [3], [4, 5]):  # three runs of one job (a restart each)
        exporter = JsonLines(url, interval_s=0.0)
        for step in steps:
            exporter.export(record(step))
        exporter.close()
    segments = [k for k in keys(moto_url, bucket) if k.startswith("run/")]
    assert segments == [f"run/telemetry-rank0/{i:08d}.jsonl" for i in range(3)]
    assert [r["step"] for r in read_records(url)[0]] == [1, 2, 3, 4, 5]
    assert [r["step"] for r in read_records(url, latest=True)[0]] == [4, 5]
    copy = tmp_path / "copy"  # the prefix copied to a local folder reads the same
    client = boto3.client("s3", endpoint_url=moto_url, region_name=REGION)
    for key in segments:
        (copy / key).parent.mkdir(parents=True, exist_ok=True)
        (copy / key).write_bytes(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    client.close()
    assert [r["step"] for r in read_records(str(copy / "run"))[0]] == [1, 2, 3, 4, 5]


def test_the_live_view_follows_a_running_job(bucket: str) -> None:
    url = f"s3://{bucket}/live"
    exporter = JsonLines(url, interval_s=0.05)
    exporter.export(record(1))
    cmd = [sys.executable, "-m", "fastload", "top", url, "--interval", "0.2"]
    seen: list[str] = []
    step = 1
    deadline = time.monotonic() + SUBPROCESS_TIMEOUT_S
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env()
    ) as top:
        assert top.stdout is not None
        try:
            for line in iter(top.stdout.readline, ""):  # a table every 0.2 s, until the last step shows
                seen.append(line)
                if line.split()[:2] == ["0", str(step)]:
                    if step == 3:
                        break
                    step += 1  # the job goes on: top shows each new step once it reaches the store
                    exporter.export(record(step))
                assert time.monotonic() < deadline, "".join(seen)
        finally:
            top.terminate()
            exporter.close()
    assert seen and seen[-1].split()[:2] == ["0", "3"], "".join(seen)
    assert any(f"fastload top {url}  (every 0.2s; Ctrl-C quits)" in line for line in seen)


def test_telemetry_urls_a_store_cannot_take_are_refused_at_once() -> None:
    with pytest.raises(ConfigError, match="cannot write to them"):
        fastload.loader([1, 2, 3], num_workers=0, telemetry="https://example.com/tel")
    with pytest.raises(ConfigError, match="mistyped S3 URL"):
        fastload.loader([1, 2, 3], num_workers=0, telemetry="s3:/bucket/tel")


FORKED = """
import os, sys, time
from fastload.config import S3Config
from fastload.storage.objectlog import SegmentLog
config = S3Config(endpoint_url="http://127.0.0.1:9", max_attempts=1, deadline_s=0.5)
log = SegmentLog("s3://b/p", "telemetry-rank0", config=config, interval_s=60, close_timeout_s=5)
log.append("{}")
time.sleep(0.5)
if os.fork() == 0:
    sys.exit(0)  # a child that exits normally runs the atexit handlers it inherited
os.wait()
"""


def test_a_forked_child_leaves_the_parents_lines_to_the_parent(s3_env: None) -> None:
    proc = run("-c", FORKED)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("1 record(s) not written to s3://b/p/telemetry-rank0/") == 1, proc.stderr
