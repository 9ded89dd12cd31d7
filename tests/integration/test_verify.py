"""`fastload verify`: catches damaged shards (named, with key and offset where it applies) and lints
foreign WebDataset tars."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest
import webdataset as wds

import fastload

from .helpers import read_index, run_cli, shard_paths


def _equal_size_tree(make_tree):
    """Ten samples of exactly the same tar size: same name length, same field sizes."""
    return make_tree(
        {f"s/{i:04d}.{f}": bytes([i]) * n for i in range(10) for f, n in (("jpg", 1000), ("cls", 1))}
    )


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


def _verify_fails(dst: Path, *needles: str) -> str:
    proc = run_cli("verify", dst, check=1)
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out
    for needle in needles:
        assert needle in out, f"{needle!r} not in verify output:\n{out}"
    return out


@pytest.fixture
def packed(rich_tree, tmp_path) -> Path:
    dst = tmp_path / "dst"
    fastload.pack(str(rich_tree.root), dst, shard_size_bytes=16 << 10, progress=False)
    assert "OK" in run_cli("verify", dst, check=0).stdout
    return dst


def test_verify_catches_a_flipped_byte_in_member_data(packed):
    shard = read_index(packed)["shards"][1]
    path = packed / shard["name"]
    with tarfile.open(path) as tf:
        member = max(tf.getmembers(), key=lambda m: m.size)
    assert member.size > 1
    _flip(path, member.offset_data + member.size // 2)
    _verify_fails(packed, shard["name"], "CRC32C")
    assert not fastload.verify(packed).ok


@pytest.mark.parametrize("cut", ["end-blocks", "mid-member"])
def test_verify_catches_a_truncated_shard(packed, cut):
    shard = read_index(packed)["shards"][0]
    path = packed / shard["name"]
    size = path.stat().st_size
    new_size = size - 1024 if cut == "end-blocks" else shard["offsets"][-1] + 700
    os.truncate(path, new_size)
    out = _verify_fails(packed, shard["name"])
    assert "truncated" in out or f"{new_size} bytes" in out


def test_verify_catches_two_samples_swapped_in_place(make_tree, tmp_path):
    tree = _equal_size_tree(make_tree)
    dst = tmp_path / "dst"
    fastload.pack(str(tree.root), dst, progress=False)
    (shard,) = read_index(dst)["shards"]
    assert len(set(shard["sizes"])) == 1, "the samples must be the same size for an in-place swap"
    path = dst / shard["name"]
    data = bytearray(path.read_bytes())
    (o1, o2), size = shard["offsets"][1:3], shard["sizes"][1]
    data[o1 : o1 + size], data[o2 : o2 + size] = data[o2 : o2 + size], data[o1 : o1 + size]
    path.write_bytes(bytes(data))
    assert path.stat().st_size == shard["bytes"]
    _verify_fails(dst, shard["name"], repr(shard["keys"][1]), repr(shard["keys"][2]), f"byte offset {o1}")


def test_verify_passes_parquet_and_catches_a_flipped_byte(sparse_tree, tmp_path):
    dst = tmp_path / "dst"
    fastload.pack(
        str(sparse_tree.root), dst, shard_format="parquet", shard_size_bytes=16 << 10, progress=False
    )
    ok = run_cli("verify", dst, check=0)
    assert ok.stdout.startswith("OK") and "Traceback" not in ok.stderr
    shard = read_index(dst)["shards"][0]
    path = dst / shard["name"]
    offset, size, _ = shard["row_groups"][0]
    _flip(path, offset + size // 2)
    _verify_fails(dst, shard["name"], "CRC32C")


def test_verify_catches_a_missing_shard(packed):
    shard = read_index(packed)["shards"][-1]
    (packed / shard["name"]).unlink()
    _verify_fails(packed, shard["name"])


# --- lint of foreign tars (no index.json) -----------------------------------------------------------------

CLEAN = [("a/0001.jpg", b"one"), ("a/0001.cls", b"1"), ("a/0002.jpg", b"two"), ("a/0002.cls", b"2")]
FOREIGN = {
    "clean": (CLEAN, None),
    "duplicate-member": ([*CLEAN[:2], ("a/0001.cls", b"again"), *CLEAN[2:]], "duplicate member"),
    "non-adjacent-key": ([CLEAN[0], *CLEAN[2:], CLEAN[1]], "not adjacent"),
    "no-extension": ([*CLEAN, ("a/README", b"hello")], "'a/README'"),
    # directories are skipped by read, index and verify alike (links are refused: tests/formats)
    "directory-member": ([("a", None), *CLEAN], None),
}


def _write_foreign_tar(path: Path, members: list[tuple[str, bytes | None]]) -> None:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tf.addfile(info)
            else:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("case", FOREIGN, ids=FOREIGN.keys())
def test_lint_of_a_foreign_tar_reports_each_problem(tmp_path, case):
    members, problem = FOREIGN[case]
    path = tmp_path / "foreign.tar"
    _write_foreign_tar(path, members)
    if problem is None:
        proc = run_cli("verify", path, check=0)
        assert proc.stdout.startswith("OK") and "no index.json" in proc.stdout
        assert "2 samples" in proc.stdout
    else:
        _verify_fails(path, "foreign.tar", problem)


def test_lint_of_a_clean_webdataset_shardwriter_folder_is_ok(tmp_path):
    folder = tmp_path / "wds"
    folder.mkdir()
    with wds.ShardWriter(str(folder / "shard-%06d.tar"), maxcount=3, verbose=0) as sink:
        for i in range(7):
            sink.write({"__key__": f"sample{i:04d}", "jpg": os.urandom(100 + i), "cls": str(i).encode()})
    assert len(list(folder.glob("*.tar"))) == 3
    proc = run_cli("verify", folder, check=0)
    assert proc.stdout.startswith("OK") and "7 samples" in proc.stdout
    assert "3 tar file(s)" in proc.stdout


def test_lint_finds_a_problem_in_one_tar_of_a_folder(tmp_path):
    folder = tmp_path / "tars"
    folder.mkdir()
    _write_foreign_tar(folder / "good.tar", CLEAN)
    _write_foreign_tar(folder / "bad.tar", FOREIGN["non-adjacent-key"][0])
    out = _verify_fails(folder, "bad.tar", "not adjacent")
    assert "good.tar" not in out


def test_packed_shards_lint_clean_without_their_index(rich_tree, tmp_path):
    """fastload's own shards pass the foreign-tar lint too (names WebDataset splits the same way)."""
    dst = tmp_path / "dst"
    fastload.pack(str(rich_tree.root), dst, shard_size_bytes=16 << 10, progress=False)
    report = fastload.verify(shard_paths(dst)[0])
    assert report.ok and not report.indexed


def test_verify_catches_a_member_resized_within_its_blocks(packed):
    """A header edited to a smaller size (checksum fixed, same 512-byte blocks): the tar is well formed
    and the sample's span is unchanged, but the member no longer matches the index's layout."""
    index = read_index(packed)
    shard = next(s for s in index["shards"] if s.get("member_fields"))
    row = max(range(shard["samples"]), key=lambda i: max(shard["member_sizes"][i]))
    k = max(range(len(shard["member_fields"])), key=lambda j: shard["member_sizes"][row][j])
    size = shard["member_sizes"][row][k]
    assert size % 512 != 1, "the edit must stay within the member's last block"
    header_at = shard["offsets"][row] + sum(
        512 + (n + 511) // 512 * 512 for n in shard["member_sizes"][row][:k]
    )
    path = packed / shard["name"]
    data = bytearray(path.read_bytes())
    header = data[header_at : header_at + 512]
    assert int(header[124:135], 8) == size
    header[124:136] = b"%011o\0" % (size - 1)
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    data[header_at : header_at + 512] = header
    path.write_bytes(bytes(data))
    _verify_fails(packed, shard["name"], "the index's layout says")


def test_lint_of_a_folder_of_tar_and_tfrecord_files(tmp_path):
    """Without an index each file is linted by the format its name says (through the format registry);
    files of no shard format are left out; a damaged TFRecord file is named."""
    from fastload.formats.tfrecord.codec import encode_example, frame

    folder = tmp_path / "mixed"
    folder.mkdir()
    _write_foreign_tar(folder / "a.tar", CLEAN)
    records = [frame(encode_example([("__key__", f"r{i}".encode()), ("txt", b"x" * i)])) for i in range(3)]
    (folder / "b.tfrecord").write_bytes(b"".join(records))
    (folder / "notes.txt").write_text("not a shard")
    report = fastload.verify(folder)
    assert report.ok and not report.indexed and report.shards == 2
    assert report.samples == 2 + 3 and "2 TFRecord and tar file(s) linted" in report.summary()
    (folder / "b.tfrecord").write_bytes(b"".join(records)[:-3])
    out = _verify_fails(folder, "b.tfrecord")
    assert "a.tar" not in out
