"""``RangedReader.fetch_range``: exact bytes for any range (clipped at the object's end), from several
threads at once, through retried faults; an object overwritten between two calls raises
ObjectChangedError instead of mixing versions."""

from __future__ import annotations

import dataclasses
import random
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import fastload
from fastload.errors import ObjectChangedError
from fastload.s3.reader import RangedReader
from fastload.testing.faultproxy import Fault, FaultProxy, Rule

from .helpers import BUCKET, PART, bounded, gets, parse_range, url

KEY = "obj-3m"


def open_reader(key: str, config: fastload.S3Config) -> RangedReader:
    reader = fastload.open(url(key), config=config)
    assert isinstance(reader, RangedReader)
    return reader


def random_ranges(rng: random.Random, size: int, n: int) -> list[tuple[int, int]]:
    """Ranges inside the object, across part boundaries, past its end, empty and inverted."""
    out = []
    for _ in range(n):
        kind = rng.randrange(6)
        if kind == 0:  # small, anywhere
            a = rng.randrange(size)
            out.append((a, a + rng.randrange(1, 5000)))
        elif kind == 1:  # several parts
            a = rng.randrange(size)
            out.append((a, a + rng.randrange(PART, 3 * PART)))
        elif kind == 2:  # running past the end
            a = rng.randrange(max(0, size - PART), size)
            out.append((a, size + rng.randrange(1, 2 * PART)))
        elif kind == 3:  # starting at or past the end
            a = size + rng.randrange(0, 100)
            out.append((a, a + rng.randrange(0, 100)))
        elif kind == 4:  # empty or inverted
            a = rng.randrange(size)
            out.append((a, a - rng.randrange(0, 10)))
        else:  # exactly on part boundaries
            a = PART * rng.randrange(size // PART)
            out.append((a, a + PART * rng.randrange(1, 3)))
    return out


def check_ranges(reader: RangedReader, data: bytes, ranges: list[tuple[int, int]], threads: int) -> None:
    """Fetch every range with ``threads`` threads that start together; compare with ``data``."""
    barrier = threading.Barrier(threads)

    def one(chunk: list[tuple[int, int]]) -> list[bytes]:
        barrier.wait(5)
        return [reader.fetch_range(a, b) for a, b in chunk]

    chunks = [ranges[i::threads] for i in range(threads)]
    with ThreadPoolExecutor(threads) as pool:
        results = bounded(lambda: [f.result() for f in [pool.submit(one, c) for c in chunks]], 30)
    for chunk, got in zip(chunks, results, strict=True):
        for (a, b), piece in zip(chunk, got, strict=True):
            want = data[a:b] if b > a else b""
            assert len(piece) == len(want), (a, b)
            assert piece == want, (a, b)


@pytest.mark.parametrize("threads", [1, 4])
def test_random_ranges_are_exact(
    config: fastload.S3Config, objects: dict[str, bytes], proxy: FaultProxy, threads: int
) -> None:
    data = objects[KEY]
    ranges = random_ranges(random.Random(threads), len(data), 16)
    with open_reader(KEY, config) as reader:
        check_ranges(reader, data, ranges, threads)
        assert reader.tell() == 0  # no read position was used or moved
    stats = fastload.s3_stats()
    assert stats["retries_total"] == 0 and stats["failures"] == 0
    # every GET asked for bytes inside one wanted range (clipped): no read-ahead beyond what was asked
    wanted = [(a, min(b, len(data))) for a, b in ranges if min(b, len(data)) > a]
    for record in gets(proxy, KEY):
        assert record.range is not None
        start, end = parse_range(record.range)
        assert any(a <= start and end <= b for a, b in wanted), (start, end)


def test_small_object_and_empty_object(config: fastload.S3Config, objects: dict[str, bytes]) -> None:
    small = objects["small"]
    with open_reader("small", config) as reader:
        assert reader.fetch_range(0, 10**9) == small
        assert reader.fetch_range(len(small) - 1, len(small) + 1) == small[-1:]
        assert reader.fetch_range(len(small), len(small) + 5) == b""
    with open_reader("empty", config) as reader:
        assert reader.fetch_range(0, 100) == b""


def test_after_sequential_reads_fetch_range_agrees(
    config: fastload.S3Config, objects: dict[str, bytes]
) -> None:
    data = objects["obj-1m"]
    with open_reader("obj-1m", config) as reader:
        head = reader.read(100_000)
        assert reader.fetch_range(500_000, 700_000) == data[500_000:700_000]
        assert reader.read(100_000) == data[100_000:200_000]  # the read position was left alone
    assert head == data[:100_000]


FAULTS: dict[str, tuple[Fault, dict[str, Any]]] = {
    "slowdown": (Fault.slowdown(), {"times": 3}),
    "reset_before_response": (Fault.reset_before_response(), {"nth": {1, 4}}),
    "reset_mid_body": (Fault.reset_mid_body(after_bytes=40_000), {"nth": {2, 5}}),
    "truncate_body": (Fault.truncate_body(after_bytes=40_000), {"nth": {1, 3, 6}}),
}


@pytest.mark.parametrize("name", list(FAULTS))
def test_faults_are_retried_and_bytes_are_exact(
    proxy: FaultProxy, config: fastload.S3Config, objects: dict[str, bytes], name: str
) -> None:
    fault, schedule = FAULTS[name]
    proxy.add(Rule(fault, method="GET", key=KEY, has_range=True, **schedule))
    data = objects[KEY]
    rng = random.Random(name)
    ranges = [r for r in random_ranges(rng, len(data), 20) if r[1] > r[0]][:10]
    with open_reader(KEY, config) as reader:
        check_ranges(reader, data, ranges, 4)
    injected = proxy.stats().injected.get(fault.kind, 0)
    assert injected == (schedule.get("times") or len(schedule["nth"]))
    # a range past the end is answered 416; a fault cutting that short error body changes nothing (the
    # status says it all), so it is not retried. Which request lands there depends on thread timing.
    past_end = sum(1 for r in gets(proxy, KEY) if r.fault == fault.kind and r.status == 416)
    stats = fastload.s3_stats()
    assert stats["retries_total"] == injected - past_end
    assert stats["failures"] == 0


@pytest.mark.parametrize("same_size", [True, False], ids=["same-size", "other-size"])
def test_object_overwritten_between_calls_raises_object_changed(
    config: fastload.S3Config, direct: Any, same_size: bool
) -> None:
    key = f"fetch-range-overwritten/{uuid.uuid4().hex}"
    rng = random.Random(17)
    old = rng.randbytes(3 * PART)
    new = rng.randbytes(len(old) if same_size else len(old) - 1000)
    direct.put_object(Bucket=BUCKET, Key=key, Body=old)
    # (no stall here to detect: timeouts well above a busy machine's, so that no timeout retry can
    # stand in the count below, which is about the change alone)
    with open_reader(key, dataclasses.replace(config, read_timeout_s=10.0, connect_timeout_s=10.0)) as reader:
        assert reader.fetch_range(10, 5000) == old[10:5000]
        direct.put_object(Bucket=BUCKET, Key=key, Body=new)
        for a, b in [(0, 100), (PART - 10, 2 * PART + 10)]:  # one part, then several
            with pytest.raises(ObjectChangedError) as caught:
                bounded(lambda a=a, b=b: reader.fetch_range(a, b))
            err = caught.value
            assert (err.bucket, err.key) == (BUCKET, key)
            assert url(key) in str(err)
    assert fastload.s3_stats()["retries_total"] == 0  # a changed object is not retried


def test_overwritten_while_threads_fetch_never_mixes_versions(
    proxy: FaultProxy, make_config: Callable[..., fastload.S3Config], direct: Any
) -> None:
    key = f"fetch-range-overwritten/{uuid.uuid4().hex}"
    rng = random.Random(18)
    old, new = rng.randbytes(4 * PART), rng.randbytes(4 * PART)
    direct.put_object(Bucket=BUCKET, Key=key, Body=old)
    proxy.add(
        Rule(
            Fault.overwrite_before(lambda r: direct.put_object(Bucket=BUCKET, Key=key, Body=new)),
            method="GET",
            key=key,
            has_range=True,
            nth={4},
        )
    )
    changed: list[ObjectChangedError] = []
    lock = threading.Lock()
    with open_reader(key, make_config(proxy)) as reader:

        def one(i: int) -> None:
            a = (i * 300_000) % len(old)
            try:
                got = reader.fetch_range(a, a + PART + 1000)
            except ObjectChangedError as exc:
                with lock:
                    changed.append(exc)
                return
            assert got == old[a : a + PART + 1000]  # whole old bytes, never a mix with the new version

        with ThreadPoolExecutor(3) as pool:
            for f in [pool.submit(one, i) for i in range(9)]:
                bounded(f.result, 30)
    assert changed
    assert proxy.stats().injected.get("overwrite_before", 0) == 1
