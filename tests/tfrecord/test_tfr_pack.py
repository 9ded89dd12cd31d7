"""`fastload pack --format tfrecord`: records readable by the ``tfrecord`` package and a reference reader that
checks every CRC, exact index offsets, determinism, verify/inspect, and samples read back by ShardDataset."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tfr_helpers import index_dict, protobuf_features, reference_records
from tfrecord.reader import tfrecord_loader

import fastload
from fastload.cli import main
from fastload.storage import listing


def _pack(src: Path, dst: Path, **options: object) -> dict:  # type: ignore[type-arg]
    fastload.pack(src, dst, shard_format="tfrecord", progress=False, **options)
    return index_dict(dst)


def _cli(*args: object) -> subprocess.CompletedProcess[str]:
    """The real command line, in a subprocess."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHONWARNINGS")}
    cmd = [sys.executable, "-m", "fastload", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


def test_pack_round_trip_through_independent_readers(rich_tree, tmp_path: Path) -> None:
    index = _pack(rich_tree.root, tmp_path / "dst", shard_size_bytes=16 << 10)
    expected = rich_tree.samples()
    assert index["shard_format"] == "tfrecord" and len(index["shards"]) > 3
    assert index["fields"] == sorted({f for s in expected.values() for f in s})
    seen: dict[str, dict[str, bytes]] = {}
    for shard in index["shards"]:
        path = tmp_path / "dst" / shard["name"]
        assert path.suffix == ".tfrecord"
        data = path.read_bytes()
        assert len(data) == shard["bytes"]
        payloads = reference_records(data)
        assert len(payloads) == shard["samples"] == len(shard["keys"])
        for i, payload in enumerate(payloads):
            # each indexed range is exactly that record
            offset, size = shard["offsets"][i], shard["sizes"][i]
            assert reference_records(data[offset : offset + size]) == [payload]
            features = protobuf_features(payload)
            key = features.pop("__key__")[0].decode()
            assert key == shard["keys"][i]
            seen[key] = {f: v[0] for f, v in features.items() if len(v) == 1}
            assert all(len(v) == 1 for v in features.values())
        # and the tfrecord package's own reader agrees
        loaded = list(tfrecord_loader(str(path), None))
        assert [bytes(r.pop("__key__")).decode() for r in loaded] == shard["keys"]
        assert [{f: bytes(v) for f, v in r.items()} for r in loaded] == [expected[k] for k in shard["keys"]]
    assert seen == expected
    report = fastload.verify(tmp_path / "dst")
    assert report.ok, report.summary()
    assert report.samples == len(expected)


def test_pack_is_deterministic_and_dataset_reads_the_source_bytes(rich_tree, tmp_path: Path) -> None:
    a = _pack(rich_tree.root, tmp_path / "a", shard_size_bytes=8 << 10, workers=1)
    b = _pack(rich_tree.root, tmp_path / "b", shard_size_bytes=8 << 10, workers=3)
    assert a == b
    for shard in a["shards"]:
        assert (tmp_path / "a" / shard["name"]).read_bytes() == (tmp_path / "b" / shard["name"]).read_bytes()
        assert shard["bytes"] <= 8 << 10 or shard["samples"] == 1
    samples = list(fastload.ShardDataset(tmp_path / "a", decode=False, seed=4, shuffle_buffer=5))
    assert sorted(s["__key__"] for s in samples) == sorted(rich_tree.samples())
    for s in samples:
        assert {k: v for k, v in s.items() if not k.startswith("__")} == rich_tree.samples()[s["__key__"]]
    decoded = {s["__key__"]: s for s in fastload.ShardDataset(tmp_path / "a", images=False)}
    assert decoded["cats/0000"]["cls"] == 0  # extension decoding applies to TFRecord fields too


def test_cli_pack_verify_inspect(rich_tree, tmp_path: Path, capsys) -> None:
    dst = tmp_path / "dst"
    proc = _cli("pack", rich_tree.root, dst, "--format", "tfrecord", "--max-samples", "10", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert "tfrecord shard(s)" in proc.stdout
    assert (dst / "shard-000000.tfrecord").is_file()
    assert main(["verify", str(dst)]) == 0
    assert capsys.readouterr().out.startswith("OK")
    assert main(["inspect", str(dst), "--shard", "0", "--limit", "2"]) == 0
    assert "offset 0  size" in capsys.readouterr().out


def test_a_file_shrinking_mid_pack_leaves_its_sample_out_whole(
    make_tree, tmp_path: Path, monkeypatch
) -> None:
    files = {f"s/{i:04d}.{f}": bytes([i]) * (500 + i) for i in range(8) for f in ("bin", "cls")}
    tree = make_tree(files)
    target = str(tree.root / "s/0003.cls")  # the sample's second member: the first is already written
    original = listing.LocalSource.open

    class Shrinks:
        def __init__(self, f) -> None:  # type: ignore[no-untyped-def]
            self.f = f

        def readinto(self, buf) -> int:  # type: ignore[no-untyped-def]
            os.truncate(target, 10)
            return self.f.readinto(buf)

        def close(self) -> None:
            self.f.close()

    def patched(self, entry):  # type: ignore[no-untyped-def]
        f, size = original(self, entry)
        return (Shrinks(f), size) if entry.path == target else (f, size)

    monkeypatch.setattr(listing.LocalSource, "open", patched)
    report = fastload.pack(
        tree.root, tmp_path / "dst", shard_format="tfrecord", allow_skip=True, progress=False
    )
    assert [s.path for s in report.skipped] == [target]
    index = index_dict(tmp_path / "dst")
    assert index["shards"][0]["keys"] == [f"s/{i:04d}" for i in range(8) if i != 3]
    assert fastload.verify(tmp_path / "dst").ok
    payloads = reference_records((tmp_path / "dst" / index["shards"][0]["name"]).read_bytes())
    assert [protobuf_features(p)["__key__"][0].decode() for p in payloads] == index["shards"][0]["keys"]


def test_index_refuses_what_is_not_a_folder_of_shards(tmp_path: Path, capsys) -> None:
    (tmp_path / "notes.txt").write_bytes(b"hello")
    assert main(["index", str(tmp_path)]) == 1
    assert "no TFRecord files" in capsys.readouterr().err
    assert main(["index", str(tmp_path / "missing")]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert main(["index", str(tmp_path / "notes.txt")]) == 2
    assert "is a file" in capsys.readouterr().err
