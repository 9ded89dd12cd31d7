"""``Mix(weigh_by="tokens")``: weights as shares of tokens over token datasets whose documents differ in
length (by samples, a source of long documents takes most tokens)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

import fastload
from fastload.errors import ConfigError

from .conftest import write_jsonl
from .helpers import documents


def token_share(mix: fastload.Mix, n: int) -> float:
    tokens = {"short": 0, "long": 0}
    for sample in itertools.islice(mix, n):
        tokens[sample["__source__"]] += len(sample["tokens.i32"])
    return tokens["long"] / sum(tokens.values())


def test_weights_by_tokens(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "short.jsonl", documents([10] * 300))
    write_jsonl(tmp_path / "long.jsonl", documents([100] * 60))
    for name in ("short", "long"):
        fastload.pack_tokens(tmp_path / f"{name}.jsonl", tmp_path / name)

    def mix(**kw: str) -> fastload.Mix:
        sources = {n: fastload.ShardDataset(tmp_path / n, seed=1) for n in ("short", "long")}
        return fastload.Mix(sources, {"short": 0.5, "long": 0.5}, stop="never", seed=3, **kw)

    assert token_share(mix(), 220) > 0.85, "by samples, long documents take most of the tokens"
    assert 0.45 < token_share(mix(weigh_by="tokens"), 220) < 0.55
    with pytest.raises(ConfigError, match=r"weigh_by='tokens': source 'x'.*fastload pack-tokens"):
        (tmp_path / "files").mkdir()
        (tmp_path / "files" / "a.txt").write_text("a")
        fastload.pack(tmp_path / "files", tmp_path / "files-ds")
        fastload.Mix({"x": fastload.ShardDataset(tmp_path / "files-ds")}, weigh_by="tokens")
    with pytest.raises(ConfigError, match="weigh_by='documents'"):
        mix(weigh_by="documents")
