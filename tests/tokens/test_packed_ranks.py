"""PackedSequences across data-parallel ranks: a checkpoint of 2 ranks resumed on 1 or 3 gives every token
exactly once (what the even split of the resumed order cuts is reported), a lone rank's state is refused on
another world size, the end of a pass on every rank (equal steps, :mod:`fastload.core.packranks`), and a
packer iterated in DataLoader workers refuses to checkpoint. The torchrun DDP loop: test_packed_ddp.py."""

from __future__ import annotations

from itertools import islice
from typing import Any

import numpy as np
import pytest
import torch

import fastload
from fastload.core.packranks import equal_steps
from fastload.errors import ConfigError

from .conftest import TokenDataset
from .helpers import STRIDE, pieces
from .test_packed import roundtrip

Pipeline = tuple[fastload.PackedSequences, fastload.ShardDataset]


def make(root: Any, rank: int, world: int, **kw: Any) -> Pipeline:
    """One rank's recommended pipeline: fastload.DataLoader reading, PackedSequences packing."""
    ds = fastload.ShardDataset(root, seed=4, shuffle_buffer=32, rank=rank, world_size=world)
    upstream = fastload.DataLoader(ds, batch_size=8, collate_fn=list)
    return fastload.PackedSequences(upstream, seq_len=64, window=16, **kw), ds


def token_counts(blocks: list[dict[str, Any]]) -> dict[int, np.ndarray]:
    """Document -> its tokens as handed out, over any number of ranks (sorted: ranks are separate streams)."""
    out: dict[int, list[np.ndarray]] = {}
    for block in blocks:
        for piece in pieces(block):
            out.setdefault(int(piece[0] // STRIDE), []).append(piece)
    return {d: np.sort(np.concatenate(p)) for d, p in out.items()}


def keyed_docs(ds: fastload.ShardDataset, docs: list[np.ndarray]) -> dict[tuple[str, str], int]:
    """(shard name, key) -> document number, from the documents' own tokens."""
    out = {}
    for sample in fastload.ShardDataset(ds.root):
        out[(sample["__shard__"], sample["__key__"])] = int(sample["tokens.i32"][0] // STRIDE)
    return out


@pytest.mark.parametrize(("old_world", "new_world"), [(2, 1), (2, 3), (1, 2)])
@pytest.mark.parametrize("cut", [0, 5, 41, 100])
def test_two_ranks_resumed_on_another_number_of_ranks_exactly_once(
    token_dataset: TokenDataset, old_world: int, new_world: int, cut: int
) -> None:
    """Each old rank hands out `cut` blocks and saves its state; every new rank loads all of them. Every
    token of every document comes exactly once over the old ranks' blocks and the new ranks' (the even
    split of the resumed order may cut `remaining mod new_world` documents: they are the ones reported)."""
    heads, states = [], []
    for rank in range(old_world):
        packer, _ = make(token_dataset.root, rank, old_world)
        heads += list(islice(iter(packer), cut))
        states.append(roundtrip(packer.state_dict()))
    rest, dropped = [], []
    for rank in range(new_world):
        packer, ds = make(token_dataset.root, rank, new_world)
        packer.load_state_dict(states[::-1])  # any order
        rest += list(packer)
        dropped += ds.epoch_report()["dropped"]
    got = token_counts(heads + rest)
    want = {int(d[0] // STRIDE): d for d in token_dataset.docs}
    for doc, tokens in got.items():
        assert np.array_equal(tokens, want[doc]), f"document {doc}: tokens missing or repeated"
    names = keyed_docs(ds, token_dataset.docs)
    assert set(want) - set(got) == {names[tuple(pair)] for pair in dropped}
    assert len(dropped) < new_world


def test_one_rank_state_on_another_world_size_is_refused(token_dataset: TokenDataset) -> None:
    """A lone rank's state cannot tell what the other ranks had read or held: refused, saying what to pass."""
    packer, _ = make(token_dataset.root, 0, 2)
    list(islice(iter(packer), 3))
    state = packer.state_dict()
    other, _ = make(token_dataset.root, 0, 1)
    with pytest.raises(ConfigError, match=r"needs every old rank's state.*state of rank 1"):
        other.load_state_dict(state)
    with pytest.raises(ConfigError, match=r"every rank 0..1"):
        other.load_state_dict([state, state])
    same, _ = make(token_dataset.root, 0, 2)  # its own state on the same world size: fine
    same.load_state_dict(state)


def test_cross_world_needs_a_shard_dataset_upstream() -> None:
    docs = [list(range(1, n + 1)) for n in (5, 70, 3, 9)]
    packer = fastload.PackedSequences(docs, seq_len=16, window=2)
    next(iter(packer))
    state = {**packer.state_dict(), "world_size": 2, "rank": 0}
    with pytest.raises(ConfigError, match="not a ShardDataset"):
        fastload.PackedSequences(docs, seq_len=16, window=2).load_state_dict([state, {**state, "rank": 1}])


def test_resume_in_the_last_round_does_not_read_the_epoch_again(token_dataset: TokenDataset) -> None:
    """A checkpoint taken while the last round is handed out (the upstream already ended and rewound)
    resumes with the rest of that round only."""
    packer, _ = make(token_dataset.root, 0, 1)
    whole = list(packer)
    packer, _ = make(token_dataset.root, 0, 1)
    head = list(islice(iter(packer), len(whole) - 1))
    again, _ = make(token_dataset.root, 0, 1)
    again.load_state_dict(roundtrip(packer.state_dict()))
    rest = list(again)
    assert len(head) + len(rest) == len(whole)
    assert torch.equal(rest[-1]["input_ids"], whole[-1]["input_ids"])


def test_state_after_iterating_in_dataloader_workers_is_refused(token_dataset: TokenDataset) -> None:
    """Each torch DataLoader worker packs its own copy: the training process's state would say nothing was
    handed out (a resume would repeat every token). It raises instead, saying what to use."""
    packer = fastload.PackedSequences(
        fastload.ShardDataset(token_dataset.root, batch_size=4), seq_len=64, window=16
    )
    loader = torch.utils.data.DataLoader(packer, batch_size=4, num_workers=2, collate_fn=list)
    assert len(list(islice(iter(loader), 2))) == 2
    with pytest.raises(ConfigError, match="iterated in DataLoader workers"):
        packer.state_dict()
    assert len(list(islice(iter(packer), 2))) == 2  # iterated here again: its state is this process's
    assert packer.state_dict()["handed"] == 2


@pytest.mark.parametrize(
    ("avail", "even", "steps", "empty", "dropped"),
    [
        ([386, 380], "balance", 383, [0, 0], [0, 0]),
        ([259, 255, 252], "balance", 256, [0, 1, 1], [0, 0, 0]),
        ([259, 255, 252], "pad", 259, [0, 4, 7], [0, 0, 0]),
        ([259, 255, 252], "drop", 252, [0, 0, 0], [7, 3, 0]),
        ([0, 5], "balance", 3, [1, 0], [0, 0]),
        ([4, 4], "balance", 4, [0, 0], [0, 0]),
    ],
)
def test_equal_steps(avail: list[int], even: str, steps: int, empty: list[int], dropped: list[int]) -> None:
    plan = equal_steps(avail, even)
    assert plan.steps == steps and plan.empty == empty and plan.dropped == dropped
    got = list(plan.keep)
    for src, dst, n in plan.moves:
        got[dst] += n
        assert src != dst and n > 0
    sent = [sum(n for s, _, n in plan.moves if s == r) for r in range(len(avail))]
    assert [k + s + d for k, s, d in zip(plan.keep, sent, plan.dropped, strict=True)] == avail
    assert [g + e for g, e in zip(got, plan.empty, strict=True)] == [steps] * len(avail)
