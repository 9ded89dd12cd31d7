"""Tail tolerance through the fault proxy: a GET whose body pauses, stops for good, or whose response head
never comes is hedged (a second GET for its remaining bytes, on a new connection) after the adaptive
deadline, not retried after ``read_timeout_s``; fault-free reads send no hedges; throttling holds hedges
back; the bytes stay exact (hedges' answers are checked like any other) and ``s3_stats()`` counts hedges.

Scaled down: the deadlines' floor is 0.05 s (``hedge_floor_s``; 0.5 s while the model is cold),
``read_timeout_s`` 4 s, pauses 8 s (twice the timeout, as the issue's 12 s pauses are against its 10 s),
"stopped for good" lasts until the proxy closes."""

from __future__ import annotations

import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import fastload
from fastload.copy import copy
from fastload.core.hedge import Deadlines, split_range
from fastload.core.ranges import ByteRange
from fastload.s3.reader import RangedReader
from fastload.testing.faultproxy import Fault, FaultProxy, Rule

from .helpers import BUCKET, PART, gets, parse_range, quiesce, sha, timed, url

PREFIX = "hedge/"
COUNT = 40
TIMEOUT_S = 4.0
FLOOR_S = 0.05  # cold (before 16 GETs are known): 10x, 0.5 s
PAUSE = Fault.stall_mid_body(after_bytes=1000, duration_s=2 * TIMEOUT_S)
STOPPED = Fault.stall_mid_body(after_bytes=1000, duration_s=600)  # ends when the proxy closes
NO_HEAD = Fault.hang(duration_s=600)


@pytest.fixture(scope="module")
def small(direct: Any) -> dict[str, bytes]:
    """``COUNT`` objects of 20-60 KB (one GET each)."""
    rng = random.Random(17)
    data = {f"{PREFIX}small-{i:03d}": rng.randbytes(rng.randrange(20_000, 60_000)) for i in range(COUNT)}
    for key, body in data.items():
        direct.put_object(Bucket=BUCKET, Key=key, Body=body)
    return data


def read_many(keys: list[str], config: fastload.S3Config) -> dict[str, bytes]:
    """Every object read whole by 8 threads, as a loader's workers would."""

    def one(key: str) -> bytes:
        with fastload.open(url(key), config=config) as f:
            return f.read()

    with ThreadPoolExecutor(8) as pool:
        return dict(zip(keys, pool.map(one, keys), strict=True))


def hedged_config(proxy: FaultProxy, make_config: Callable[..., fastload.S3Config], **kw: Any) -> Any:
    return make_config(
        proxy, **{"read_timeout_s": TIMEOUT_S, "hedge_floor_s": FLOOR_S, "deadline_s": 30.0, **kw}
    )


@pytest.mark.parametrize(
    "fault", [PAUSE, STOPPED, NO_HEAD], ids=["body-paused", "body-stopped", "first-byte-stalled"]
)
def test_stalled_gets_are_hedged_not_waited_out(
    proxy: FaultProxy,
    make_config: Callable[..., fastload.S3Config],
    small: dict[str, bytes],
    objects: dict[str, bytes],
    fault: Fault,
) -> None:
    keys = [*small, "obj-3m"]
    config = hedged_config(proxy, make_config)
    # fault-free first: the time to beat, and it warms the latency model (a cold one knows only the floor,
    # which a first request to a cold moto on a busy machine may pass: test_fault_free_reads... checks that)
    clean, clean_s = timed(lambda: read_many(keys, config), timeout_s=30)
    fastload.s3_stats(reset=True)
    # 3 of the next ~55 GETs (about 5%), spread over small objects and the parts of the big one: the first
    # GET of each of three objects, so it is that object's original GET (a hedge comes later), whatever
    # hedges a loaded machine sends for other, healthy GETs (counting all GETs, one of those could be hit)
    for key in (f"{PREFIX}small-004", f"{PREFIX}small-021", "obj-3m"):
        proxy.add(Rule(fault, method="GET", key=key, has_range=True, times=1))

    got, elapsed = timed(lambda: read_many(keys, config), timeout_s=30)

    expected = {**small, "obj-3m": objects["obj-3m"]}
    assert {k: sha(v) for k, v in got.items()} == {k: sha(v) for k, v in expected.items()}
    assert clean == got
    assert proxy.stats().injected[fault.kind] == 3
    stats = fastload.s3_stats()
    hedges = stats["hedges"]
    assert hedges["sent"] >= 3 and hedges["won"] >= 3, hedges  # every stalled GET was rescued by a hedge
    assert stats["retries_total"] == 0 and stats["failures"] == 0, stats  # none waited out read_timeout
    assert elapsed < TIMEOUT_S, (elapsed, clean_s)
    assert elapsed < max(1.5 * clean_s, clean_s + 1.5), (elapsed, clean_s)


def test_fault_free_reads_send_no_hedges(
    proxy: FaultProxy, make_config: Callable[..., fastload.S3Config], small: dict[str, bytes]
) -> None:
    defaults = fastload.S3Config()
    config = make_config(proxy, read_timeout_s=TIMEOUT_S, hedge_floor_s=defaults.hedge_floor_s)
    read_many(list(small), config)  # warms the latency model (a cold one waits 10x the floor)
    fastload.s3_stats(reset=True)
    for _ in range(3):
        read_many(list(small), config)
    stats = fastload.s3_stats()
    assert stats["requests"] >= 3 * COUNT
    assert stats["hedges"]["sent"] <= stats["requests"] // 100, stats["hedges"]


def test_no_hedges_while_the_store_throttles(
    proxy: FaultProxy, make_config: Callable[..., fastload.S3Config], objects: dict[str, bytes]
) -> None:
    """503s first, then a stall: the AIMD gate is in charge, so the stall is not hedged but waited out."""
    config = hedged_config(proxy, make_config, read_timeout_s=1.5)
    proxy.add(Rule(Fault.slowdown(), method="GET", key="small", times=2))
    proxy.add(Rule(PAUSE, method="GET", key="small", nth={3}))
    got, elapsed = timed(lambda: read_many(["small"], config), timeout_s=20)
    assert got["small"] == objects["small"]
    stats = fastload.s3_stats()
    assert stats["throttles"] == 2
    assert stats["hedges"]["sent"] == 0 and stats["hedges"]["suppressed_throttle"] == 1, stats["hedges"]
    assert stats["retries"].get("timeout") == 1  # the stall waited out read_timeout_s instead
    assert elapsed >= 1.5


def test_hedge_setting_zero_turns_hedging_off(
    proxy: FaultProxy, make_config: Callable[..., fastload.S3Config], objects: dict[str, bytes]
) -> None:
    config = hedged_config(proxy, make_config, read_timeout_s=1.0, hedge=0.0)
    proxy.add(Rule(PAUSE, method="GET", key="small", nth={1}))
    got, elapsed = timed(lambda: read_many(["small"], config), timeout_s=20)
    assert got["small"] == objects["small"]
    assert fastload.s3_stats()["hedges"]["sent"] == 0 and elapsed >= 1.0


def test_hedge_answers_are_checked_like_any_other(
    proxy: FaultProxy, make_config: Callable[..., fastload.S3Config], objects: dict[str, bytes]
) -> None:
    """The first hedge gets a wrong Content-Range: rejected, and the next hedge brings the right bytes."""
    config = hedged_config(proxy, make_config)
    proxy.add(Rule(STOPPED, method="GET", key="small", nth={1}))
    proxy.add(Rule(Fault.wrong_content_range(shift_bytes=7), method="GET", key="small", nth={2}))
    got, elapsed = timed(lambda: read_many(["small"], config), timeout_s=20)
    assert got["small"] == objects["small"]
    hedges = fastload.s3_stats()["hedges"]
    assert hedges["sent"] == 2 and hedges["failed"] == 1 and hedges["won"] == 1, hedges
    assert elapsed < TIMEOUT_S


def test_ranged_sample_reads_and_cp_are_hedged(
    proxy: FaultProxy,
    make_config: Callable[..., fastload.S3Config],
    objects: dict[str, bytes],
    tmp_path: Path,
) -> None:
    """``fetch_range`` (ShardDataset's ranged reads of sample runs) and ``fastload cp`` share the policy."""
    config = hedged_config(proxy, make_config)
    proxy.add(Rule(STOPPED, method="GET", key="obj-2m", nth={1, 4}))
    data = objects["obj-2m"]

    def ranges() -> list[bytes]:
        with RangedReader(BUCKET, "obj-2m", config=config) as reader:
            return [reader.fetch_range(s, s + 300_000) for s in (0, 700_000, 1_500_000)]

    got, elapsed = timed(ranges, timeout_s=20)
    assert got == [data[s : s + 300_000] for s in (0, 700_000, 1_500_000)]
    report, cp_s = timed(lambda: copy(url("obj-2m"), str(tmp_path / "out.bin"), config=config), timeout_s=20)
    assert report.files == 1 and (tmp_path / "out.bin").read_bytes() == data
    assert proxy.stats().injected["stall_mid_body"] == 2
    stats = fastload.s3_stats()
    assert stats["hedges"]["won"] == 2 and stats["retries_total"] == 0, stats
    assert elapsed < TIMEOUT_S and cp_s < TIMEOUT_S


def test_the_botocore_transport_is_not_hedged(
    proxy: FaultProxy, make_config: Callable[..., fastload.S3Config], objects: dict[str, bytes]
) -> None:
    """botocore offers no public way to cut a request short, so its stalls wait out read_timeout_s."""
    config = hedged_config(proxy, make_config, read_timeout_s=1.0, transport="botocore")
    proxy.add(Rule(PAUSE, method="GET", key="small", nth={1}))
    got, elapsed = timed(lambda: read_many(["small"], config), timeout_s=20)
    assert got["small"] == objects["small"]
    stats = fastload.s3_stats()
    assert stats["hedges"]["sent"] == 0 and stats["retries"].get("timeout") == 1 and elapsed >= 1.0


def test_shard_dataset_reads_are_hedged(
    proxy: FaultProxy, make_config: Callable[..., fastload.S3Config], direct: Any, tmp_path: Path
) -> None:
    """ShardDataset over S3 (index.json, then ranged reads of sample runs): stalled GETs among them are
    hedged, and every sample comes back as packed."""
    rng = random.Random(5)
    src = tmp_path / "src"
    files = {f"d{i // 10}/s{i:03d}.bin": rng.randbytes(rng.randrange(1000, 30_000)) for i in range(60)}
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    fastload.pack(str(src), str(tmp_path / "packed"), max_samples=20, progress=False)
    for path in sorted(p for p in (tmp_path / "packed").rglob("*") if p.is_file()):
        rel = path.relative_to(tmp_path / "packed").as_posix()
        direct.put_object(Bucket=BUCKET, Key=f"hedge-ds/{rel}", Body=path.read_bytes())
    # a stall waited out would take read_timeout_s; 10 s leaves a loaded machine room for the hedged read
    config = hedged_config(proxy, make_config, read_timeout_s=10.0)
    proxy.add(Rule(STOPPED, method="GET", key="hedge-ds/index.json", nth={1}))
    # the first data GET of two shards (their original GETs, whatever hedges of healthy GETs or sample
    # tables fetched ahead a busy machine sends first; counting all "shard-" GETs, one of those was hit)
    for shard in ("shard-000000.tar", "shard-000002.tar"):
        data = Rule(
            STOPPED, method="GET", key=f"hedge-ds/{shard}", times=1, where=lambda r: r.path.endswith(".tar")
        )
        proxy.add(data)

    def read() -> dict[str, bytes]:
        dataset = fastload.ShardDataset(f"s3://{BUCKET}/hedge-ds", s3_config=config, decode=False)
        return {s["__key__"]: s["bin"] for s in dataset}

    got, elapsed = timed(read, timeout_s=30)
    assert got == {rel[: -len(".bin")]: data for rel, data in files.items()}
    stalled = [r for r in proxy.requests() if r.fault == "stall_mid_body"]
    assert stalled[0].target.endswith("/index.json") and len(stalled) == 3
    assert all(r.target.endswith(".tar") and r.range for r in stalled[1:])  # ranged reads of sample runs
    stats = fastload.s3_stats()
    assert stats["hedges"]["won"] == 3 and stats["retries_total"] == 0, (stats["hedges"], stats["retries"])
    assert elapsed < 10.0


def test_hedges_that_lose_make_the_hedger_patient_and_winning_ones_undo_it() -> None:
    """The hedger's wiring of core.hedge.Patience: a race whose original GET beat its hedge stretches the
    deadline of the kind of lag it was hedged for; a race a hedge won shrinks it; a race without hedges,
    or one that failed, changes nothing."""
    from fastload.core.hedge import HedgePolicy, Lag
    from fastload.s3.hedging import Hedger
    from fastload.s3.stats import S3Stats

    class Ended:  # what Hedger.closed reads of a race
        def __init__(self, why: Lag | None, hedge_won: bool | None) -> None:
            self.primary, hedge = object(), object()
            self.group = None
            self.hedges = [hedge] if why is not None else []
            self.why = why
            self.winner = None if hedge_won is None else hedge if hedge_won else self.primary

    hedger = Hedger(S3Stats())
    policy = HedgePolicy()
    base = hedger.deadlines(policy)
    for race in (Ended(None, False), Ended(Lag.FIRST_BYTE, None)):
        hedger.closed(race, 0)  # type: ignore[arg-type]
        assert hedger.deadlines(policy) == base
    hedger.closed(Ended(Lag.FIRST_BYTE, False), 0)  # type: ignore[arg-type]
    hedger.closed(Ended(Lag.FIRST_BYTE, False), 0)  # type: ignore[arg-type]
    now = hedger.deadlines(policy)
    assert now.first_byte_s == pytest.approx(min(policy.ceiling_s, 4 * base.first_byte_s))
    assert now.progress_s == base.progress_s  # another kind: untouched
    hedger.closed(Ended(Lag.FIRST_BYTE, True), 0)  # type: ignore[arg-type]
    assert hedger.deadlines(policy).first_byte_s == pytest.approx(
        min(policy.ceiling_s, 2 * base.first_byte_s)
    )


def test_a_part_left_silent_is_hedged_early_in_concurrent_checked_ranges(
    proxy: FaultProxy,
    make_config: Callable[..., fastload.S3Config],
    objects: dict[str, bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """obj-3m in 256 KiB parts, 4 at a time: one part's GET never gets its response head while the reader's
    other GETs come back whole, so it is stranded and hedged at 3x the median first byte, not 3x the p99
    (0.9 s after the warm-up's two 0.3 s heads). The hedge asks for the part as 4 concurrent ranges (forced
    here: this endpoint needs no split), each answer checked: the first hedge's piece with a wrong
    Content-Range fails that hedge, the next one brings the bytes. The budget is the process's from the
    warm-up on: 5% would allow 4 hedges in all, and a loaded machine's warm-up (its first GETs against a
    cold model's 0.5 s) can spend 3 of them, leaving the silent part one hedge, then a cut and a retry."""
    config = hedged_config(proxy, make_config, hedge=0.25)
    proxy.add(Rule(Fault.latency(delay_s=0.3), method="GET", key="obj-3m", nth={2, 3}))
    for _ in range(2):  # 24 GETs: the latency model is warm, its p99 first byte 0.3 s
        assert read_many(["obj-3m"], config)["obj-3m"] == objects["obj-3m"]
    quiesce()  # a hedge a busy machine sent in the warm-up ends before the counters start
    fastload.s3_stats(reset=True)
    monkeypatch.setattr(Deadlines, "pieces", lambda self, nbytes: 4)
    before = len(gets(proxy, "obj-3m"))
    proxy.add(Rule(NO_HEAD, method="GET", key="obj-3m", has_range=True, nth={3}))
    mid_part = Rule(  # a GET that starts inside a part: a piece of a split hedge (the first one only)
        Fault.wrong_content_range(shift_bytes=7),
        method="GET",
        key="obj-3m",
        times=1,
        where=lambda r: r.range is not None and parse_range(r.range)[0] % PART != 0,
    )
    proxy.add(mid_part)

    got, elapsed = timed(lambda: read_many(["obj-3m"], config), timeout_s=20)

    assert sha(got["obj-3m"]) == sha(objects["obj-3m"])
    stats = fastload.s3_stats()
    hedges = stats["hedges"]
    # hedged early (a hedge sent past the p99 deadline counts as first_byte, not stranded); a loaded
    # machine may hedge a healthy GET too, hence the lower bounds
    assert hedges["stranded"] >= 1 and hedges["sent"] >= 2 and hedges["gets"] >= 8, hedges
    assert hedges["failed"] >= 1 and hedges["won"] >= 1, hedges  # the wrong piece failed its hedge
    assert stats["retries_total"] == 0 and elapsed < TIMEOUT_S, (stats, elapsed)
    records = gets(proxy, "obj-3m")[before:]
    silent = [r for r in records if r.fault == "hang"]
    assert len(silent) == 1 and silent[0].range is not None
    part = ByteRange(*parse_range(silent[0].range))
    asked = [parse_range(r.range) for r in records if r.range and r is not silent[0]]
    pieces = {(a, b) for a, b in asked if part.start <= a < part.end}  # the stalled part's hedges asked
    assert pieces == {(p.start, p.end) for p in split_range(part, 4)}  # for four ranges that tile it
    assert sum(1 for r in records if r.fault == "wrong_content_range") == 1


STOPPED_READER = r"""
import json, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
import fastload

endpoint, bucket, keys = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
config = fastload.S3Config(endpoint_url=endpoint, addressing_style="path", read_timeout_s=5.0,
                           hedge_floor_s=0.1, max_concurrency=4)
def one(key):
    with fastload.open(f"s3://{bucket}/{key}", config=config) as f:
        return len(f.read())
def rounds(n):
    with ThreadPoolExecutor(8) as pool:
        for _ in range(n):
            assert all(pool.map(one, keys))
rounds(1)  # the latency model warms up
fastload.s3_stats(reset=True)
stopped = threading.Event()  # the test closes stdin once its last stop is over: read until then, however slow
threading.Thread(target=lambda: (sys.stdin.read(), stopped.set()), daemon=True).start()
print("warm", flush=True)
done = 0
while not stopped.is_set():
    rounds(1)
    done += 1
stats = fastload.s3_stats()
print(json.dumps(stats["hedges"] | {"requests": stats["requests"], "rounds": done}), flush=True)
"""


def test_time_off_the_cpu_is_not_counted_as_lag(proxy: FaultProxy, small: dict[str, bytes]) -> None:
    """A reader process stopped (SIGSTOP) for 0.4 s five times while its GETs are in flight, as a loaded
    machine's scheduler does: every GET looks 0.4 s late when it resumes, but none lagged, so none is
    hedged (its deadlines: 3x a loopback p99, at least 0.1 s here; without the excuse a hedge follows some
    of the stops, whenever the watchdog runs before the readers take their waiting responses)."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    keys = ",".join(list(small)[:16])
    cmd = [sys.executable, "-c", STOPPED_READER, proxy.endpoint_url, BUCKET, keys]
    pipe = subprocess.PIPE
    child = subprocess.Popen(cmd, stdin=pipe, stdout=pipe, text=True, env=os.environ.copy())
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "warm"
        for _ in range(5):
            time.sleep(0.15)
            child.send_signal(signal.SIGSTOP)
            time.sleep(0.4)
            child.send_signal(signal.SIGCONT)
        out, _ = child.communicate(timeout=60)  # closes its stdin: it ends the round it is in
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, out
    hedges = json.loads(out.strip().splitlines()[-1])
    # it read from before the first stop to after the last, every read a GET at least (no fixed count: a
    # loaded machine reads fewer in the same time, and the reads, not their number, are what was stopped)
    assert hedges["rounds"] >= 1 and hedges["requests"] >= 16 * hedges["rounds"], hedges
    assert hedges["sent"] == 0, hedges
