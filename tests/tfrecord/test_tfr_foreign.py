"""Foreign TFRecord files (written by the ``tfrecord`` package; plain and gzip; with and without ``__key__``):
`fastload index`, then ShardDataset, verify and inspect, locally and on S3 (moto)."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from dataset.test_s3 import ACCESS_KEY, REGION, SECRET_KEY, s3_env  # noqa: F401 (s3_env is a fixture)
from tfr_helpers import Foreign, check_sample, index_dict

import fastload
from fastload.cli import main
from fastload.errors import ConfigError
from fastload.formats.tfrecord.index import index_tfrecord_files
from fastload.packing.indexing import build_index


def test_index_lists_every_record(foreign: Foreign) -> None:
    index = index_dict(foreign.root)
    assert index["shard_format"] == "tfrecord" and index["version"] == 2
    assert index["fields"] == ["emb", "image", "label", "tags"]
    assert {s["name"]: s["samples"] for s in index["shards"]} == foreign.files
    for shard in index["shards"]:
        stored = (foreign.root / shard["name"]).read_bytes()
        assert shard["bytes"] == len(stored)
        ends = [o + n for o, n in zip(shard["offsets"], shard["sizes"], strict=True)]
        assert shard["offsets"] == [0, *ends[:-1]]  # records back to back, in the (decompressed) stream
    assert sorted(k for s in index["shards"] for k in s["keys"]) == sorted(foreign.expected)
    assert index["totals"]["samples"] == sum(foreign.files.values())


def test_dataset_reads_every_feature(foreign: Foreign) -> None:
    samples = list(fastload.ShardDataset(foreign.root, decode=False, seed=1, shuffle_buffer=6))
    assert sorted(s["__key__"] for s in samples) == sorted(foreign.expected)
    for s in samples:
        check_sample(s, foreign.expected)
    gz = [s for s in samples if s["__shard__"].endswith(".gz")]
    assert {s["__shard__"] for s in gz} == {"train/b.tfrecord.gz", "val/c.tfrecords.gz"}
    assert any(k.startswith("train/b-key-") for k in (s["__key__"] for s in gz))  # __key__ feature
    assert "val/c/000003" in {s["__key__"] for s in gz}  # derived key


def test_verify_and_inspect(foreign: Foreign, capsys) -> None:
    report = fastload.verify(foreign.root)
    assert report.ok and report.indexed and report.samples == sum(foreign.files.values()), report.summary()
    assert main(["inspect", str(foreign.root)]) == 0
    out = capsys.readouterr().out
    assert "format:   tfrecord" in out and "gzip:     2 shard(s)" in out


def test_verify_lints_tfrecord_files_without_an_index(foreign_copy: Foreign) -> None:
    report = fastload.verify(foreign_copy.root)
    assert report.ok and not report.indexed, report.summary()
    assert report.shards == 4 and report.samples == sum(foreign_copy.files.values())
    single = fastload.verify(foreign_copy.root / "val" / "d.tfrec")
    assert single.ok and single.samples == 31


def test_index_keeps_an_existing_index_unless_forced(foreign_copy: Foreign, capsys) -> None:
    assert main(["index", str(foreign_copy.root)]) == 0
    first = (foreign_copy.root / "index.json").read_bytes()
    assert "indexed 75 samples in 4 TFRecord file(s)" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="--force"):
        build_index(foreign_copy.root)
    assert build_index(foreign_copy.root, force=True, workers=1).ok
    assert (foreign_copy.root / "index.json").read_bytes() == first


def test_records_that_are_not_examples_are_refused(tmp_path: Path) -> None:
    from fastload.formats.tfrecord.codec import frame

    (tmp_path / "raw.tfrecord").write_bytes(frame(b"\x0a\x05ab") + frame(b"plain text, not a protobuf"))
    report = build_index(tmp_path)
    assert not report.ok and not (tmp_path / "index.json").exists()
    assert str(report.problems[0]).startswith("raw.tfrecord, byte offset 0: record 0 is not a readable")


BUCKET = "fastload-tfrecord-tests"


@pytest.mark.usefixtures("s3_env")
def test_index_and_read_an_s3_prefix(foreign_copy: Foreign, moto_url: str) -> None:
    client = boto3.client(
        "s3",
        endpoint_url=moto_url,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(s3={"addressing_style": "path"}),
    )
    client.create_bucket(Bucket=BUCKET)
    for name in foreign_copy.files:
        client.put_object(Bucket=BUCKET, Key=f"tf/{name}", Body=(foreign_copy.root / name).read_bytes())
    config = fastload.S3Config(endpoint_url=moto_url, addressing_style="path", part_size_bytes=64 << 10)
    url = f"s3://{BUCKET}/tf"
    report = build_index(url, s3_config=config)
    assert report.ok, report.summary()
    assert json.loads(client.get_object(Bucket=BUCKET, Key="tf/index.json")["Body"].read())["totals"][
        "samples"
    ] == sum(foreign_copy.files.values())
    client.close()
    samples = list(fastload.ShardDataset(url, decode=False, s3_config=config, seed=2, shuffle_buffer=4))
    assert sorted(s["__key__"] for s in samples) == sorted(foreign_copy.expected)
    for s in samples:
        check_sample(s, foreign_copy.expected)
    assert fastload.verify(url, s3_config=config).ok


def test_index_tfrecord_files_for_a_list_of_urls(foreign_copy: Foreign) -> None:
    urls = [str(foreign_copy.root / n) for n in ("val/d.tfrec", "train/b.tfrecord.gz")]
    root, index = index_tfrecord_files(urls)
    assert root == str(foreign_copy.root)
    assert [s.name for s in index.shards] == ["val/d.tfrec", "train/b.tfrecord.gz"]
    assert index.samples == 31 + 17 and not (foreign_copy.root / "index.json").exists()
    with pytest.raises(ConfigError, match="not a TFRecord file"):
        index_tfrecord_files([*urls, str(foreign_copy.root / "x.tar")])


def test_index_a_folder_of_foreign_tars(rich_tree, tmp_path: Path) -> None:
    fastload.pack(rich_tree.root, tmp_path / "packed", shard_size_bytes=16 << 10, progress=False)
    packed = index_dict(tmp_path / "packed")
    (tmp_path / "packed" / "index.json").unlink()
    for shard in packed["shards"]:
        (tmp_path / "packed" / f"{shard['name']}.fltable").unlink()
    report = build_index(tmp_path / "packed")
    assert report.ok and "tar file(s)" in report.summary()
    assert report.index is not None and report.index.shard_format == "tar"
    indexed = index_dict(tmp_path / "packed")["shards"]
    assert all(s["crcs"] for s in indexed)
    for field in ("offsets", "sizes", "crcs", "keys", "member_fields", "member_sizes"):
        assert [s.get(field) for s in indexed] == [s.get(field) for s in packed["shards"]], field
    assert fastload.verify(tmp_path / "packed").ok
    samples = {s["__key__"]: s for s in fastload.ShardDataset(tmp_path / "packed", decode=False)}
    assert {k: {f: v for f, v in s.items() if not f.startswith("__")} for k, s in samples.items()} == (
        rich_tree.samples()
    )
    (tmp_path / "packed" / "x.tfrecord").write_bytes(b"")
    with pytest.raises(ConfigError, match="both TFRecord and tar"):
        build_index(tmp_path / "packed", force=True)
