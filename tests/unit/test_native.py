"""The optional C reader (fastload/_native.c) called directly on tar files written here with core.tar's
member headers: the same bytes as the source, batches that end where asked, and a stop (never an
exception, never short data) at the first member that does not match the layout."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fastload.core.tar import BLOCK, member_header, padded
from fastload.io import native

needs_c = pytest.mark.skipif(
    native.layout_run is None, reason="fastload._native is not built here (no C compiler at install time)"
)


def write_tar(path: Path, samples: list[tuple[str, list[bytes]]], fields: list[str]) -> dict[str, Any]:
    """A plain tar of ``samples`` (key, one value per field) and the index lists the reader takes."""
    offsets, rows, out = [], [], bytearray()
    for key, values in samples:
        offsets.append(len(out))
        rows.append([len(v) for v in values])
        for field, value in zip(fields, values, strict=True):
            out += member_header(f"{key}.{field}", len(value))
            out += value + b"\0" * (padded(len(value)) - len(value))
    out += b"\0" * (2 * BLOCK)
    path.write_bytes(bytes(out))
    return {"offsets": offsets, "keys": [k for k, _ in samples], "rows": rows, "fields": fields}


def run(path: Path, ix: dict[str, Any], first: int, stop: int, max_bytes: int = 1 << 20) -> Any:
    assert native.layout_run is not None
    fd = os.open(path, os.O_RDONLY)
    try:
        dots = [b"." + f.encode() for f in ix["fields"]]
        return native.layout_run(
            fd, ix["offsets"], ix["keys"], ix["rows"], ix["fields"], dots, first, stop, max_bytes
        )
    finally:
        os.close(fd)


def read_all(path: Path, ix: dict[str, Any], max_bytes: int) -> Iterator[dict[str, Any]]:
    i, stop = 0, len(ix["keys"])
    while i < stop:
        samples, nxt, whole = run(path, ix, i, stop, max_bytes)
        assert whole and nxt > i
        yield from samples
        i = nxt


@needs_c
def test_every_size_around_the_block_comes_back_exact(tmp_path: Path) -> None:
    rng = random.Random(5)
    sizes = [0, 1, 2, 511, 512, 513, 1023, 1024, 1025, 16_383, 16_384, 100_000, 300_001]
    samples = [(f"s/{i:03d}", [b"%d" % i, rng.randbytes(n)]) for i, n in enumerate(sizes)]
    ix = write_tar(tmp_path / "a.tar", samples, ["cls", "bin"])
    for max_bytes in (1, 4096, 1 << 20):
        got = list(read_all(tmp_path / "a.tar", ix, max_bytes))
        assert [(s["__key__"], s["__index__"]) for s in got] == [(k, i) for i, (k, _) in enumerate(samples)]
        assert [[s["cls"], s["bin"]] for s in got] == [v for _, v in samples]
        assert all(type(s["bin"]) is bytes for s in got)


@needs_c
def test_a_batch_ends_after_max_bytes_and_at_most_the_stop(tmp_path: Path) -> None:
    samples = [(f"k{i}", [bytes([i]) * 3000]) for i in range(10)]
    ix = write_tar(tmp_path / "a.tar", samples, ["bin"])
    got, nxt, whole = run(tmp_path / "a.tar", ix, 2, 10, max_bytes=3 * 3584)
    assert (len(got), nxt, whole) == (3, 5, True)  # each sample is 512 + 3584 bytes in the file
    got, nxt, whole = run(tmp_path / "a.tar", ix, 8, 9)
    assert ([s["__key__"] for s in got], nxt, whole) == (["k8"], 9, True)
    assert got[0]["bin"] == bytes([8]) * 3000


@needs_c
def test_many_samples_per_batch_respect_the_iovec_limit(tmp_path: Path) -> None:
    samples = [(f"k{i}", [b"a", b"bb", b"ccc"]) for i in range(1000)]
    ix = write_tar(tmp_path / "a.tar", samples, ["x", "y", "z"])
    got, nxt, whole = run(tmp_path / "a.tar", ix, 0, 1000)
    assert whole and 0 < nxt < 1000 and len(got) == nxt  # at most ~1020 iovecs per call
    assert list(read_all(tmp_path / "a.tar", ix, 1 << 20))[-1] == {
        "__key__": "k999",
        "__index__": 999,
        "x": b"a",
        "y": b"bb",
        "z": b"ccc",
    }


def damage(path: Path, ix: dict[str, Any], i: int, how: str) -> None:
    data = bytearray(path.read_bytes())
    at = ix["offsets"][i] + BLOCK + padded(ix["rows"][i][0])  # the second member's header
    if how == "name":
        data[at + 2] ^= 1
    elif how == "size":
        data[at + 124 : at + 136] = b"%011o\0" % (ix["rows"][i][1] - 1)
    elif how == "type":
        data[at + 156 : at + 157] = b"5"
    elif how == "truncated":
        del data[at + BLOCK + 10 :]
    path.write_bytes(bytes(data))


@needs_c
@pytest.mark.parametrize("how", ["name", "size", "type", "truncated"])
def test_it_stops_before_the_first_sample_that_does_not_match(tmp_path: Path, how: str) -> None:
    samples = [(f"k{i}", [b"%d" % i, bytes([i]) * 20_000]) for i in range(8)]
    ix = write_tar(tmp_path / "a.tar", samples, ["cls", "bin"])
    damage(tmp_path / "a.tar", ix, 5, how)
    got, nxt, whole = run(tmp_path / "a.tar", ix, 1, 8)
    assert (nxt, whole) == (5, False)
    assert [[s["cls"], s["bin"]] for s in got] == [v for _, v in samples[1:5]]
    assert run(tmp_path / "a.tar", ix, 5, 8)[1:] == (5, False)


@needs_c
def test_an_index_row_of_the_wrong_shape_is_handed_back(tmp_path: Path) -> None:
    samples = [(f"k{i}", [b"a", b"b"]) for i in range(4)]
    ix = write_tar(tmp_path / "a.tar", samples, ["x", "y"])
    ix["rows"][2] = [1]
    got, nxt, whole = run(tmp_path / "a.tar", ix, 0, 4)
    assert (len(got), nxt, whole) == (2, 2, True)
    assert run(tmp_path / "a.tar", ix, 2, 4) == ([], 2, False)


@needs_c
def test_bad_arguments_raise(tmp_path: Path) -> None:
    ix = write_tar(tmp_path / "a.tar", [("k", [b"a"])], ["x"])
    with pytest.raises(ValueError, match="bad sample range"):
        run(tmp_path / "a.tar", ix, 0, 2)
    with pytest.raises(ValueError, match="bad sample range"):
        run(tmp_path / "a.tar", ix, 1, 1)
    with pytest.raises(OSError):
        native.layout_run(-1, ix["offsets"], ix["keys"], ix["rows"], ["x"], [b".x"], 0, 1, 1 << 20)  # type: ignore[misc]


@pytest.mark.skipif(os.environ.get("FASTLOAD_REQUIRE_NATIVE") != "1", reason="only where CI requires it")
def test_ci_builds_the_c_reader() -> None:
    assert native.in_use() == "C"
