"""A real torchrun job (2 ranks, gloo): a plain DDP loop over PackedSequences of a skewed corpus runs through
the end of the epoch (equal steps on every rank, every token once), and the checkpoint it gathers at step 5
resumes on 1 and on 3 ranks with every token exactly once."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import fastload

from .conftest import TokenDataset, write_jsonl
from .helpers import STRIDE, documents, lognormal_lengths, pieces

SCRIPT = Path(__file__).resolve().parent / "scripts" / "packed_ddp.py"
# as tests/dataset/test_torchrun.py: failures that mean "no rendezvous on loopback here"
CANNOT_START = ("RendezvousConnectionError", "RendezvousTimeoutError", "DistNetworkError")
Run = tuple[Path, list[dict[str, Any]]]


def loopback_available() -> str | None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
    except OSError as exc:
        return f"cannot listen on 127.0.0.1: {exc}"
    return None


@pytest.fixture(scope="module")
def skewed(tmp_path_factory: pytest.TempPathFactory) -> TokenDataset:
    """120 long documents then 120 short ones: without a seed rank 0 of 2 reads the long ones."""
    base = tmp_path_factory.mktemp("skewed")
    lengths = lognormal_lengths(120, seed=5, median=90, cap=300) + lognormal_lengths(120, seed=6, median=40)
    docs = documents([min(n, 300) for n in lengths])
    write_jsonl(base / "src" / "a.jsonl", docs)
    fastload.pack_tokens(base / "src", base / "ds", shard_size_bytes=16 << 10, row_group_bytes=4 << 10)
    return TokenDataset(base / "ds", docs)


def torchrun(dataset: Path, out: Path, *args: str) -> list[dict[str, Any]]:
    why = loopback_available()
    if why:
        pytest.skip(f"torchrun needs a TCP listener on loopback; {why}")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += [os.fspath(SCRIPT), os.fspath(dataset), os.fspath(out), *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONWARNINGS", "COVERAGE"))}
    env.update(MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        env.pop(name, None)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180)
    output = proc.stdout[-4000:] + proc.stderr[-4000:]
    if proc.returncode != 0 and any(marker in output for marker in CANNOT_START):
        pytest.skip(f"torchrun could not start a rendezvous on loopback:\n{output}")
    assert proc.returncode == 0, output
    return [json.loads((out / f"rank{r}.json").read_text(encoding="utf-8")) for r in range(2)]


@pytest.fixture(scope="module")
def ddp_run(
    skewed: TokenDataset, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("packed-ddp")
    return out, torchrun(skewed.root, out)


def assert_every_token_once(docs: list[np.ndarray], segments: list[np.ndarray]) -> None:
    got: dict[int, list[np.ndarray]] = {}
    for seg in segments:
        got.setdefault(int(seg[0] // STRIDE), []).append(seg)
    want = {int(d[0] // STRIDE): d for d in docs}
    assert set(got) == set(want), f"missing documents {sorted(set(want) - set(got))[:10]}"
    for doc, parts in got.items():
        assert np.array_equal(np.sort(np.concatenate(parts)), want[doc]), f"document {doc}"


def split_docs(rows: list[list[int]]) -> list[np.ndarray]:
    """A block's real tokens cut where the document changes (segments of one document each)."""
    out = []
    for row in rows:
        a = np.asarray(row, dtype=np.int64)
        cuts = np.flatnonzero(np.diff(a // STRIDE)) + 1
        out += [s for s in np.split(a, cuts) if s.size]
    return out


def test_ddp_loop_runs_through_the_epoch_end(skewed: TokenDataset, ddp_run: Any) -> None:
    """Rank 0's documents make more blocks than rank 1's; by default (even="balance") rank 0 hands its last
    blocks to rank 1, both take the same steps, DDP finishes, and every token comes exactly once."""
    _, ranks = ddp_run
    assert ranks[0]["steps"] == ranks[1]["steps"] and ranks[0]["steps"][0] == ranks[0]["steps"][1]
    reports = [r["report"] for r in ranks]
    assert all(r["equal_steps"] is True and r["even"] == "balance" for r in reports)
    own = reports[0]["blocks_per_rank"]
    assert own == reports[1]["blocks_per_rank"] and own[0] > own[1] + 4, "the corpus is skewed"
    assert reports[0]["blocks_out"] == reports[1]["blocks_in"] > 0
    assert reports[0]["steps"] == reports[1]["steps"] == (own[0] + own[1] + 1) // 2
    assert sum(r["empty_blocks"] for r in reports) == (own[0] + own[1]) % 2
    rows = [row for r in ranks for row in r["head"] + r["tail"] if row]
    assert_every_token_once(skewed.docs, split_docs(rows))


@pytest.mark.parametrize("new_world", [1, 3])
def test_torchrun_checkpoint_resumes_on_another_number_of_ranks(
    skewed: TokenDataset, ddp_run: Any, new_world: int
) -> None:
    """The two ranks' states gathered at step 5 of the torchrun job, loaded on 1 or 3 ranks: the blocks of
    the first 5 steps plus the resumed ranks' give every token exactly once (minus the even split's cut of
    the resumed order, reported)."""
    out, ranks = ddp_run
    states = torch.load(out / "states.pt", weights_only=True)
    segments = split_docs([row for r in ranks for row in r["head"] if row])
    dropped = []
    for rank in range(new_world):
        ds = fastload.ShardDataset(skewed.root, rank=rank, world_size=new_world)
        upstream = fastload.DataLoader(ds, batch_size=8, collate_fn=list)
        packed = fastload.PackedSequences(upstream, seq_len=64, window=16)
        packed.load_state_dict(states)
        segments += [p for block in packed for p in pieces(block)]
        dropped += ds.epoch_report()["dropped"]
    assert len(dropped) < new_world
    keys = {s["__key__"]: int(s["tokens.i32"][0] // STRIDE) for s in fastload.ShardDataset(skewed.root)}
    cut = {keys[key] for _, key in dropped}
    assert_every_token_once([d for i, d in enumerate(skewed.docs) if i not in cut], segments)


def test_torchrun_checkpoint_resumes_on_the_same_ranks_under_ddp(ddp_run: Any) -> None:
    """The gathered states loaded on the same 2 ranks (each takes its own) in a second DDP loop: the same
    blocks as after the cut of the uninterrupted run, equal steps again."""
    _, ranks = ddp_run
    assert [r["resumed"] for r in ranks] == [r["tail"] for r in ranks]
