"""pack_tokens / ``fastload pack-tokens``: JSONL and Parquet inputs into token shards that verify, inspect
and read back exactly through ShardDataset; clear refusals for bad input; local and S3 destinations."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import fastload
from fastload import formats
from fastload.cli import main
from fastload.errors import ConfigError, PackError, SkippedInputError

from .conftest import TokenDataset, write_jsonl
from .helpers import documents, lognormal_lengths, moto_bucket


def read_back(root: Path | str, **kw: Any) -> dict[str, np.ndarray]:
    """Every document of a token dataset by key, read with ShardDataset."""
    return {
        s["__key__"]: s[next(k for k in s if k.startswith("tokens."))].numpy()
        for s in fastload.ShardDataset(root, **kw)
    }


def test_token_dataset_verifies_and_reads_back(token_dataset: TokenDataset) -> None:
    assert fastload.verify(token_dataset.root).ok
    index = json.loads((token_dataset.root / "_fastload" / "index.json").read_bytes())  # (Parquet shards)
    assert index["version"] == 2 and all("keys" not in s for s in index["shards"])
    index["shards"] = [s.to_dict() for s in formats.load_index(token_dataset.root, tables=True).shards]
    assert index["fields"] == ["tokens.i32"] and index["shard_format"] == "parquet"
    opts = index["options"]
    assert opts["kind"] == "tokens" and opts["dtype"] == "int32" and opts["field"] == "tokens.i32"
    assert opts["documents"] == len(token_dataset.docs) == index["totals"]["samples"]
    assert opts["tokens"] == sum(d.size for d in token_dataset.docs)
    assert index["totals"]["payload_bytes"] == 4 * opts["tokens"]
    assert len(index["shards"]) > 2 and all(len(s["row_groups"]) >= 1 for s in index["shards"])
    got = read_back(token_dataset.root)
    want = {f"a/{i}": d for i, d in enumerate(token_dataset.docs[:130])}
    want |= {f"b/{i}": d for i, d in enumerate(token_dataset.docs[130:])}
    assert got.keys() == want.keys()
    for key, d in want.items():
        assert got[key].dtype == np.int64 and np.array_equal(got[key], d)
    keys = [k for s in index["shards"] for k in s["keys"]]
    assert keys == [*(f"a/{i}" for i in range(130)), *(f"b/{i}" for i in range(110))], "input order kept"


def test_shards_and_row_groups_are_cut_by_token_bytes(tmp_path: Path) -> None:
    docs = documents([100] * 50)  # 400 bytes each as int32
    write_jsonl(tmp_path / "src.jsonl", docs)
    report = fastload.pack_tokens(
        tmp_path / "src.jsonl", tmp_path / "ds", shard_size_bytes=4096, row_group_bytes=1000
    )
    shards = formats.load_index(tmp_path / "ds", tables=True).shards
    assert [s.samples for s in shards] == [10] * 5, "4,096 bytes hold ten 400-byte documents"
    assert [(s.name, s.samples) for s in report.index.shards] == [(s.name, s.samples) for s in shards]
    assert all([rg[2] for rg in s.row_groups] == [2] * 5 for s in shards), "1,000 bytes hold two"
    assert fastload.verify(tmp_path / "ds").ok
    # the same input and options give the same bytes
    again = fastload.pack_tokens(
        tmp_path / "src.jsonl", tmp_path / "ds2", shard_size_bytes=4096, row_group_bytes=1000
    )
    for a, b in zip(shards, again.index.shards, strict=True):
        assert (tmp_path / "ds" / a.name).read_bytes() == (tmp_path / "ds2" / b.name).read_bytes()
    manifest = Path("_fastload", "index.json")
    assert (tmp_path / "ds" / manifest).read_bytes() == (tmp_path / "ds2" / manifest).read_bytes()
    assert not (tmp_path / "ds" / ".fastload-pack").exists()


def test_parquet_and_gzip_inputs_uint16(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 50_000, int(n)) for n in lognormal_lengths(60, seed=2, median=40, cap=300)]
    table = pa.table(
        {
            "ids": pa.array([d.tolist() for d in docs[:30]], type=pa.list_(pa.int32())),
            "doc": [f"p{i}" for i in range(30)],
        }
    )
    (tmp_path / "src").mkdir()
    pq.write_table(table, tmp_path / "src" / "x.parquet")
    with gzip.open(tmp_path / "src" / "y.jsonl.gz", "wt") as f:
        for i, d in enumerate(docs[30:]):
            f.write(json.dumps({"ids": d.tolist(), "doc": f"j{i}"}) + "\n")
    report = fastload.pack_tokens(
        tmp_path / "src", tmp_path / "ds", column="ids", key_column="doc", vocab_size=50_257
    )
    assert report.dtype == "uint16" and report.index.fields == ["tokens.u16"]
    assert report.documents == 60 and report.tokens == sum(d.size for d in docs)
    got = read_back(tmp_path / "ds")
    for i, d in enumerate(docs):
        assert np.array_equal(got[f"p{i}" if i < 30 else f"j{i - 30}"], d)
    assert fastload.verify(tmp_path / "ds").ok
    raw = pq.read_table(tmp_path / "ds" / report.index.shards[0].name)
    assert raw.schema.field("tokens.u16").type == pa.binary()
    first = np.frombuffer(raw.column("tokens.u16")[0].as_py(), dtype="<u2")
    assert np.array_equal(first, docs[0]), "little-endian uint16 ids, one binary value per document"


def test_bad_documents_are_named_and_left_out(tmp_path: Path) -> None:
    lines = [
        {"input_ids": [1, 2, 3]},
        {"input_ids": "not ids"},
        {"input_ids": [1.5, 2]},
        {"input_ids": [1, 70_000]},
        {"input_ids": [[1], [2]]},
        {"input_ids": [-1]},
        {"input_ids": []},
    ]
    src = tmp_path / "src.jsonl"
    src.write_text(
        "\n".join(json.dumps(r) for r in lines[:3])
        + "\n{broken\n"
        + "\n".join(json.dumps(r) for r in lines[3:])
        + "\n"
    )
    with pytest.raises(SkippedInputError) as caught:
        fastload.pack_tokens(src, tmp_path / "ds", vocab_size=65_536)
    assert caught.value.written
    reasons = {s.path.rsplit(":", 1)[1]: s.reason for s in caught.value.skipped}
    assert set(reasons) == {"2", "3", "4", "5", "6", "7"}
    assert "not a list of integers" in reasons["2"] and "not a list of integers" in reasons["3"]
    assert "not valid JSON" in reasons["4"]
    assert "token id 70000 at position 1 is out of range for vocab_size 65,536" in reasons["5"]
    assert "token id -1 at position 0" in reasons["7"]
    report = fastload.pack_tokens(src, tmp_path / "ds2", vocab_size=65_536, allow_skip=True)
    assert report.documents == 2 and report.tokens == 3 and len(report.skipped) == 6
    assert len(report.index.skipped) == 6 and "skipped 6" in report.summary()
    assert read_back(tmp_path / "ds2")["src/0"].tolist() == [1, 2, 3]


def test_refusals_before_anything_is_written(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", documents([3, 4]), column="tokens")
    dst = tmp_path / "ds"
    with pytest.raises(ConfigError, match=r"a\.jsonl:1 has no field 'input_ids' \(fields: tokens\)"):
        fastload.pack_tokens(tmp_path / "a.jsonl", dst)
    assert not dst.exists()
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "b.parquet")
    with pytest.raises(ConfigError, match=r"b\.parquet has no column 'input_ids'"):
        fastload.pack_tokens(tmp_path / "b.parquet", dst)
    with pytest.raises(ConfigError, match="column 'x' is int64, expected token ids"):
        fastload.pack_tokens(tmp_path / "b.parquet", dst, column="x")
    for kw, match in [
        ({"dtype": "uint8"}, "dtype"),
        ({"dtype": "uint16", "vocab_size": 100_000}, "does not fit uint16"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"row_group_bytes": 0}, "row_group_bytes"),
        ({"field_name": "a.b"}, "field_name"),
        ({"tokenizer": "nocolon"}, "module:function"),
        ({"tokenizer": "no_such_module_xyz:f"}, "cannot import"),
    ]:
        with pytest.raises(ConfigError, match=match):
            fastload.pack_tokens(tmp_path / "a.jsonl", dst, column="tokens", **kw)
    with pytest.raises(ConfigError, match="does not exist"):
        fastload.pack_tokens(tmp_path / "missing", dst)
    assert not dst.exists()
    dst.mkdir()
    (dst / "x").write_text("x")
    with pytest.raises(PackError, match="not empty"):
        fastload.pack_tokens(tmp_path / "a.jsonl", dst, column="tokens")


def test_tokenizer_hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mytok.py").write_text("def encode(text):\n    return [ord(c) for c in text]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mytok", raising=False)
    (tmp_path / "t.jsonl").write_text('{"text": "héllo"}\n{"text": ""}\n{"text": 5}\n')
    report = fastload.pack_tokens(
        tmp_path / "t.jsonl", tmp_path / "ds", tokenizer="mytok:encode", allow_skip=True
    )
    assert report.documents == 2 and [s.path.rsplit(":", 1)[1] for s in report.skipped] == ["3"]
    got = read_back(tmp_path / "ds")
    assert got["t/0"].tolist() == [ord(c) for c in "héllo"] and got["t/1"].tolist() == []
    assert report.index.options["tokenizer"] == "mytok:encode"


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_jsonl(tmp_path / "a.jsonl", [*documents([3, 4]), np.array([5, 6])])
    assert (
        main(["pack-tokens", str(tmp_path / "a.jsonl"), str(tmp_path / "ds"), "--shard-size", "64KiB"]) == 0
    )
    out = capsys.readouterr().out
    assert "packed 3 documents (9 tokens, int32)" in out
    assert main(["pack-tokens", str(tmp_path / "a.jsonl"), str(tmp_path / "ds2"), "--dtype", "uint16"]) == 1
    assert "out of range for uint16" in capsys.readouterr().err
    assert main(["pack-tokens", str(tmp_path / "a.jsonl"), str(tmp_path / "ds3"), "--column", "nope"]) == 2
    assert "has no field 'nope'" in capsys.readouterr().err
    assert main(["verify", str(tmp_path / "ds")]) == 0
    assert main(["inspect", str(tmp_path / "ds")]) == 0
    assert "tokens.i32" in capsys.readouterr().out


BUCKET = "fastload-token-tests"


def test_s3_destination_and_read_back(tmp_path: Path, moto_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """pack-tokens into s3:// (moto), then ShardDataset -> PackedSequences from S3: every token once."""

    from fastload.s3 import runtime

    moto_bucket(monkeypatch, tmp_path, moto_url, BUCKET)
    try:
        docs = documents(lognormal_lengths(40, seed=9, median=30, cap=200))
        write_jsonl(tmp_path / "src.jsonl", docs)
        config = fastload.S3Config(endpoint_url=moto_url, addressing_style="path")
        url = f"s3://{BUCKET}/tok"
        report = fastload.pack_tokens(tmp_path / "src.jsonl", url, shard_size_bytes=4096, s3_config=config)
        assert len(report.index.shards) > 1
        assert fastload.verify(url, s3_config=config).ok
        blocks = list(
            fastload.PackedSequences(fastload.ShardDataset(url, seed=1, s3_config=config), seq_len=128)
        )
        from .helpers import assert_exactly_once

        assert_exactly_once(docs, blocks, seq_len=128)
    finally:
        runtime.reset()


def test_parquet_nulls_are_named_by_row(tmp_path: Path) -> None:
    ids = pa.array([[1, 2], None, [3, None], [], [4]], type=pa.list_(pa.int64()))
    pq.write_table(pa.table({"input_ids": ids}), tmp_path / "n.parquet")
    report = fastload.pack_tokens(tmp_path / "n.parquet", tmp_path / "ds", allow_skip=True)
    assert [s.path.rsplit(" ", 1)[1] for s in report.skipped] == ["1", "2"]
    assert "is null" in report.skipped[0].reason and "not a list of integers" in report.skipped[1].reason
    got = read_back(tmp_path / "ds")
    assert {k: v.tolist() for k, v in got.items()} == {"n/0": [1, 2], "n/3": [], "n/4": [4]}
