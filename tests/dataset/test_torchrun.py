"""A real two-process torchrun job on loopback: each rank reads its share, rank and world size taken from
torch.distributed; together the ranks read every sample exactly once, minus what the split reports dropped."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import fastload

from .helpers import SUBPROCESS_TIMEOUT_S, Packed, child_env, flat
from .test_v2 import data_byte, flip, to_v2

SCRIPT = Path(__file__).resolve().parent / "scripts" / "torchrun_keys.py"
# Failures that mean "no rendezvous on loopback here", not a fastload problem.
CANNOT_START = (
    "RendezvousConnectionError",
    "RendezvousTimeoutError",
    "Address family not supported",
    "Cannot assign requested address",
    "Network is unreachable",
    "DistNetworkError",
)


def loopback_available() -> str | None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            s.listen(1)
    except OSError as exc:
        return f"cannot listen on 127.0.0.1: {exc}"
    return None


def damaged_copy(packed: Packed, root: Path) -> Path:
    """An index v2 copy of ``packed`` where a data byte of each sample of rank 0's second batch (of 2 ranks,
    seed 5, no shuffle buffer, batches of 4) is flipped: those samples fail their CRC32C."""
    to_v2(packed, root)
    plan = fastload.ShardDataset(root, seed=5, rank=0, world_size=2).plan()
    for shard, sample in plan.samples[4:8]:
        name, _, _, at = data_byte(root, shard, sample)
        flip(root / name, at)
    return root


@pytest.fixture(scope="module")
def torchrun_out(uneven: Packed, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One two-rank torchrun job (both scenarios of the script): its output folder and log."""
    why = loopback_available()
    if why:
        pytest.skip(f"torchrun needs a TCP listener on loopback; {why}")
    out = tmp_path_factory.mktemp("torchrun")
    damaged = damaged_copy(uneven, tmp_path_factory.mktemp("damaged") / "ds")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += [os.fspath(SCRIPT), os.fspath(uneven.root), os.fspath(out), os.fspath(damaged)]
    env = child_env(MASTER_ADDR="127.0.0.1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        env.pop(name, None)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=SUBPROCESS_TIMEOUT_S)
    output = proc.stdout[-4000:] + proc.stderr[-4000:]
    if proc.returncode != 0 and any(marker in output for marker in CANNOT_START):
        pytest.skip(f"torchrun could not start a rendezvous on loopback:\n{output}")
    assert proc.returncode == 0, output
    return out, output


def test_torchrun_two_ranks_read_every_sample_once(uneven: Packed, torchrun_out: tuple[Path, str]) -> None:
    tmp_path = torchrun_out[0]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text(encoding="utf-8")) for r in range(2)]
    assert [r["rank_world"] for r in ranks] == [[0, 2], [1, 2]]
    keys = [flat(r["batches"]) for r in ranks]
    dropped = [key for r in ranks for _, key in r["report"]["dropped"]]
    delivered = keys[0] + keys[1]
    assert len(delivered) == len(set(delivered)), "a sample was read by both ranks, or twice"
    assert sorted(delivered + dropped) == sorted(uneven.keys)
    assert len(dropped) == len(uneven.keys) % 2
    assert ranks[0]["steps"] == ranks[1]["steps"] and ranks[0]["steps"][0] == ranks[1]["steps"][1]
    # Each rank read its canonical share (one DataLoader worker changes nothing).
    for r in range(2):
        assert keys[r] == uneven.rank_keys(
            rank=r, world_size=2, seed=5, epoch=0, even="split", shuffle_buffer=8
        )


def test_torchrun_ranks_take_equal_steps_when_a_batch_is_all_skipped(torchrun_out: tuple[Path, str]) -> None:
    """Rank 0 meets a whole batch of undecodable samples under on_error="skip": without a step for it, rank
    0 would take one step fewer and DDP would hang. The batch before is repeated, and counted."""
    out, output = torchrun_out
    ranks = [json.loads((out / f"rank{r}-skip.json").read_text(encoding="utf-8")) for r in range(2)]
    assert ranks[0]["steps"] == ranks[1]["steps"] and ranks[0]["steps"][0] == ranks[0]["steps"][1]
    assert ranks[0]["skipped"] == 4 and ranks[1]["skipped"] == 0
    assert ranks[0]["repeated"] == 1 and ranks[1]["repeated"] == 0
    assert ranks[0]["batches"][1] == ranks[0]["batches"][0], "the batch before the skipped one is repeated"
    assert "every sample of a batch was skipped" in output


def test_torchrun_ranks_take_equal_steps_when_a_batch_fails_its_crc(torchrun_out: tuple[Path, str]) -> None:
    """Rank 0's second batch is damaged (every sample fails its CRC32C) and on_error="skip": the samples
    are left out, named with shard, key and byte offset, and the batch is a step all the same."""
    out, output = torchrun_out
    ranks = [json.loads((out / f"rank{r}-damaged.json").read_text(encoding="utf-8")) for r in range(2)]
    assert ranks[0]["steps"] == ranks[1]["steps"] and ranks[0]["steps"][0] == ranks[0]["steps"][1]
    assert ranks[0]["skipped"] == 4 and ranks[1]["skipped"] == 0
    assert ranks[0]["repeated"] == 1 and ranks[1]["repeated"] == 0
    assert ranks[0]["batches"][1] == ranks[0]["batches"][0]
    assert len(ranks[0]["named"]) == 4 and all(isinstance(n[2], int) for n in ranks[0]["named"])
    assert not {n[1] for n in ranks[0]["named"]} & {k for b in ranks[0]["batches"] for k in b}
    assert "fails its CRC32C" in output


def test_torchrun_mixture_ranks_draw_alike_and_take_equal_steps(torchrun_out: tuple[Path, str]) -> None:
    """A fastload.Mix on two torchrun ranks: the same sources at the same steps on both ranks (equal
    per-source counts), equal steps, each source's samples split between the ranks without repeats."""
    out, _ = torchrun_out
    ranks = [json.loads((out / f"rank{r}-mix.json").read_text(encoding="utf-8")) for r in range(2)]
    assert ranks[0]["steps"] == ranks[1]["steps"] and ranks[0]["steps"][0] == ranks[0]["steps"][1]
    pairs = [[tuple(p) for b in r["batches"] for p in b] for r in ranks]
    assert [s for s, _ in pairs[0]] == [s for s, _ in pairs[1]]
    for source in ("x", "y"):
        keys = [k for p in pairs for s, k in p if s == source]
        assert len(keys) == len(set(keys))
    counts = ranks[0]["report"]["sources"]
    assert abs(counts["x"]["samples"] - 0.7 * len(pairs[0])) < 2
