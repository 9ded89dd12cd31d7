"""Multi-node training needs nothing new: two torchrun "nodes" (two agent processes on loopback, joined by a
c10d rendezvous, one rank each) read a dataset with ``ShardDataset`` + ``DataLoader``; each rank takes its
share by its global rank, and together they read every sample exactly once, minus what the split reports
dropped. The same command, run once per machine, is the multi-node recipe of docs/multi-node.md."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import SUBPROCESS_TIMEOUT_S, Packed, child_env, flat
from .test_torchrun import CANNOT_START, SCRIPT, loopback_available

NODES = 2


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_command(port: int, dataset: Path, outdir: Path) -> list[str]:
    """One node's launcher: ``torchrun --nnodes 2 --rdzv-backend c10d --rdzv-endpoint HOST:PORT ...``."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(NODES),
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "fastload-multinode-test",
        "--local-addr",
        "127.0.0.1",
        "--max-restarts",
        "0",
        os.fspath(SCRIPT),
        os.fspath(dataset),
        os.fspath(outdir),
    ]


def test_two_nodes_read_every_sample_once(uneven: Packed, tmp_path: Path) -> None:
    why = loopback_available()
    if why:
        pytest.skip(f"torchrun needs a TCP listener on loopback; {why}")
    env = child_env()
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK"):
        env.pop(name, None)
    cmd = node_command(free_port(), uneven.root, tmp_path)
    nodes = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for _ in range(NODES)
    ]
    outputs = []
    try:
        for node in nodes:
            out, _ = node.communicate(timeout=SUBPROCESS_TIMEOUT_S)
            outputs.append(out[-4000:])
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.wait()
    output = "\n---\n".join(outputs)
    if any(n.returncode for n in nodes) and any(marker in output for marker in CANNOT_START):
        pytest.skip(f"torchrun could not start a rendezvous on loopback:\n{output}")
    assert [n.returncode for n in nodes] == [0] * NODES, output

    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text(encoding="utf-8")) for r in range(NODES)]
    assert [r["rank_world"] for r in ranks] == [[0, 2], [1, 2]], "each node's rank took a share of its own"
    keys = [flat(r["batches"]) for r in ranks]
    dropped = [key for r in ranks for _, key in r["report"]["dropped"]]
    delivered = keys[0] + keys[1]
    assert len(delivered) == len(set(delivered)), "a sample was read on both nodes, or twice"
    assert sorted(delivered + dropped) == sorted(uneven.keys)
    assert len(dropped) == len(uneven.keys) % NODES
    assert ranks[0]["steps"] == ranks[1]["steps"], "the nodes took different step counts: DDP would hang"
    for r in range(NODES):
        assert keys[r] == uneven.rank_keys(
            rank=r, world_size=NODES, seed=5, epoch=0, even="split", shuffle_buffer=8
        )
