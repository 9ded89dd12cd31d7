"""Index-less WebDataset tars over ``http(s)://`` given as a brace pattern, as webdataset's and the Hub's
users give them (issue 32): indexed in memory once, then split exactly once across ranks and workers as an
indexed dataset is."""

from __future__ import annotations

import faulthandler
import warnings
from pathlib import Path

import pytest
import torch

import fastload
from fastload.core.weburls import expand_braces
from fastload.errors import ConfigError, NotFoundError
from fastload.testing.httpserve import WebServer

from .helpers import run_cli

PATTERN = "wds/shard-{000000..000004}.tar"


def test_brace_expansion_follows_braceexpand() -> None:
    assert expand_braces("s-{000..002}.tar") == ["s-000.tar", "s-001.tar", "s-002.tar"]
    assert expand_braces("{a,b}/{8..10}") == ["a/8", "a/9", "a/10", "b/8", "b/9", "b/10"]
    assert expand_braces("x{0..6..3}") == ["x0", "x3", "x6"]
    assert expand_braces("no-braces.tar") == ["no-braces.tar"]
    with pytest.raises(ConfigError, match="not a brace pattern"):
        expand_braces("s-{abc}.tar")
    with pytest.raises(ConfigError, match="expands to over"):
        expand_braces("{0..999999}{0..9}")


def test_brace_urls_are_read_exactly_once_across_ranks_and_workers(www: Path, web: WebServer) -> None:
    local = [s["__key__"] for s in fastload.ShardDataset(str(www / "ds"))]
    seen: list[str] = []
    for rank in range(2):
        with pytest.warns(UserWarning, match="A web server holds no index"):
            ds = fastload.ShardDataset(web.url(PATTERN), seed=1, rank=rank, world_size=2, batch_size=4)
        assert len(ds.view.index.shards) == 5
        loader = torch.utils.data.DataLoader(
            ds, batch_size=4, num_workers=2, collate_fn=list, timeout=60, worker_init_fn=_dump_if_stuck
        )
        seen += [s["__key__"] for batch in loader for s in batch]
    assert sorted(seen) == sorted(local)


def _dump_if_stuck(worker_id: int) -> None:
    """A worker that makes no progress for 50 s prints its threads' stacks (one CI run timed out here
    once; the stacks say where, should it happen again)."""
    faulthandler.dump_traceback_later(50, exit=False)


def test_brace_urls_give_the_same_samples_as_the_packed_dataset(www: Path, web: WebServer) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        got = list(fastload.ShardDataset(web.url(PATTERN), decode=False))
        mapped = fastload.MapDataset(web.url(PATTERN), decode=False)
    want = list(fastload.ShardDataset(str(www / "ds"), decode=False))
    assert [(s["__key__"], s["bin"]) for s in got] == [(s["__key__"], s["bin"]) for s in want]
    assert len(mapped) == 120 and mapped[77]["bin"] == want[77]["bin"]


def test_a_missing_shard_of_a_pattern_is_named(web: WebServer) -> None:
    with pytest.raises(NotFoundError, match=r"shard-000005\.tar"):
        fastload.ShardDataset(web.url("wds/shard-{000003..000005}.tar"))


def test_commands_take_a_brace_pattern(www: Path, web: WebServer, tmp_path: Path) -> None:
    """``ls`` (each shard's size), ``inspect`` (and ``--shard``), ``verify`` (every shard parsed end to end)
    and ``cp`` (each shard into a folder) of a pattern, as ShardDataset reads one."""
    pattern = web.url("wds/shard-{000001..000003}.tar")
    shards = [f"shard-{i:06d}.tar" for i in (1, 2, 3)]
    listed = run_cli("ls", pattern).stdout.splitlines()
    sizes = [(www / "wds" / name).stat().st_size for name in shards]
    want = [[str(n), name] for n, name in zip(sizes, shards, strict=True)]
    assert [line.split() for line in listed] == want
    described = run_cli("inspect", pattern)
    assert "72" in described.stdout and "no index.json" in described.stderr, described
    one = run_cli("inspect", pattern, "--shard", "1").stdout
    assert "shard-000002.tar" in one
    checked = run_cli("verify", pattern).stdout
    assert "read 3 shard(s) whole" in checked and "72 samples" in checked, checked
    run_cli("cp", pattern, tmp_path / "got")
    assert sorted(p.name for p in (tmp_path / "got").iterdir()) == shards
    assert all((tmp_path / "got" / n).read_bytes() == (www / "wds" / n).read_bytes() for n in shards)
    missing = run_cli("verify", web.url("wds/shard-{000004..000005}.tar"), check=1)
    assert "shard-000005.tar" in missing.stderr, missing.stderr
