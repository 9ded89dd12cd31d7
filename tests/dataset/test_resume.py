"""Exact resume: batches delivered before a checkpoint + batches delivered after restoring it == the
uninterrupted epoch, at any stop point, with any worker count on either side, and after a real SIGKILL."""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fastload.errors import ConfigError

from .helpers import (
    SUBPROCESS_TIMEOUT_S,
    Packed,
    batch_keys,
    child_env,
    flat,
    keys_of,
    make_loader,
    pack_files,
    run_python,
    take,
    uneven_files,
)

SCRIPTS = Path(__file__).resolve().parent / "scripts"
KW: dict[str, Any] = {"seed": 13, "shuffle_buffer": 16}


def uninterrupted(packed: Packed, *, batch_size: int = 4, epoch: int = 1, **kw: Any) -> list[str]:
    ds, dl = make_loader(packed, batch_size=batch_size, **{**KW, **kw})
    ds.set_epoch(epoch)
    return keys_of(dl)


def stop_after(
    packed: Packed, k: int, *, batch_size: int = 4, num_workers: int = 0, epoch: int = 1, **kw: Any
) -> tuple[list[str], dict[str, Any]]:
    """Iterate ``k`` batches, then checkpoint: the keys delivered and the state (through JSON)."""
    ds, dl = make_loader(packed, batch_size=batch_size, num_workers=num_workers, **{**KW, **kw})
    ds.set_epoch(epoch)
    iterator = iter(dl)
    before = keys_of(take(iterator, k))
    state = json.loads(json.dumps(dl.state_dict()))
    iterator.close()  # the job dies here
    return before, state


def resume(
    packed: Packed, state: dict[str, Any], *, batch_size: int = 4, num_workers: int = 0, **kw: Any
) -> list[str]:
    """A fresh dataset and loader that restore ``state`` and run to the end of the epoch."""
    _, dl = make_loader(packed, batch_size=batch_size, num_workers=num_workers, **{**KW, **kw})
    dl.load_state_dict(state)
    return keys_of(dl)


def test_resume_at_every_stop_point(uneven: Packed) -> None:
    full = uninterrupted(uneven)
    batches = math.ceil(len(full) / 4)
    assert len(full) % 4, "the last batch should be a short one"
    for k in range(batches + 1):
        before, state = stop_after(uneven, k)
        assert state["epoch"] == 1 and state["delivered"] == min(4 * k, len(full))
        after = resume(uneven, state)
        assert before + after == full, f"stopped after {k} batches"


@pytest.mark.parametrize(("workers_before", "workers_after"), [(2, 0), (0, 3), (1, 2), (3, 1)])
def test_resume_with_another_worker_count(uneven: Packed, workers_before: int, workers_after: int) -> None:
    full = uninterrupted(uneven, batch_size=5)
    batches = math.ceil(len(full) / 5)
    for k in (0, 1, 6, batches // 2 + 1, batches - 1, batches):
        before, state = stop_after(uneven, k, batch_size=5, num_workers=workers_before)
        after = resume(uneven, state, batch_size=5, num_workers=workers_after)
        assert before + after == full, f"stopped after {k} batches"


def test_resume_one_rank_of_three(uneven: Packed) -> None:
    kw = {"rank": 2, "world_size": 3, "even": "split"}
    full = uninterrupted(uneven, **kw)
    assert len(full) == len(uneven.keys) // 3
    for k in (0, 3, 7, 8):
        before, state = stop_after(uneven, k, num_workers=2, **kw)
        assert before + resume(uneven, state, num_workers=1, **kw) == full


def test_resume_with_another_batch_size(uneven: Packed) -> None:
    # The order is defined per sample, so a job may change its batch size (and workers) on restart.
    full = uninterrupted(uneven)
    before, state = stop_after(uneven, 5)  # 20 samples: not a multiple of the new batch size
    _, dl = make_loader(uneven, batch_size=3, num_workers=2, **KW)
    dl.load_state_dict(state)
    after_batches = batch_keys(dl)
    assert before + flat(after_batches) == full
    assert [len(b) for b in after_batches[:-1]] == [3] * (len(after_batches) - 1)


def test_resume_twice(uneven: Packed) -> None:
    full = uninterrupted(uneven)
    first, state = stop_after(uneven, 4, num_workers=2)
    _, dl = make_loader(uneven, batch_size=4, num_workers=3, **KW)
    dl.load_state_dict(state)
    iterator = iter(dl)
    second = keys_of(take(iterator, 9))
    state2 = json.loads(json.dumps(dl.state_dict()))
    iterator.close()
    assert state2["delivered"] == 4 * (4 + 9)
    third = resume(uneven, state2, num_workers=1)
    assert first + second + third == full


def test_resume_mid_second_epoch_with_persistent_workers(uneven: Packed) -> None:
    ds, dl = make_loader(uneven, batch_size=4, num_workers=2, loader={"persistent_workers": True}, **KW)
    ds.set_epoch(0)
    assert keys_of(dl) == uninterrupted(uneven, epoch=0)
    assert dl.state_dict()["delivered"] == 0  # a finished epoch leaves nothing to skip
    ds.set_epoch(1)
    iterator = iter(dl)
    before = keys_of(take(iterator, 7))
    state = dl.state_dict()
    iterator.close()
    assert state["epoch"] == 1
    assert before + resume(uneven, state, num_workers=2) == uninterrupted(uneven, epoch=1)


@pytest.mark.parametrize(
    ("change", "kw"),
    [("seed", {"seed": 14}), ("samples", None)],
)
def test_resume_refuses_a_different_job(
    uneven: Packed, small: Packed, change: str, kw: dict[str, Any] | None
) -> None:
    _, state = stop_after(uneven, 2)
    target = small if kw is None else uneven
    if kw is None:
        state = {**state, "seed": None}
        kw = {"seed": None}
    _, dl = make_loader(target, batch_size=4, **{**KW, **kw})
    with pytest.raises(ConfigError, match=change):
        dl.load_state_dict(state)


@pytest.mark.parametrize("change", ["shuffle_buffer", "even", "shard layout"])
def test_resume_refuses_a_checkpoint_of_another_order(uneven: Packed, tmp_path: Path, change: str) -> None:
    # Restoring skips the first `delivered` positions of *this* run's order; if the order differs from the
    # checkpointed run's, samples are silently repeated and lost, so such a restore must be refused.
    kw: dict[str, Any] = {"rank": 0, "world_size": 2, "even": "split"}
    _, state = stop_after(uneven, 3, **kw)
    target = uneven
    if change == "shuffle_buffer":
        kw["shuffle_buffer"] = 0
    elif change == "even":
        kw["even"] = "none"
    else:  # the same files packed into other shards: same sample count, another order
        target = pack_files(tmp_path, uneven_files(), max_samples=10)
        assert sorted(target.keys) == sorted(uneven.keys) and target.counts != uneven.counts
    _, dl = make_loader(target, batch_size=4, **{**KW, **kw})
    with pytest.raises(ConfigError):
        dl.load_state_dict(state)


@pytest.mark.parametrize(
    ("old", "new", "even"), [(2, 3, "split"), (3, 2, "split"), (2, 1, "pad"), (3, 2, "none")]
)
def test_resume_with_another_world_size_delivers_the_rest_exactly_once(
    uneven: Packed, old: int, new: int, even: str
) -> None:
    """Ranks in step (synchronous DDP) stop after 2 batches each; any one rank's checkpoint restores the
    rest of the epoch on a different number of ranks: nothing lost, nothing repeated beyond the policy."""
    delivered: list[str] = []
    states = []
    for rank in range(old):
        before, state = stop_after(uneven, 2, rank=rank, world_size=old, even=even)
        delivered += before
        states.append(state)
    assert len({s["delivered"] for s in states}) == 1
    rest: list[list[str]] = []
    reported: dict[str, list[tuple[str, str]]] = {"dropped": [], "repeated": []}
    for rank in range(new):
        ds, dl = make_loader(uneven, batch_size=4, rank=rank, world_size=new, even=even, **KW)
        dl.load_state_dict(states[rank % old])  # any rank's state describes them all
        rest.append(keys_of(dl))
        report = ds.epoch_report()
        reported["dropped"] += report["dropped"]
        reported["repeated"] += report["repeated"]
    after = [k for r in rest for k in r]
    repeated = [k for _, k in reported["repeated"]]
    dropped = {k for _, k in reported["dropped"]}
    # the original epoch's own drops (even="split" cuts N mod old) stay dropped
    original: set[str] = set()
    for rank in range(old):
        ds, _ = make_loader(uneven, batch_size=4, rank=rank, world_size=old, even=even, **KW)
        ds.set_epoch(1)
        original |= {k for _, k in ds.epoch_report()["dropped"]}
        repeated_before = [k for _, k in ds.epoch_report()["repeated"]]
        repeated = [k for k in repeated if k not in repeated_before] if even == "pad" else repeated
    everything = delivered + after
    if even == "pad":
        assert set(everything) == set(uneven.keys)
    else:
        assert not repeated
        assert len(everything) == len(set(everything)), "a sample was delivered twice"
        assert set(everything) | dropped | original == set(uneven.keys)
        assert not set(everything) & (dropped | original)
    if even != "none":
        assert len({len(r) for r in rest}) == 1, "DDP needs the same count on every new rank"


def test_a_resumed_epoch_checkpoints_and_resumes_again_on_the_same_world(uneven: Packed) -> None:
    _, state = stop_after(uneven, 2, rank=0, world_size=2)
    parts: dict[int, list[str]] = {}
    middle_states = []
    for rank in range(3):
        _, dl = make_loader(uneven, batch_size=4, rank=rank, world_size=3, **KW)
        dl.load_state_dict(state)
        iterator = iter(dl)
        parts[rank] = keys_of(take(iterator, 1))
        middle_states.append(json.loads(json.dumps(dl.state_dict())))
        iterator.close()
    assert middle_states[0]["resumed_from"] == {"world_size": 2, "delivered": 8}
    for rank in range(3):
        _, dl = make_loader(uneven, batch_size=4, rank=rank, world_size=3, **KW)
        dl.load_state_dict(middle_states[rank])
        parts[rank] += keys_of(dl)
    whole_rest = [resume(uneven, state, rank=rank, world_size=3) for rank in range(3)]
    assert [parts[r] for r in range(3)] == whole_rest
    _, dl = make_loader(uneven, batch_size=4, rank=0, world_size=1, **KW)
    with pytest.raises(ConfigError, match="already continues an epoch"):
        dl.load_state_dict(middle_states[0])
    too_far = {**state, "delivered": len(uneven.keys)}  # more than any old rank had
    with pytest.raises(ConfigError, match="cannot resume from this checkpoint"):
        dl.load_state_dict(too_far)


def label_and_key(sample: dict[str, Any]) -> tuple[int, str]:
    """``map=`` as training scripts write it: a (input, target)-style tuple per sample."""
    return sample["cls"], sample["__key__"]


def test_resume_when_map_returns_tuples(uneven: Packed) -> None:
    # Default collation turns a batch of 4 (label, key) tuples into [labels, keys]: still 4 samples.
    kw = {**KW, "map": label_and_key}
    _, dl = make_loader(uneven, batch_size=4, num_workers=2, **kw)
    full = [k for _, keys in dl for k in keys]
    _, dl = make_loader(uneven, batch_size=4, num_workers=2, **kw)
    iterator = iter(dl)
    before = [k for _, keys in take(iterator, 3) for k in keys]
    state = dl.state_dict()
    iterator.close()
    assert state["delivered"] == 12
    _, dl = make_loader(uneven, batch_size=4, num_workers=2, **kw)
    dl.load_state_dict(state)
    assert before + [k for _, keys in dl for k in keys] == full


# --- a real crash -----------------------------------------------------------------------------------


def read_batches(path: Path) -> list[list[str]]:
    """Complete JSON lines only (a kill may cut the last one short)."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def test_sigkill_mid_epoch_then_resume(uneven: Packed, tmp_path: Path) -> None:
    from .scripts import train_loop

    # The same job, uninterrupted and without workers.
    full = uninterrupted(
        uneven,
        batch_size=train_loop.BATCH,
        epoch=train_loop.EPOCH,
        seed=train_loop.SEED,
        shuffle_buffer=train_loop.SHUFFLE_BUFFER,
    )
    script = SCRIPTS / "train_loop.py"
    checkpoint, keys_log = tmp_path / "checkpoint.json", tmp_path / "keys.jsonl"
    cmd = [sys.executable, os.fspath(script), os.fspath(uneven.root), os.fspath(tmp_path)]
    proc = subprocess.Popen(
        [*cmd, "--num-workers", "2", "--step-s", "0.05"],
        env=child_env(),
        start_new_session=True,  # its own process group: the kill takes its DataLoader workers too
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        # Kill once 10+ batches are checkpointed, preferably while a batch is recorded but not checkpointed.
        deadline = time.monotonic() + SUBPROCESS_TIMEOUT_S
        while True:
            assert proc.poll() is None, (
                f"the training loop ended early: {proc.stderr.read().decode()[-3000:]}"
            )
            assert time.monotonic() < deadline, "the training loop made no progress"
            delivered = json.loads(checkpoint.read_bytes())["delivered"] if checkpoint.exists() else 0
            if delivered >= 40 and 4 * len(read_batches(keys_log)) > delivered:
                break
            time.sleep(0.002)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    assert not (tmp_path / "done").exists()

    state = json.loads(checkpoint.read_bytes())
    d = state["delivered"]
    recorded = flat(read_batches(keys_log))
    assert 40 <= d < len(full), "killed mid-epoch"
    # What the dead job trained on up to its checkpoint is a prefix of the uninterrupted order; what it saw
    # after the checkpoint (at most one batch, never checkpointed) must come again after the restart.
    assert recorded[:d] == full[:d]
    assert d <= len(recorded) <= d + train_loop.BATCH
    assert recorded[d:] == full[d : len(recorded)]

    done = run_python(script, uneven.root, tmp_path, "--resume", "--num-workers", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    resumed = flat(read_batches(tmp_path / "resumed.jsonl"))
    assert recorded[:d] + resumed == full
    assert json.loads(checkpoint.read_bytes())["delivered"] == len(full)


def legacy_fingerprint(packed: Packed, *, shuffle_buffer: int, world: int) -> str:
    """``order`` as fastload wrote it before even='split' without a seed rotated its cut."""
    digest = hashlib.sha256(repr((None, shuffle_buffer, "split", world)).encode())
    for shard in packed.index["shards"]:
        digest.update(f"{shard['name']}\0{shard['samples']}\0{shard.get('checksum')}\n".encode())
    return digest.hexdigest()[:16]


@pytest.mark.parametrize("epoch", [0, 1])
def test_a_checkpoint_from_before_the_split_rotation(uneven: Packed, epoch: int) -> None:
    # 95 samples over 2 ranks cut 1 sample; the cut now moves with the epoch, so an older checkpoint's
    # position means other samples, except in epoch 0 (no rotation yet): refused, saying why, past it
    kw: dict[str, Any] = {"rank": 1, "world_size": 2, "seed": None, "even": "split"}
    before, state = stop_after(uneven, 3, epoch=epoch, **kw)
    assert state["order"] != legacy_fingerprint(uneven, shuffle_buffer=KW["shuffle_buffer"], world=2)
    old = {**state, "order": legacy_fingerprint(uneven, shuffle_buffer=KW["shuffle_buffer"], world=2)}
    if epoch == 0:
        assert before + resume(uneven, old, **kw) == uninterrupted(uneven, epoch=0, **kw)
        return
    _, dl = make_loader(uneven, batch_size=4, **{**KW, **kw})
    with pytest.raises(ConfigError, match=r"rotates that cut with the epoch.*set_epoch\(1\)"):
        dl.load_state_dict(old)
    # a checkpoint of this version resumes exactly
    assert before + resume(uneven, state, **kw) == uninterrupted(uneven, epoch=1, **kw)


def test_resume_refuses_a_position_past_the_end_of_the_epoch(uneven: Packed) -> None:
    _, state = stop_after(uneven, 2, rank=0, world_size=2)
    _, dl = make_loader(uneven, batch_size=4, rank=0, world_size=2, **KW)
    with pytest.raises(ConfigError, match="delivered=400"):
        dl.load_state_dict({**state, "delivered": 400})
