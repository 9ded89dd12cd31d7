"""A straggler made on purpose: a real torchrun job (2 ranks, gloo) reads the same dataset from the embedded
S3 endpoint, rank 1 through a fault proxy that delays every response by 150 ms. Within the first
``telemetry_every`` steps both ranks' records name rank 1 with a slow store as its cause, and rank 1 says
so in its log; rank 0 is never named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastload.testing.faultproxy import Fault, FaultProxy, Rule
from fastload.testing.s3serve import S3Server

from .helpers import SUBPROCESS_TIMEOUT_S, Packed, child_env
from .test_torchrun import CANNOT_START, loopback_available

SCRIPT = Path(__file__).resolve().parent / "scripts" / "straggler.py"
EVERY = 4


def test_a_slow_rank_is_named_with_its_cause(uneven: Packed, tmp_path: Path) -> None:
    why = loopback_available()
    if why:
        pytest.skip(f"torchrun needs a TCP listener on loopback; {why}")
    with (
        S3Server(os.fspath(uneven.root.parent), bucket="data") as server,
        FaultProxy(server.endpoint_url) as proxy,
    ):
        proxy.add(Rule(Fault.latency(delay_s=0.15), method="GET"))
        url = f"s3://data/{uneven.root.name}"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        cmd += [
            os.fspath(SCRIPT),
            url,
            os.fspath(tmp_path),
            str(EVERY),
            server.endpoint_url,
            proxy.endpoint_url,
        ]
        env = child_env(MASTER_ADDR="127.0.0.1", AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="y")
        env["AWS_REGION"] = "us-east-1"
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
            env.pop(name, None)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=SUBPROCESS_TIMEOUT_S)
    output = proc.stdout[-4000:] + proc.stderr[-4000:]
    if proc.returncode != 0 and any(marker in output for marker in CANNOT_START):
        pytest.skip(f"torchrun could not start a rendezvous on loopback:\n{output}")
    assert proc.returncode == 0, output
    records = {
        r: [
            json.loads(line)
            for line in (tmp_path / "telemetry" / f"telemetry-rank{r}.jsonl").read_text().splitlines()
        ]
        for r in range(2)
    }
    for r in range(2):
        first = records[r][0]
        assert first["step"] == EVERY and first["world"] == 2
        named = {s["rank"]: s["cause"] for s in first["stragglers"]}
        assert list(named) == [1], (first["stragglers"], records[0][0]["wait_s"], records[1][0]["wait_s"])
        assert named[1].startswith("slow store"), named
        assert all(s["rank"] != 0 for rec in records[r] for s in rec["stragglers"])
    assert "rank 1 is a straggler" in proc.stderr and "slow store" in proc.stderr
    assert "rank 0 is a straggler" not in proc.stderr
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text())["report"] for r in range(2)]
    assert reports[1]["latency"]["first_byte"]["p50_ms"] > 100 > reports[0]["latency"]["first_byte"]["p50_ms"]
