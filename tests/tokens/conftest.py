"""Fixtures for the token tests: a small token dataset written by ``pack_tokens`` (several shards and row
groups), made once per session from documents whose tokens say where they came from."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import fastload

from .helpers import documents, lognormal_lengths


@dataclass(frozen=True)
class TokenDataset:
    root: Path
    docs: list[np.ndarray]  # in the order they were written; document d has tokens d * STRIDE + p


def write_jsonl(path: Path, docs: list[np.ndarray], *, column: str = "input_ids") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for d in docs:
            f.write(json.dumps({column: d.tolist()}) + "\n")


@pytest.fixture(scope="session")
def token_dataset(tmp_path_factory: pytest.TempPathFactory) -> TokenDataset:
    """240 documents (log-normal lengths, median 60, up to 400 tokens) in two JSONL files, packed into
    int32 token shards of at most 16 KiB with 4 KiB row groups."""
    base = tmp_path_factory.mktemp("tokens")
    docs = documents(lognormal_lengths(240, seed=3, median=60, cap=400))
    write_jsonl(base / "src" / "a.jsonl", docs[:130])
    write_jsonl(base / "src" / "b.jsonl", docs[130:])
    fastload.pack_tokens(base / "src", base / "ds", shard_size_bytes=16 << 10, row_group_bytes=4 << 10)
    return TokenDataset(base / "ds", docs)
