"""What ``--tokenizer`` takes (a module in the working directory as the ``fastload`` command sees it, a
``file.py:function``, a Hugging Face ``tokenizer.json``, ``hf:NAME`` from the Hub cache), ids put around
each document (``bos_id``/``eos_id``), and JSON booleans refused as ids."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import fastload
from fastload.cli import main
from fastload.errors import ConfigError, SkippedInputError

from .conftest import write_jsonl
from .helpers import documents

tokenizers = pytest.importorskip("tokenizers")

TEXTS = ["the quick brown fox", "jumps over the lazy dog", "", "hello world", "the fox and the dog"]


def read_back(root: Path) -> dict[str, list[int]]:
    return {s["__key__"]: s["tokens.i32"].tolist() for s in fastload.ShardDataset(root)}


def small_tokenizer(path: Path) -> Any:
    """A BPE tokenizer trained here on a few sentences (no download), saved as ``tokenizer.json``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(TEXTS * 20, trainers.BpeTrainer(vocab_size=120, special_tokens=["[UNK]", "<s>"]))
    tok.save(str(path))
    return tok


def write_texts(path: Path, texts: list[Any]) -> None:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))


def test_the_command_imports_a_tokenizer_module_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``fastload`` command's sys.path holds its script's folder, not the working directory (unlike
    ``python -m``): the documented ``--tokenizer mytok:encode`` must still find ./mytok.py."""
    (tmp_path / "mytok.py").write_text("def encode(text):\n    return [len(w) for w in text.split()]\n")
    write_texts(tmp_path / "t.jsonl", TEXTS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path), ".")])
    monkeypatch.delitem(sys.modules, "mytok", raising=False)
    assert main(["pack-tokens", "t.jsonl", "ds", "--tokenizer", "mytok:encode"]) == 0
    assert read_back(tmp_path / "ds")["t/1"] == [5, 4, 3, 4, 3]
    assert str(tmp_path) not in sys.path, "the working directory is not left on sys.path"


def test_a_python_file_and_a_missing_one(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "tok.py").write_text(
        "class T:\n    def encode(self, text):\n        return [7] * len(text)\n\n\ntok = T()\n"
    )
    write_texts(tmp_path / "t.jsonl", ["ab", "abc"])
    fastload.pack_tokens(tmp_path / "t.jsonl", tmp_path / "ds", tokenizer=f"{tmp_path}/lib/tok.py:tok.encode")
    assert read_back(tmp_path / "ds") == {"t/0": [7, 7], "t/1": [7, 7, 7]}
    with pytest.raises(ConfigError, match="no file"):
        fastload.pack_tokens(tmp_path / "t.jsonl", tmp_path / "x", tokenizer="lib/nope.py:f")
    with pytest.raises(ConfigError, match=r"run from the folder holding no_such_tok\.py"):
        fastload.pack_tokens(tmp_path / "t.jsonl", tmp_path / "x", tokenizer="no_such_tok:f")


def test_a_tokenizers_json_file_tokenises_in_batches(tmp_path: Path) -> None:
    tok = small_tokenizer(tmp_path / "tokenizer.json")
    write_texts(tmp_path / "t.jsonl", [*TEXTS, 5])
    with pytest.raises(SkippedInputError) as caught:
        fastload.pack_tokens(tmp_path / "t.jsonl", tmp_path / "ds", tokenizer=f"{tmp_path}/tokenizer.json")
    assert [s.path.rsplit(":", 1)[1] for s in caught.value.skipped] == ["6"], "the number is named, not text"
    got = read_back(tmp_path / "ds")
    assert got == {f"t/{i}": tok.encode(t, add_special_tokens=False).ids for i, t in enumerate(TEXTS)}
    assert all(got[f"t/{i}"] for i in (0, 1, 3, 4)) and got["t/2"] == []
    # the same through the Parquet reader's text path, with an id after each document
    pq.write_table(pa.table({"text": TEXTS}), tmp_path / "t.parquet")
    eos = tok.token_to_id("<s>")
    fastload.pack_tokens(
        tmp_path / "t.parquet", tmp_path / "pq", tokenizer=str(tmp_path / "tokenizer.json"), eos_id=eos
    )
    assert read_back(tmp_path / "pq") == {k: [*v, eos] for k, v in got.items()}


def test_hf_names_resolve_through_the_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``hf:ORG/NAME`` loads through huggingface_hub (here from its cache, offline: tests reach no Hub)."""
    pytest.importorskip("huggingface_hub")
    snapshot = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    tok = small_tokenizer(snapshot / "tokenizer.json")
    (tmp_path / "hub" / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--tiny" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    write_texts(tmp_path / "t.jsonl", TEXTS[:2])
    report = fastload.pack_tokens(tmp_path / "t.jsonl", tmp_path / "ds", tokenizer="hf:acme/tiny")
    assert read_back(tmp_path / "ds")["t/0"] == tok.encode(TEXTS[0], add_special_tokens=False).ids
    assert report.index.options["tokenizer"] == "hf:acme/tiny"
    with pytest.raises(ConfigError, match="cannot load 'acme/nothing' from the Hugging Face Hub"):
        fastload.pack_tokens(tmp_path / "t.jsonl", tmp_path / "x", tokenizer="hf:acme/nothing")


def test_bos_and_eos_around_every_document(tmp_path: Path) -> None:
    docs = documents([3, 0, 2])
    write_jsonl(tmp_path / "a.jsonl", docs)
    pq.write_table(pa.table({"input_ids": [d.tolist() for d in docs]}), tmp_path / "b.parquet")
    for src in ("a.jsonl", "b.parquet"):  # the JSON reader and Parquet's list<int> fast path
        out = tmp_path / f"ds-{src}"
        report = fastload.pack_tokens(tmp_path / src, out, bos_id=1, eos_id=2)
        want = {f"{src.split('.')[0]}/{i}": [1, *d.tolist(), 2] for i, d in enumerate(docs)}
        assert read_back(out) == want
        assert report.tokens == sum(d.size + 2 for d in docs)
        assert report.index.options["bos_id"] == 1 and report.index.options["eos_id"] == 2
    with pytest.raises(ConfigError, match=r"eos_id=70000 must be a token id in 0\.\.65,535"):
        fastload.pack_tokens(tmp_path / "a.jsonl", tmp_path / "x", vocab_size=65_536, eos_id=70_000)


def test_json_booleans_are_not_token_ids(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"input_ids": [1, true, 3]}\n{"input_ids": [4, 5]}\n')
    with pytest.raises(SkippedInputError) as caught:
        fastload.pack_tokens(tmp_path / "a.jsonl", tmp_path / "ds")
    (skip,) = caught.value.skipped
    assert skip.path.endswith("a.jsonl:1") and "true/false" in skip.reason
    assert read_back(tmp_path / "ds") == {"a/1": [4, 5]}
    assert np.array_equal(np.asarray([4, 5]), read_back(tmp_path / "ds")["a/1"])
