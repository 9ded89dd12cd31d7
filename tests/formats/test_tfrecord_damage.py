"""A damaged-TFRecord corpus: cuts at every field of a record (the 8-byte length, its CRC, each protobuf
tag and length varint of the payload, the payload's CRC), lengths past the record and the file, 10-byte and
unending varints, map entries that overrun, wrong CRCs, a key that differs from the index, and random byte
flips and cuts from a fixed seed; in shards written by ``fastload.pack`` and by the ``tfrecord`` package
(with int64 and float features). Over the C reader (``fastload/_native.c``, called directly and through
``ShardDataset``) and the Python one, direct and prefetched, ``fastload verify`` and ``fastload index``:
each reads the original bytes or raises a ``fastload.errors`` error naming the shard; never a crash, never
short or wrong bytes silently; the C and Python readers agree. Damage that keeps the CRCs right
(recomputed) may make another valid record: that must read as the reference protobuf decoder reads it, or
fail. Last, map entry heads cut by the end of the C reader's buffer at every byte (its varint reader).

Runs standalone (CI runs it under AddressSanitizer, ``.ci/sanitize``). One file past 400 lines: the damages
and the buffer-end cases share the record walker (:func:`marks`) and the checks."""

from __future__ import annotations

import os
import random
import shutil
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest

import fastload
from fastload.errors import FastloadError
from fastload.formats import native
from fastload.formats.tfrecord import codec as tfr
from fastload.formats.tfrecord.reader import DIRECT_RECORD_BYTES, HEAD_READ_BYTES
from fastload.packing.indexing import build_index

from .tarbuild import index_dict

example_pb2 = pytest.importorskip("tfrecord.example_pb2")  # the reference decoder (the official .proto)

Samples = dict[str, dict[str, bytes]]
Damage = Callable[[bytearray], None]

# (a, b, c) value sizes per sample: tiny values, 127/128 and 16383/16384 (one/two/three-byte lengths),
# records below and above the C reader's 16 KiB "big record" threshold
SHAPES = [
    (1, 1, 1),
    (127, 128, 3),
    (16_384, 2, 16_383),
    (2, 20_000, 1),
    (900, 40_000, 5),
    (3, 1, 128),
    (20_000, 16_384, 1),
    (7, 7, 7),
]


def _samples(seed: int = 5) -> Samples:
    rng = random.Random(seed)
    return {
        f"s/{i:03d}": {f: rng.randbytes(n) for f, n in zip("abc", sizes, strict=True)}
        for i, sizes in enumerate(SHAPES)
    }


def _pack(base: Path, samples: Samples) -> dict[str, Any]:
    """``samples`` packed into one TFRecord shard by ``fastload.pack``: its folder, name and index entry."""
    src = base / "src"
    for key, fields in samples.items():
        for field, data in fields.items():
            (src / f"{key}.{field}").parent.mkdir(parents=True, exist_ok=True)
            (src / f"{key}.{field}").write_bytes(data)
    fastload.pack(src, base / "ds", progress=False, shard_format="tfrecord", shard_size_bytes=1 << 30)
    (entry,) = index_dict(base / "ds")["shards"]
    return {"root": base / "ds", "name": entry["name"], "entry": entry, "samples": samples}


def _varint_at(data: bytes | bytearray, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        value |= (data[pos] & 0x7F) << shift
        shift += 7
        pos += 1
        if data[pos - 1] < 0x80:
            return value, pos


def marks(data: bytes | bytearray, at: int) -> dict[str, int]:
    """Where each field of the record at ``at`` starts (written by fastload: an Example of single-value bytes
    features), by name: "length", "length-crc", "example", "features" (its length varint), then per
    feature "<name>:entry" (the map entry's tag), ":entry-len", ":name", ":name-len", ":feature",
    ":feature-len", ":list", ":list-len", ":value", ":value-len", ":data"; and "crc" (the payload's)."""
    (length,) = struct.unpack_from("<Q", data, at)
    out = {"length": at, "length-crc": at + 8, "example": at + 12, "features": at + 13}
    size, pos = _varint_at(data, at + 13)
    end = pos + size
    while pos < end:
        entry = pos
        _, pos = _varint_at(data, pos + 1)
        name_len, name_at = _varint_at(data, pos + 1)
        name = bytes(data[name_at : name_at + name_len]).decode()
        places = {"entry": entry, "entry-len": entry + 1, "name": pos, "name-len": pos + 1}
        pos = name_at + name_len
        for part in ("feature", "list", "value"):
            places[part], places[f"{part}-len"] = pos, pos + 1
            value_len, pos = _varint_at(data, pos + 1)
        places["data"] = pos
        pos += value_len
        out.update({f"{name}:{k}": v for k, v in places.items()})
    assert pos == at + 12 + length
    out["crc"] = pos
    return out


def fix_crcs(data: bytearray, at: int, length: int | None = None) -> None:
    """Recompute the record at ``at``'s two CRCs (its payload taken as ``length`` bytes, or as its length
    field says), so that damage inside it reaches the parser."""
    if length is None:
        (length,) = struct.unpack_from("<Q", data, at)
    data[at + 8 : at + 12] = struct.pack("<I", tfr.masked_crc(bytes(data[at : at + 8])))
    end = at + 12 + length
    data[end : end + 4] = struct.pack("<I", tfr.masked_crc(bytes(data[at + 12 : end])))


@contextmanager
def reader(kind: str) -> Iterator[None]:
    """``"C"`` or ``"Python"``: which reader local direct TFRecord reads use meanwhile."""
    saved = native.tfrecord_run
    if kind == "C" and saved is None:
        pytest.skip("fastload._native's TFRecord reader is not in use here (not built, or no CRC32C)")
    if kind == "Python":
        native.tfrecord_run = None
    try:
        yield
    finally:
        native.tfrecord_run = saved


def reference(payload: bytes) -> dict[str, bytes] | None:
    """The features of one bytes value in the payload as the official protobuf Example decoder reads it (the
    key included), or None where it refuses the payload. (Features of another shape are left out: on a map
    entry with an unknown field, say, fastload gives an empty list where protobuf drops the entry.)"""
    try:
        example = example_pb2.Example.FromString(payload)
    except Exception:  # (protobuf's DecodeError; which module it lives in depends on the protobuf build)
        return None
    return {
        name: feature.bytes_list.value[0]
        for name, feature in example.features.feature.items()
        if feature.WhichOneof("kind") == "bytes_list" and len(feature.bytes_list.value) == 1
    }


def plain(sample: dict[str, Any]) -> dict[str, Any]:
    """A sample's features, comparable with ``==``: bytes as they are, int64/float lists (numpy arrays) as
    ``(dtype, values)``, lists of several bytes values as lists."""
    out: dict[str, Any] = {}
    for name, value in sample.items():
        if not name.startswith("__"):
            out[name] = value if isinstance(value, bytes | list) else (str(value.dtype), value.tolist())
    return out


def assert_right(
    corpus: dict[str, Any], data: bytes, i: int, key: str, fields: dict[str, Any], crc_fixed: bool
) -> None:
    """Record ``i`` of the damaged shard ``data`` was read as ``key``, ``fields``: the original sample, or
    (the CRCs recomputed: the record may have become another valid one) what the reference decoder reads."""
    entry = corpus["entry"]
    assert key == entry["keys"][i]
    if fields != corpus["samples"][key]:
        assert crc_fixed, key
        at, size = entry["offsets"][i], entry["sizes"][i]
        simple = {name: value for name, value in fields.items() if isinstance(value, bytes)}
        assert {"__key__": key.encode(), **simple} == reference(data[at + 12 : at + size - 4]), key


READS = [("C", 0), ("Python", 0), ("C", 1 << 20)]


def _read(corpus: dict[str, Any], root: Path, kind: str, prefetch: int, crc_fixed: bool) -> tuple[list, str]:
    """What ShardDataset delivers: each sample right (the original, or with the CRC recomputed, what the
    reference decoder reads in the damaged payload), then all of them or a fastload error naming the shard
    (any other exception fails the test). Returns the samples and the error."""
    delivered: list[tuple[str, dict[str, bytes]]] = []
    error = ""
    with reader(kind):
        try:
            for s in fastload.ShardDataset(str(root), decode=False, prefetch_bytes=prefetch):
                delivered.append((s["__key__"], plain(s)))
        except FastloadError as exc:
            assert getattr(exc, "shard", None) == corpus["name"], exc
            error = f"{type(exc).__name__}: {exc}"
    data = (root / corpus["name"]).read_bytes()
    for i, (key, fields) in enumerate(delivered):
        assert_right(corpus, data, i, key, fields, crc_fixed)
    assert error or len(delivered) == len(corpus["samples"]), (kind, prefetch)
    return delivered, error


def _native_direct(corpus: dict[str, Any], path: Path, crc_fixed: bool) -> None:
    """The C reader called as the direct path calls it: the records it returns are right (the rest it hands
    to the Python reader), and it reads the whole shard only if nothing changed in it."""
    if native.tfrecord_run is None:
        return
    entry = corpus["entry"]
    fd = os.open(path, os.O_RDONLY)
    try:
        args = (entry["offsets"], entry["sizes"], entry["keys"], entry["name"].rsplit(".", 1)[0])
        got, stop, whole = native.tfrecord_run(fd, *args, 0, len(entry["keys"]), 1 << 30)
    finally:
        os.close(fd)
    assert stop == len(got) and [s["__index__"] for s in got] == list(range(stop))
    data = path.read_bytes()
    for i, s in enumerate(got):
        assert_right(corpus, data, i, s["__key__"], plain(s), crc_fixed)
    if whole:
        assert stop == len(entry["keys"]) and (crc_fixed or data == corpus["original"])


def check(corpus: dict[str, Any], damage: Damage, tmp: Path, *, crc_fixed: bool = False) -> None:
    root = tmp / "ds"
    shutil.copytree(corpus["root"], root)
    path = root / corpus["name"]
    data = bytearray(corpus["original"])
    damage(data)
    path.write_bytes(bytes(data))
    _native_direct(corpus, path, crc_fixed)
    c, python, prefetched = (_read(corpus, root, kind, prefetch, crc_fixed) for kind, prefetch in READS)
    assert c == python  # the C reader is an accelerator: the same samples, the same error
    # (the prefetched path reads a run whole: it delivers no sample of a run that fails)
    assert prefetched[0] == c[0][: len(prefetched[0])] and prefetched[1].split(":")[0] == c[1].split(":")[0]
    report = fastload.verify(root, workers=1)  # (every change fails the shard's CRC32C at least)
    assert (not report.ok) == (bytes(data) != corpus["original"])
    assert all(p.shard == corpus["name"] for p in report.problems)
    # fastload index: the records it finds, or problems naming the shard (and then no index)
    indexed = build_index(str(root), workers=1, force=True)
    assert all(p.shard == corpus["name"] for p in indexed.problems)
    assert (indexed.index is None) == bool(indexed.problems)


def _foreign(base: Path, samples: Samples) -> dict[str, Any]:
    """``samples`` with an int64 and a float feature more each, written by the ``tfrecord`` package (the
    protobuf library's encoding and entry order) and indexed by ``fastload index``."""
    writer_module = pytest.importorskip("tfrecord.writer")
    (base / "ds").mkdir()
    writer = writer_module.TFRecordWriter(str(base / "ds" / "foreign.tfrecord"))
    for i, (key, fields) in enumerate(samples.items()):
        datum = {"__key__": (key.encode(), "byte"), "n": ([i, -(2**40)], "int"), "f": ([0.5, i], "float")}
        writer.write({**datum, **{f: (v, "byte") for f, v in fields.items()}})
    writer.close()
    assert build_index(str(base / "ds"), workers=1).ok
    (entry,) = index_dict(base / "ds")["shards"]
    with reader("Python"):
        read = {s["__key__"]: plain(s) for s in fastload.ShardDataset(str(base / "ds"), decode=False)}
    for i, (key, fields) in enumerate(samples.items()):
        assert read[key] == {**fields, "n": ("int64", [i, -(2**40)]), "f": ("float32", [0.5, i])}
    return {"root": base / "ds", "name": entry["name"], "entry": entry, "samples": read}


@pytest.fixture(scope="module", params=["packed", "foreign"])
def corpus(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One shard of the samples of SHAPES: written by ``fastload.pack`` (the layout the fast paths read),
    or by the ``tfrecord`` package with int64 and float features as well (the records the C reader hands on
    to the Python one)."""
    make = _pack if request.param == "packed" else _foreign
    out = make(tmp_path_factory.mktemp("tfr-damage"), _samples())
    out["original"] = (out["root"] / out["name"]).read_bytes()
    sizes = out["entry"]["sizes"]
    assert min(sizes) < DIRECT_RECORD_BYTES <= max(sizes)
    return out


def _record(corpus: dict[str, Any], i: int) -> tuple[int, dict[str, int]]:
    at = corpus["entry"]["offsets"][i]
    return at, marks(corpus["original"], at)


# records cut through: a small one (1), a big one read value by value (4), the last one (7)
CUT_RECORDS = (1, 4, 7)


def test_every_field_of_the_corpus_is_found(corpus: dict[str, Any]) -> None:
    for i, key in enumerate(corpus["entry"]["keys"]):
        at, where = _record(corpus, i)
        data = corpus["original"]
        for field, value in corpus["samples"][key].items():
            start = where[f"{field}:data"]
            if not isinstance(value, bytes):  # (a packed int64 or float list: its length only)
                assert 0 < where[f"{field}:value-len"] < start
                continue
            assert data[start : start + len(value)] == value
        assert where["crc"] + 4 == at + corpus["entry"]["sizes"][i]


@pytest.mark.parametrize("record", CUT_RECORDS)
def test_a_shard_cut_in_any_field_reads_right_or_raises(
    corpus: dict[str, Any], record: int, tmp_path: Path
) -> None:
    at, where = _record(corpus, record)
    cuts = sorted({p + d for p in where.values() for d in (0, 1, 2)} | {at + 3, at + 7, at + 10})
    for n, cut in enumerate(cuts):
        check(corpus, lambda d, c=cut: d.__delitem__(slice(c, None)), tmp_path / str(n))


def _set(field: str, value: bytes, record: int = 4, fix: bool = True) -> Callable[[dict[str, Any]], Damage]:
    """Overwrite record ``record``'s ``field`` (a name from :func:`marks`) with ``value`` in place, then
    recompute the CRCs (``fix``)."""

    def make(corpus: dict[str, Any]) -> Damage:
        at, where = _record(corpus, record)

        def damage(data: bytearray) -> None:
            pos = where[field]
            data[pos : pos + len(value)] = value
            if fix:
                fix_crcs(data, at, corpus["entry"]["sizes"][record] - 16)

        return damage

    return make


def _header(length: Callable[[int, int], int], record: int = 4, fix: bool = True) -> Callable[..., Damage]:
    """Record ``record``'s length field set to ``length(length now, bytes in the file)``, its CRC
    recomputed (``fix``)."""

    def make(corpus: dict[str, Any]) -> Damage:
        at = corpus["entry"]["offsets"][record]

        def damage(data: bytearray) -> None:
            (now,) = struct.unpack_from("<Q", data, at)
            data[at : at + 8] = struct.pack("<Q", length(now, len(data)) % (1 << 64))
            if fix:
                data[at + 8 : at + 12] = struct.pack("<I", tfr.masked_crc(bytes(data[at : at + 8])))

        return damage

    return make


FF10 = b"\xff" * 9 + b"\x01"  # a 10-byte varint (2**64 - 1)
FF = b"\xff" * 12  # a varint that never ends within 10 bytes

DAMAGES: dict[str, Callable[[dict[str, Any]], Damage]] = {
    "length-plus-one": _header(lambda n, size: n + 1),
    "length-minus-one": _header(lambda n, size: n - 1),
    "length-past-the-file": _header(lambda n, size: size),
    "length-huge": _header(lambda n, size: 1 << 63),
    "length-max": _header(lambda n, size: -1),
    "length-zero": _header(lambda n, size: 0),
    "length-crc-wrong": _header(lambda n, size: n + 1, fix=False),
    "last-length-past-the-file": _header(lambda n, size: n + 5, record=7),
    "small-length-huge": _header(lambda n, size: 1 << 40, record=1),
    "payload-crc-wrong": _set("crc", b"\0\0\0\0", fix=False),
    "length-crc-flipped": _set("length-crc", b"\x55", fix=False),
    "example-tag-wrong": _set("example", b"\x12"),
    "example-tag-unknown": _set("example", b"\x7a"),
    "features-len-10-bytes": _set("features", FF10),
    "features-len-unending": _set("features", FF),
    "features-len-short": _set("features", b"\x05"),
    "entry-len-10-bytes": _set("b:entry-len", FF10),
    "entry-len-unending": _set("b:entry-len", FF),
    "entry-overruns": _set("b:entry-len", b"\xff\xff\x7f"),
    "entry-overruns-small": _set("b:entry-len", b"\x7f", record=1),
    "entry-len-short": _set("a:entry-len", b"\x02", record=1),
    "name-len-huge": _set("b:name-len", b"\xff\xff\xff\xff\x0f"),
    "name-len-past-entry": _set("c:name-len", b"\x7f"),
    "name-not-utf8": _set("b:name", b"\x0a\x01\xff"),
    "feature-tag-int64": _set("b:list", b"\x1a"),
    "feature-tag-float": _set("c:list", b"\x12", record=1),
    "feature-len-10-bytes": _set("b:feature-len", FF10),
    "list-len-huge": _set("b:list-len", b"\xff\xff\xff\x7f"),
    "value-len-unending": _set("b:value-len", FF),
    "value-len-plus-one": _set("c:value-len", b"\x06"),
    "value-len-minus-one": _set("c:value-len", b"\x04"),
    "big-value-len-huge": _set("b:value-len", b"\xff\xff\x7f"),
    "small-value-len-unending": _set("b:value-len", FF, record=1),
    "key-differs": _set("__key__:data", b"t"),
    "key-differs-small": _set("__key__:data", b"t", record=1),
    "key-renamed": _set("__key__:name", b"__kez__"),
    "key-differs-crc-wrong": _set("__key__:data", b"t", fix=False),
    "value-byte-crc-wrong": _set("b:data", b"\0\1\2", fix=False),
}


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_shard_reads_right_or_raises_naming_it(
    corpus: dict[str, Any], how: str, tmp_path: Path
) -> None:
    check(corpus, DAMAGES[how](corpus), tmp_path, crc_fixed=True)


def _flip(spots: list[int], masks: list[int], crcs_of: tuple[int, int] | None, data: bytearray) -> None:
    for spot, mask in zip(spots, masks, strict=True):
        data[spot] ^= mask
    if crcs_of is not None:
        fix_crcs(data, *crcs_of)


def test_random_flips_and_cuts_read_right_or_raise(corpus: dict[str, Any], tmp_path: Path) -> None:
    """Flips of one to three bytes (mostly near the start of a field, so in the structure; half of them
    with the record's CRCs recomputed, so that they reach the parser), and cuts anywhere, from a fixed
    seed."""
    rng = random.Random(14)
    entry = corpus["entry"]
    size = len(corpus["original"])
    for n in range(240):
        record = rng.randrange(len(entry["offsets"]))
        at, where = _record(corpus, record)
        base = rng.choice(list(where.values())) if n % 8 else rng.randrange(size)
        spots = [min(size - 1, max(0, base + rng.randrange(-2, 6))) for _ in range(rng.randint(1, 3))]
        masks = [rng.randrange(1, 256) for _ in spots]
        crcs_of = (at, entry["sizes"][record] - 16) if n % 2 == 0 else None
        check(corpus, partial(_flip, spots, masks, crcs_of), tmp_path / f"flip{n}", crc_fixed=bool(crcs_of))
    for n in range(60):
        cut = rng.randrange(size)
        check(corpus, lambda d, c=cut: d.__delitem__(slice(c, None)), tmp_path / f"cut{n}")


# -- the C reader's varints at the end of its buffer ---------------------------------------------------------
#
# The C reader reads a big record's head (HEAD_READ_BYTES), and after a value read straight into its bytes
# object, the next HEAD_READ_BYTES: a map entry's head may be cut there, in any of its length varints, and
# read_length() must stop at the buffer's end (the entry is then read again from its start). Past that end
# the buffer holds what an earlier, longer read left there: below, either 0xff bytes (a varint read on
# there never ends: the C reader would give up on a sound shard) or the very bytes that follow in the file
# (read on, the value would seem to start past the buffer: a negative copy).

FILLER = 9000  # the small record's value, whose bytes lie in the buffer past the cut


def _example(key: str, fields: list[tuple[str, bytes]]) -> bytes:
    return tfr.frame(tfr.encode_example([("__key__", key.encode()), *fields]))


def _cut_group(
    rng: random.Random, n: int, cut: int, planted: bool
) -> list[tuple[str, list[tuple[str, bytes]]]]:
    """Three records: a big one whose last value is followed by a long read (the next small record and the
    head of the one after); that small one; and a big one with fields ``a``, ``b`` (big), ``c`` and ``d``
    (big), ``c`` sized so that the read after ``b`` cuts ``d``'s entry head after ``cut`` bytes. The small
    record's value holds, where the buffer has it past that cut, 0xff or (``planted``) ``d``'s entry head."""
    keys = [f"g{n:03d}/{i}" for i in range(3)]
    first = [("a", b"\1"), ("b", rng.randbytes(20_000)), ("c", b"z")]
    size_c = HEAD_READ_BYTES - cut - 15
    last = [
        ("a", b"\2"),
        ("b", rng.randbytes(20_000)),
        ("c", rng.randbytes(size_c)),
        ("d", rng.randbytes(20_001)),
    ]
    record = _example(keys[2], last)
    where = marks(record, 0)
    after_b = where["b:data"] + 20_000
    assert where["d:entry"] - after_b == HEAD_READ_BYTES - cut and where["d:data"] - where["d:entry"] == 19
    head = record[where["d:entry"] : where["d:data"]]
    # the long read starts after the first record's b; the small record's value starts `lead` bytes later
    first_where = marks(_example(keys[0], first), 0)
    small = _example(keys[1], [("a", b"\3"), ("b", bytes(FILLER))])
    lead = (len(_example(keys[0], first)) - first_where["b:data"] - 20_000) + marks(small, 0)["b:data"]
    filler = bytearray(b"\xff" * FILLER)
    if planted:  # the buffer's bytes at [1024 - cut, 1024 - cut + 19) after the read following the big b
        at = HEAD_READ_BYTES - cut - lead
        filler[at : at + len(head)] = head
    return [(keys[0], first), (keys[1], [("a", b"\3"), ("b", bytes(filler))]), (keys[2], last)]


@pytest.fixture(scope="module")
def cut_heads(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A shard of such groups, every cut of the 19-byte head, with either filler, indexed by fastload."""
    rng = random.Random(7)
    records = [
        r
        for n, (cut, planted) in enumerate((c, p) for p in (True, False) for c in range(1, 20))
        for r in _cut_group(rng, n, cut, planted)
    ]
    root = tmp_path_factory.mktemp("tfr-cut-heads") / "ds"
    root.mkdir()
    (root / "cut.tfrecord").write_bytes(b"".join(_example(k, f) for k, f in records))
    assert build_index(str(root), workers=1).ok
    (entry,) = index_dict(root)["shards"]
    return {"root": root, "entry": entry, "samples": {k: dict(f) for k, f in records}}


def test_the_c_reader_stops_its_varints_at_the_end_of_its_buffer(cut_heads: dict[str, Any]) -> None:
    """The C reader reads every record of the shard itself (none handed on to the Python reader), right."""
    if native.tfrecord_run is None:
        pytest.skip("fastload._native's TFRecord reader is not in use here (not built, or no CRC32C)")
    entry, samples = cut_heads["entry"], cut_heads["samples"]
    fd = os.open(cut_heads["root"] / entry["name"], os.O_RDONLY)
    try:
        got, stop, whole = native.tfrecord_run(
            fd, entry["offsets"], entry["sizes"], entry["keys"], "cut", 0, len(entry["keys"]), 1 << 30
        )
    finally:
        os.close(fd)
    assert whole and stop == len(samples) == len(got)
    for s in got:
        assert {k: v for k, v in s.items() if k[:2] != "__"} == samples[s["__key__"]]
    for kind in ("C", "Python"):
        with reader(kind):
            seen = {s["__key__"]: s for s in fastload.ShardDataset(str(cut_heads["root"]), decode=False)}
        assert {k: {f: v for f, v in s.items() if f[:2] != "__"} for k, s in seen.items()} == samples
