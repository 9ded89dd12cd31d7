"""The optional C reader (fastload/_native.c) called directly on tar files written here with core.tar's
member headers: the same bytes as the source, batches that end where asked, and a stop (never an
exception, never short data) at the first member that does not match the layout."""

from __future__ import annotations

import itertools
import os
import platform
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from crc32c import crc32c

from fastload.formats import native
from fastload.formats.tar.header import BLOCK, member_header, padded
from fastload.formats.tfrecord import codec as tfr
from fastload.formats.tfrecord.reader import DIRECT_RECORD_BYTES

needs_c = pytest.mark.skipif(
    native.layout_run is None, reason="fastload._native is not built here (no C compiler at install time)"
)


def write_tar(path: Path, samples: list[tuple[str, list[bytes]]], fields: list[str]) -> dict[str, Any]:
    """A plain tar of ``samples`` (key, one value per field) and the index lists the reader takes (with
    the CRC32C of each sample's bytes, as index v2 records them)."""
    offsets, rows, crcs, out = [], [], [], bytearray()
    for key, values in samples:
        offsets.append(len(out))
        rows.append([len(v) for v in values])
        for field, value in zip(fields, values, strict=True):
            out += member_header(f"{key}.{field}", len(value))
            out += value + b"\0" * (padded(len(value)) - len(value))
        crcs.append(crc32c(bytes(out[offsets[-1] :])))
    out += b"\0" * (2 * BLOCK)
    path.write_bytes(bytes(out))
    keys = [k for k, _ in samples]
    return {"offsets": offsets, "keys": keys, "rows": rows, "fields": fields, "crcs": crcs}


def key_blob(keys: list[str]) -> tuple[bytes, list[int]]:
    """Keys as an index v2 table keeps them: UTF-8 bytes concatenated, and where each ends."""
    encoded = [k.encode() for k in keys]
    return b"".join(encoded), list(itertools.accumulate(len(k) for k in encoded))


def run(
    path: Path,
    ix: dict[str, Any],
    first: int,
    stop: int,
    max_bytes: int = 1 << 20,
    *,
    crcs: bool = False,
    blob: bool = False,
) -> Any:
    """``layout_run`` over samples ``first..stop-1``, given the keys from ``first`` on (as the reader
    does for a v1 index), or with ``blob`` all keys as a key blob and its ends (a v2 table's), with the
    CRC check when ``crcs``."""
    assert native.layout_run is not None
    fd = os.open(path, os.O_RDONLY)
    try:
        dots = [b"." + f.encode() for f in ix["fields"]]
        keys = key_blob(ix["keys"]) if blob else ix["keys"][first:]
        return native.layout_run(
            fd,
            ix["offsets"],
            keys,
            0 if blob else first,
            ix["rows"],
            ix["fields"],
            dots,
            ix["crcs"] if crcs else [],
            first,
            stop,
            max_bytes,
        )
    finally:
        os.close(fd)


def read_all(path: Path, ix: dict[str, Any], max_bytes: int, blob: bool = False) -> Iterator[dict[str, Any]]:
    i, stop = 0, len(ix["keys"])
    while i < stop:
        samples, nxt, whole = run(path, ix, i, stop, max_bytes, blob=blob)
        assert whole and nxt > i
        yield from samples
        i = nxt


@needs_c
@pytest.mark.parametrize("blob", [False, True], ids=["key-list", "key-blob"])
def test_every_size_around_the_block_comes_back_exact(tmp_path: Path, blob: bool) -> None:
    rng = random.Random(5)
    # (around 4096 too: smaller data is read with the headers into scratch and copied out, bigger straight)
    sizes = [0, 1, 2, 511, 512, 513, 1023, 1024, 1025, 4095, 4096, 4097, 16_383, 16_384, 100_000, 300_001]
    # (keys of several lengths: a key blob is cut by byte offsets; names that are not ASCII take a pax header,
    # which this reader hands back to the parsing reader)
    names = ["s/{:03d}", "e/{}", "k{}-long-{}", "{}"]
    samples = [(names[i % 4].format(i, i), [b"%d" % i, rng.randbytes(n)]) for i, n in enumerate(sizes)]
    ix = write_tar(tmp_path / "a.tar", samples, ["cls", "bin"])
    for max_bytes in (1, 4096, 1 << 20):
        got = list(read_all(tmp_path / "a.tar", ix, max_bytes, blob))
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
    elif how == "prefix":  # a ustar prefix (checksum fixed): the parser reads another name
        data[at + 345] = ord("p")
        data[at + 148 : at + 156] = b" " * 8
        data[at + 148 : at + 156] = b"%06o\0 " % sum(data[at : at + BLOCK])
    path.write_bytes(bytes(data))


@needs_c
@pytest.mark.parametrize("how", ["name", "size", "type", "truncated", "prefix"])
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
        native.layout_run(-1, ix["offsets"], ix["keys"], 0, ix["rows"], ["x"], [b".x"], [], 0, 1, 1 << 20)
    two = write_tar(tmp_path / "b.tar", [("k", [b"a"]), ("l", [b"b"])], ["x"])
    with pytest.raises(ValueError, match="bad sample range"):  # fewer CRCs than samples
        run(tmp_path / "b.tar", {**two, "crcs": two["crcs"][:1]}, 0, 2, crcs=True)
    fd = os.open(tmp_path / "b.tar", os.O_RDONLY)
    try:
        for keys, error, match in [
            ((b"kl", [1]), ValueError, "bad sample range"),  # fewer key ends than samples
            ((b"kl", [1, 3]), ValueError, "key ends do not fit"),  # past the blob
            ((b"kl", [1, 0]), ValueError, "key ends do not fit"),  # going back
            (("kl", [1, 2]), TypeError, "keys must be"),
        ]:
            with pytest.raises(error, match=match):
                native.layout_run(fd, two["offsets"], keys, 0, two["rows"], ["x"], [b".x"], [], 0, 2, 1 << 20)
    finally:
        os.close(fd)
    # a key that is not UTF-8 (its header names the same bytes) raises as Keys would
    bad = write_tar(tmp_path / "c.tar", [("k", [b"a"])], ["x"])
    raw = bytearray((tmp_path / "c.tar").read_bytes())
    raw[0] = 0xFF  # the name's first byte (the reader compares names, not the header checksum)
    (tmp_path / "c.tar").write_bytes(bytes(raw))
    fd = os.open(tmp_path / "c.tar", os.O_RDONLY)
    try:
        with pytest.raises(UnicodeDecodeError):
            native.layout_run(
                fd, bad["offsets"], (b"\xff", [1]), 0, bad["rows"], ["x"], [b".x"], [], 0, 1, 1 << 20
            )
    finally:
        os.close(fd)


@needs_c
def test_each_sample_is_checked_against_its_crc_headers_and_padding_included(tmp_path: Path) -> None:
    samples = [(f"k{i}", [b"%d" % i, bytes([i]) * (20_000 + i)]) for i in range(8)]
    ix = write_tar(tmp_path / "a.tar", samples, ["cls", "bin"])
    got = run(tmp_path / "a.tar", ix, 0, 8, crcs=True)
    assert (len(got[0]), got[1:]) == (8, (8, True))
    assert run(tmp_path / "a.tar", ix, 3, 8, crcs=True)[0][0]["__key__"] == "k3"  # keys from first on
    good = (tmp_path / "a.tar").read_bytes()
    bin_data = ix["offsets"][5] + BLOCK + padded(ix["rows"][5][0]) + BLOCK
    places = {
        "data": bin_data + 7,
        "padding": bin_data + ix["rows"][5][1] + 3,  # (not a member's bytes: only the CRC sees it)
        "header": ix["offsets"][5] + 300,  # an unused header byte (past the name, before the mode)
        "small data": ix["offsets"][5] + BLOCK,  # (the cls member: read with the headers, copied out)
        "small padding": ix["offsets"][5] + BLOCK + ix["rows"][5][0] + 3,
    }
    for where, at in places.items():
        data = bytearray(good)
        data[at] ^= 0x10
        (tmp_path / "a.tar").write_bytes(bytes(data))
        got, nxt, whole = run(tmp_path / "a.tar", ix, 1, 8, crcs=True)
        assert (len(got), nxt, whole) == (4, 5, False), where
        assert [[s["cls"], s["bin"]] for s in got] == [v for _, v in samples[1:5]]
        assert run(tmp_path / "a.tar", ix, 1, 8)[1:] == (8, True), where  # what the header check sees


@pytest.mark.skipif(os.environ.get("FASTLOAD_REQUIRE_NATIVE") != "1", reason="only where CI requires it")
def test_ci_builds_the_c_reader() -> None:
    assert native.in_use() == "C"
    if platform.machine() in ("x86_64", "AMD64"):  # (every x86-64 CPU in use has a CRC32C instruction)
        assert native.tfrecord_run is not None and native.in_use("tfrecord") == "C"


def test_in_use_names_the_reader_and_refuses_other_formats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "layout_run", None)
    monkeypatch.setattr(native, "tfrecord_run", None)
    assert (native.in_use(), native.in_use("tfrecord")) == ("Python", "Python")
    with pytest.raises(ValueError, match="'tar' or 'tfrecord'"):
        native.in_use("parquet")


# -- TFRecord records (tfrecord_run) -----------------------------------------------------------------------

needs_c_tfrecord = pytest.mark.skipif(
    native.tfrecord_run is None,
    reason="fastload._native's TFRecord reader is not in use here (not built, or no CRC32C instruction)",
)
BIG = DIRECT_RECORD_BYTES


def write_tfrecord(path: Path, payloads: list[bytes], keys: list[str]) -> dict[str, Any]:
    """A TFRecord file of ``payloads`` and the index lists the reader takes."""
    records = [tfr.frame(p) for p in payloads]
    offsets = [sum(len(r) for r in records[:i]) for i in range(len(records))]
    path.write_bytes(b"".join(records))
    return {"offsets": offsets, "sizes": [len(r) for r in records], "keys": keys, "stem": path.stem}


def tfr_run(path: Path, ix: dict[str, Any], first: int, stop: int, max_bytes: int = 1 << 20) -> Any:
    assert native.tfrecord_run is not None
    fd = os.open(path, os.O_RDONLY)
    try:
        return native.tfrecord_run(
            fd, ix["offsets"], ix["sizes"], ix["keys"], ix["stem"], first, stop, max_bytes
        )
    finally:
        os.close(fd)


def example(key: str | None, fields: list[tuple[str, int]], rng: random.Random, target: int = 0) -> bytes:
    """An Example of random values of ``fields`` (name, size), after a ``__key__`` feature if ``key``;
    with ``target``, the last value grown or cut so that the record is ``target`` bytes where it can be
    (a length's varint can make it a byte off)."""
    head = [] if key is None else [(tfr.KEY_FEATURE, key.encode())]
    values = [(n, rng.randbytes(s)) for n, s in fields]
    payload = tfr.encode_example(head + values)
    for _ in range(8 if target else 0):
        missing = target - tfr.record_size(len(payload))
        name, value = values[-1]
        values[-1] = (name, value + rng.randbytes(missing) if missing >= 0 else value[:missing])
        payload = tfr.encode_example(head + values)
    return payload


def tfr_samples() -> tuple[list[bytes], list[str], list[dict[str, Any]]]:
    """Records of sizes around the reader's thresholds, with and without ``__key__``: payloads, keys and
    the samples expected."""
    rng = random.Random(7)
    shapes: list[tuple[list[tuple[str, int]], int]] = [([("a", 1)], 0), ([], 0)]  # tiny, no features
    shapes += [([("cls", 1), ("jpg", 100)], t) for t in range(BIG - 4, BIG + 5)]  # around 16 KiB
    shapes += [([("cls", 1), ("jpg", 300_000), ("txt", 40)], 0), ([("a", 70_000), ("b", 200_000)], 0)]
    shapes += [([("x", 10)], 0)] * 40  # small records after each other
    shapes += [([(f"f{k}", 300) for k in range(70)], 0)]  # heads past 1 KiB, names past the cache
    shapes += [([("a", 127), ("b", 128), ("c", 16_383), ("d", 16_384)], 0), ([("e", 0), ("f", 1000)], 0)]
    shapes += [([("a", 5)], 0)]  # (its key is big: read as big values are)
    payloads, keys, expected = [], [], []
    for i, (fields, target) in enumerate(shapes):
        key = None if i % 3 == 1 else f"s/{i:04d}"  # every third without __key__: the key is derived
        key = "k" * 20_000 if i == len(shapes) - 1 else key
        payloads.append(example(key, fields, rng, target))
        keys.append(key or tfr.derived_key("shard.tfrecord", i))
        found = tfr.simple_example(payloads[-1], 0, len(payloads[-1]))
        assert found is not None
        found.pop(tfr.KEY_FEATURE, None)
        expected.append({"__key__": keys[-1], **found, "__index__": i})
    return payloads, keys, expected


def test_the_c_crc32c_matches_the_crc32c_package() -> None:
    """Every method the CPU has (0: a table, 1: the crc32 instruction, 2: VPCLMULQDQ folding), on random
    lengths and splits, and lengths around the methods' block sizes."""
    if native.layout_run is None:
        pytest.skip("fastload._native is not built here")
    from fastload import _native

    rng = random.Random(11)
    data = rng.randbytes(600_000)
    edges = [n + d for n in (0, 8, 64, 256, 512, 768, 3 * 256, 3 * 8192) for d in (-1, 0, 1) if n + d >= 0]
    lengths = edges + [rng.randrange(0, 300_001) for _ in range(200)]
    for t, n in enumerate(lengths):
        at, value = rng.randrange(0, 300_000), rng.getrandbits(32)
        chunk, cut = data[at : at + n], rng.randrange(0, n + 1)
        want = crc32c(chunk, value)
        for level in range(_native.crc32c_hardware + 1) if t < 40 else [_native.crc32c_hardware]:
            assert _native.crc32c(chunk, value, level) == want, (n, level)
            assert _native.crc32c(chunk[cut:], _native.crc32c(chunk[:cut], value, level), level) == want


@needs_c_tfrecord
def test_tfrecord_records_come_back_exact(tmp_path: Path) -> None:
    payloads, keys, expected = tfr_samples()
    ix = write_tfrecord(tmp_path / "shard.tfrecord", payloads, keys)
    assert {BIG - 1, BIG, BIG + 1} <= set(ix["sizes"]) and max(ix["sizes"]) > 300_000
    for max_bytes in (1, 50_000, 1 << 20):
        got, i = [], 0
        while i < len(keys):
            samples, nxt, whole = tfr_run(tmp_path / "shard.tfrecord", ix, i, len(keys), max_bytes)
            assert whole and nxt > i
            got += samples
            i = nxt
        assert [list(s.items()) for s in got] == [list(s.items()) for s in expected]
        assert all(type(v) is bytes for s in got for k, v in s.items() if not k.startswith("__"))


@needs_c_tfrecord
def test_a_tfrecord_batch_ends_after_max_bytes_and_at_most_the_stop(tmp_path: Path) -> None:
    keys = [f"k{i}" for i in range(10)]
    payloads = [
        tfr.encode_example([("__key__", k.encode()), ("bin", bytes([i]) * 3000)]) for i, k in enumerate(keys)
    ]
    ix = write_tfrecord(tmp_path / "a.tfrecord", payloads, keys)
    size = ix["sizes"][0]
    got, nxt, whole = tfr_run(tmp_path / "a.tfrecord", ix, 2, 10, max_bytes=3 * size)
    assert ([s["__key__"] for s in got], nxt, whole) == (["k2", "k3", "k4"], 5, True)
    got, nxt, whole = tfr_run(tmp_path / "a.tfrecord", ix, 8, 9)
    assert ([s["__key__"] for s in got], nxt, whole) == (["k8"], 9, True)
    assert got[0] == {"__key__": "k8", "bin": bytes([8]) * 3000, "__index__": 8}


def _ld(field: int, body: bytes) -> bytes:
    return tfr._varint_bytes(field << 3 | 2) + tfr._varint_bytes(len(body)) + body


SHAPES = ["int64", "two values", "cut entry", "name not UTF-8", "6-byte length"]


def tfr_damage(path: Path, ix: dict[str, Any], i: int, how: str) -> None:
    data = bytearray(path.read_bytes())
    at, size = ix["offsets"][i], ix["sizes"][i]
    if how == "length CRC":
        data[at + 9] ^= 1
    elif how == "payload CRC":
        data[at + size // 2] ^= 1
    elif how == "footer":
        data[at + size - 2] ^= 1
    elif how == "length":
        ix["sizes"][i] += 1
    elif how == "key":
        ix["keys"][i] = "not/the-key"
    elif how == "derived key":
        ix["stem"] = "other"
    elif how == "truncated":
        del data[at + size - 3 :]
    elif how in SHAPES:  # a record of another shape (its CRCs right)

        def entry(name: bytes, feature: bytes) -> bytes:
            return _ld(1, _ld(1, name) + _ld(2, feature))

        other = {
            "int64": entry(b"n", _ld(3, _ld(1, b"\x07"))),
            "two values": entry(b"n", _ld(1, _ld(1, b"x") + _ld(1, b""))),
            "cut entry": b"\x0a\x85",  # its length runs on into the footer
            "name not UTF-8": entry(b"\xff", _ld(1, _ld(1, b"x"))),
            "6-byte length": b"\x0a\x85\x80\x80\x80\x80\x00" + _ld(1, b"n") + b"\x12\x00",  # (valid)
        }[how]
        record = tfr.frame(_ld(1, entry(b"__key__", _ld(1, _ld(1, ix["keys"][i].encode()))) + other))
        data[at : at + size] = record
        ix["sizes"][i] = len(record)
    path.write_bytes(bytes(data))


DAMAGE = [
    "length CRC",
    "payload CRC",
    "footer",
    "length",
    "key",
    "derived key",
    "truncated",
    *SHAPES,
]


@needs_c_tfrecord
@pytest.mark.parametrize("big", [True, False], ids=["big", "small"])
@pytest.mark.parametrize("how", DAMAGE)
def test_tfrecord_run_stops_before_the_first_record_not_as_expected(
    tmp_path: Path, how: str, big: bool
) -> None:
    n, size = 8, 40_000 if big else 2000
    keys = [f"k{i}" for i in range(n)]
    payloads = [
        tfr.encode_example(
            ([] if how == "derived key" else [("__key__", k.encode())])
            + [("a", b"%d" % i), ("bin", bytes([i]) * size)]
        )
        for i, k in enumerate(keys)
    ]
    if how == "derived key":
        keys = [tfr.derived_key("a.tfrecord", i) for i in range(n)]
    path = tmp_path / "a.tfrecord"
    ix = write_tfrecord(path, payloads, keys)
    bad = n - 1 if how == "truncated" else 5
    if how == "derived key":
        ix["keys"][bad] = keys[bad] = "a/000555"  # (not record 5's derived key)
    else:
        tfr_damage(path, ix, bad, how)
    got, nxt, whole = tfr_run(path, ix, 1, n)
    assert (nxt, whole) == (bad, False)
    assert [(s["__key__"], s["a"], s["bin"]) for s in got] == [
        (keys[i], b"%d" % i, bytes([i]) * size) for i in range(1, bad)
    ]
    assert tfr_run(path, ix, bad, n)[1:] == (bad, False)


@needs_c_tfrecord
def test_tfrecord_run_bad_arguments_raise(tmp_path: Path) -> None:
    ix = write_tfrecord(tmp_path / "a.tfrecord", [tfr.encode_example([("a", b"x")])], ["a/000000"])
    with pytest.raises(ValueError, match="bad record range"):
        tfr_run(tmp_path / "a.tfrecord", ix, 0, 2)
    with pytest.raises(ValueError, match="bad record range"):
        tfr_run(tmp_path / "a.tfrecord", ix, 1, 1)
    with pytest.raises(OSError):
        native.tfrecord_run(-1, ix["offsets"], ix["sizes"], ix["keys"], "a", 0, 1, 1 << 20)  # type: ignore[misc]
    assert tfr_run(tmp_path / "a.tfrecord", ix, 0, 1)[1:] == (1, True)
