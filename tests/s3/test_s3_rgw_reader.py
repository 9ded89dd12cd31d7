"""``fastload.open`` on a real S3 implementation (Ceph RGW): a 40 MiB object read as 4 MiB ranged GETs, eight
at a time, whole, with random seeks, and through the fault proxy (503 storm, resets, truncation, a 200 for a
Range, a shifted range, an overwrite mid-read). The proxy re-signs the requests it rewrites: RGW checks SigV4.
"""

from __future__ import annotations

import hashlib
import io
import random
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from s3util import MIB, payload, s3_config

import fastload
from fastload.errors import ObjectChangedError
from fastload.s3.reader import FIRST_PART_BYTES
from fastload.testing.faultproxy import Fault, Rule

OBJECT_BYTES = 40 * MIB
PART_BYTES = 4 * MIB
CONCURRENCY = 8
FIRST_BYTES = min(PART_BYTES, FIRST_PART_BYTES)  # the reader's small first part, then PART_BYTES parts
PARTS = 1 + -(-(OBJECT_BYTES - FIRST_BYTES) // PART_BYTES)
PART_STARTS = {0} | set(range(FIRST_BYTES, OBJECT_BYTES, PART_BYTES))


@pytest.fixture(scope="module")
def big(rgw: Any, rgw_client: Any, module_bucket: Callable[..., str]) -> SimpleNamespace:
    """One 40 MiB random object, shared by the module's tests (none of them changes it)."""
    name = module_bucket(rgw)
    data = payload(OBJECT_BYTES, seed=40)
    rgw_client.put_object(Bucket=name, Key="data/big.bin", Body=data)
    return SimpleNamespace(
        bucket=name, key="data/big.bin", url=f"s3://{name}/data/big.bin", data=data, sha256=_sha256(data)
    )


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_all_sha256(f: io.BufferedIOBase, chunk: int = 3 * MIB + 17) -> tuple[str, int]:
    digest, total = hashlib.sha256(), 0
    while block := f.read(chunk):
        digest.update(block)
        total += len(block)
    return digest.hexdigest(), total


def reader_config(rgw: Any, *, endpoint_url: str | None = None, **overrides: Any) -> fastload.S3Config:
    # deadline_s bounds a test whose reader keeps failing (the default is 120 s).
    options: dict[str, Any] = {
        "part_size_bytes": PART_BYTES,
        "max_concurrency": CONCURRENCY,
        "deadline_s": 30,
    }
    options.update(overrides)
    return s3_config(rgw, endpoint_url=endpoint_url, **options)


def test_whole_object_read_matches_its_sha256(
    rgw: Any, rgw_env: dict[str, str], big: SimpleNamespace
) -> None:
    before = fastload.s3_stats()["requests"]
    with fastload.open(big.url, config=reader_config(rgw)) as f:
        digest, total = read_all_sha256(f)
        assert f.read(1) == b""
    assert (digest, total) == (big.sha256, len(big.data))
    assert fastload.s3_stats()["requests"] - before >= PARTS, "read as ranged parts"


def test_random_seeks_return_the_right_bytes(rgw: Any, rgw_env: dict[str, str], big: SimpleNamespace) -> None:
    data, size = big.data, len(big.data)
    rng = random.Random(7)
    with fastload.open(big.url, config=reader_config(rgw)) as f:
        assert f.seek(0, io.SEEK_END) == size
        assert f.read(10) == b""
        for _ in range(60):
            start = rng.choice([rng.randrange(size), rng.randrange(PARTS) * PART_BYTES - 1, size - 5])
            start = max(0, start)
            length = rng.choice([1, 100, PART_BYTES + 3, rng.randrange(2 * PART_BYTES)])
            assert f.seek(start) == start
            assert f.read(length) == data[start : start + length], (start, length)
            assert f.tell() == min(size, start + length)
        f.seek(-1000, io.SEEK_END)
        assert f.read() == data[-1000:]
        f.seek(10)
        f.seek(PART_BYTES, io.SEEK_CUR)
        assert f.read(64) == data[10 + PART_BYTES : 10 + PART_BYTES + 64]


# Each case: a rule made fresh per test, and the fault kind the proxy must report as injected.
FAULT_CASES: dict[str, tuple[Callable[[], Rule], str]] = {
    "reset_mid_body": (
        lambda: Rule(
            Fault.reset_mid_body(after_bytes=MIB + 123), method="GET", has_range=True, nth={1, 3, 6}
        ),
        "reset_mid_body",
    ),
    "truncated_body": (
        lambda: Rule(Fault.truncate_body(after_bytes=2 * MIB), method="GET", has_range=True, nth={2, 4, 5}),
        "truncate_body",
    ),
    "shift_range": (
        lambda: Rule(Fault.shift_range(shift_bytes=4096), method="GET", has_range=True, nth={1, 3, 8}),
        "shift_range",
    ),
    "ignore_range_on_a_later_part": (
        lambda: Rule(Fault.ignore_range(), method="GET", has_range=True, nth={3}),
        "ignore_range",
    ),
}


@pytest.mark.parametrize("case", sorted(FAULT_CASES))
def test_faults_are_retried_and_bytes_stay_correct(
    case: str, rgw: Any, rgw_env: dict[str, str], rgw_proxy: Callable[..., Any], big: SimpleNamespace
) -> None:
    make_rule, kind = FAULT_CASES[case]
    proxy = rgw_proxy(seed=11)
    active = proxy.add(make_rule())
    # hedge=0: the requests counted below are the retries under test (a loaded machine can make a part
    # lag and be hedged, one more GET; hedging has tests of its own)
    config = reader_config(
        rgw, endpoint_url=proxy.endpoint_url, base_backoff_s=0.01, max_backoff_s=0.1, hedge=0
    )
    with fastload.open(big.url, config=config) as f:
        assert read_all_sha256(f) == (big.sha256, len(big.data))
    assert active.fired >= 1
    assert proxy.stats().injected.get(kind, 0) >= 1, proxy.stats().injected
    gets = [r for r in proxy.requests() if r.method == "GET"]
    if kind == "ignore_range":
        # One 200 with the whole object, and its body is used: no range is fetched again after it.
        assert [r.status for r in gets].count(200) == 1
        assert len(gets) <= PARTS
    else:
        assert all(r.range for r in gets)
        assert len(gets) > PARTS, "the faulted ranges were fetched again"
    if kind == "truncate_body":  # (after a reset the kernel may drop bytes already received: not checked)
        starts = [int(r.range.removeprefix("bytes=").split("-")[0]) for r in gets]
        assert any(start not in PART_STARTS for start in starts), (
            f"a retry resumes after the good bytes: {starts}"
        )


def test_a_200_with_the_whole_object_for_the_first_range_is_used_once(
    rgw: Any, rgw_env: dict[str, str], rgw_proxy: Callable[..., Any], big: SimpleNamespace
) -> None:
    proxy = rgw_proxy()
    proxy.add(Rule(Fault.ignore_range(), method="GET", has_range=True, nth={1}))
    # no hedges: a loaded machine's slow whole body could be hedged by range, which is not what this checks
    config = reader_config(rgw, endpoint_url=proxy.endpoint_url, hedge=0)
    with fastload.open(big.url, config=config) as f:
        assert read_all_sha256(f) == (big.sha256, len(big.data))
        f.seek(PART_BYTES * 3 + 5)
        assert f.read(100) == big.data[PART_BYTES * 3 + 5 : PART_BYTES * 3 + 105]
    records = proxy.requests()
    assert [(r.method, r.fault, r.status) for r in records] == [("GET", "ignore_range", 200)]
    # The whole body crossed the proxy once (plus heads), not once more as ranges.
    assert proxy.stats().bytes_from_upstream < len(big.data) + 64 * 1024


def test_a_1_5_second_503_storm_is_ridden_out(
    rgw: Any, rgw_env: dict[str, str], rgw_proxy: Callable[..., Any], big: SimpleNamespace
) -> None:
    proxy = rgw_proxy(seed=3)
    # A process gate of its own (keyed by its limit), so the storm's AIMD cut does not slow other tests.
    config = reader_config(
        rgw, endpoint_url=proxy.endpoint_url, process_max_concurrency=61, max_backoff_s=0.4, deadline_s=30
    )
    began = time.monotonic()
    proxy.add(Rule(Fault.slowdown(), method="GET", for_s=1.5, from_first=True))  # from the first GET
    with fastload.open(big.url, config=config) as f:
        assert read_all_sha256(f) == (big.sha256, len(big.data))
    elapsed = time.monotonic() - began
    slowdowns = proxy.stats().injected.get("slowdown", 0)
    assert slowdowns >= 3
    assert elapsed >= 1.4, "no byte can arrive while every GET gets 503"
    assert elapsed < 15
    statuses = [r.status for r in proxy.requests()]
    assert statuses.count(503) == slowdowns


def test_an_object_overwritten_mid_read_raises_object_changed(
    rgw: Any,
    rgw_env: dict[str, str],
    rgw_client: Any,
    rgw_proxy: Callable[..., Any],
    bucket: Callable[..., str],
) -> None:
    name, key = bucket(rgw), "data/changing.bin"
    old, new = payload(OBJECT_BYTES, seed=50), payload(OBJECT_BYTES, seed=51)  # same size: only ETags differ
    rgw_client.put_object(Bucket=name, Key=key, Body=old)
    overwrites: list[int] = []

    def overwrite(request: Any) -> None:
        rgw_client.put_object(Bucket=name, Key=key, Body=new)  # straight to RGW, not through the proxy
        overwrites.append(request.number)

    proxy = rgw_proxy()
    proxy.add(Rule(Fault.overwrite_before(overwrite), method="GET", has_range=True, nth={3}))
    got = bytearray()
    # no hedges: on a loaded machine the 3rd GET could be a hedge whose original then wins with old bytes
    # (a consistent read of the old version, rightly not an error), and this test would see no 412
    config = reader_config(rgw, endpoint_url=proxy.endpoint_url, hedge=0)
    with (
        pytest.raises(ObjectChangedError) as excinfo,
        fastload.open(f"s3://{name}/{key}", config=config) as f,
    ):
        while block := f.read(MIB):
            got += block
    assert len(overwrites) == 1
    assert excinfo.value.key == key and key in str(excinfo.value)
    assert bytes(got) == old[: len(got)], "bytes handed out before the error all come from the old version"
    # RGW honoured If-Match: the overwritten object's ranges were refused with 412 Precondition Failed.
    statuses = [r.status for r in proxy.requests() if r.method == "GET"]
    assert 412 in statuses, statuses
    with fastload.open(f"s3://{name}/{key}", config=reader_config(rgw)) as f:
        assert read_all_sha256(f)[0] == _sha256(new)
