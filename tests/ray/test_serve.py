"""``fastload.serve`` on a local 2-CPU Ray cluster: batches made by feeder actors equal
``fastload.DataLoader``'s stream; a feeder SIGKILLed or ``ray.kill``-ed mid-epoch, or one added, changes
nothing; a checkpoint resumes exactly; two torchrun ranks each get their own stream; feeders are stopped
when a loader is closed or collected (none outlives a test); each feeder's telemetry reaches ``report()``;
tensors arrive without a copy."""

from __future__ import annotations

import gc
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from ray_helpers import worker_env, write_files

import fastload
from fastload.errors import ConfigError
from fastload.train.feeder import WireTensor, from_wire, to_wire
from fastload.train.serve import Served

pytestmark = pytest.mark.usefixtures("ray_cluster")

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "serve_ranks.py"
BATCH = 4
OPTIONS: dict[str, Any] = {"seed": 3, "shuffle_buffer": 8}


@pytest.fixture(autouse=True)
def no_feeder_outlives_a_test(ray_cluster: Any) -> Iterator[None]:
    yield
    assert alive_feeders(ray_cluster, wait_s=15) == []


def alive_feeders(ray: Any, *, wait_s: float = 0.0) -> list[str]:
    """The feeder actors alive on the cluster, after waiting up to ``wait_s`` for none to be."""
    from ray._private.state import state

    deadline = time.monotonic() + wait_s
    while True:
        alive = [
            str(a["ActorID"])
            for a in state.actor_table(None).values()
            if a["ActorClassName"] == "Feeder" and a["State"] != "DEAD"
        ]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.2)


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


def test_the_stream_equals_the_local_loaders_and_each_feeders_telemetry_reaches_report(dataset: Path) -> None:
    with served(dataset, map=add_length) as s:
        batches = list(s)
        report = s.report()
        same(batches, local(dataset, map=add_length))
        assert len(s) == len(local(dataset))
    feeders = report["feeders"]
    assert feeders and set(feeders) <= {"feeder0", "feeder1"}  # (one may start late and make nothing)
    made = [f["counters"]["samples"] for f in feeders.values()]
    assert all(made) and sum(made) == 50 == report["counters"]["samples"]
    assert report["counters"]["batches"] == len(batches)  # received, counted once (by the trainer)
    for f in feeders.values():
        assert f["stages"]["parse"]["items"] > 0 and f["stages"]["collate"]["calls"] > 0
    assert sum(f["stages"]["map"]["items"] for f in feeders.values()) > 0  # one sample in 8 is timed
    assert report["stages"]["handover"]["calls"] == len(batches)


def test_feeders_ask_for_the_resources_that_place_them_near_the_data(ray_cluster: Any, dataset: Path) -> None:
    """``feeder_resources``: each feeder holds the custom resource (on a cluster, only nodes started with
    it run feeders); one that no node has is refused up front, naming it, not waited for."""
    s = served(dataset, feeder_resources={"near_data": 1})
    try:
        stream = iter(s)
        first = next(stream)
        assert ray_cluster.available_resources().get("near_data", 0) == 4 - len(s.actors) == 2
        same([first, *stream], local(dataset))
    finally:
        s.close()
    with pytest.raises(ConfigError, match=r"feeder_resources names \['far_away'\].*near_data"):
        list(served(dataset, feeder_resources={"far_away": 1}))


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


def test_closing_or_collecting_a_loader_stops_its_feeders(ray_cluster: Any, dataset: Path) -> None:
    with served(dataset) as s:
        next(iter(s))
        assert len(alive_feeders(ray_cluster)) == 2
    assert alive_feeders(ray_cluster, wait_s=15) == []
    assert ray_cluster.is_initialized()  # a Ray this process started before serve is left running
    same(list(s), local(dataset))  # a closed loader starts anew, with new feeders
    assert len(alive_feeders(ray_cluster)) == 2
    del s
    gc.collect()
    assert alive_feeders(ray_cluster, wait_s=15) == []


def test_a_ray_that_serve_started_is_shut_down_by_its_last_user(dataset: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONWARNINGS", "RAY_ADDRESS"))}
    env.update(worker_env(tmp_path))
    proc = subprocess.run(
        [sys.executable, os.fspath(HERE / "serve_own_ray.py"), os.fspath(dataset)],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.splitlines() == ["after close: True", "after collect: False"]


def test_tensors_travel_as_numpy_and_arrive_without_a_copy(ray_cluster: Any) -> None:
    batch = {
        "x": torch.arange(24, dtype=torch.float32).reshape(2, 3, 4),
        "n": [torch.tensor(3), (torch.ones(2, dtype=torch.bfloat16), "a")],
        "__key__": ["a", "b"],
    }
    wire = ray_cluster.get(ray_cluster.put(to_wire(batch)))
    assert isinstance(wire["x"], WireTensor) and not wire["x"].array.flags.writeable  # the store's memory
    assert isinstance(wire["n"][1][0], torch.Tensor)  # bfloat16: no numpy dtype, pickled as a tensor
    back = from_wire(wire)
    assert back["x"].data_ptr() == wire["x"].array.ctypes.data  # a view of it, not a copy
    assert torch.equal(back["x"], batch["x"]) and back["__key__"] == ["a", "b"]
    assert torch.equal(back["n"][0], batch["n"][0]) and torch.equal(back["n"][1][0], batch["n"][1][0])
    assert back["n"][1][1] == "a" and isinstance(back["n"][1], tuple)


def test_a_mix_or_an_opened_dataset_is_refused_clearly(dataset: Path) -> None:
    mix = fastload.Mix({"a": fastload.ShardDataset(dataset), "b": fastload.ShardDataset(dataset)})
    with pytest.raises(fastload.errors.ConfigError, match=r"does not serve a fastload\.Mix yet"):
        fastload.serve(mix, BATCH)
    with pytest.raises(fastload.errors.ConfigError, match="not a ShardDataset"):
        fastload.serve(fastload.ShardDataset(dataset), BATCH)


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
