"""``fastload.Mix`` over real packed sources: the stream is the same for any number of workers (through
``fastload.DataLoader`` and torch's), the proportions on every rank stay within the stated bound, ranks take
equal steps, stop rules, a schedule change lands at the step asked, and exact resume (same world, another
world size, a real SIGKILL)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch.utils.data

import fastload
from fastload.errors import ConfigError

from .helpers import SUBPROCESS_TIMEOUT_S, WORKER_TIMEOUT_S, Packed, child_env, pack_files, take

SCRIPT = Path(__file__).resolve().parent / "scripts" / "mix_loop.py"
WEIGHTS = {"a": 0.5, "b": 0.3, "c": 0.2}


def tiny_files(prefix: str, n: int) -> dict[str, bytes]:
    return {f"{prefix}/{i:03d}.txt": f"{prefix}{i}".encode() for i in range(n)}


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Packed]:
    """Three tiny datasets: 41 samples in shards of 6, 23 in shards of 4, 9 in shards of 3."""
    base = tmp_path_factory.mktemp("mix")
    sizes = {"a": (41, 6), "b": (23, 4), "c": (9, 3)}
    return {k: pack_files(base / k, tiny_files(k, n), max_samples=per) for k, (n, per) in sizes.items()}


def mix(sources: dict[str, Packed], rank: int = 0, world: int = 1, **kw: Any) -> fastload.Mix:
    order = {"rank": rank, "world_size": world}
    datasets = {
        "a": fastload.ShardDataset(sources["a"].root, seed=1, **order),
        "b": fastload.ShardDataset(sources["b"].root, seed=2, shuffle_buffer=4, **order),
        "c": fastload.ShardDataset(sources["c"].root, **order),
    }
    return fastload.Mix(datasets, kw.pop("weights", WEIGHTS), **{"seed": 7, **kw})


def pairs(batches: Any) -> list[tuple[str, str]]:
    return [(s, k) for b in batches for s, k in zip(b["__source__"], b["__key__"], strict=True)]


def loader(m: fastload.Mix, workers: int = 0, batch: int = 4) -> fastload.DataLoader:
    extra = {"timeout": WORKER_TIMEOUT_S} if workers else {}
    return fastload.DataLoader(m, batch_size=batch, num_workers=workers, **extra)


def check_bound(names: list[str], weights: dict[str, float]) -> None:
    """Every source's count over every window of N positions is within 2 of weight x N."""
    w = np.asarray([weights[k] for k in sorted(weights)]) / sum(weights.values())
    idx = np.asarray([sorted(weights).index(n) for n in names])
    counts = np.vstack([np.zeros(len(w)), np.cumsum(np.eye(len(w))[idx], axis=0)])
    for n in range(1, len(names) + 1):
        excess = np.abs(counts[n:] - counts[:-n] - n * w).max()
        assert excess < 2, f"window of {n}: off by {excess}"


def test_one_source_reads_exactly_as_the_dataset(sources: dict[str, Packed]) -> None:
    alone = fastload.Mix({"a": fastload.ShardDataset(sources["a"].root, seed=1, shuffle_buffer=5)})
    assert [s["__key__"] for s in alone] == sources["a"].rank_keys(
        rank=0, world_size=1, seed=1, epoch=0, shuffle_buffer=5
    )


@pytest.fixture(scope="module")
def reference(sources: dict[str, Packed]) -> list[tuple[str, str]]:
    """The uninterrupted first_exhausted epoch of rank 0 of 1, read in this process."""
    return [(s["__source__"], s["__key__"]) for s in mix(sources)]


def test_first_exhausted_stream_and_report(
    sources: dict[str, Packed], reference: list[tuple[str, str]]
) -> None:
    m = mix(sources)
    report = m.epoch_report()
    assert report["samples"] == len(reference) == len(m)
    got = {k: sum(1 for s, _ in reference if s == k) for k in WEIGHTS}
    assert {k: v["samples"] for k, v in report["sources"].items()} == got
    assert got["c"] == 9  # the smallest source ran out: the epoch ends at its next draw
    for k in WEIGHTS:  # each source's own first pass, without repeats
        keys = [key for s, key in reference if s == k]
        assert len(set(keys)) == len(keys)
    check_bound([s for s, _ in reference], WEIGHTS)


@pytest.mark.parametrize(("world", "rank", "workers"), [(1, 0, 2), (1, 0, 3), (3, 1, 2)])
def test_any_worker_count_gives_the_same_stream(
    sources: dict[str, Packed], reference: list[tuple[str, str]], world: int, rank: int, workers: int
) -> None:
    alone = reference if world == 1 else [(s["__source__"], s["__key__"]) for s in mix(sources, rank, world)]
    assert pairs(loader(mix(sources, rank, world), workers)) == alone
    if workers == 2:  # torch's own DataLoader, told the batch size
        dl = torch.utils.data.DataLoader(
            mix(sources, rank, world, batch_size=4), batch_size=4, num_workers=2, timeout=WORKER_TIMEOUT_S
        )
        assert pairs(dl) == alone


def test_skipped_samples_still_make_steps(sources: dict[str, Packed]) -> None:
    def fail_on_b(sample: dict[str, Any]) -> dict[str, Any]:
        if sample["__key__"].startswith("b/00"):
            raise ValueError("undecodable")
        return sample

    order = {"rank": 0, "world_size": 1}
    datasets = {
        "a": fastload.ShardDataset(sources["a"].root, seed=1, **order),
        "b": fastload.ShardDataset(sources["b"].root, map=fail_on_b, on_error="skip", **order),
    }
    plain = {"a": datasets["a"], "b": fastload.ShardDataset(sources["b"].root, **order)}
    full = [(s["__source__"], s["__key__"]) for s in fastload.Mix(plain, seed=7)]
    dl = loader(fastload.Mix(datasets, seed=7), workers=2)
    batches = [list(zip(b["__source__"], b["__key__"], strict=True)) for b in dl]
    assert [p for b in batches for p in b] == [p for p in full if not p[1].startswith("b/00")]
    assert dl.skipped == 10 and len(batches) == len(dl) == -(-len(full) // 4)  # every step taken


def test_bad_mixtures_are_refused(sources: dict[str, Packed]) -> None:
    a = fastload.ShardDataset(sources["a"].root, rank=0, world_size=1)
    with pytest.raises(ConfigError, match="disagree on"):
        fastload.Mix([a, fastload.ShardDataset(sources["b"].root, rank=1, world_size=2)])
    with pytest.raises(ConfigError, match="the sources are"):
        fastload.Mix({"a": a}, weights={"x": 1})
    with pytest.raises(ConfigError, match="not all 0"):
        fastload.Mix({"a": a}, weights=[0])
    with pytest.raises(ConfigError, match="stop="):
        fastload.Mix({"a": a}, stop="sometimes")
    with pytest.raises(ConfigError, match="increase"):
        fastload.Mix({"a": a}, schedule=[(3, [1]), (2, [1])])
    with pytest.raises(ConfigError, match="can never end"):
        stopping = fastload.Mix([a, a], schedule=[(1, [1, 0])], stop="all_exhausted", batch_size=4)
        len(stopping)


def test_persistent_workers_read_the_next_epoch(sources: dict[str, Packed]) -> None:
    m = mix(sources)
    dl = fastload.DataLoader(
        m, batch_size=4, num_workers=2, persistent_workers=True, timeout=WORKER_TIMEOUT_S
    )
    first, second = pairs(dl), pairs(dl)
    again = mix(sources)
    assert first == [(s["__source__"], s["__key__"]) for s in again]
    again.set_epoch(1)
    assert second == [(s["__source__"], s["__key__"]) for s in again] != first


def test_fastload_loader_takes_a_mix(sources: dict[str, Packed], reference: list[tuple[str, str]]) -> None:
    ready = fastload.loader(mix(sources), batch_size=4, num_workers=0)
    assert pairs(ready) == reference
    assert ready.state_dict()["kind"] == "fastload.Mix"


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_rank_tracks_the_weights_and_takes_equal_steps(sources: dict[str, Packed], world: int) -> None:
    skewed = {"a": 0.99, "b": 0.01, "c": 0.0}
    streams: list[list[str]] = []
    lengths = set()
    for r in range(world):
        m = mix(sources, r, world)
        names = [s["__source__"] for s in m]
        check_bound(names, WEIGHTS)
        lengths.add(len(names))
        endless = mix(sources, r, world, weights=skewed, stop="never")
        streams.append([s["__source__"] for s in itertools.islice(iter(endless), 250)])
        check_bound(streams[-1], skewed)
    assert len(lengths) == 1, "ranks must take the same number of steps"
    assert all(s == streams[0] for s in streams), "every rank draws the same sources at the same step"


def test_all_exhausted_reads_every_sample_and_never_cycles(sources: dict[str, Packed]) -> None:
    m = mix(sources, stop="all_exhausted")
    got = [(s["__source__"], s["__key__"]) for s in m]
    for k, packed in sources.items():
        assert {key for s, key in got if s == k} == set(packed.keys)
    assert m.epoch_report()["sources"]["c"]["passes"] > 1
    endless = mix(sources, stop="never")
    first = [(s["__source__"], s["__key__"]) for s in itertools.islice(iter(endless), 100)]
    c = [key for s, key in first if s == "c"]
    assert len(c) == 20 and sorted(c[:9]) == sorted(c[9:18])  # passes of c: each one whole
    with pytest.raises(TypeError, match="endless"):
        len(endless)


def test_a_source_read_in_several_passes_fetches_each_table_once(
    sources: dict[str, Packed], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each pass of a source plans its reads afresh; the sample tables its dataset keeps between passes
    (``cache_tables_bytes``) are not fetched again: once per shard over the epoch, however many passes."""
    from collections import Counter

    from fastload.storage import tables

    fetched: Counter[tuple[str, str]] = Counter()
    real = tables.fetch_table

    def fetch(root: str, entry: Any, **kw: Any) -> Any:
        fetched[root, entry.name] += 1
        return real(root, entry, **kw)

    monkeypatch.setattr(tables, "fetch_table", fetch)
    m = mix(sources, stop="all_exhausted")
    assert {s["__key__"] for s in m if s["__source__"] == "c"} == set(sources["c"].keys)
    assert m.epoch_report()["sources"]["c"]["passes"] > 1
    shards = {(str(p.root), s["name"]) for p in sources.values() for s in p.index["shards"]}
    assert set(fetched) == shards and set(fetched.values()) == {1}


def test_a_schedule_change_lands_at_the_step_asked(sources: dict[str, Packed]) -> None:
    m = mix(sources, weights={"a": 1, "b": 0, "c": 0}, schedule=[(3, {"a": 0, "b": 1, "c": 0})], stop="never")
    dl = loader(m, workers=2)
    batches = [list(b["__source__"]) for b in itertools.islice(iter(dl), 6)]
    assert batches == [["a"] * 4] * 3 + [["b"] * 4] * 3
    with pytest.raises(ConfigError, match="batch_size"):
        list(itertools.islice(iter(mix(sources, schedule=[(3, WEIGHTS)])), 1))


def stop_after(m: fastload.Mix, k: int, workers: int) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    dl = loader(m, workers)
    it = iter(dl)
    before = pairs(take(it, k))
    state = json.loads(json.dumps(dl.state_dict()))
    del it
    return before, state


@pytest.mark.parametrize("stop", ["first_exhausted", "never"])
def test_resume_with_other_workers_is_exact(sources: dict[str, Packed], stop: str) -> None:
    m = mix(sources, stop=stop)
    full = pairs(itertools.islice(iter(loader(m)), 30))
    before, state = stop_after(mix(sources, stop=stop), 7, workers=2)
    assert state["delivered"] == 28 and sum(state["sources"].values()) == 28
    assert len(json.dumps(state)) < 400
    dl = loader(mix(sources, stop=stop), workers=1)
    dl.load_state_dict(state)
    after = pairs(itertools.islice(iter(dl), 30 - 7))
    assert before + after == full


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")  # torchdata 0.11 on torch 2.13
@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumes_each_worker(sources: dict[str, Packed], workers: int) -> None:
    """torchdata's StatefulDataLoader keeps each worker's state (its own positions passed) and restores it
    in that worker: the resumed run continues exactly."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def make() -> Any:
        options = {"timeout": WORKER_TIMEOUT_S} if workers else {}
        m = mix(sources, batch_size=4, stop="never")
        return stateful.StatefulDataLoader(m, batch_size=4, num_workers=workers, **options)

    full = pairs(itertools.islice(iter(make()), 12))
    dl = make()
    it = iter(dl)
    before = pairs(take(it, 5))
    state = dl.state_dict()
    del it
    resumed = make()
    resumed.load_state_dict(state)
    assert before + pairs(itertools.islice(iter(resumed), 7)) == full


def test_resume_under_another_world_size(sources: dict[str, Packed]) -> None:
    """Two ranks in step stop after 3 batches; three ranks continue: within each source's pass no sample
    is read twice, the new ranks take equal steps, and the epoch ends when a source runs out."""
    read: dict[str, list[str]] = {k: [] for k in WEIGHTS}
    state: dict[str, Any] = {}
    for r in range(2):
        before, state = stop_after(mix(sources, r, 2), 3, workers=0)
        for s, key in before:
            read[s].append(key)
    steps = set()
    for r in range(3):
        m = mix(sources, r, 3)
        m.load_state_dict(state)
        rest = [(s["__source__"], s["__key__"]) for s in m]
        steps.add(len(rest))
        chosen = m.schedule().choices(np.arange(12, 12 + len(rest)))  # the schedule goes on at position 12
        assert [s for s, _ in rest] == [m.names[c] for c in chosen]
        for s, key in rest:
            read[s].append(key)
    assert len(steps) == 1
    for k, keys in read.items():
        assert len(keys) == len(set(keys)), f"source {k}: a sample was read twice"
    # c ran out: of its 9 samples, even="split" cut 1 (9 mod 2) and the re-split of the rest at most 2
    assert len(read["c"]) >= len(sources["c"].keys) - 1 - 2
    with pytest.raises(ConfigError, match="differs"):
        mix(sources, seed=8).load_state_dict(state)


def test_sigkill_mid_stream_then_resume(sources: dict[str, Packed], tmp_path: Path) -> None:
    roots = [os.fspath(sources[k].root) for k in WEIGHTS]
    full = pairs(itertools.islice(iter(loader(mix(sources, stop="never"))), 10))  # 40 samples
    checkpoint, log = tmp_path / "checkpoint.json", tmp_path / "keys.jsonl"
    proc = subprocess.Popen(
        [sys.executable, os.fspath(SCRIPT), *roots, os.fspath(tmp_path), "--num-workers", "2"],
        env=child_env(),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + SUBPROCESS_TIMEOUT_S
        while not (checkpoint.exists() and json.loads(checkpoint.read_bytes())["delivered"] >= 40):
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the loop made no progress"
            time.sleep(0.01)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stderr.close()  # type: ignore[union-attr]
    state = json.loads(checkpoint.read_bytes())
    d = state["delivered"]
    recorded = [tuple(p) for line in log.read_text().splitlines(keepends=True) if line.endswith("\n")
                for p in json.loads(line)]  # fmt: skip
    assert recorded[:40] == full and d <= len(recorded)
    dl = loader(mix(sources, stop="never"), workers=1)  # the restarted job (here, to save a start-up)
    dl.load_state_dict(state)
    resumed = pairs(itertools.islice(iter(dl), 10))
    longer = pairs(itertools.islice(iter(loader(mix(sources, stop="never"))), d // 4 + 10))
    assert recorded[:d] + resumed == longer


def test_a_scheduled_mix_reports_through_fastload_dataloader(sources: dict[str, Packed]) -> None:
    """docs/mixtures.md's form: the schedule's steps are the DataLoader's batches, and the mixture's own
    reports (which count them) work on the object the user made, as with ``Mix(batch_size=)``."""
    schedule = [(3, {"a": 0, "b": 1, "c": 0})]
    m = mix(sources, weights={"a": 1, "b": 0, "c": 0}, schedule=schedule)
    got = pairs(itertools.islice(iter(loader(m, batch=4)), 5))
    assert [s for s, _ in got] == ["a"] * 12 + ["b"] * 8
    explicit = mix(sources, weights={"a": 1, "b": 0, "c": 0}, schedule=schedule, batch_size=4)
    assert m.epoch_report() == explicit.epoch_report()
    assert m.source_counts(20) == explicit.source_counts(20) == {"a": 12, "b": 8, "c": 0}


def test_a_schedule_that_is_not_a_list_of_steps_is_refused(sources: dict[str, Packed]) -> None:
    with pytest.raises(ConfigError, match=r"a function is not taken.*\[\(s, f\(s\)\)"):
        mix(sources, schedule=lambda step: WEIGHTS, batch_size=4)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"must be a \(step, weights\) pair"):
        mix(sources, schedule=[WEIGHTS], batch_size=4)  # type: ignore[list-item]
