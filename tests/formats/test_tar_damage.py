"""A damaged-shard corpus: truncations, flipped header bytes, bad checksums, sizes past the end of the file,
bad base-256 numbers, huge pax lengths, member types a sample cannot be. Over the C and Python readers, the
prefetched (bytes) path, ``fastload index`` and ``fastload verify``: each reads the right bytes or raises a
``fastload.errors`` error naming the shard; never a crash, never short or wrong bytes silently. The C and
Python direct readers give the same samples and the same error.

Tar has no checksum over data bytes: with an index v1 they are left alone (``fastload verify`` checks the
shard's CRC32C); an index v2 records each sample's CRC32C, and a flipped data byte or a size shrunk within
its last block raises on read, the same error from every reader (``..._v2`` tests).
Runs standalone (CI runs it under AddressSanitizer)."""

from __future__ import annotations

import random
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastload
from fastload import formats
from fastload.errors import FastloadError
from fastload.formats.tar.index import index_tar_shard
from fastload.formats.tar.layout import layout_of
from fastload.packing.indexing import build_index
from fastload.packing.upgrade import upgrade_index

from .tarbuild import dataset_sees, index_dict, samples_of, write_tar

Damage = Callable[[bytearray, list[tuple[int, int]]], None]  # (shard bytes, (header, data offset) of members)


def _members(seed: int, long: bool) -> list[tuple[str, bytes | None]]:
    rng = random.Random(seed)
    folder = "d" + "x" * 110 if long else "d"
    out: list[tuple[str, bytes | None]] = []
    for i in range(8):
        for field in ("cls", "bin"):
            out.append(
                (f"{folder}/{i:03d}.{field}", rng.randbytes(rng.choice([1, 2, 511, 512, 513, 20_000])))
            )
    return out


@pytest.fixture(scope="module", params=["packed", "gnu-long-names"])
def corpus(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A shard and its index: written by ``fastload pack`` (plain headers, member layout: the fast paths),
    or by tarfile in GNU format with names past 100 bytes and indexed by ``fastload index`` (the parser)."""
    base = tmp_path_factory.mktemp("corpus")
    members = _members(1, long=request.param != "packed")
    if request.param == "packed":
        src = base / "src"
        for name, data in members:
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).write_bytes(data or b"")
        fastload.pack(src, base / "ds", progress=False, shard_size_bytes=1 << 30)
    else:
        (base / "ds").mkdir()
        write_tar(base / "ds" / "a.tar", members, "tarfile-gnu")
        assert build_index(str(base / "ds"), workers=1).ok
    index = index_dict(base / "ds")
    (shard,) = index["shards"]
    assert bool(shard.get("member_fields")) == (request.param == "packed")
    name = shard["name"]
    with tarfile.open(base / "ds" / name) as tf:
        spans = [(m.offset_data - 512, m.offset_data) for m in tf]
    v1 = not fastload.ShardDataset(base / "ds").index.detached  # (fastload index writes v2 once it does)
    return {"root": base / "ds", "name": name, "spans": spans, "samples": samples_of(members), "v1": v1}


def _fix_checksum(data: bytearray, at: int) -> None:
    data[at + 148 : at + 156] = b" " * 8
    data[at + 148 : at + 156] = b"%06o\0 " % sum(data[at : at + 512])


def _set(field: slice, value: bytes, fix: bool = True) -> Damage:
    def damage(data: bytearray, spans: list[tuple[int, int]]) -> None:
        at = spans[5][0]
        data[at + field.start : at + field.stop] = value.ljust(field.stop - field.start, b"\0")
        if fix:
            _fix_checksum(data, at)

    return damage


def _truncate(where: Callable[[list[tuple[int, int]]], int]) -> Damage:
    def damage(data: bytearray, spans: list[tuple[int, int]]) -> None:
        del data[where(spans) :]

    return damage


def _huge_pax(data: bytearray, spans: list[tuple[int, int]]) -> None:
    """Member 5 becomes a pax header that claims 2**40 bytes of records."""
    at = spans[5][0]
    data[at + 156 : at + 157] = b"x"
    data[at + 124 : at + 136] = b"\x80" + (1 << 40).to_bytes(11, "big")
    _fix_checksum(data, at)


def _long_pax_record(data: bytearray, spans: list[tuple[int, int]]) -> None:
    """Member 5 becomes a pax header whose record says it is 10**12 bytes long."""
    at = spans[5][0]
    data[at + 156 : at + 157] = b"x"
    data[at + 124 : at + 136] = b"%011o\0" % 30
    data[at + 512 : at + 542] = b"999999999999 path=x.cls\n".ljust(30, b"\0")
    _fix_checksum(data, at)


DAMAGES: dict[str, Damage] = {
    "cut-in-header": _truncate(lambda s: s[5][0] + 100),
    "cut-at-header": _truncate(lambda s: s[5][0]),
    "cut-in-data": _truncate(lambda s: s[-1][1] + 1),
    "cut-in-end-blocks": lambda d, s: d.__delitem__(slice(len(d) - 512, None)),
    "bad-checksum": _set(slice(148, 156), b"zzzzzz\0 ", fix=False),
    "checksum-off-by-one": lambda d, s: d.__setitem__(s[5][0] + 150, d[s[5][0] + 150] ^ 1),
    "size-past-the-file": _set(slice(124, 136), b"%011o\0" % (8**11 - 1)),
    "size-smaller": _set(slice(124, 136), b"%011o\0" % 1),
    "size-not-octal": _set(slice(124, 136), b"0000000009x\0"),
    "base256-negative": _set(slice(124, 136), b"\xff" * 12),
    "base256-unknown": _set(slice(124, 136), b"\x81" + bytes(11)),
    "base256-huge": _set(slice(124, 136), b"\x80" + b"\x7f" * 11),
    "renamed": _set(slice(0, 100), b"zz/999.cls"),
    "no-extension": _set(slice(0, 100), b"d/000"),
    "prefix-set": _set(slice(345, 500), b"p"),
    "magic-v7": _set(slice(257, 265), b""),
    "type-hardlink": _set(slice(156, 157), b"1"),
    "type-symlink": _set(slice(156, 157), b"2"),
    "type-sparse": _set(slice(156, 157), b"S"),
    "type-directory": _set(slice(156, 157), b"5"),
    "type-unknown": _set(slice(156, 157), b"Q"),
    "type-global-pax": _set(slice(156, 157), b"g"),
    "type-long-name": _set(slice(156, 157), b"L"),
    "huge-pax-length": _huge_pax,
    "huge-pax-record": _long_pax_record,
    "zero-header": _set(slice(0, 512), b"", fix=False),
}


READS = [
    ("C", {"prefetch_bytes": 0}),
    ("Python", {"prefetch_bytes": 0}),
    ("Python", {"prefetch_bytes": 1 << 20}),
]


def _read(
    root: Path, samples: dict[str, Any], shard: str, kind: str, **options: Any
) -> tuple[list[str], str]:
    """What ShardDataset delivers: every sample right, then all of them or a fastload error naming the
    shard (any other exception fails the test). Returns the keys and the error's text."""
    delivered: list[tuple[str, dict[str, bytes]]] = []
    error = ""
    try:
        dataset_sees(root, kind, into=delivered, **options)
    except FastloadError as exc:
        assert getattr(exc, "shard", None) == shard, exc
        error = f"{type(exc).__name__}: {exc}"
    for key, fields in delivered:
        assert fields == samples[key], key
    assert error or [k for k, _ in delivered] == list(samples)
    return [k for k, _ in delivered], error


def _check(corpus: dict[str, Any], damage: Damage, tmp: Path) -> None:
    root = tmp / "ds"
    shutil.copytree(corpus["root"], root)
    path = root / corpus["name"]
    data = bytearray(path.read_bytes())
    damage(data, corpus["spans"])
    path.write_bytes(bytes(data))
    samples, name = corpus["samples"], corpus["name"]
    c, python, _ = (_read(root, samples, name, kind, **options) for kind, options in READS)
    assert c == python  # the C reader is an accelerator: the same samples, the same error
    # verify: every changed byte fails the shard's CRC32C at least; it reports, never raises
    report = fastload.verify(root, workers=1)
    assert not report.ok and all(p.shard == name for p in report.problems)
    linted = fastload.verify(path, workers=1)
    assert all(p.shard == name for p in linted.problems)
    try:  # (a header changed into another valid one is indexed as what it now says)
        index_tar_shard(str(path), name)
    except FastloadError as exc:
        assert getattr(exc, "shard", None) == name


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_shard_reads_right_or_raises_naming_it(
    corpus: dict[str, Any], how: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if how == "size-smaller" and request.node.callspec.params["corpus"] != "packed" and corpus["v1"]:
        # A KNOWN LIMITATION OF INDEX v1: a size made smaller within the member's last 512-byte block, its
        # checksum fixed, in a shard whose index has no member layout (names past 100 bytes): the tar is
        # valid and every sample is where the index says; only a checksum over the sample's bytes could
        # tell (verify's CRC32C does; index v2's per-sample CRC32C does on read: the test below).
        with pytest.raises(AssertionError):  # the sample comes back one byte short, silently
            _check(corpus, DAMAGES[how], tmp_path)
        pytest.xfail("index v1 has no per-sample checksum over data; `fastload index --upgrade` to v2")
    _check(corpus, DAMAGES[how], tmp_path)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 15), st.integers(0, 511), st.integers(1, 255))
def test_a_flipped_header_byte_reads_right_or_raises(
    corpus: dict[str, Any], tmp_path_factory: pytest.TempPathFactory, member: int, at: int, mask: int
) -> None:
    def flip(data: bytearray, spans: list[tuple[int, int]]) -> None:
        data[spans[member][0] + at] ^= mask

    _check(corpus, flip, tmp_path_factory.mktemp("flip"))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_a_shard_cut_anywhere_reads_right_or_raises(
    corpus: dict[str, Any], tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    size = (corpus["root"] / corpus["name"]).stat().st_size
    cut = data.draw(st.integers(0, size - 1))
    _check(corpus, _truncate(lambda _: cut), tmp_path_factory.mktemp("cut"))


def test_index_refuses_a_shard_of_only_damage(tmp_path: Path) -> None:
    path = tmp_path / "junk.tar"
    path.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(FastloadError) as info:
        index_tar_shard(str(path), "junk.tar")
    assert getattr(info.value, "shard", None) == "junk.tar"
    with tarfile.open(tmp_path / "empty.tar", "w"):
        pass
    entry, _ = index_tar_shard(str(tmp_path / "empty.tar"), "empty.tar")
    assert entry.keys == []


def _flip_data(data: bytearray, spans: list[tuple[int, int]]) -> None:
    data[spans[5][1] + 1] ^= 0x40  # a byte of member 5's data


@pytest.mark.parametrize("how", ["size-smaller", "flipped-data-byte"])
def test_damage_the_tar_cannot_show_is_caught_by_the_v2_crc(
    corpus: dict[str, Any], how: str, tmp_path: Path
) -> None:
    root = tmp_path / "ds"
    shutil.copytree(corpus["root"], root)
    if corpus["v1"]:
        upgrade_index(str(root))
    assert fastload.ShardDataset(root).index.detached  # (each sample's CRC32C in the sidecar)
    path = root / corpus["name"]
    data = bytearray(path.read_bytes())
    (DAMAGES["size-smaller"] if how == "size-smaller" else _flip_data)(data, corpus["spans"])
    path.write_bytes(bytes(data))
    samples, name = corpus["samples"], corpus["name"]
    outcomes = [_read(root, samples, name, kind, **options) for kind, options in READS]
    assert outcomes[0] == outcomes[1]  # C and Python direct: the same samples, the same error
    assert outcomes[2][1] == outcomes[0][1]  # prefetched: the same error (a run's samples come together)
    keys, error = outcomes[0]
    damaged = list(samples)[2]  # member 5 is the second of sample 2
    assert keys == list(samples)[: len(keys)] and damaged not in keys  # (a whole piece is checked first)
    (entry,) = fastload.ShardDataset(root).index.shards
    entry = formats.full_entry(str(root), entry, shard_format="tar")
    offset = entry.offsets[2]
    kind = "SampleChecksumError" if "CRC32C" in error else "VerifyError"  # (the first a VerifyError too)
    assert error.startswith(f"{kind}: {name}, sample {damaged!r}, byte offset {offset}: ")
    assert "fastload verify" in error
    if how != "size-smaller" or layout_of(entry) is None:  # (with a member layout, the layout check names it)
        assert "CRC32C" in error
    if how != "flipped-data-byte":
        return
    # verify_samples=False: the bytes as they are, and no error
    delivered = dict(dataset_sees(root, "C", verify_samples=False))
    assert list(delivered) == list(samples)
    assert [k for k in samples if delivered[k] != samples[k]] == [damaged]
