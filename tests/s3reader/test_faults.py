"""Every fault the proxy can inject is retried for its range only, and the bytes read are the object's."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

import fastload
from fastload.core.hedge import PIECE_BYTES
from fastload.testing.faultproxy import Fault, FaultProxy, Rule

from .helpers import PART, gets, parse_range, sha, timed, url

KEY = "obj-2m"


def read_all(key: str, config: fastload.S3Config) -> bytes:
    with fastload.open(url(key), config=config) as f:
        return f.read()


# fault, rule schedule, the retry causes fastload may count for it
CASES: dict[str, tuple[Fault, dict[str, Any], set[str]]] = {
    "slowdown": (Fault.slowdown(), {"times": 3}, {"throttle"}),
    "internal_error": (Fault.internal_error(), {"nth": {1, 4}}, {"server"}),
    "request_timeout": (Fault.request_timeout(), {"nth": {2, 5}}, {"timeout"}),
    "reset_before_response": (Fault.reset_before_response(), {"nth": {1, 3}}, {"connection"}),
    # a reset mid-body surfaces from urllib3 either as a broken stream or as a short read
    "reset_mid_body": (
        Fault.reset_mid_body(after_bytes=50_000),
        {"nth": {2, 6}},
        {"connection", "short_body"},
    ),
    "truncate_body": (Fault.truncate_body(after_bytes=50_000), {"nth": {1, 3}}, {"short_body"}),
    "stall_mid_body": (Fault.stall_mid_body(after_bytes=50_000, duration_s=20), {"nth": {3}}, {"timeout"}),
    "hang": (Fault.hang(duration_s=20), {"nth": {2}}, {"timeout"}),
    "shift_range": (Fault.shift_range(shift_bytes=1000), {"nth": {1, 4}}, {"bad_range"}),
    "wrong_content_range": (Fault.wrong_content_range(shift_bytes=1), {"nth": {2, 3}}, {"bad_range"}),
}


def timeout_for(fault: Fault) -> float:
    """``read_timeout_s`` for a case: 1 s where the fault is a silence (the retry it costs is the point),
    5 s elsewhere, so a loaded machine's pause is not counted as a timeout retry beside the fault's own."""
    return 1.0 if fault.kind in ("stall_mid_body", "hang") else 5.0


@pytest.mark.parametrize("name", list(CASES))
def test_fault_is_retried_and_bytes_are_correct(
    proxy: FaultProxy, config: fastload.S3Config, objects: dict[str, bytes], name: str
) -> None:
    fault, schedule, causes = CASES[name]
    proxy.add(Rule(fault, method="GET", key=KEY, has_range=True, **schedule))
    data = objects[KEY]
    config = replace(config, hedge=0.0, read_timeout_s=timeout_for(fault))  # (hedged stalls: test_hedge.py)

    got, elapsed = timed(lambda: read_all(KEY, config))

    assert sha(got) == sha(data)
    injected = proxy.stats().injected.get(fault.kind, 0)
    expected = schedule.get("times") or len(schedule["nth"])
    assert injected == expected
    stats = fastload.s3_stats()
    assert set(stats["retries"]) <= causes, stats["retries"]
    assert stats["retries_total"] == injected  # one retry per fault, of that range only
    assert stats["failures"] == 0
    assert stats["throttles"] == (injected if fault.kind == "slowdown" else 0)
    records = gets(proxy, KEY)
    assert len(records) == len(data) // PART + injected
    # a stall or hang costs one read_timeout_s (1 s), not the fault's 20 s (the time includes the client;
    # 12 s leaves a machine loaded 10x room, and is still well short of one fault waited out); other
    # faults' retries back off for milliseconds (8 s: the same room)
    assert elapsed < (12.0 if fault.kind in ("stall_mid_body", "hang") else 8.0), elapsed


def test_retried_range_asks_for_the_same_bytes(
    proxy: FaultProxy, config: fastload.S3Config, objects: dict[str, bytes]
) -> None:
    proxy.add(Rule(Fault.internal_error(), method="GET", key=KEY, has_range=True, nth={3}))
    assert sha(timed(lambda: read_all(KEY, config))[0]) == sha(objects[KEY])
    records = gets(proxy, KEY)
    failed = [r for r in records if r.fault == "internal_error"]
    assert len(failed) == 1 and failed[0].status == 500
    later = [r.range for r in records if r.number > failed[0].number]
    assert failed[0].range in later  # asked again, as it was
    asked = [r.range for r in records]
    assert asked.count(failed[0].range) == 2
    assert all(asked.count(value) == 1 for value in asked if value != failed[0].range)  # no other repeats


@pytest.mark.parametrize("kind", ["truncate_body", "stall_mid_body"])
def test_retry_resumes_after_the_last_good_byte(
    proxy: FaultProxy, make_config: Callable[..., fastload.S3Config], objects: dict[str, bytes], kind: str
) -> None:
    """docs/s3.md: faults "retried for that range only, resuming after the last good byte". The proxy sends
    ``after_bytes`` of the body, then ends it (truncate: FIN) or goes silent (stall: until read_timeout_s);
    either way those bytes reached the reader intact, so the retry should ask only for the rest. A body is
    read in pieces of ``PIECE_BYTES`` (``fastload.s3.http1``), so a hedge sent when the stall passed its
    deadline asks for the rest after the whole pieces that arrived; a retry after the read timed out (a
    busy machine may hold the hedge back) asks for what follows the last byte (a piece cut by a timeout
    keeps its bytes)."""
    part = 1 << 20
    after = 600 << 10
    # the read timeout ends the stall; longer than the tests' usual 1 s, so that a machine too busy to
    # deliver the first body bytes within a second does not time the request out before the fault
    timeout_s = 3.0 if kind == "stall_mid_body" else 10.0
    config = make_config(proxy, part_size_bytes=part, read_timeout_s=timeout_s)
    fault = (
        Fault.truncate_body(after_bytes=after)
        if kind == "truncate_body"
        else Fault.stall_mid_body(after_bytes=after, duration_s=20)
    )
    proxy.add(Rule(fault, method="GET", key=KEY, has_range=True, nth={1}))
    assert sha(timed(lambda: read_all(KEY, config))[0]) == sha(objects[KEY])
    records = gets(proxy, KEY)
    assert records[0].fault == kind and records[0].range == f"bytes=0-{part - 1}"
    retry = next(r for r in records[1:] if r.range is not None and r.range.endswith(f"-{part - 1}"))
    resumed = {after} if kind == "truncate_body" else {after - after % PIECE_BYTES, after}
    start, end = parse_range(retry.range or "")
    assert start in resumed and end == part, (retry.range, resumed)


def test_truncated_first_answer_for_an_object_smaller_than_a_part(
    proxy: FaultProxy, config: fastload.S3Config, objects: dict[str, bytes]
) -> None:
    """The first request asks for a whole part, past the end of a small object; its retry resumes there."""
    data = objects["small"]
    proxy.add(Rule(Fault.truncate_body(after_bytes=40_000), method="GET", key="small", nth={1}))
    assert timed(lambda: read_all("small", config))[0] == data
    assert [(r.range, r.status) for r in gets(proxy, "small")] == [
        (f"bytes=0-{PART - 1}", 206),
        (f"bytes=40000-{PART - 1}", 206),
    ]


def test_slowdown_storm_is_ridden_out(
    proxy: FaultProxy, make_config: Callable[..., fastload.S3Config], objects: dict[str, bytes]
) -> None:
    # With max_backoff_s=0.2, the default 20 attempts last only about 1.5 s: let deadline_s bound the retries.
    config = make_config(proxy, max_attempts=500)
    # 2 s from the first GET (not from now: on a loaded machine the first GET came after a 2 s window)
    storm = proxy.add(Rule(Fault.slowdown(), method="GET", key=KEY, for_s=2.0, from_first=True))
    got, _ = timed(lambda: read_all(KEY, config))
    ended = time.monotonic()  # the proxy's clock: this process's monotonic one
    assert sha(got) == sha(objects[KEY])
    slowdowns = proxy.stats().injected["slowdown"]
    assert slowdowns >= 5
    stats = fastload.s3_stats()
    assert stats["throttles"] == stats["retries"]["throttle"] == stats["retries_total"] == slowdowns
    assert stats["failures"] == 0
    # no byte while every GET got 503 (2 s from the first); then the storm is ridden out, not waited out to
    # the deadline (10 s): at most a capped backoff (0.2 s) and the read at a lowered concurrency; a loaded
    # machine reads slower, so the bound grows with a clean read of the same object timed just after
    assert storm.first_at is not None
    _, clean = timed(lambda: read_all(KEY, config))
    assert 2.0 < ended - storm.first_at < 5.0 + 10 * clean, (ended - storm.first_at, clean)


@pytest.mark.parametrize("nth", [1, 3], ids=["first-request", "third-request"])
def test_ignored_range_uses_the_whole_body_once(
    proxy: FaultProxy, config: fastload.S3Config, objects: dict[str, bytes], nth: int
) -> None:
    data = objects[KEY]
    proxy.add(Rule(Fault.ignore_range(), method="GET", key=KEY, has_range=True, nth={nth}))

    def settled_count() -> int:
        """GETs for KEY once no new one has arrived for 0.3 s (bounded): a part scheduled just before the
        200's body was in may reach the proxy a moment after the read returned on a busy machine."""
        count, since, deadline = len(gets(proxy, KEY)), time.monotonic(), time.monotonic() + 5
        while time.monotonic() - since < 0.3 and time.monotonic() < deadline:
            time.sleep(0.02)
            if (now := len(gets(proxy, KEY))) != count:
                count, since = now, time.monotonic()
        return count

    def read_then_seek() -> tuple[bytes, int, bytes]:
        with fastload.open(url(KEY), config=config) as f:
            whole = f.read()
            issued = settled_count()
            f.seek(12345)
            return whole, issued, f.read(PART * 3)

    (got, issued, again), _ = timed(read_then_seek)
    assert sha(got) == sha(data)
    assert again == data[12345 : 12345 + PART * 3]
    records = gets(proxy, KEY)
    whole = [r for r in records if r.status == 200]
    assert len(whole) == 1 and whole[0].fault == "ignore_range"
    if nth == 1:
        assert len(records) == issued == 1  # the first answer was the whole object: nothing more fetched
    else:
        # Parts scheduled before the 200's body was in may still go out (how many depends on how fast the
        # other parts come back and slide the window), but no range is fetched twice, and once the whole
        # body is in, re-reads are served from it.
        asked = [r.range for r in records]
        parts = -(-len(data) // config.part_size_bytes)
        assert len(set(asked)) == len(asked) <= parts
        assert len(records) == issued
    assert fastload.s3_stats()["retries_total"] == 0


MIX = [
    Fault.slowdown(),
    Fault.internal_error(),
    Fault.request_timeout(),
    Fault.reset_before_response(),
    Fault.reset_mid_body(after_bytes=30_000),
    Fault.truncate_body(after_bytes=70_000),
    Fault.shift_range(shift_bytes=4096),
    Fault.wrong_content_range(shift_bytes=-7),
]


@pytest.mark.parametrize("seed", [1, 2, 3, 5, 6])
def test_random_mix_of_faults(
    make_proxy: Callable[..., FaultProxy],
    make_config: Callable[..., fastload.S3Config],
    objects: dict[str, bytes],
    seed: int,
) -> None:
    """30% of GETs fail, each with one of the fast faults (stall and hang have tests of their own; each costs
    a read timeout). Rule i fires with p_i = q / (1 - i q) on the requests earlier rules passed, so every kind
    gets q = 0.3 / len(MIX) of all requests."""
    proxy = make_proxy(seed)
    config = make_config(proxy)
    q = 0.3 / len(MIX)
    for i, fault in enumerate(MIX):
        proxy.add(Rule(fault, method="GET", key=KEY, probability=q / (1 - i * q)))

    def read_mixed() -> bytes:
        with fastload.open(url(KEY), config=config) as f:
            out = f.read(PART // 2)
            f.seek(len(out))
            return out + f.read()

    got, _ = timed(read_mixed, 30)
    assert sha(got) == sha(objects[KEY])
    injected = proxy.stats().injected
    assert sum(injected.values()) >= 1, "the seed injected nothing: pick another"
    stats = fastload.s3_stats()
    assert stats["retries_total"] == sum(injected.values())
    assert stats["throttles"] == injected.get("slowdown", 0)
    assert stats["failures"] == 0


def test_faults_on_head_are_retried(
    proxy: FaultProxy, config: fastload.S3Config, objects: dict[str, bytes]
) -> None:
    proxy.add(Rule(Fault.slowdown(), method="HEAD", times=2))
    data = objects["obj-1m"]

    def tail() -> bytes:
        with fastload.open(url("obj-1m"), config=config) as f:
            f.seek(-5000, io.SEEK_END)  # size unknown: asks HEAD first
            return f.read()

    assert timed(tail)[0] == data[-5000:]
    assert proxy.stats().injected["slowdown"] == 2
    assert fastload.s3_stats()["retries"] == {"throttle": 2}
