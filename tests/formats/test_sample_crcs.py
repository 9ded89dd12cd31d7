"""Per-sample CRC32C written by the tar writer (and by `fastload index` for foreign tars): each equals the
CRC32C of the sample's byte range ``[offset, offset + size)`` of the shard, however the bytes passed through
the writer's buffer (flushes inside a sample, members larger than the buffer, samples rolled back)."""

from __future__ import annotations

import io
import random
import tarfile
from pathlib import Path
from typing import BinaryIO

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload.core.keys import Sample
from fastload.formats.tar.index import index_tar_shard
from fastload.formats.tar.writer import write_tar_shard
from fastload.formats.tfrecord.writer import write_tfrecord_shard
from fastload.storage.inputs import Input
from fastload.storage.listing import FileEntry


class _Files:
    """An in-memory source; a name in ``short`` gives fewer bytes than its listed size (it 'shrank')."""

    def __init__(self, data: dict[str, bytes], short: frozenset[str] = frozenset()) -> None:
        self.data, self.short = data, short

    def open(self, entry: FileEntry) -> tuple[BinaryIO, int]:
        data = self.data[entry.path]
        return io.BytesIO(data[: len(data) // 2] if entry.path in self.short else data), len(data)


def _samples(spec: list[list[int]], short: set[str] = set()) -> list[Sample[Input]]:  # noqa: B006
    rng = random.Random(len(spec))
    data: dict[str, bytes] = {}
    samples = []
    for i, sizes in enumerate(spec):
        members = []
        for j, size in enumerate(sizes):
            name = f"s{i:04d}.f{j}"
            data[name] = rng.randbytes(size)
            members.append((f"f{j}", FileEntry(name, name, size, "")))
        samples.append((f"s{i:04d}", members))
    files = _Files(data, frozenset(short))
    return [Sample(key, tuple((f, Input(files, e)) for f, e in members)) for key, members in samples]


def _check_ranges(path: Path, offsets: list[int], sizes: list[int], crcs: list[int]) -> None:
    blob = path.read_bytes()
    assert len(crcs) == len(offsets)
    for off, size, crc in zip(offsets, sizes, crcs, strict=True):
        assert crc == crc32c.crc32c(blob[off : off + size])


@settings(max_examples=40, deadline=None)
@given(
    spec=st.lists(st.lists(st.integers(0, 3000), min_size=1, max_size=3), min_size=1, max_size=12),
    buffer_bytes=st.sampled_from([1024, 1536, 4096, 1 << 20]),
    shrink=st.sets(st.integers(0, 11), max_size=3),
)
def test_writer_crcs_are_crc32c_of_each_sample_range(
    tmp_path_factory: pytest.TempPathFactory, spec: list[list[int]], buffer_bytes: int, shrink: set[int]
) -> None:
    short = {f"s{i:04d}.f0" for i in shrink if i < len(spec) and spec[i][0] > 1}
    path = tmp_path_factory.mktemp("w") / "x.tar"
    result = write_tar_shard("x.tar", _samples(spec, short), str(path), buffer_bytes=buffer_bytes)
    entry = result.entry
    assert len(result.skipped) == len(short)
    assert entry.samples == len(spec) - len(short)
    _check_ranges(path, entry.offsets, entry.sizes, entry.crcs)
    assert entry.checksum == f"{crc32c.crc32c(path.read_bytes()):08x}"  # the whole-file CRC is unchanged
    with tarfile.open(path) as tf:  # and the archive is whole
        assert len(tf.getmembers()) == sum(len(s) for i, s in enumerate(spec) if f"s{i:04d}.f0" not in short)


def test_a_member_larger_than_the_buffer_after_a_rolled_back_sample(tmp_path: Path) -> None:
    spec = [[100], [5000, 10], [9000], [7]]
    path = tmp_path / "x.tar"
    result = write_tar_shard("x.tar", _samples(spec, {"s0001.f0"}), str(path), buffer_bytes=2048)
    assert result.entry.keys == ["s0000", "s0002", "s0003"]
    _check_ranges(path, result.entry.offsets, result.entry.sizes, result.entry.crcs)


def test_tfrecord_shards_keep_their_own_record_crcs_only(tmp_path: Path) -> None:
    """TFRecord records carry CRCs the reader checks: the writer stores no per-sample CRCs for them."""
    result = write_tfrecord_shard("x.tfrecord", _samples([[10], [20]]), str(tmp_path / "x.tfrecord"))
    assert result.entry.crcs == [] and result.entry.samples == 2


def _foreign_tar(path: Path, members: list[tuple[str, bytes | None]]) -> None:
    """A tar written by Python's tarfile; ``None`` data makes a directory entry."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
            else:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


def test_index_of_a_foreign_tar_has_each_samples_crc(tmp_path: Path) -> None:
    """Directory entries before, between and inside samples, a pax-headed long name, big members."""
    long_key = "d/" + "x" * 120
    path = tmp_path / "f.tar"
    _foreign_tar(
        path,
        [
            ("a", None),
            ("a/0001.jpg", b"j" * 700),
            ("a/0001.cls", b"3"),
            ("b", None),
            ("b/0002.jpg", b"k" * 5),
            ("b/sub", None),
            ("b/0002.json", b"{}" * 3000),
            (f"{long_key}.jpg", b"z" * 10),
            ("c/0003.jpg", bytes(9 << 20)),
        ],
    )
    entry, _ = index_tar_shard(str(path), "f.tar")
    assert list(entry.keys) == ["a/0001", "b/0002", long_key, "c/0003"]
    _check_ranges(path, entry.offsets, entry.sizes, entry.crcs)
    assert entry.checksum == f"{crc32c.crc32c(path.read_bytes()):08x}"
