"""``fastload.serve`` on a local 2-CPU Ray cluster: batches made by feeder actors equal
``fastload.DataLoader``'s stream; a feeder SIGKILLed or ``ray.kill``-ed mid-epoch, or one added, changes
nothing; a checkpoint resumes exactly."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from ray_helpers import write_files

import fastload
from fastload.train.serve import Served

pytestmark = pytest.mark.usefixtures("ray_cluster")

HERE = Path(__file__).resolve().parent
BATCH = 4
OPTIONS: dict[str, Any] = {"seed": 3, "shuffle_buffer": 8}


def add_length(sample: dict[str, Any]) -> dict[str, Any]:
    return {**sample, "length": torch.tensor(len(sample["bin"]))}


@pytest.fixture(scope="module", autouse=True)
def by_value(ray_cluster: Any) -> None:
    """This module's functions (``map=``) travel to the feeders by value: Ray's workers cannot import it."""
    ray_cluster.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def packed(base: Path, n: int = 50) -> Path:
    rng = random.Random(5)
    files = {}
    for i in range(n):
        files[f"s/{i:04d}.cls"] = b"%d" % (i % 3)
        files[f"s/{i:04d}.bin"] = rng.randbytes(rng.randrange(1, 3000))
    write_files(base / "src", files)
    fastload.pack(base / "src", base / "ds", progress=False, shard_size_bytes=16 << 10)
    return base / "ds"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return packed(tmp_path_factory.mktemp("serve"))


def local(root: Path, **options: Any) -> list[Any]:
    """The batches of ``fastload.DataLoader`` in this process, the reference stream."""
    return list(fastload.DataLoader(fastload.ShardDataset(root, **OPTIONS, **options), batch_size=BATCH))


def keys(batches: list[Any]) -> list[str]:
    return [k for b in batches for k in b["__key__"]]


def same(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            if isinstance(x[k], torch.Tensor):
                assert torch.equal(x[k], y[k]), k
            else:
                assert x[k] == y[k], k


def served(root: Path, **kw: Any) -> Served:
    return fastload.serve(root, BATCH, feeders=2, feeder_cpus=0.5, **OPTIONS, **kw)


def test_the_stream_equals_the_local_loaders(dataset: Path) -> None:
    s = served(dataset, map=add_length)
    try:
        same(list(s), local(dataset, map=add_length))
        assert len(s) == len(local(dataset))
    finally:
        s.close()


def test_a_feeder_killed_mid_epoch_loses_and_repeats_nothing(ray_cluster: Any, dataset: Path) -> None:
    s = served(dataset, max_in_flight=2, window=6)
    try:
        it = iter(s)
        got = [next(it), next(it)]
        victim = next(iter(s.actors.values()))
        os.kill(ray_cluster.get(victim.pid.remote()), signal.SIGKILL)  # the feeder's process, mid-epoch
        got += list(it)
        same(got, local(dataset))
        assert s.feeder_deaths == 1 and len(s.actors) == 2
        ray_cluster.kill(next(iter(s.actors.values())), no_restart=True)  # and through Ray, next epoch
        s.set_epoch(0)
        same(list(s), local(dataset))
        assert s.feeder_deaths == 2
    finally:
        s.close()


def test_a_feeder_added_mid_epoch_changes_nothing(dataset: Path) -> None:
    s = served(dataset)
    try:
        it = iter(s)
        got = [next(it)]
        s.add_feeder()
        got += list(it)
        same(got, local(dataset))
        assert len(s.actors) == 3
    finally:
        s.close()


def test_a_checkpoint_resumes_exactly(dataset: Path) -> None:
    expected = local(dataset)
    s = served(dataset)
    try:
        it = iter(s)
        first = [next(it) for _ in range(5)]
        state = s.state_dict()
    finally:
        s.close()
    assert state["delivered"] == 5 * BATCH
    again = served(dataset)
    try:
        again.load_state_dict(state)
        same(first + list(again), expected)
    finally:
        again.close()
    # the same checkpoint restores fastload.DataLoader too
    loader = fastload.DataLoader(fastload.ShardDataset(dataset, **OPTIONS), batch_size=BATCH)
    loader.load_state_dict(state)
    same(first + list(loader), expected)


def test_a_feeder_that_cannot_start_is_an_error(dataset: Path, tmp_path: Path) -> None:
    """A ``collate_fn`` whose module only the trainer can import: every feeder would fail alike, so the
    first failure is the error (not a retry per feeder)."""
    (tmp_path / "trainer_only.py").write_text("def collate(samples):\n    return samples\n")
    sys.path.insert(0, os.fspath(tmp_path))
    try:
        import trainer_only  # type: ignore[import-not-found]

        s = served(dataset, collate_fn=trainer_only.collate)
        with pytest.raises(fastload.errors.ConfigError, match="could not start") as caught:
            list(s)
        assert s.feeder_deaths == 0
        assert "trainer_only" in str(caught.value)
        s.close()
    finally:
        sys.path.remove(os.fspath(tmp_path))
        sys.modules.pop("trainer_only", None)


def test_feeders_that_see_another_dataset_are_refused(tmp_path: Path) -> None:
    root = packed(tmp_path / "a")
    s = served(root)  # the trainer opened it; then it is replaced before any feeder opens it
    shutil.rmtree(root)
    shutil.move(packed(tmp_path / "b", n=30), root)
    with pytest.raises(fastload.errors.ConfigError, match="sees another dataset"):
        list(s)
    s.close()


def fail_on_some(sample: dict[str, Any]) -> dict[str, Any]:
    if sample["__key__"].endswith(("3", "7")):
        raise ValueError(f"bad sample {sample['__key__']}")
    return sample


def test_sample_errors_are_skipped_or_raised_as_locally(dataset: Path) -> None:
    s = served(dataset, map=fail_on_some, on_error="skip")
    try:
        expected = local(dataset, map=fail_on_some, on_error="skip")
        same(list(s), expected)
        assert s.skipped == 10 == s.dataset.skipped
    finally:
        s.close()
    s = served(dataset, map=fail_on_some)
    try:
        with pytest.raises(Exception) as here:
            local(dataset, map=fail_on_some)
        with pytest.raises(type(here.value), match="bad sample"):
            list(s)
    finally:
        s.close()


def hang_once(marker: str, sample: dict[str, Any]) -> dict[str, Any]:
    """Hangs in the first process that meets sample ``s/0007`` (it creates ``marker``), nowhere else."""
    if sample["__key__"] == "s/0007":
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return sample
        time.sleep(3600)
    return sample


def test_a_stuck_feeder_is_replaced(dataset: Path, tmp_path: Path) -> None:
    s = served(dataset, map=partial(hang_once, os.fspath(tmp_path / "hung")), feeder_timeout_s=4)
    try:
        same(list(s), local(dataset))
        assert (tmp_path / "hung").exists() and s.feeder_deaths == 1
    finally:
        s.close()


def test_a_trainer_killed_resumes_exactly(ray_cluster: Any, dataset: Path, tmp_path: Path) -> None:
    """SIGKILL of the training process mid-epoch (its feeders die with it); the checkpoint it last wrote
    resumes with new feeders: every sample trained on exactly once, in the local loader's order."""
    checkpoint = tmp_path / "ckpt.pt"
    address = ray_cluster.get_runtime_context().gcs_address
    cmd = [sys.executable, os.fspath(HERE / "serve_trainer.py"), os.fspath(dataset), address]
    cmd.append(os.fspath(checkpoint))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONWARNINGS", "RAY_ADDRESS"))}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if checkpoint.exists() and len(torch.load(checkpoint)["seen"]) >= 3 * BATCH:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"the trainer ended by itself:\n{err.decode(errors='replace')}"
    saved = torch.load(checkpoint)
    expected = keys(local(dataset))
    assert BATCH * 3 <= len(saved["seen"]) < len(expected)
    s = served(dataset)
    try:
        s.load_state_dict(saved["data"])
        assert saved["seen"] + keys(list(s)) == expected
    finally:
        s.close()
