"""fastload.train.collate: dynamic padding (pad) and batches of packed blocks (blocks)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fastload
from fastload.errors import ConfigError


def test_pad_right_with_multiple() -> None:
    out = fastload.train.collate.pad(
        [[5, 6, 7], torch.tensor([8]), np.array([9, 10], dtype=np.uint16)], pad_to_multiple_of=4
    )
    assert out["input_ids"].tolist() == [[5, 6, 7, 0], [8, 0, 0, 0], [9, 10, 0, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0]]
    assert out["labels"].tolist() == [[5, 6, 7, -100], [8, -100, -100, -100], [9, 10, -100, -100]]
    assert all(out[k].dtype == torch.int64 for k in ("input_ids", "attention_mask", "labels"))


def test_pad_left_pad_id_and_ignore_index() -> None:
    out = fastload.train.collate.pad([[1, 2], [3]], pad_id=7, label_ignore_index=-1, padding_side="left")
    assert out["input_ids"].tolist() == [[1, 2], [7, 3]]
    assert out["attention_mask"].tolist() == [[1, 1], [0, 1]]
    assert out["labels"].tolist() == [[1, 2], [-1, 3]]


def test_pad_dicts_labels_and_other_fields() -> None:
    batch = [
        {"__key__": "a", "input_ids": [1, 2, 3], "labels": [-100, -100, 3], "lang": "en"},
        {"__key__": "b", "input_ids": [4], "lang": "fr"},
    ]
    out = fastload.train.collate.pad(batch)
    assert out["labels"].tolist() == [[-100, -100, 3], [4, -100, -100]]
    assert out["__key__"] == ["a", "b"] and out["lang"] == ["en", "fr"]
    raw = [{"tokens.u16": np.array([1, 300], dtype="<u2").tobytes()}, {"tokens.u16": b""}]
    assert fastload.train.collate.pad(raw)["input_ids"].tolist() == [[1, 300], [0, 0]]


@pytest.mark.parametrize(
    ("batch", "kw", "match"),
    [
        ([], {}, "non-empty list"),
        ([[1]], {"pad_to_multiple_of": 0}, "pad_to_multiple_of"),
        ([[1]], {"padding_side": "middle"}, "padding_side"),
        ([[1.5, 2.0]], {}, "batch item 0 is not a 1-D sequence of integer"),
        ([{"__key__": "x", "text": "hi"}], {}, "cannot tell which holds the token ids"),
        ([{"__key__": "x", "ids": [1]}], {"field": "input_ids"}, "no field 'input_ids'"),
        ([{"input_ids": [1, 2], "labels": [1]}], {}, "1 labels for 2 token ids"),
        ([{"tokens.u16": b"\x01"}], {}, "not token ids"),
    ],
)
def test_pad_refuses_bad_input(batch, kw, match) -> None:
    with pytest.raises(ConfigError, match=match):
        fastload.train.collate.pad(batch, **kw)


@settings(max_examples=60, deadline=None)
@given(
    seqs=st.lists(st.lists(st.integers(0, 1000), max_size=20), min_size=1, max_size=8),
    multiple=st.one_of(st.none(), st.integers(1, 16)),
    side=st.sampled_from(["right", "left"]),
)
def test_pad_property(seqs: list[list[int]], multiple: int | None, side: str) -> None:
    out = fastload.train.collate.pad(seqs, pad_id=-5, pad_to_multiple_of=multiple, padding_side=side)
    width = out["input_ids"].shape[1]
    longest = max(len(s) for s in seqs)
    assert width >= longest and width - longest < (multiple or 1) and width % (multiple or 1) == 0
    for row, mask, labels, s in zip(
        out["input_ids"], out["attention_mask"], out["labels"], seqs, strict=True
    ):
        assert row[mask.bool()].tolist() == s and labels[mask.bool()].tolist() == s
        assert (row[~mask.bool()] == -5).all() and (labels[~mask.bool()] == -100).all()
        assert int(mask.sum()) == len(s)
        real = mask.nonzero().flatten().tolist()
        want = list(range(len(s))) if side == "right" else list(range(width - len(s), width))
        assert real == want


def test_blocks_join_cu_seqlens_with_offsets() -> None:
    docs = [np.arange(n) for n in (10, 3, 30, 20, 7, 40)]
    blocks = list(fastload.PackedSequences(docs, seq_len=32, attention_mask=True))
    batch = fastload.train.collate.blocks(blocks)
    n = len(blocks)
    assert batch["input_ids"].shape == batch["labels"].shape == batch["position_ids"].shape == (n, 32)
    assert batch["attention_mask"].shape == (n, 32, 32)
    want = [0] + [int(x) + 32 * i for i, b in enumerate(blocks) for x in b["cu_seqlens"][1:]]
    assert batch["cu_seqlens"].tolist() == want and batch["cu_seqlens"].dtype == torch.int32
    assert batch["max_seqlen"] == max(b["max_seqlen"] for b in blocks)
    assert batch["num_tokens"].tolist() == [b["num_tokens"] for b in blocks]
    with pytest.raises(ConfigError, match="PackedSequences"):
        fastload.train.collate.blocks([{"input_ids": torch.zeros(3)}])
    with pytest.raises(ConfigError, match="non-empty"):
        fastload.train.collate.blocks([])
