"""The range-served files pyarrow reads Parquet through: one base (storage.rangedfile) under three
subclasses (a foreign footer scan, a projected read, random access)."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fastload.formats.parquet.foreign import SparseFile as FooterFile
from fastload.formats.parquet.sparse import SparseFile
from fastload.storage.rangedfile import RangedFile
from fastload.train.mapshards import RangeFile

DATA = bytes(range(256)) * 1024  # 256 KiB: more than RangeFile keeps of the tail (64 KiB)


class Calls:
    """A ranged read over DATA that records each (offset, size) asked for; ``short`` bytes fewer each."""

    def __init__(self, short: int = 0) -> None:
        self.asked: list[tuple[int, int]] = []
        self.short = short

    def __call__(self, offset: int, size: int) -> bytes:
        self.asked.append((offset, size))
        return DATA[offset : offset + size - self.short]


def files(read: Calls) -> list[RangedFile]:
    return [
        FooterFile(len(DATA), read),
        SparseFile(len(DATA), [(100, DATA[100:300])], read),
        RangeFile(read, len(DATA), "shard-0.parquet"),
    ]


@pytest.mark.parametrize("kind", range(3))
def test_reads_seeks_and_ends_like_a_file(kind: int) -> None:
    f = files(Calls())[kind]
    assert f.readable() and f.seekable()
    assert f.seek(100) == 100 and f.read(50) == DATA[100:150] and f.tell() == 150
    assert f.seek(-10, io.SEEK_END) == len(DATA) - 10  # (RangeFile: reads the 64 KiB tail once here)
    assert f.read(100) == DATA[-10:]  # what is left
    assert f.read(10) == b"" and f.tell() == len(DATA)
    assert f.seek(-20, io.SEEK_CUR) == len(DATA) - 20 and f.read() == DATA[-20:]
    with pytest.raises(ValueError, match="negative seek position -1"):
        f.seek(-1)
    with pytest.raises(ValueError, match="negative seek position"):
        f.seek(-len(DATA) - 1, io.SEEK_END)
    with pytest.raises(ValueError, match="invalid whence 7"):
        f.seek(0, 7)


@pytest.mark.parametrize("kind", range(3))
def test_a_short_ranged_read_is_an_error_not_short_data(kind: int) -> None:
    f = files(Calls(short=3))[kind]
    f.seek(5000)
    with pytest.raises(OSError, match="short read: 97 of 100 bytes at offset 5000"):
        f.read(100)
    assert f.tell() == 5000  # nothing was taken


def test_the_name_is_in_the_message() -> None:
    f = RangeFile(Calls(short=1), len(DATA), "shard-7.parquet")
    with pytest.raises(OSError, match=r"shard-7\.parquet: short read"):
        f.read(10)


def test_held_ranges_are_served_without_a_read() -> None:
    read = Calls()
    footer_file, sparse, ranged = files(read)
    footer_file.add(1000, DATA[1000:2000])
    assert footer_file.holds(1200, 100) and footer_file.read(0) == b""
    footer_file.seek(1200)
    assert footer_file.read(100) == DATA[1200:1300] and read.asked == []
    sparse.seek(150)
    assert sparse.read(100) == DATA[150:250] and read.asked == [] and sparse.misses == 0
    sparse.seek(250)
    assert sparse.read(100) == DATA[250:350] and read.asked == [(250, 100)] and sparse.misses == 1
    ranged.hold(4000, 500)
    ranged.seek(4100)
    assert ranged.read(200) == DATA[4100:4300] and read.asked[-1] == (4000, 500)
    ranged.seek(len(DATA) - 1000)
    assert ranged.read(100) == DATA[-1000:-900] and read.asked[-1] == (len(DATA) - (64 << 10), 64 << 10)
    ranged.seek(len(DATA) - 5000)
    assert ranged.read(100) == DATA[-5000:-4900] and len(read.asked) == 3  # the tail kept


def test_a_fetched_range_is_kept_for_the_next_read() -> None:
    read = Calls()
    f = FooterFile(len(DATA), read)
    f.seek(300)
    f.read(64)
    f.seek(300)
    assert f.read(64) == DATA[300:364] and read.asked == [(300, 64)]


def test_pyarrow_reads_parquet_through_it() -> None:
    sink = io.BytesIO()
    pq.write_table(pa.table({"x": list(range(1000)), "s": [str(i) for i in range(1000)]}), sink)
    raw = sink.getvalue()
    f = RangeFile(lambda offset, size: raw[offset : offset + size], len(raw), "t.parquet")
    table = pq.read_table(f)
    assert table.column("x").to_pylist() == list(range(1000))
    assert table.column("s").to_pylist()[-1] == "999"
