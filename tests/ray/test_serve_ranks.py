"""``fastload.serve`` on two trainer ranks of a torchrun job (gloo on loopback), both fed by feeders of one
local Ray cluster: each rank's stream equals ``fastload.DataLoader``'s for that rank, and the ranks together
deliver every sample exactly once."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from test_serve import BATCH, OPTIONS, add_length, keys, packed, same

import fastload

pytestmark = pytest.mark.usefixtures("ray_cluster")

SCRIPT = Path(__file__).resolve().parent / "serve_ranks.py"
# Failures that mean "no rendezvous on loopback here", not a fastload problem (tests/dataset/test_torchrun).
CANNOT_START = ("RendezvousConnectionError", "RendezvousTimeoutError", "DistNetworkError")


def test_two_torchrun_ranks_each_get_their_loaders_stream(ray_cluster: Any, tmp_path: Path) -> None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
    except OSError as exc:
        pytest.skip(f"torchrun needs a TCP listener on loopback: {exc}")
    root = packed(tmp_path, n=30)
    address = ray_cluster.get_runtime_context().gcs_address
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += [os.fspath(SCRIPT), os.fspath(root), address, os.fspath(tmp_path)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONWARNINGS", "RAY_ADDRESS"))}
    env.update(MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        env.pop(name, None)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    output = proc.stdout[-4000:] + proc.stderr[-4000:]
    if proc.returncode != 0 and any(marker in output for marker in CANNOT_START):
        pytest.skip(f"torchrun could not start a rendezvous on loopback:\n{output}")
    assert proc.returncode == 0, output
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert [tuple(r["rank_world"]) for r in ranks] == [(0, 2), (1, 2)]
    for rank, got in enumerate(ranks):
        dataset = fastload.ShardDataset(root, rank=rank, world_size=2, map=add_length, **OPTIONS)
        same(got["batches"], list(fastload.DataLoader(dataset, batch_size=BATCH)))
    delivered = keys(ranks[0]["batches"]) + keys(ranks[1]["batches"])
    everything = fastload.DataLoader(fastload.ShardDataset(root), batch_size=BATCH)
    assert sorted(delivered) == sorted(keys(list(everything)))  # every sample once across the ranks
