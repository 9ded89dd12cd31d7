"""Reading TFRecord shards every way there is: the direct path (local, no prefetch: big records read value by
value, small ones several at a time), the prefetched path (runs read whole, the fast decoder) and the
general decoder, each giving the source bytes over records of many sizes around the thresholds; records of
other shapes in between (the rest of the run falls back, still right); and damaged records, big and small,
giving the same precise errors on every path. The direct path runs with the C reader (fastload/_native.c)
and with the Python one."""

from __future__ import annotations

import random
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dataset.helpers import Packed, pack_files
from test_tfr_codec import _len, _varint
from tfr_helpers import index_dict, reference_records, write_index_dict

import fastload
from fastload.errors import VerifyError
from fastload.formats import native
from fastload.formats.tfrecord import codec as tfr
from fastload.formats.tfrecord import reader as tfrecordread
from fastload.formats.tfrecord.reader import DIRECT_RECORD_BYTES, HEAD_READ_BYTES, TFRecordSamples
from fastload.packing.indexing import build_index

BIG = DIRECT_RECORD_BYTES


def _record_size(key: str, sizes: tuple[int, int, int]) -> int:
    return tfr.record_size(tfr.sample_layout(key, list(zip("abc", sizes, strict=True)))[0])


def _sized(key: str, target: int, a: int) -> tuple[int, int, int] | None:
    """Field sizes giving a record of exactly ``target`` bytes (``b`` adjusted), if there are any."""
    b = target - _record_size(key, (a, 0, 1))
    for guess in range(max(0, b - 8), b + 8):
        if _record_size(key, (a, guess, 1)) == target:
            return a, guess, 1
    return None


def threshold_files(seed: int = 3) -> dict[str, bytes]:
    """Samples with fields ``a``, ``b``, ``c`` (written in that order) whose records and values have sizes
    around every threshold of the read paths: records of 16 KiB +- a few bytes, values around 127/128 and
    16383/16384 bytes (one/two/three-byte lengths), an ``a`` value around the 1 KiB head read (``b``'s head
    then lies past it), two big values in one record, runs of small records longer than one
    small read, and records bigger than a small read."""
    rng = random.Random(seed)
    shapes: list[tuple[int, int, int]] = []
    shapes += [(rng.randrange(1, 50), rng.randrange(3000, 9000), 1) for _ in range(40)]  # > 256 KiB of small
    for i, target in enumerate(range(BIG - 6, BIG + 7)):
        found = _sized(f"t/{len(shapes):04d}", target, a=3 + i)
        assert found is not None, target
        shapes.append(found)
    shapes += [(a, 40_000, 1) for a in range(HEAD_READ_BYTES - 60, HEAD_READ_BYTES + 20, 7)]
    shapes += [(20_000, 30_000, 2), (1, 1, 1), (1, 17_000, 1), (127, 128, 16_383), (16_384, 16_383, 128)]
    shapes += [(5, 300_000, 3), (4, 10, 5), (6, 290_000, 7), (100, 5000, 1), (1, 2 << 20, 1)]
    files: dict[str, bytes] = {}
    for i, sizes in enumerate(shapes):
        for name, size in zip("abc", sizes, strict=True):
            files[f"t/{i:04d}.{name}"] = rng.randbytes(size)
    return files


@pytest.fixture(scope="module")
def thresholds(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    packed = pack_files(
        tmp_path_factory.mktemp("tfr-thresholds"),
        threshold_files(),
        shard_format="tfrecord",
        shard_size_bytes=1 << 20,
    )
    shards = index_dict(packed.root)["shards"]
    sizes = [n for s in shards for n in s["sizes"]]
    assert {BIG - 1, BIG, BIG + 1} <= set(sizes) and len(shards) >= 3
    first = shards[0]
    payload = reference_records((packed.root / first["name"]).read_bytes())[0]
    assert [n for n, _, _ in tfr.iter_features(payload)] == ["__key__", "a", "b", "c"]
    return packed


def _use_reader(reader: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the direct path use the C reader (fastload/_native.c) or the Python one."""
    if reader == "C" and native.tfrecord_run is None:
        pytest.skip(
            "fastload._native's TFRecord reader is not in use here (not built, or no CRC32C instruction)"
        )
    if reader == "Python":
        monkeypatch.setattr(native, "tfrecord_run", None)


@pytest.fixture(params=["C", "Python"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which reader the direct path uses."""
    _use_reader(request.param, monkeypatch)
    return str(request.param)


@pytest.fixture(params=["direct-C", "direct-Python", "prefetched"])
def prefetch_bytes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """How samples are read: direct (no prefetch) with the C or the Python reader, or prefetched."""
    mode, _, reader = str(request.param).partition("-")
    _use_reader(reader, monkeypatch)
    return 0 if mode == "direct" else 1 << 20


def _read(root: Path, **options: Any) -> list[dict[str, Any]]:
    return list(fastload.ShardDataset(root, decode=False, **options))


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many times each way of reading ran."""
    calls = {"read_run": 0, "direct_run": 0}
    for name in calls:
        method = getattr(TFRecordSamples, name)

        def spy(self: TFRecordSamples, *args: Any, _m: Any = method, _n: str = name, **kw: Any) -> Any:
            calls[_n] += 1
            return _m(self, *args, **kw)

        monkeypatch.setattr(TFRecordSamples, name, spy)
    return calls


def _same_as_source(samples: list[dict[str, Any]], packed: Packed) -> None:
    assert sorted(s["__key__"] for s in samples) == sorted(packed.samples)
    for s in samples:
        fields = {k: v for k, v in s.items() if not k.startswith("__")}
        assert fields == packed.samples[s["__key__"]], s["__key__"]
        assert all(type(v) is bytes for v in fields.values())
        shard, position = packed.where(s["__key__"])
        assert (s["__shard__"], s["__index__"]) == (shard, position)


def test_direct_path(thresholds: Packed, counted: dict[str, int], reader: str) -> None:
    _same_as_source(_read(thresholds.root, prefetch_bytes=0), thresholds)
    assert counted["direct_run"] > 0 and counted["read_run"] == 0  # no record fell back


def test_prefetched_path(thresholds: Packed, counted: dict[str, int]) -> None:
    _same_as_source(_read(thresholds.root, prefetch_bytes=1 << 20, seed=5), thresholds)
    assert counted["direct_run"] == 0 and counted["read_run"] > 0


def test_general_decoder(
    thresholds: Packed, monkeypatch: pytest.MonkeyPatch, counted: dict[str, int]
) -> None:
    monkeypatch.setattr(native, "tfrecord_run", None)  # (the Python reader, with its fast decoders off)
    monkeypatch.setattr(tfrecordread, "fast_sample", lambda *a, **k: None)
    monkeypatch.setattr(tfrecordread, "simple_entry", lambda *a, **k: None)
    _same_as_source(_read(thresholds.root, prefetch_bytes=0), thresholds)
    assert counted["read_run"] > 0


def test_direct_path_in_dataloader_workers(thresholds: Packed) -> None:
    loader = fastload.DataLoader(
        fastload.ShardDataset(thresholds.root, decode=False), batch_size=7, num_workers=2, collate_fn=list
    )
    _same_as_source([s for batch in loader for s in batch], thresholds)


# -- records of other shapes among common ones ------------------------------------------------------------


def _entry(name: str, feature: bytes) -> bytes:
    return _len(1, _len(1, name.encode()) + _len(2, feature))


def _other_shapes(rng: random.Random) -> Iterator[tuple[bytes, dict[str, Any]]]:
    """``(payload, expected sample fields)`` for records the fast decoder declines, big and small."""
    for size in (100, 40_000):
        v = rng.randbytes(size)
        ints = _len(3, _len(1, _varint(7) + _varint(-2)))
        yield _len(1, _entry("a", _len(1, _len(1, v))) + _entry("n", ints)), {"a": v, "n": np.array([7, -2])}
        yield _len(1, _entry("a", _len(1, _len(1, v) + _len(1, b"x")))), {"a": [v, b"x"]}
        swapped = _len(1, _len(2, _len(1, _len(1, v))) + _len(1, b"a"))  # value before name
        yield _len(1, swapped), {"a": v}
        unknown = _len(1, _entry("a", _len(1, _len(1, v)))) + _len(5, b"?")  # an unknown Example field
        yield unknown, {"a": v}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, Any]]]:
    """Shards of common records with a record of another shape here and there (no ``__key__``: keys are
    derived), indexed by ``fastload index``."""
    root = tmp_path_factory.mktemp("tfr-mixed") / "ds"
    root.mkdir()
    rng = random.Random(9)
    expected: dict[str, dict[str, Any]] = {}
    others = list(_other_shapes(rng))
    for s, other in enumerate(others):
        records = []
        for i in range(9):
            if i == 3 + s % 4:
                payload, fields = other
            else:
                a = rng.randbytes(rng.choice([0, 10, 3000, 30_000]))
                fields = {"a": a, "b": b"%d" % i if i % 2 else b""}  # (empty values too)
                payload = tfr.encode_example(list(fields.items()))
            records.append(tfr.frame(payload))
            expected[tfr.derived_key(f"m{s}.tfrecord", i)] = fields
        (root / f"m{s}.tfrecord").write_bytes(b"".join(records))
    assert build_index(root).ok
    return root, expected


def test_other_shapes_fall_back_and_read_right(
    mixed: tuple[Path, dict[str, dict[str, Any]]], prefetch_bytes: int, counted: dict[str, int]
) -> None:
    root, expected = mixed
    samples = _read(root, prefetch_bytes=prefetch_bytes)
    assert sorted(s["__key__"] for s in samples) == sorted(expected)
    for s in samples:
        got = {k: v for k, v in s.items() if not k.startswith("__")}
        want = expected[s["__key__"]]
        assert set(got) == set(want), s["__key__"]
        for name, value in want.items():
            if isinstance(value, np.ndarray):
                assert got[name].dtype == np.int64 and got[name].tolist() == value.tolist()
            else:
                assert type(got[name]) is type(value) and got[name] == value
    assert counted["read_run"] > 0


# -- damage ----------------------------------------------------------------------------------------------


def _pick(index: dict[str, Any], big: bool) -> tuple[dict[str, Any], int]:
    """A shard and a record in it (not its first, not its last) that is big or small."""
    for shard in index["shards"]:
        for k in range(1, shard["samples"] - 1):
            if (shard["sizes"][k] >= BIG) == big:
                return shard, k
    raise AssertionError("no such record")


@pytest.fixture
def copy(thresholds: Packed, tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    root = tmp_path / "ds"
    shutil.copytree(thresholds.root, root)
    return root, index_dict(root)


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x04
    path.write_bytes(bytes(data))


SIZES = [pytest.param(True, id="big"), pytest.param(False, id="small")]


@pytest.mark.parametrize("big", SIZES)
@pytest.mark.parametrize("where", ["length", "length CRC", "key", "value", "tail", "footer"])
def test_damage_is_named_precisely(
    copy: tuple[Path, dict[str, Any]], big: bool, prefetch_bytes: int, where: str
) -> None:
    root, index = copy
    shard, k = _pick(index, big)
    at, size = shard["offsets"][k], shard["sizes"][k]
    flip = {
        "length": at + 1,
        "length CRC": at + 9,
        "key": at + 12 + 12,  # in the __key__ feature's value
        "value": at + size // 2,
        "tail": at + size - 6,  # in the last field (after the big value)
        "footer": at + size - 2,
    }[where]
    _flip(root / shard["name"], flip)
    what = "the length field's CRC" if where.startswith("length") else "the payload's CRC"
    expected = rf"^{re.escape(shard['name'])}, byte offset {at}: record {k}: {what}"
    with pytest.raises(VerifyError, match=expected):
        _read(root, prefetch_bytes=prefetch_bytes)


@pytest.mark.parametrize("big", SIZES)
def test_truncation_is_named_precisely(
    copy: tuple[Path, dict[str, Any]], big: bool, prefetch_bytes: int
) -> None:
    root, index = copy
    shard, k = _pick(index, big)
    at, size = shard["offsets"][k], shard["sizes"][k]
    path = root / shard["name"]
    path.write_bytes(path.read_bytes()[: at + size - 3])
    key = re.escape(shard["keys"][k])
    expected = rf"sample '{key}', byte offset {at}: record {k} \({size} bytes\) is truncated"
    with pytest.raises(VerifyError, match=expected):
        _read(root, prefetch_bytes=prefetch_bytes)


@pytest.mark.parametrize("big", SIZES)
def test_keys_are_checked_against_the_index(
    copy: tuple[Path, dict[str, Any]], big: bool, prefetch_bytes: int
) -> None:
    root, index = copy
    shard, k = _pick(index, big)
    shard["keys"][k] = "not/the-key"
    write_index_dict(root, index)
    with pytest.raises(VerifyError, match=rf"record {k}: '.*', index says 'not/the-key'"):
        _read(root, prefetch_bytes=prefetch_bytes)
