"""Training on a dataset that grows: a checkpoint records the version it read; resuming after an append
finishes the interrupted epoch exactly over that version (same samples, same order as without the append),
on every rank and with DataLoader workers on either side, also after a SIGKILL; the next epoch reads the
newest version unless ``version=`` pins one. A checkpoint of a version the dataset does not have (pinned
older, or replaced rather than appended to) is refused, saying which."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import fastload
from fastload.errors import ConfigError

from .helpers import (
    SUBPROCESS_TIMEOUT_S,
    child_env,
    flat,
    keys_of,
    make_loader,
    run_python,
    take,
    write_files,
)

SCRIPTS = Path(__file__).resolve().parent / "scripts"
TRAIN_OPTIONS = ("--num-workers", "2", "--step-s", "0.05")
KW: dict[str, Any] = {"seed": 13, "shuffle_buffer": 8}


def files(first: int, n: int, tag: str) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for i in range(first, first + n):
        out[f"{tag}/{i:04d}.txt"] = f"{tag} {i} ".encode() * (1 + i % 5)
        out[f"{tag}/{i:04d}.cls"] = b"%d" % (i % 3)
    return out


@pytest.fixture(scope="module")
def grown(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A dataset of 61 samples in uneven shards (version 1), and the same with 23 more appended
    (version 2)."""
    base = tmp_path_factory.mktemp("grow")
    write_files(base / "a", files(0, 61, "a"))
    write_files(base / "b", files(0, 23, "b"))
    v1, v2 = base / "v1", base / "v2"
    fastload.pack(base / "a", v1, max_samples=7, progress=False)
    shutil.copytree(v1, v2)
    fastload.pack(base / "b", v2, max_samples=5, append=True, progress=False)
    return v1, v2


def epoch_keys(root: Path, *, epoch: int, rank: int = 0, world: int = 1, **kw: Any) -> list[str]:
    ds, dl = make_loader(str(root), batch_size=4, rank=rank, world_size=world, **{**KW, **kw})
    ds.set_epoch(epoch)
    return keys_of(dl)


@pytest.mark.parametrize(("world", "workers_before", "workers_after"), [(1, 0, 2), (2, 2, 0), (3, 1, 3)])
def test_resume_after_an_append_finishes_the_epoch_over_the_old_version(
    grown: tuple[Path, Path], world: int, workers_before: int, workers_after: int
) -> None:
    v1, v2 = grown
    for rank in range(world):
        full_v1 = epoch_keys(v1, epoch=1, rank=rank, world=world)
        next_v2 = epoch_keys(v2, epoch=2, rank=rank, world=world)
        ds, dl = make_loader(
            str(v1), batch_size=4, num_workers=workers_before, rank=rank, world_size=world, **KW
        )
        ds.set_epoch(1)
        iterator = iter(dl)
        before = keys_of(take(iterator, 2))
        state = json.loads(json.dumps(dl.state_dict()))
        iterator.close()
        assert state["version"] == 1

        # the job restarts after the append: ShardDataset(dst) opens the newest version, 2
        ds2, dl2 = make_loader(
            str(v2), batch_size=4, num_workers=workers_after, rank=rank, world_size=world, **KW
        )
        assert ds2.view.version == 2
        dl2.load_state_dict(state)
        after = keys_of(dl2)
        assert before + after == full_v1, f"rank {rank} of {world}"
        assert not any(k.startswith("b/") for k in after)
        assert keys_of(dl2) == next_v2  # the next epoch reads version 2
        assert any(k.startswith("b/") for k in next_v2)


def test_a_checkpoint_records_its_version_and_a_pin_keeps_reading_it(grown: tuple[Path, Path]) -> None:
    v1, v2 = grown
    ds = fastload.ShardDataset(v2, **KW)
    assert ds.state_dict()["version"] == 2
    pinned = fastload.ShardDataset(v2, version=1, **KW)
    assert len(pinned.index.shards) == len(fastload.ShardDataset(v1).index.shards)
    pinned.set_epoch(3)
    assert [s["__key__"] for s in pinned] == epoch_keys(v1, epoch=3)
    state = fastload.ShardDataset(v1, **KW).state_dict()
    assert state["version"] == 1
    m = fastload.MapDataset(v2, version=1)
    assert len(m) == 61 and len(fastload.MapDataset(v2)) == 84

    # resumed over version 1 with version=1 pinned: every epoch is version 1's
    _, dl = make_loader(str(v2), batch_size=4, version=1, **KW)
    dl.load_state_dict(state)
    assert keys_of(dl) == epoch_keys(v1, epoch=0)
    assert keys_of(dl) == epoch_keys(v1, epoch=1)


def test_a_checkpoint_of_a_version_the_dataset_does_not_have_is_refused(
    grown: tuple[Path, Path], tmp_path: Path
) -> None:
    v1, v2 = grown
    newer = fastload.ShardDataset(v2, **KW)
    newer.set_epoch(1)
    state = newer.state_dict()
    with pytest.raises(ConfigError, match=r"version 2 \(\d+ shards\).*at version 1 .*does not have yet"):
        fastload.ShardDataset(v2, version=1, **KW).load_state_dict(state)
    # re-packed with other shard sizes: no version of it has the checkpoint's shard count
    old = fastload.ShardDataset(v1, **KW).state_dict()
    replaced = tmp_path / "replaced"
    fastload.pack(v1.parent / "a", replaced, max_samples=3, progress=False)
    fastload.pack(v1.parent / "b", replaced, max_samples=3, progress=False, append=True)
    with pytest.raises(ConfigError, match="replaced or re-packed since, not appended to"):
        fastload.ShardDataset(replaced, **KW).load_state_dict(old)


def read_batches(path: Path) -> list[list[str]]:
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def test_sigkill_then_append_then_resume(grown: tuple[Path, Path], tmp_path: Path) -> None:
    from .scripts import train_loop

    v1, _ = grown
    live = tmp_path / "ds"
    shutil.copytree(v1, live)
    full = epoch_keys(
        v1, epoch=train_loop.EPOCH, seed=train_loop.SEED, shuffle_buffer=train_loop.SHUFFLE_BUFFER
    )
    script = SCRIPTS / "train_loop.py"
    checkpoint, keys_log = tmp_path / "checkpoint.json", tmp_path / "keys.jsonl"
    proc = subprocess.Popen(
        [sys.executable, os.fspath(script), os.fspath(live), os.fspath(tmp_path), *TRAIN_OPTIONS],
        env=child_env(),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + SUBPROCESS_TIMEOUT_S
        while True:
            assert proc.poll() is None, (
                f"the training loop ended early: {proc.stderr.read().decode()[-3000:]}"
            )
            assert time.monotonic() < deadline, "the training loop made no progress"
            delivered = json.loads(checkpoint.read_bytes())["delivered"] if checkpoint.exists() else 0
            if delivered >= 16:
                break
            time.sleep(0.002)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stderr.close()
    state = json.loads(checkpoint.read_bytes())
    d = state["delivered"]
    assert 16 <= d < len(full) and state["version"] == 1
    recorded = flat(read_batches(keys_log))
    fastload.pack(v1.parent / "b", live, max_samples=5, append=True, progress=False)  # the data grew

    done = run_python(script, live, tmp_path, "--resume", "--num-workers", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    resumed = flat(read_batches(tmp_path / "resumed.jsonl"))
    assert recorded[:d] + resumed == full
    final = json.loads(checkpoint.read_bytes())
    assert final["delivered"] == len(full) and final["version"] == 1


def _mix(grows: Path, other: Path, **grows_kw: Any) -> fastload.Mix:
    sources = {
        "grows": fastload.ShardDataset(grows, **KW, **grows_kw),
        "other": fastload.ShardDataset(other, seed=1),
    }
    return fastload.Mix(sources, seed=3, batch_size=4)


def test_a_mix_whose_source_grew_finishes_the_epoch_over_the_version_its_checkpoint_read(
    grown: tuple[Path, Path],
) -> None:
    """As a ShardDataset does: the restored epoch reads the grown source's old version (same samples, same
    order as without the append), the next epoch the newest; a checkpoint taken meanwhile records the
    version it reads, and restores again."""
    v1, v2 = grown
    mix = _mix(v1, v1)
    mix.set_epoch(1)
    stream = iter(mix)
    [next(stream) for _ in range(10)]
    state = json.loads(json.dumps(mix.state_dict()))
    assert "source_versions" not in state  # (all read version 1: what a checkpoint without it means)
    assert fastload.Mix({"g": fastload.ShardDataset(v2, **KW)}).state_dict()["source_versions"] == {"g": 2}
    whole = _mix(v1, v1)
    whole.set_epoch(1)
    want = [s["__key__"] for s in whole]
    after = _mix(v2, v1)  # the job restarts after the append: the source opens version 2
    after.load_state_dict(state)
    assert [s["__key__"] for s in after] == want[10:]
    newest = _mix(v2, v1)
    newest.set_epoch(2)
    assert [s["__key__"] for s in after] == [s["__key__"] for s in newest]  # the next epoch: version 2
    assert any(k.startswith("b/") for k in (s["__key__"] for s in newest))

    again = _mix(v2, v1)
    again.load_state_dict(state)
    stream = iter(again)
    [next(stream) for _ in range(5)]
    mid = json.loads(json.dumps(again.state_dict()))
    stream.close()
    assert "source_versions" not in mid  # this epoch reads version 1 of "grows" (v2's own says 2)
    third = _mix(v2, v1)
    third.load_state_dict(mid)
    assert [s["__key__"] for s in third] == want[15:]
    pinned = _mix(v2, v1, version=1)  # pinned to version 1: the same epoch, and the next one stays there
    pinned.load_state_dict(state)
    assert [s["__key__"] for s in pinned] == want[10:]


@pytest.mark.parametrize(("workers_before", "workers_after"), [(2, 0), (0, 2)])
def test_a_mix_resumed_across_an_append_with_loader_workers(
    grown: tuple[Path, Path], workers_before: int, workers_after: int
) -> None:
    v1, v2 = grown
    whole = _mix(v1, v1)
    whole.set_epoch(1)
    want = [s["__key__"] for s in whole]
    mix = _mix(v1, v1)
    dl = fastload.DataLoader(
        mix, batch_size=4, num_workers=workers_before, timeout=60 if workers_before else 0
    )
    mix.set_epoch(1)
    iterator = iter(dl)
    before = keys_of(take(iterator, 3))
    state = json.loads(json.dumps(dl.state_dict()))
    iterator.close()
    later = _mix(v2, v1)
    dl2 = fastload.DataLoader(
        later, batch_size=4, num_workers=workers_after, timeout=60 if workers_after else 0
    )
    dl2.load_state_dict(state)
    assert before + keys_of(dl2) == want
    assert any(k.startswith("b/") for k in keys_of(dl2))  # the next epoch reads the appended samples


def test_torchrun_two_ranks_resume_across_an_append(grown: tuple[Path, Path], tmp_path: Path) -> None:
    """A real two-rank gloo job checkpoints mid-epoch, one rank appends, every rank restarts and finishes
    the epoch over version 1 with other worker counts, then reads version 2."""
    from .test_torchrun import CANNOT_START, loopback_available

    why = loopback_available()
    if why:
        pytest.skip(f"torchrun needs a TCP listener on loopback; {why}")
    v1, v2 = grown
    live, out = tmp_path / "ds", tmp_path / "out"
    shutil.copytree(v1, live)
    out.mkdir()
    script = SCRIPTS / "torchrun_append.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += [os.fspath(script), os.fspath(live), os.fspath(v1.parent / "b"), os.fspath(out)]
    env = child_env(MASTER_ADDR="127.0.0.1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        env.pop(name, None)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=SUBPROCESS_TIMEOUT_S)
    output = proc.stdout[-4000:] + proc.stderr[-4000:]
    if proc.returncode != 0 and any(marker in output for marker in CANNOT_START):
        pytest.skip(f"torchrun could not start a rendezvous on loopback:\n{output}")
    assert proc.returncode == 0, output
    kw = {"seed": 7, "shuffle_buffer": 8}
    for rank in range(2):
        got = json.loads((out / f"rank{rank}.json").read_text())
        assert (got["version"], got["opened"]) == (1, 2)
        assert got["before"] + got["after"] == epoch_keys(v1, epoch=1, rank=rank, world=2, **kw)
        assert got["next"] == epoch_keys(v2, epoch=2, rank=rank, world=2, **kw)
