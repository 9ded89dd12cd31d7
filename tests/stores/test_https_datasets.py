"""A dataset folder and single shards over ``http(s)://`` (issue 32): every reader and command that takes a
dataset URL reads one served by a plain web server, with the same bytes and splitting as a local copy."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import fastload
from fastload.testing.httpserve import WebServer

from .helpers import run_cli


def local_keys(www: Path) -> list[str]:
    return [s["__key__"] for s in fastload.ShardDataset(str(www / "ds"), decode=False)]


def test_shard_dataset_over_https_reads_what_a_local_copy_reads(www: Path, web: WebServer) -> None:
    url = web.url("ds/")
    got = list(fastload.ShardDataset(url, decode=False))
    want = list(fastload.ShardDataset(str(www / "ds"), decode=False))
    assert [s["__key__"] for s in got] == [s["__key__"] for s in want]
    assert all(a["bin"] == b["bin"] and a["cls"] == b["cls"] for a, b in zip(got, want, strict=True))
    assert fastload.s3_stats()["requests"] > 0


def test_dataloader_workers_and_ranks_read_each_sample_once(www: Path, web: WebServer) -> None:
    url = web.url("ds")
    seen: list[str] = []
    for rank in range(2):
        ds = fastload.ShardDataset(url, seed=3, rank=rank, world_size=2, batch_size=5)
        loader = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=2, collate_fn=list, timeout=60)
        seen += [s["__key__"] for batch in loader for s in batch]
    assert sorted(seen) == sorted(local_keys(www))


def test_map_dataset_over_https(www: Path, web: WebServer) -> None:
    ds = fastload.MapDataset(web.url("ds"))
    local = fastload.MapDataset(str(www / "ds"))
    assert len(ds) == len(local) == 120
    for i in (0, 57, 119, 23):
        assert ds[i]["__key__"] == local[i]["__key__"] and ds[i]["bin"] == local[i]["bin"]


def test_verify_inspect_cp_and_open_over_https(www: Path, web: WebServer, tmp_path: Path) -> None:
    url = web.url("ds")
    assert fastload.verify(url).problems == []
    run_cli("verify", url)
    out = run_cli("inspect", url).stdout
    assert "samples:  120" in out, out
    shard = web.url("ds/shard-000002.tar")
    out = run_cli("inspect", shard).stdout
    assert "shard-000002.tar" in out and "24" in out, out
    with fastload.open(shard) as f:
        assert f.read() == (www / "ds" / "shard-000002.tar").read_bytes()
    run_cli("cp", "-r", url, tmp_path / "copy")
    assert sorted(os.listdir(tmp_path / "copy")) == sorted(os.listdir(www / "ds"))
    run_cli("verify", tmp_path / "copy")
    run_cli("cp", shard, tmp_path)
    assert (tmp_path / "shard-000002.tar").read_bytes() == (www / "ds" / "shard-000002.tar").read_bytes()


def test_a_web_folder_without_index_says_to_give_shards_by_brace_pattern(web: WebServer) -> None:
    with pytest.raises(fastload.errors.FastloadError, match=r"brace pattern") as caught:
        fastload.ShardDataset(web.url("wds/"))
    assert "{000000..000099}" in str(caught.value)
    proc = run_cli("cp", "-r", web.url("wds"), "/tmp/never", check=1)
    assert "has no index.json" in proc.stderr and "Traceback" not in proc.stderr


def test_header_on_the_command_line_reaches_a_server_that_requires_it(www: Path, tmp_path: Path) -> None:
    """``--header "Authorization: Bearer T"`` (repeatable, as curl's ``-H``) goes with every request to the
    URL's host; without it the server's 401 is reported; a malformed one is refused without echoing it."""
    with WebServer(www, require={"Authorization": "Bearer s3cr3t", "X-Team": "vision"}) as server:
        url = server.url("ds")
        headers = ("--header", "Authorization: Bearer s3cr3t", "--header", "X-Team: vision")
        out = run_cli("inspect", url, *headers).stdout
        assert "120" in out and "s3cr3t" not in out
        run_cli("cp", "-r", url, tmp_path / "copy", *headers)
        run_cli("verify", tmp_path / "copy")
        denied = run_cli("inspect", url, "--header", "X-Team: vision", check=1)
        assert "401" in denied.stderr or "denied" in denied.stderr.lower(), denied.stderr
        bad = run_cli("inspect", url, "--header", "Bearer s3cr3t", check=2)
        assert "not 'Name: value'" in bad.stderr and "s3cr3t" not in bad.stderr, bad.stderr
        seen = [h for m, p, h in server.requests if p.startswith("/ds/") and h.get("Authorization")]
        assert seen and all(h["X-Team"] == "vision" for h in seen)
