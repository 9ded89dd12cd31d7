"""The member layout in the index (each sample's fields and data sizes): written by ``fastload pack`` when
every sample of a shard has the same fields with plain headers, and used by readers to read members without
parsing headers. Reads with and without it must give the same bytes, and a shard that does not match its
index must still raise, whichever path reads it."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

import fastload
from fastload.core.index import ShardEntry
from fastload.errors import IndexFormatError, VerifyError
from fastload.formats import native
from fastload.formats.tar.layout import TarLayout, layout_problem, plain_member_bytes

from .helpers import Packed, attached_index, pack_files, samples_of

# prefetch_bytes=0: local shards read member by member in the consumer; > 0: runs read by prefetch
# threads and cut by the layout; "stripped": the index without the layout (the header-parsing reader)
READS = [
    pytest.param({"prefetch_bytes": 0}, False, id="direct"),
    pytest.param({"prefetch_bytes": 1 << 20}, False, id="prefetched"),
    pytest.param({"prefetch_bytes": 0}, True, id="stripped-direct"),
    pytest.param({"prefetch_bytes": 1 << 20}, True, id="stripped-prefetched"),
]


@pytest.fixture(params=["C", "Python"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which reader the direct (no prefetch) path uses: the C one (fastload/_native.c) or the Python one."""
    if request.param == "C" and native.layout_run is None:
        pytest.skip("fastload._native is not built here (no C compiler at install time)")
    if request.param == "Python":
        monkeypatch.setattr(native, "layout_run", None)
    return str(request.param)


def mixed_files(n: int = 60, seed: int = 3) -> dict[str, bytes]:
    """Samples whose ``bin`` field is sometimes tiny, sometimes well past the readers' 16 KiB
    member-at-a-time threshold, with small fields sorted before and after it."""
    rng = random.Random(seed)
    files: dict[str, bytes] = {}
    for i in range(n):
        key = f"m/{i:04d}"
        size = rng.choice([1, 2, 511, 512, 513, 5_000, 16_383, 16_384, 40_000, 150_000])
        files[f"{key}.a.cls"] = b"%d" % (i % 7)
        files[f"{key}.bin"] = rng.randbytes(size)
        files[f"{key}.txt"] = f"sample {i}".encode() * rng.randrange(1, 50)
    return files


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    return pack_files(tmp_path_factory.mktemp("mixed"), mixed_files(), shard_size_bytes=600 << 10)


def strip_layout(packed: Packed, dest: Path) -> Packed:
    shutil.copytree(packed.root, dest)
    index = attached_index(dest)
    for shard in index["shards"]:
        shard.pop("member_fields", None)
        shard.pop("member_sizes", None)
    (dest / "index.json").write_text(json.dumps(index))
    return Packed(dest, packed.samples, index)


def read_all(root: Path, **options: Any) -> dict[str, dict[str, Any]]:
    out = {}
    for s in fastload.ShardDataset(str(root), decode=False, **options):
        out[s["__key__"]] = {k: v for k, v in s.items() if not k.startswith("__")}
    return out


def test_pack_records_each_samples_fields_and_sizes(mixed: Packed) -> None:
    assert len(mixed.index["shards"]) > 2
    for shard in mixed.index["shards"]:
        assert shard["member_fields"] == ["a.cls", "bin", "txt"]
        for key, row, size in zip(shard["keys"], shard["member_sizes"], shard["sizes"], strict=True):
            assert row == [len(mixed.samples[key][f]) for f in shard["member_fields"]]
            assert sum(plain_member_bytes(n) for n in row) == size


@pytest.mark.parametrize(("options", "stripped"), READS)
def test_reads_give_the_source_bytes_with_or_without_the_layout(
    mixed: Packed, tmp_path: Path, options: dict[str, Any], stripped: bool, reader: str
) -> None:
    packed = strip_layout(mixed, tmp_path / "ds") if stripped else mixed
    got = read_all(packed.root, **options)
    assert got == mixed.samples
    assert all(type(v) is bytes for s in got.values() for v in s.values())


@pytest.mark.parametrize("options", [{"prefetch_bytes": 0}, {"prefetch_bytes": 1 << 20}], ids=str)
def test_shuffled_reads_give_the_source_bytes(mixed: Packed, options: dict[str, Any], reader: str) -> None:
    assert read_all(mixed.root, seed=7, **options) == mixed.samples


def test_no_layout_where_samples_differ_or_names_need_pax(tmp_path: Path) -> None:
    files = {f"k/{i}.{f}": b"x" * (i + 1) for i in range(6) for f in ("a", "b")}
    del files["k/3.b"]  # one sample lacks a field
    long_key = "p/" + "n" * 120  # needs a pax header
    files[f"{long_key}.a"] = b"long"
    packed = pack_files(tmp_path / "odd", files, max_samples=100)
    (shard,) = packed.index["shards"]
    assert "member_fields" not in shard
    assert read_all(packed.root) == samples_of(files)


def tamper(packed: Packed, dest: Path, how: str) -> tuple[str, str]:
    """Damage a big sample in the middle of a shard; returns (shard name, damaged key)."""
    shutil.copytree(packed.root, dest)
    shard = packed.index["shards"][1]
    i = next(i for i, row in enumerate(shard["member_sizes"]) if row[1] >= 40_000 and i > 2)
    key = shard["keys"][i]
    path = dest / shard["name"]
    data = bytearray(path.read_bytes())
    big = shard["offsets"][i] + plain_member_bytes(shard["member_sizes"][i][0])  # the bin member's header
    header = data[big : big + 512]
    if how == "renamed":
        header[0:100] = b"m/9999.bin".ljust(100, b"\0")
    elif how == "resized":  # a plausible, smaller size: the data would come back short
        header[124:136] = b"%011o\0" % (shard["member_sizes"][i][1] - 7)
    if how in ("renamed", "resized"):
        header[148:156] = b" " * 8
        header[148:156] = b"%06o\0 " % sum(header)
        data[big : big + 512] = header
    elif how == "garbage":
        data[big : big + 64] = bytes(range(64))
    else:  # cut inside the big member's data
        del data[big + 512 + 1000 :]
    path.write_bytes(bytes(data))
    return shard["name"], key


@pytest.mark.parametrize("options", [{"prefetch_bytes": 0}, {"prefetch_bytes": 1 << 20}], ids=str)
@pytest.mark.parametrize(
    ("how", "says"),
    [
        ("renamed", "not the keys the index lists"),
        ("resized", "not the fields and sizes the index lists"),
        ("garbage", "corrupt tar header"),
        ("truncated", "shorter"),
    ],
)
def test_a_damaged_big_sample_raises_whichever_reader(
    mixed: Packed, tmp_path: Path, options: dict[str, Any], how: str, says: str, reader: str
) -> None:
    name, key = tamper(mixed, tmp_path / "ds", how)
    delivered: dict[str, dict[str, Any]] = {}
    with pytest.raises(VerifyError, match=says) as info:
        for s in fastload.ShardDataset(str(tmp_path / "ds"), decode=False, **options):
            delivered[s["__key__"]] = {k: v for k, v in s.items() if not k.startswith("__")}
    assert info.value.shard == name
    assert key not in delivered
    for k, fields in delivered.items():  # whatever came before the error was right
        assert fields == mixed.samples[k]


def test_an_index_whose_layout_does_not_add_up_is_refused(mixed: Packed, tmp_path: Path) -> None:
    shutil.copytree(mixed.root, tmp_path / "ds")
    index = attached_index(tmp_path / "ds")
    index["shards"][0]["member_sizes"][2][1] += 1000
    (tmp_path / "ds" / "index.json").write_text(json.dumps(index))
    with pytest.raises(IndexFormatError, match="member layout"):
        fastload.ShardDataset(str(tmp_path / "ds"))


def test_layout_problem_names_what_is_wrong() -> None:
    entry = ShardEntry("s.tar", 0, "0", ["a", "b"], offsets=[0, 2048], sizes=[2048, 2560])
    assert layout_problem(TarLayout(["x", "y"], [[10, 20], [10, 600]]), entry) is None
    assert "row 1" in (layout_problem(TarLayout(["x", "y"], [[10, 20], [10, 20]]), entry) or "")
    problem = layout_problem(TarLayout(["x", "y"], [[10, 20]]), entry)
    assert "one member_sizes row per sample" in (problem or "")
    assert "duplicates" in (layout_problem(TarLayout(["x", "x"], [[10, 20], [10, 600]]), entry) or "")


def test_the_direct_path_reads_through_the_c_reader_when_built(
    mixed: Packed, monkeypatch: pytest.MonkeyPatch
) -> None:
    if native.layout_run is None:
        pytest.skip("fastload._native is not built here (no C compiler at install time)")
    calls: list[tuple[int, int]] = []
    real = native.layout_run

    def counting(*args: Any) -> Any:
        calls.append((args[8], args[9]))  # (first, stop)
        return real(*args)

    monkeypatch.setattr(native, "layout_run", counting)
    assert read_all(mixed.root, prefetch_bytes=0) == mixed.samples
    assert native.in_use() == "C"
    shards = mixed.index["shards"]
    assert len(calls) >= len(shards)
    assert {a for a, _ in calls} >= {0}
