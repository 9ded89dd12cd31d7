"""Helpers for the token tests: documents whose every token says where it came from, and a checker that
takes blocks apart again."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

STRIDE = 1_000_000  # token value = document * STRIDE + position in the document


def documents(lengths: Sequence[int], *, first: int = 0) -> list[np.ndarray]:
    """Document ``first + i`` of ``lengths[i]`` tokens; token ``p`` of document ``d`` is
    ``d * STRIDE + p``."""
    return [(first + d) * STRIDE + np.arange(n, dtype=np.int64) for d, n in enumerate(lengths)]


def pieces(block: dict[str, Any]) -> list[np.ndarray]:
    """The real segments of one block (the padding segment, if any, left out), in order."""
    ids = block["input_ids"].numpy()
    cu = block["cu_seqlens"].numpy()
    real = block["num_tokens"]
    return [ids[a:b] for a, b in itertools.pairwise(cu) if b <= real]


def check_block(
    block: dict[str, Any], *, seq_len: int, pad_id: int = 0, ignore_index: int = -100, doc_starts: bool = True
) -> None:
    """One block's layout agrees with its document boundaries."""
    ids, pos, labels = (block[k].numpy() for k in ("input_ids", "position_ids", "labels"))
    cu = block["cu_seqlens"].numpy()
    real = block["num_tokens"]
    assert ids.shape == pos.shape == labels.shape == (seq_len,)
    assert block["cu_seqlens"].dtype.is_floating_point is False and cu.dtype == np.int32
    assert cu[0] == 0 and cu[-1] == seq_len and (np.diff(cu) > 0).all()
    assert real in cu and 0 < real <= seq_len
    assert block["max_seqlen"] == int(np.diff(cu).max())
    for a, b in itertools.pairwise(cu):
        assert (pos[a:b] == np.arange(b - a)).all(), "positions restart at every segment"
        if b <= real:
            want = ids[a:b].copy()
            if doc_starts:
                want[0] = ignore_index
            assert (labels[a:b] == want).all()
    assert (ids[real:] == pad_id).all() and (labels[real:] == ignore_index).all()
    if "attention_mask" in block:
        mask = block["attention_mask"].numpy()
        seg = np.searchsorted(cu, np.arange(seq_len), side="right")
        assert (mask == (seg[:, None] == seg[None, :])).all()


def reassemble(blocks: Iterable[dict[str, Any]]) -> dict[int, list[np.ndarray]]:
    """Document -> its pieces in the order they were handed out; each piece is one document's run of
    consecutive tokens."""
    out: dict[int, list[np.ndarray]] = {}
    for block in blocks:
        for piece in pieces(block):
            doc = int(piece[0] // STRIDE)
            assert (piece // STRIDE == doc).all(), "a segment mixes two documents"
            out.setdefault(doc, []).append(piece)
    return out


def assert_exactly_once(docs: Sequence[np.ndarray], blocks: Sequence[dict[str, Any]], **check: Any) -> None:
    """Every token of every document exactly once across the blocks, in order within its document."""
    for block in blocks:
        check_block(block, **check)
    got = reassemble(blocks)
    want = {int(d[0] // STRIDE): d for d in docs if d.size}
    assert set(got) == set(want)
    for doc, parts in got.items():
        assert np.array_equal(np.concatenate(parts), want[doc]), f"document {doc} reassembles differently"


def same_blocks(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if set(x) != set(y):
            return False
        for key in x:
            u, v = x[key], y[key]
            if hasattr(u, "numpy"):
                if not np.array_equal(u.numpy(), v.numpy()) or u.dtype != v.dtype:
                    return False
            elif u != v:
                return False
    return True


def lognormal_lengths(n: int, *, seed: int = 0, median: int = 150, cap: int = 2000) -> list[int]:
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.lognormal(np.log(median), 0.9, n)), 1, cap).astype(int).tolist()


def moto_bucket(monkeypatch: Any, tmp_path: Any, moto_url: str, bucket: str) -> None:
    """Credentials for the moto server in this process's environment (nothing of the user's AWS set-up
    read), and an empty ``bucket`` there."""
    import boto3

    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {
        "AWS_ACCESS_KEY_ID": "AKIDTOKENS",
        "AWS_SECRET_ACCESS_KEY": "tokens-secret",
        "AWS_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(name, value)
    client = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1")
    client.create_bucket(Bucket=bucket)
    client.close()
