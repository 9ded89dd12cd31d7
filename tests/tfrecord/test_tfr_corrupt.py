"""Damaged TFRecord shards: a corrupted length CRC, a corrupted payload, a truncated last record and a broken
gzip stream each give an error naming the shard, the record and its byte offset, from `fastload verify`,
`fastload index` and ShardDataset alike."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from dataset.helpers import Packed
from tfr_helpers import Foreign, index_dict

import fastload
from fastload.errors import VerifyError
from fastload.packing.indexing import build_index


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture
def damaged(tfr_uneven: Packed, tmp_path: Path) -> tuple[Path, dict]:  # type: ignore[type-arg]
    """A copy of the packed dataset, and the index entry of its shard with the most records."""
    root = tmp_path / "ds"
    shutil.copytree(tfr_uneven.root, root)
    index = index_dict(root)
    return root, max(index["shards"], key=lambda s: s["samples"])


def _read_all(root: Path) -> None:
    list(fastload.ShardDataset(root, decode=False))


def _problem(root: Path) -> str:
    report = fastload.verify(root)
    assert not report.ok
    return "\n".join(map(str, report.problems))


def test_corrupt_length_crc(damaged: tuple[Path, dict]) -> None:  # type: ignore[type-arg]
    root, shard = damaged
    k = 5
    at = shard["offsets"][k]
    _flip(root / shard["name"], at + 9)  # a byte of the length's CRC
    expected = rf"{shard['name']}, byte offset {at}: record {k}: the length field's CRC does not match"
    assert re.search(expected, _problem(root))
    with pytest.raises(VerifyError, match=expected):
        _read_all(root)


def test_corrupt_payload(damaged: tuple[Path, dict]) -> None:  # type: ignore[type-arg]
    root, shard = damaged
    k = shard["samples"] // 2
    at = shard["offsets"][k]
    _flip(root / shard["name"], at + shard["sizes"][k] - 10)  # a byte of the last field's value
    expected = rf"{shard['name']}, byte offset {at}: record {k}: the payload's CRC does not match"
    problems = _problem(root)
    assert re.search(expected, problems) and "CRC32C is" in problems  # and the whole file's checksum
    with pytest.raises(VerifyError, match=expected):
        _read_all(root)


def test_truncated_last_record(damaged: tuple[Path, dict]) -> None:  # type: ignore[type-arg]
    root, shard = damaged
    path = root / shard["name"]
    k = shard["samples"] - 1
    at, size = shard["offsets"][k], shard["sizes"][k]
    path.write_bytes(path.read_bytes()[:-3])
    problems = _problem(root)
    assert f"index says {shard['bytes']}" in problems  # the size check
    assert (
        f"byte offset {at}: record {k} is truncated: the file ends after {size - 3} of its {size} bytes"
        in problems
    )
    key = shard["keys"][k]
    with pytest.raises(
        VerifyError, match=rf"sample '{key}', byte offset {at}: record {k} \({size} bytes\) is truncated"
    ):
        _read_all(root)


def test_foreign_damage_stops_the_index(foreign_copy: Foreign) -> None:
    plain = foreign_copy.root / "train/a.tfrecord"
    _flip(plain, 8)  # record 0's length CRC
    gz = foreign_copy.root / "train/b.tfrecord.gz"
    gz.write_bytes(gz.read_bytes()[:-20])  # the gzip stream loses its end
    report = build_index(foreign_copy.root)
    assert not report.ok and not (foreign_copy.root / "index.json").exists()
    text = "\n".join(map(str, report.problems))
    assert "train/a.tfrecord, byte offset 0: record 0: the length field's CRC does not match" in text
    assert "train/b.tfrecord.gz: the gzip stream is corrupt or truncated" in text
    assert len(report.problems) == 2 and "FAILED: 2 bad file(s)" in report.summary()


def test_damaged_gzip_shard_after_indexing(foreign: Foreign, tmp_path: Path) -> None:
    root = tmp_path / "ds"
    shutil.copytree(foreign.root, root)
    gz = root / "val/c.tfrecords.gz"
    gz.write_bytes(gz.read_bytes()[: len(gz.read_bytes()) // 2])
    assert "val/c.tfrecords.gz" in _problem(root)
    with pytest.raises(VerifyError, match=r"val/c\.tfrecords\.gz.*gzip stream is corrupt or truncated"):
        _read_all(root)


@pytest.mark.filterwarnings("ignore:.*fails its CRC32C:UserWarning")
def test_on_error_skip_leaves_out_damaged_records(damaged: tuple[Path, dict]) -> None:  # type: ignore[type-arg]
    """A record whose length or payload CRC fails is a damaged sample: on_error="skip" leaves it out, counted
    and named with its key (from the index) and byte offset; the records after it are read."""
    root, shard = damaged
    every = [s["__key__"] for s in fastload.ShardDataset(root, decode=False)]
    k, m = 2, shard["samples"] - 2
    _flip(root / shard["name"], shard["offsets"][k] + 9)  # the length's CRC
    _flip(root / shard["name"], shard["offsets"][m] + shard["sizes"][m] - 10)  # the payload
    for kw in ({"prefetch_bytes": 0}, {"prefetch_bytes": 1 << 20}):
        ds = fastload.ShardDataset(root, decode=False, on_error="skip", **kw)
        keys = [s["__key__"] for s in ds]
        bad = [shard["keys"][k], shard["keys"][m]]
        assert keys == [key for key in every if key not in bad]
        named = [(s.shard, s.key, s.offset) for s in ds.skipped_samples]
        assert named == [
            (shard["name"], bad[0], shard["offsets"][k]),
            (shard["name"], bad[1], shard["offsets"][m]),
        ]
