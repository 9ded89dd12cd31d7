"""Through a proxy that injects nothing: file semantics, archive libraries, parallel ranged GETs."""

from __future__ import annotations

import io
import random
import tarfile
import time
import zipfile
from typing import Any

import pyarrow.parquet as pq
import pytest

import fastload
from fastload.testing.faultproxy import Fault, FaultProxy, Rule

from .conftest import parquet_table
from .helpers import PART, bounded, gets, parse_range, sha, url


def read_all(key: str, config: fastload.S3Config) -> bytes:
    with fastload.open(url(key), config=config) as f:
        return f.read()


def test_sequential_read_is_ranged_parts_covering_the_object_once(
    proxy: FaultProxy, config: fastload.S3Config, objects: dict[str, bytes]
) -> None:
    data = objects["obj-3m"]
    assert sha(bounded(lambda: read_all("obj-3m", config))) == sha(data)

    records = gets(proxy, "obj-3m")
    assert records and all(r.range is not None for r in records)
    assert all(r.status == 206 for r in records)
    ranges = sorted(parse_range(r.range) for r in records if r.range)
    assert ranges == [(a, min(a + PART, len(data))) for a in range(0, len(data), PART)]
    stats = fastload.s3_stats()
    assert stats["requests"] == len(ranges)
    assert stats["bytes"] == len(data)
    assert stats["retries_total"] == stats["throttles"] == stats["failures"] == 0


def test_read_in_small_chunks(
    proxy: FaultProxy, config: fastload.S3Config, objects: dict[str, bytes]
) -> None:
    data = objects["obj-2m"]

    def chunks() -> bytes:
        out = bytearray()
        with fastload.open(url("obj-2m"), config=config) as f:
            while chunk := f.read(99_991):  # crosses part boundaries at odd places
                assert f.tell() == len(out) + len(chunk)
                out += chunk
        return bytes(out)

    assert sha(bounded(chunks)) == sha(data)


def test_readinto_fills_the_buffer(
    proxy: FaultProxy, config: fastload.S3Config, objects: dict[str, bytes]
) -> None:
    data = objects["obj-2m"]

    def into() -> tuple[int, bytearray, int, bytes]:
        buf = bytearray(len(data) + 10)
        with fastload.open(url("obj-2m"), config=config) as f:
            n = f.readinto(buf)
            assert f.readinto(bytearray(10)) == 0  # at EOF
        raw_buf = bytearray(PART * 2)
        with fastload.open(url("obj-2m"), config=config) as f:
            f.seek(PART - 100)
            m = f.readinto(memoryview(raw_buf)[10:])  # spans a part boundary, fills the whole view
        return n, buf, m, bytes(raw_buf[10 : 10 + m])

    n, buf, m, raw_bytes = bounded(into)
    assert n == len(data)
    assert sha(buf[:n]) == sha(data)
    assert buf[n:] == bytes(10)
    assert m == min(PART * 2 - 10, len(data) - (PART - 100))
    assert raw_bytes == data[PART - 100 : PART - 100 + m]


def test_random_seeks_and_reads_match_slices(
    proxy: FaultProxy, config: fastload.S3Config, objects: dict[str, bytes]
) -> None:
    data = objects["obj-3m"]
    rng = random.Random(42)

    def seek_around() -> int:
        with fastload.open(url("obj-3m"), config=config) as f:
            for _ in range(60):
                near_boundary = rng.randrange(12) * PART + rng.randrange(-3, 3)
                offset = max(0, rng.choice([rng.randrange(len(data)), near_boundary]))
                length = rng.choice([1, 100, PART - 1, PART + 1, 3 * PART, rng.randrange(1, 400_000)])
                how = rng.randrange(3)
                if how == 0:
                    assert f.seek(offset) == offset
                elif how == 1:
                    assert f.seek(offset - f.tell(), io.SEEK_CUR) == offset
                else:
                    assert f.seek(offset - len(data), io.SEEK_END) == offset
                assert f.tell() == offset
                got = f.read(length)
                assert got == data[offset : offset + length], (offset, length)
                assert f.tell() == min(len(data), offset + length)
            return f.tell()

    bounded(seek_around, 30)


def test_seek_from_end_and_tell(
    proxy: FaultProxy, config: fastload.S3Config, objects: dict[str, bytes]
) -> None:
    data = objects["obj-1m"]

    def tail() -> tuple[int, bytes, int, int, bytes]:
        with fastload.open(url("obj-1m"), config=config) as f:  # nothing read yet: size comes from HEAD
            pos = f.seek(-1000, io.SEEK_END)
            last = f.read()
            end_tell = f.tell()
            return pos, last, end_tell, f.seek(0, io.SEEK_END), f.read(5)

    pos, last, end_tell, end, after = bounded(tail)
    assert pos == len(data) - 1000
    assert last == data[-1000:]
    assert end_tell == end == len(data)
    assert after == b""


@pytest.mark.parametrize(
    ("fresh", "beyond"),
    [(True, 12345), (True, 0), (False, 12345), (False, 0)],
    ids=["before-first-read", "at-size-before-first-read", "after-a-read", "at-size-after-a-read"],
)
def test_reading_past_eof_returns_empty(
    proxy: FaultProxy, config: fastload.S3Config, objects: dict[str, bytes], fresh: bool, beyond: int
) -> None:
    data = objects["obj-1m"]
    assert len(data) % PART == 0  # at-size: the position is the first byte of a part that does not exist

    def past_end() -> tuple[bytes, bytes, int, bytes, bytes]:
        with fastload.open(url("obj-1m"), config=config) as f:
            if not fresh:
                f.read(10)
            f.seek(len(data) + beyond)
            a = f.read(100)
            b = f.read()
            where = f.tell()
            f.seek(len(data) - 3)
            return a, b, where, f.read(100), f.read(100)

    a, b, where, last3, empty = bounded(past_end)
    assert a == b == empty == b""
    assert where == len(data) + beyond
    assert last3 == data[-3:]


@pytest.mark.parametrize("key", ["obj-3m", "small"])
def test_first_read_in_the_middle_or_at_the_end(
    proxy: FaultProxy, config: fastload.S3Config, objects: dict[str, bytes], key: str
) -> None:
    data = objects[key]
    offsets = [len(data) // 2 + 7, len(data) - 10]

    def first_reads() -> list[bytes]:
        out = []
        for offset in offsets:
            with fastload.open(url(key), config=config) as f:  # a fresh reader: the size is unknown
                f.seek(offset)
                out.append(f.read(100_000))
        return out

    assert bounded(first_reads) == [data[o : o + 100_000] for o in offsets]
    first_ranges = [parse_range(r.range or "") for r in gets(proxy, key) if r.fault is None][:1]
    part = offsets[0] // PART
    assert first_ranges == [(part * PART, (part + 1) * PART)]  # the part holding the position, as asked


def test_empty_object(proxy: FaultProxy, config: fastload.S3Config) -> None:
    def empty() -> tuple[bytes, bytes, int, int]:
        with fastload.open(url("empty"), config=config) as f:
            first = f.read()
            again = f.read(10)
            n = f.readinto(bytearray(10))
            return first, again, n, f.seek(0, io.SEEK_END)

    assert bounded(empty) == (b"", b"", 0, 0)


def test_object_smaller_than_one_part(
    proxy: FaultProxy, config: fastload.S3Config, objects: dict[str, bytes]
) -> None:
    data = objects["small"]
    assert len(data) < PART
    assert sha(bounded(lambda: read_all("small", config))) == sha(data)
    records = gets(proxy, "small")
    assert [(r.range, r.status) for r in records] == [(f"bytes=0-{PART - 1}", 206)]


@pytest.mark.parametrize("mode", ["r", "r|"])
def test_tarfile_over_the_reader(
    proxy: FaultProxy, config: fastload.S3Config, objects: dict[str, bytes], mode: str
) -> None:
    expected = _members_of_tar(objects["archive.tar"])

    def members() -> dict[str, str]:
        out = {}
        with fastload.open(url("archive.tar"), config=config) as f, tarfile.open(fileobj=f, mode=mode) as tar:
            for member in tar:
                extracted = tar.extractfile(member)
                assert extracted is not None
                out[member.name] = sha(extracted.read())
        return out

    assert bounded(members) == expected
    assert all(r.range is not None for r in gets(proxy, "archive.tar"))


def _members_of_tar(blob: bytes) -> dict[str, str]:
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        return {m.name: sha(tar.extractfile(m).read()) for m in tar}  # type: ignore[union-attr]


def test_zipfile_over_the_reader(
    proxy: FaultProxy, config: fastload.S3Config, objects: dict[str, bytes]
) -> None:
    with zipfile.ZipFile(io.BytesIO(objects["archive.zip"])) as zf:
        expected = {name: sha(zf.read(name)) for name in zf.namelist()}

    def members() -> dict[str, str]:
        with fastload.open(url("archive.zip"), config=config) as f, zipfile.ZipFile(f) as zf:
            assert zf.testzip() is None
            return {name: sha(zf.read(name)) for name in reversed(zf.namelist())}

    assert bounded(members) == expected


def test_parquet_over_the_reader(
    proxy: FaultProxy, config: fastload.S3Config, objects: dict[str, bytes]
) -> None:
    def table() -> Any:
        with fastload.open(url("table.parquet"), config=config) as f:
            whole = pq.read_table(f)
        with fastload.open(url("table.parquet"), config=config) as f:
            parquet = pq.ParquetFile(f)
            assert parquet.metadata.num_row_groups == 6
            group = parquet.read_row_group(4)
        return whole, group

    whole, group = bounded(table)
    expected = parquet_table()
    assert whole.equals(expected)
    assert group.equals(expected.slice(400, 100))


def test_parts_are_fetched_in_parallel(
    proxy: FaultProxy, config: fastload.S3Config, objects: dict[str, bytes]
) -> None:
    delay_s = 0.2
    data = objects["obj-2m"]
    parts = len(data) // PART
    assert parts == 8

    def read_slow_parts() -> tuple[bytes, float]:
        with fastload.open(url("obj-2m"), config=config) as f:
            proxy.add(Rule(Fault.latency(delay_s=delay_s), method="GET"))
            f.seek(0, io.SEEK_END)  # HEAD: the client exists and the size is known before the clock starts
            started = time.monotonic()
            f.seek(0)
            got = f.read()
            return got, time.monotonic() - started

    got, elapsed = bounded(read_slow_parts)
    assert sha(got) == sha(data)
    # one GET per part, plus one per retry the reader reports (on a loaded machine a response can miss the
    # 1 s read timeout or find its keep-alive connection closed: recovered, and counted, never silent)
    retries = fastload.s3_stats()["retries_total"]
    assert proxy.stats().injected["latency"] == parts + retries
    # One request at a time would take at least parts x delay (1.6 s); 4 in flight take about 2 x delay.
    assert elapsed < 0.6 * parts * delay_s + retries * (config.read_timeout_s + delay_s), elapsed
