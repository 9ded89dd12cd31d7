"""`fastload verify`: catches damaged shards (named, with key and offset where it applies) and lints
foreign WebDataset tars."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from pathlib import Path

import pytest
import webdataset as wds

import fastload
from fastload.core.keys import split_key

from .helpers import make_v1, read_index, read_manifest, run_cli, shard_paths


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
    """Named by the sample's CRC32C (index v2): the shard, the sample's key and its byte offset."""
    shard = read_index(packed)["shards"][1]
    path = packed / shard["name"]
    with tarfile.open(path) as tf:
        member = max(tf.getmembers(), key=lambda m: m.size)
    assert member.size > 1
    _flip(path, member.offset_data + member.size // 2)
    key = split_key(member.name)[0]
    at = shard["offsets"][shard["keys"].index(key)]
    _verify_fails(packed, f"{shard['name']}, sample {key!r}, byte offset {at}: the sample's bytes", "CRC32C")
    report = fastload.verify(packed)
    assert not report.ok
    assert [(p.shard, p.key, p.offset) for p in report.problems] == [
        (shard["name"], key, at),  # the sample
        (shard["name"], None, None),  # and the whole file's CRC32C
    ]


def test_verify_checks_each_shards_sample_table(packed):
    """A missing or damaged sidecar is named; the shard's whole-file CRC32C is still checked."""
    first, second = read_manifest(packed)["shards"][:2]
    (packed / first["table"]["name"]).unlink()
    _flip(packed / second["table"]["name"], 20)
    report = fastload.verify(packed)
    found = {p.shard: str(p) for p in report.problems}
    assert set(found) == {first["name"], second["name"]}, report.summary()
    assert "sample table of shard" in found[first["name"]] and "is missing" in found[first["name"]]
    assert f"{second['name']}.fltable" in found[second["name"]] and "CRC32C" in found[second["name"]]
    _flip(packed / first["name"], 600)
    problems = [str(p) for p in fastload.verify(packed).problems if p.shard == first["name"]]
    assert len(problems) == 2 and "the shard's bytes changed" in problems[1]


def test_a_v1_dataset_still_loads_and_verifies(packed):
    """What an older fastload wrote (every sample in index.json, no sample tables) reads and verifies as
    before: whole-file CRC32C, each sample's span."""
    expected = read_index(packed)["shards"]
    make_v1(packed)
    index = fastload.formats.load_index(packed, tables=True)
    assert not index.detached and [s.to_dict()["keys"] for s in index.shards] == [s["keys"] for s in expected]
    assert run_cli("verify", packed, check=0).stdout.startswith("OK")
    assert "index:    v1 (every sample listed in index.json; `fastload index --upgrade` writes v2)" in (
        run_cli("inspect", packed, check=0).stdout
    )
    shard = expected[0]
    _flip(packed / shard["name"], shard["offsets"][-1] + 700)
    _verify_fails(packed, shard["name"], "CRC32C")


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
    offset, size, rows = shard["row_groups"][0]
    _flip(path, offset + size // 2)
    first, last = shard["keys"][0], shard["keys"][rows - 1]
    _verify_fails(dst, shard["name"], "CRC32C", f"row group 0 (keys {first!r} .. {last!r}), column")


def test_verify_names_the_parquet_page_whose_checksum_fails(make_tree, tmp_path):
    """A flipped byte inside a page's data (not its header): only the page checksum catches it."""
    tree = make_tree({f"s/{i:04d}.{f}": bytes([65 + i]) * 3000 for i in range(6) for f in ("bin", "txt")})
    dst = tmp_path / "dst"
    fastload.pack(str(tree.root), dst, shard_format="parquet", row_group_bytes=12000, progress=False)
    shard = read_index(dst)["shards"][0]
    assert len(shard["row_groups"]) == 3
    path = dst / shard["name"]
    data = path.read_bytes()
    at = data.index(bytes([65 + 2]) * 3000) + 1500  # inside sample s/0002's value: row group 1
    _flip(path, at)
    report = fastload.verify(dst)
    groups = [p for p in report.problems if "row group" in str(p)]
    assert len(groups) == 1, report.summary()
    (problem,) = groups
    assert problem.shard == shard["name"] and problem.key == "s/0002" and problem.offset is not None
    assert "row group 1 (keys 's/0002' .. 's/0003'), column 'bin'" in str(problem)
    assert "checksum" in str(problem).lower()


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
    alone = tmp_path / "alone"
    alone.mkdir()
    shard = shard_paths(dst)[0]
    report = fastload.verify(shutil.copy(shard, alone / shard.name))
    assert report.ok and not report.indexed
    beside = fastload.verify(shard)  # beside its index.json: checked against it (issue 28 item 8)
    assert beside.ok and beside.indexed and beside.shards == 1


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
