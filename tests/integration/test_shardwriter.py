"""fastload.ShardWriter: samples from Python into a dataset, read back by fastload and by other readers."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

import fastload
from fastload.errors import PackError, SampleError

from .helpers import fields_of, shard_paths, webdataset_samples
from .writer_samples import samples


def encoded(sample: dict[str, Any]) -> dict[str, bytes]:
    """The bytes ShardWriter writes for ``sample`` (the documented encodings)."""
    out: dict[str, bytes] = {}
    for f, v in sample.items():
        if f == "__key__":
            continue
        if isinstance(v, bytes):
            out[f] = v
        elif isinstance(v, str):
            out[f] = v.encode()
        elif isinstance(v, int):
            out[f] = str(v).encode()
        elif isinstance(v, dict):
            out[f] = json.dumps(v).encode()
        else:
            raise AssertionError(v)
    return out


def read_back(dst: Path | str) -> dict[str, dict[str, bytes]]:
    ds = fastload.ShardDataset(str(dst), decode=False)
    return {s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")} for s in ds}


@pytest.mark.parametrize("fmt", ["tar", "parquet", "tfrecord"])
def test_round_trip_every_format(tmp_path: Path, fmt: str) -> None:
    given = samples(120)
    given[5]["bin"] = b""  # an empty value is a value (not a missing field), in every format
    with fastload.ShardWriter(tmp_path / "ds", format=fmt, shard_size_bytes=64 << 10) as w:
        for s in given:
            w.write(s)
    report = w.report
    assert report.samples == 120 and report.shards > 2
    assert "wrote 120 samples" in report.summary()
    assert read_back(tmp_path / "ds") == {s["__key__"]: encoded(s) for s in given}
    assert fastload.verify(str(tmp_path / "ds")).ok
    assert not (tmp_path / "ds" / ".fastload-pack").exists()


def test_tar_shards_read_by_webdataset(tmp_path: Path) -> None:
    given = samples(50)
    with fastload.ShardWriter(tmp_path / "ds", shard_size_bytes=32 << 10) as w:
        for s in given:
            w.write(s)
    got = webdataset_samples(shard_paths(tmp_path / "ds"))
    assert [g["__key__"] for g in got] == [s["__key__"] for s in given]
    assert [fields_of(g) for g in got] == [encoded(s) for s in given]


def test_parquet_shards_read_by_pyarrow(tmp_path: Path) -> None:
    given = samples(40)
    with fastload.ShardWriter(tmp_path / "ds", format="parquet", shard_size_bytes=32 << 10) as w:
        for s in given:
            w.write(s)
    table = pq.read_table(tmp_path / "ds")  # the folder, as pyarrow/pandas read it (_fastload/ skipped)
    assert table.column("__key__").to_pylist() == [s["__key__"] for s in given]
    assert table.column("json").to_pylist() == [encoded(s)["json"] for s in given]


def test_tfrecord_shards_read_by_the_tfrecord_package(tmp_path: Path) -> None:
    import struct

    from tfrecord import example_pb2
    from tfrecord.writer import TFRecordWriter

    given = samples(30)
    with fastload.ShardWriter(tmp_path / "ds", format="tfrecord", shard_size_bytes=1 << 20) as w:
        for s in given:
            w.write(s)
    (shard,) = sorted((tmp_path / "ds").glob("*.tfrecord"))
    data, pos, got = shard.read_bytes(), 0, []
    while pos < len(data):  # TensorFlow's record framing, CRCs checked with the tfrecord package's mask
        (length,) = struct.unpack_from("<Q", data, pos)
        assert data[pos + 8 : pos + 12] == TFRecordWriter.masked_crc(data[pos : pos + 8])
        payload = data[pos + 12 : pos + 12 + length]
        assert data[pos + 12 + length : pos + 16 + length] == TFRecordWriter.masked_crc(payload)
        example = example_pb2.Example.FromString(payload)
        got.append({k: f.bytes_list.value[0] for k, f in example.features.feature.items()})
        pos += 16 + length
    assert got == [{"__key__": s["__key__"].encode(), **encoded(s)} for s in given]


def test_values_encoded_and_read_back_exactly(tmp_path: Path) -> None:
    from PIL import Image

    image = Image.new("RGB", (8, 6), (10, 200, 30))
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    raw = bytes(range(256))
    with fastload.ShardWriter(tmp_path / "ds", encoders={"xyz": lambda v: b"custom:" + v.encode()}) as w:
        w.write(
            {
                "__key__": "a",
                "bin": memoryview(raw),
                "jpg": image,
                "png": image,
                "npy": array,
                "float": 0.5,
                "flag": True,
                "json": [1, 2],
                "xyz": "x",
                "seg.bin": bytearray(b"s"),
            }
        )
    got = read_back(tmp_path / "ds")["a"]
    assert got["bin"] == raw and got["seg.bin"] == b"s" and got["xyz"] == b"custom:x"
    assert got["float"] == b"0.5" and got["flag"] == b"1" and got["json"] == b"[1, 2]"
    assert np.array_equal(np.load(io.BytesIO(got["npy"])), array)
    assert Image.open(io.BytesIO(got["jpg"])).format == "JPEG"
    assert Image.open(io.BytesIO(got["png"])).convert("RGB").getpixel((0, 0)) == (10, 200, 30)
    decoded = next(iter(fastload.ShardDataset(str(tmp_path / "ds"))))  # and fastload's decoders read them
    assert np.array_equal(decoded["npy"], array)


@pytest.mark.parametrize(
    ("sample", "words"),
    [
        ({"jpg": b"x"}, "'__key__'"),
        ({"__key__": "", "jpg": b"x"}, "'__key__'"),
        ({"__key__": 3, "jpg": b"x"}, "'__key__'"),
        ({"__key__": "a.b", "jpg": b"x"}, "WebDataset would split"),
        ({"__key__": "k", "a/b": b"x"}, "not a valid extension"),
        ({"__key__": "k", ".jpg": b"x"}, "not a valid extension"),
        ({"__key__": "k", "_x": b"x"}, "not a valid extension"),
        ({"__key__": "k", "jpg": None}, "is None"),
        ({"__key__": "k", "jpg": object()}, "cannot encode"),
        ({"__key__": "k", "json": {"a": object()}}, "not JSON-serialisable"),
        ({"__key__": "k", "npy": np.array([object()])}, "Python objects"),
        ({"__key__": "k"}, "no fields"),
    ],
)
def test_bad_samples_refused_before_anything_is_written(
    tmp_path: Path, sample: dict[str, Any], words: str
) -> None:
    with fastload.ShardWriter(tmp_path / "ds") as w:
        w.write({"__key__": "ok", "txt": "fine"})
        with pytest.raises(SampleError, match=words) as info:
            w.write(sample)
        assert isinstance(info.value, ValueError)
        w.write({"__key__": "after", "txt": "still usable"})
    assert sorted(read_back(tmp_path / "ds")) == ["after", "ok"]


def test_error_names_key_and_field(tmp_path: Path) -> None:
    with fastload.ShardWriter(tmp_path / "ds") as w:
        w.write({"__key__": "k1", "jpg": b"fine"})
        with pytest.raises(SampleError) as info:
            w.write({"__key__": "k7", "jpg": object()})
    assert info.value.key == "k7" and info.value.field == "jpg"
    assert "k7" in str(info.value) and "'jpg'" in str(info.value)


def test_a_writer_given_no_samples_publishes_nothing(tmp_path: Path) -> None:
    with pytest.raises(PackError, match="no samples"), fastload.ShardWriter(tmp_path / "ds"):
        pass
    assert not (tmp_path / "ds" / "index.json").exists()


def test_duplicate_keys_refused(tmp_path: Path) -> None:
    with fastload.ShardWriter(tmp_path / "ds", shard_size_bytes=4096) as w:
        for s in samples(20):
            w.write(s)
        with pytest.raises(SampleError, match="written already"):
            w.write({"__key__": "s/00003", "txt": "again"})  # (in a shard published long ago)
    with fastload.ShardWriter(tmp_path / "ds2", keys="ordered") as w:
        w.write({"__key__": "b", "txt": "x"})
        with pytest.raises(SampleError, match="does not come after"):
            w.write({"__key__": "a", "txt": "x"})
    with fastload.ShardWriter(tmp_path / "ds3", keys="off") as w:
        w.write({"__key__": "b", "txt": "x"})
        w.write({"__key__": "a", "txt": "x"})


def test_parquet_refuses_a_field_outside_its_columns(tmp_path: Path) -> None:
    with fastload.ShardWriter(tmp_path / "ds", format="parquet") as w:
        w.write({"__key__": "a", "jpg": b"1", "txt": "t"})
        w.write({"__key__": "b", "jpg": b"2"})  # a field left out: a null
        with pytest.raises(SampleError, match="fields="):
            w.write({"__key__": "c", "png": b"3"})
    assert read_back(tmp_path / "ds") == {"a": {"jpg": b"1", "txt": b"t"}, "b": {"jpg": b"2"}}


def test_exception_in_with_block_publishes_nothing_and_says_so(tmp_path: Path) -> None:
    dst = tmp_path / "ds"
    with pytest.raises(RuntimeError) as info, fastload.ShardWriter(dst, shard_size_bytes=8192) as w:
        for s in samples(40):
            w.write(s)
        raise RuntimeError("boom")
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "no index.json" in notes and "removed" in notes
    assert not dst.exists() or sorted(os.listdir(dst)) == []


def test_abort_removes_what_was_written(tmp_path: Path) -> None:
    dst = tmp_path / "ds"
    w = fastload.ShardWriter(dst, shard_size_bytes=8192)
    for s in samples(40):
        w.write(s)
    w.abort()
    assert not dst.exists() or sorted(os.listdir(dst)) == []
    with pytest.raises(PackError, match="aborted"):
        w.write(samples(1)[0])


def test_non_empty_destination_refused_before_writing(tmp_path: Path) -> None:
    dst = tmp_path / "ds"
    dst.mkdir()
    (dst / "other.txt").write_text("x")
    with pytest.raises(PackError, match="not empty"):
        fastload.ShardWriter(dst)
    assert sorted(os.listdir(dst)) == ["other.txt"]


def test_a_failed_write_to_the_destination_is_raised_and_cleaned_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    import fastload.formats.shard as shard_kit

    writes = {"n": 0}
    real = shard_kit.write_all

    def full_disk(fd: int, data: memoryview) -> None:
        writes["n"] += 1
        if writes["n"] > 2:  # (two shards written, then the disk is full)
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data)

    monkeypatch.setattr(shard_kit, "write_all", full_disk)
    dst = tmp_path / "ds"
    with (
        pytest.raises(PackError, match="no space left") as info,
        fastload.ShardWriter(dst, shard_size_bytes=8192) as w,
    ):
        for s in samples(200):
            w.write(s)
    assert "no index.json" in "\n".join(getattr(info.value, "__notes__", []))
    assert not dst.exists() or sorted(os.listdir(dst)) == []


def test_max_samples_per_shard_and_an_oversized_sample(tmp_path: Path) -> None:
    with fastload.ShardWriter(tmp_path / "ds", max_samples_per_shard=10, shard_size_bytes=64 << 10) as w:
        for i in range(25):
            w.write({"__key__": f"{i:03d}", "bin": bytes(100 << 10) if i == 12 else b"x"})
    counts = [s.samples for s in w.report.index.shards]
    assert counts == [10, 2, 1, 10, 2]  # the 100 KiB sample (over 64 KiB) has a shard of its own
