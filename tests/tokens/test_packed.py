"""PackedSequences: every token exactly once, block layout, input forms, and resume == uninterrupted for
every kind of upstream (a list, a ShardDataset, a fastload.DataLoader)."""

from __future__ import annotations

import io
from collections.abc import Callable
from itertools import islice
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fastload
from fastload.errors import ConfigError
from fastload.train.collate import blocks as collate_blocks

from .conftest import TokenDataset
from .helpers import STRIDE, assert_exactly_once, check_block, documents, lognormal_lengths, same_blocks


def packed(source: Any, **kw: Any) -> fastload.PackedSequences:
    kw.setdefault("seq_len", 64)
    kw.setdefault("window", 16)
    return fastload.PackedSequences(source, **kw)


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    """Through torch.save / torch.load(weights_only=True), as a checkpoint would go."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


DOCS = documents([*lognormal_lengths(150, seed=1, median=20, cap=150), 0, 64, 65, 200, 1])


def test_every_token_exactly_once_in_order() -> None:
    p = packed(DOCS)
    out = list(p)
    assert_exactly_once(DOCS, out, seq_len=64)
    total = sum(d.size for d in DOCS)
    assert p.stats.tokens == total and p.stats.blocks == len(out)
    assert p.stats.blocks * 64 == total + p.stats.padding
    assert p.stats.documents == len(DOCS) and 0 <= p.stats.waste < 0.1
    assert same_blocks(out, list(packed(DOCS))), "a second pass gives the same blocks"


def test_input_forms_give_the_same_blocks() -> None:
    docs = documents([5, 40, 17, 90, 3, 64, 33], first=0)
    small = [d % STRIDE + 7 * i for i, d in enumerate(docs)]  # ids that fit uint16
    want = list(packed(small))
    forms: dict[str, list[Any]] = {
        "tensors": [torch.from_numpy(d) for d in small],
        "lists": [d.tolist() for d in small],
        "dicts": [{"__key__": str(i), "input_ids": d} for i, d in enumerate(small)],
        "raw u16 bytes": [{"tokens.u16": d.astype("<u2").tobytes()} for d in small],
        "decoded i32": [{"__key__": "k", "tokens.i32": torch.from_numpy(d)} for d in small],
        "batches": [[{"input_ids": d} for d in small[:3]], [{"input_ids": d} for d in small[3:]]],
        "named field": [{"ids": d, "other": 1} for d in small],
    }
    for name, items in forms.items():
        kw = {"field": "ids"} if name == "named field" else {}
        assert same_blocks(list(packed(items, **kw)), want), name


def test_truncate_keeps_each_document_head() -> None:
    docs = documents([10, 100, 64, 300, 5])
    p = packed(docs, split="truncate")
    out = list(p)
    heads = [d[:64] for d in docs]
    assert_exactly_once(heads, out, seq_len=64)
    assert p.stats.truncated == 36 + 236


def test_options_mask_labels_and_pad_id() -> None:
    docs = documents([10, 20, 7])
    out = list(packed(docs, attention_mask=True, pad_id=3, ignore_index=-1, ignore_doc_starts=False))
    assert len(out) == 1 and out[0]["attention_mask"].shape == (64, 64)
    check_block(out[0], seq_len=64, pad_id=3, ignore_index=-1, doc_starts=False)
    assert out[0]["num_tokens"] == 37


def test_empty_upstream_gives_nothing() -> None:
    assert list(packed([])) == []
    assert list(packed([[], np.zeros(0, dtype=np.int64)])) == []


@pytest.mark.parametrize(
    ("item", "match"),
    [
        ({"__key__": "k1", "input_ids": torch.ones(3)}, "k1.*not a 1-D sequence of integer"),
        ({"__key__": "k2", "text": "hello"}, "k2.*cannot tell which holds the token ids"),
        (np.ones((2, 2), dtype=np.int64), "not a 1-D sequence"),
        ({"__key__": "k3", "input_ids": b"\x01\x02"}, "k3.*holds bytes"),
        ({"__key__": "k4", "tokens.u16": b"\x01\x02\x03"}, "k4.*whole number of token ids"),
    ],
)
def test_bad_documents_are_named(item: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        list(packed([item]))


def test_bad_options() -> None:
    for kw, match in [
        ({"seq_len": 0}, "seq_len"),
        ({"window": 0}, "window"),
        ({"split": "wrap"}, "split"),
    ]:
        with pytest.raises(ConfigError, match=match):
            packed(DOCS, **kw)


# --- resume ---------------------------------------------------------------------------------------------


def _resume(make: Callable[[], fastload.PackedSequences], cut: int) -> list[dict[str, Any]]:
    """Take ``cut`` blocks, checkpoint, rebuild everything, restore, take the rest."""
    first = make()
    head = list(islice(iter(first), cut))
    state = roundtrip(first.state_dict())
    second = make()
    second.load_state_dict(state)
    return head + list(second)


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 120), max_size=50),
    seq_len=st.integers(1, 48),
    window=st.integers(1, 12),
    split=st.sampled_from(["split", "truncate"]),
    cut=st.integers(0, 60),
)
def test_resume_anywhere_equals_uninterrupted(
    lengths: list[int], seq_len: int, window: int, split: str, cut: int
) -> None:
    docs = documents(lengths)

    def make() -> fastload.PackedSequences:
        return fastload.PackedSequences(docs, seq_len=seq_len, window=window, split=split)

    whole = list(make())
    if split == "split":
        assert_exactly_once(docs, whole, seq_len=seq_len)
    # a checkpoint taken after the pass ended (the iterator exhausted) starts the next pass
    assert same_blocks(_resume(make, cut), whole if cut <= len(whole) else whole + whole)


def test_resume_twice_and_state_before_iterating() -> None:
    def make() -> fastload.PackedSequences:
        return packed(DOCS)

    whole = list(make())
    p = make()
    assert same_blocks(list(p), whole)
    q = make()
    q.load_state_dict(roundtrip(make().state_dict()))  # a state taken before any iteration: from the start
    it = iter(q)
    head = list(islice(it, 10))
    r = make()
    r.load_state_dict(roundtrip(q.state_dict()))
    assert roundtrip(r.state_dict()).keys() == q.state_dict().keys()  # restored but not yet iterated
    mid = list(islice(iter(r), 7))
    s = make()
    s.load_state_dict(r.state_dict())
    assert same_blocks(head + mid + list(s), whole)
    assert s.stats.blocks == len(whole) and s.stats.tokens == sum(d.size for d in DOCS)


def test_resume_refuses_other_options_or_upstreams(token_dataset: TokenDataset) -> None:
    state = packed(DOCS).state_dict()
    with pytest.raises(ConfigError, match="seq_len=64"):
        packed(DOCS, seq_len=32).load_state_dict(state)
    with pytest.raises(ConfigError, match="upstream is 'replay'"):
        packed(fastload.ShardDataset(token_dataset.root)).load_state_dict(state)
    with pytest.raises(ConfigError, match="not a PackedSequences state"):
        packed(DOCS).load_state_dict({"epoch": 1})
    short = packed(DOCS[:3])
    big = packed(DOCS)
    it = iter(big)
    list(islice(it, 30))
    short.load_state_dict(big.state_dict())
    with pytest.raises(ConfigError, match="yielded only"):
        list(short)


def _shard_dataset(root: Any) -> fastload.ShardDataset:
    return fastload.ShardDataset(root, seed=4, shuffle_buffer=32)


@pytest.mark.parametrize("cut", [0, 1, 23, 10_000])
def test_resume_over_a_shard_dataset(token_dataset: TokenDataset, cut: int) -> None:
    whole = list(packed(_shard_dataset(token_dataset.root)))
    assert_exactly_once(token_dataset.docs, whole, seq_len=64)
    ds = _shard_dataset(token_dataset.root)
    first = packed(ds)
    head = list(islice(iter(first), cut))
    state = roundtrip(first.state_dict())
    ds2 = _shard_dataset(token_dataset.root)
    second = packed(ds2)
    second.load_state_dict(state)
    ds2.set_epoch(0)  # the training loop's own call keeps the restored position
    # a checkpoint taken after the pass ended (the iterator exhausted) holds the next epoch (what the
    # dataset reads next); the loop's own set_epoch(0) above reads epoch 0 again, as asked
    assert same_blocks(head + list(second), whole if cut <= len(whole) else whole + whole)
    assert ds2.start == 0, "a complete pass leaves the dataset at the start of an epoch"
    upstream = second.state_dict()["upstream"]  # the dataset's own state_dict (its Stateful protocol)
    assert upstream["kind"] == "stateful"
    assert (upstream["state"]["epoch"], upstream["state"]["delivered"]) == (1, 0)


def test_resume_from_a_checkpoint_of_the_previous_upstream_format(token_dataset: TokenDataset) -> None:
    """Checkpoints written before ShardDataset had state_dict() held ``{"kind": "shard_dataset", "epoch",
    "delivered"}``: they still restore, to the same blocks."""
    whole = list(packed(_shard_dataset(token_dataset.root)))
    first = packed(_shard_dataset(token_dataset.root))
    head = list(islice(iter(first), 23))
    state = roundtrip(first.state_dict())
    inner = state["upstream"]["state"]
    state["upstream"] = {"kind": "shard_dataset", "epoch": inner["epoch"], "delivered": inner["delivered"]}
    second = packed(_shard_dataset(token_dataset.root))
    second.load_state_dict(state)
    assert same_blocks(head + list(second), whole)


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_over_a_fastload_dataloader(token_dataset: TokenDataset, workers: int) -> None:
    """The recommended setup: samples read by fastload.DataLoader workers, packed in this process, blocks
    batched by a torch DataLoader without workers."""

    def make(workers: int = workers) -> tuple[fastload.PackedSequences, torch.utils.data.DataLoader]:
        samples = fastload.DataLoader(
            _shard_dataset(token_dataset.root), batch_size=8, collate_fn=list, num_workers=workers
        )
        p = packed(samples, window=40)
        return p, torch.utils.data.DataLoader(p, batch_size=4, collate_fn=collate_blocks)

    _, loader = make(0)  # the order does not depend on the number of workers
    whole = list(loader)
    p2, loader2 = make()
    head = list(islice(iter(loader2), 3))
    state = roundtrip(p2.state_dict())
    p3, loader3 = make()
    p3.load_state_dict(state)
    rest = list(loader3)
    assert len(head + rest) == len(whole)
    for a, b in zip(head + rest, whole, strict=True):
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["cu_seqlens"], b["cu_seqlens"])
    real = [row[:n] for b in whole for row, n in zip(b["input_ids"], b["num_tokens"].tolist(), strict=True)]
    assert np.array_equal(np.sort(torch.cat(real).numpy()), np.sort(np.concatenate(token_dataset.docs)))


# blocks come from each worker's own stretch of the documents, in an order that depends on num_workers: the
# dataset says so once (tests/dataset/test_torch_loader.py checks that warning)
@pytest.mark.filterwarnings("ignore:fastload.ShardDataset is read by 2 DataLoader workers")
def test_workers_need_an_upstream_that_splits_itself(
    token_dataset: TokenDataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In DataLoader workers a list would reach every worker whole: refused. A ShardDataset splits by
    worker, so two workers still hand out every token exactly once."""
    with monkeypatch.context() as m:
        m.setattr(torch.utils.data, "get_worker_info", lambda: object())  # as inside a worker
        with pytest.raises(ConfigError, match="would hand every worker every document"):
            next(iter(packed(DOCS)))
    loader = torch.utils.data.DataLoader(
        packed(fastload.ShardDataset(token_dataset.root)), batch_size=None, num_workers=2
    )
    assert_exactly_once(token_dataset.docs, list(loader), seq_len=64)
