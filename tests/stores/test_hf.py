"""``hf://datasets/ORG/NAME[@REVISION]/PATH`` (issue 32): resolved to the Hub's ``/resolve/`` URLs at
``HF_ENDPOINT`` (here a local server with the Hub's two routes), ``HF_TOKEN`` sent to the Hub and never to
its CDN, folders listed by the Hub's tree API."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

import fastload
from fastload.core.weburls import parse_hf_url
from fastload.errors import AccessDeniedError, ConfigError, NotFoundError
from fastload.testing.httpserve import WebServer

from .helpers import run_cli

TOKEN = "hf_secret_token_never_shown"


@pytest.fixture
def hub(www: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[WebServer]:
    """The Hub over ``www``'s parent: repository ``www/ds`` is the packed dataset, ``www/wds`` its bare
    shards; every request to the Hub needs the token (the CDN refuses one)."""
    with WebServer(www.parent, hub=True, page_size=3, require={"Authorization": f"Bearer {TOKEN}"}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint_url)
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        yield server


def test_hf_urls_map_to_the_hubs_routes() -> None:
    hub = parse_hf_url("hf://datasets/org/name@refs/convert/parquet/data/x.tar")
    assert (hub.repo, hub.revision, hub.path) == ("org/name", "refs", "convert/parquet/data/x.tar")
    hub = parse_hf_url("hf://datasets/org/name@v1.0/data/train-{0..3}.tar")
    assert hub.resolve_url("https://huggingface.co/") == (
        "https://huggingface.co/datasets/org/name/resolve/v1.0/data/train-%7B0..3%7D.tar"
    )
    assert parse_hf_url("hf://datasets/org/name").tree_url("http://h") == (
        "http://h/api/datasets/org/name/tree/main?recursive=true"
    )
    with pytest.raises(ConfigError, match="hf://datasets/ORG/NAME/PATH"):
        parse_hf_url("hf://org/name/x")


def test_a_dataset_on_the_hub_is_read_with_the_token_kept_from_the_cdn(www: Path, hub: WebServer) -> None:
    got = [s["__key__"] for s in fastload.ShardDataset("hf://datasets/www/ds@v1.0")]
    assert got == [s["__key__"] for s in fastload.ShardDataset(str(www / "ds"))]
    assert fastload.MapDataset("hf://datasets/www/ds")[5]["__key__"] == got[5]
    cdn = [h for _, path, h in hub.requests if path.startswith("/cdn/")]
    resolve = [h for _, path, h in hub.requests if path.startswith("/datasets/")]
    assert cdn and resolve and "v1.0" in hub.revisions
    assert all("Authorization" not in h for h in cdn)
    assert all(h.get("Authorization") == f"Bearer {TOKEN}" for h in resolve)
    # the CDN's URL is kept for an object's later ranges: the first range resolves, the others do not
    before = len(hub.requests)
    with fastload.open("hf://datasets/www/ds/shard-000001.tar", part_size_bytes=16 << 10) as f:
        assert f.read() == (www / "ds" / "shard-000001.tar").read_bytes()
    paths = [path for _, path, _ in hub.requests[before:]]
    assert sum(p.startswith("/datasets/") for p in paths) == 1
    assert sum(p.startswith("/cdn/") for p in paths) == -(
        -(www / "ds" / "shard-000001.tar").stat().st_size // (16 << 10)
    )


def test_hub_folders_without_an_index_are_listed_by_the_tree_api(www: Path, hub: WebServer) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        listed = fastload.ShardDataset("hf://datasets/www/wds")
        braced = fastload.ShardDataset("hf://datasets/www/wds/shard-{000000..000004}.tar")
    want = sorted(s["__key__"] for s in fastload.ShardDataset(str(www / "ds")))
    assert sorted(s["__key__"] for s in listed) == want == sorted(s["__key__"] for s in braced)
    assert sum(path.startswith("/api/") for _, path, _ in hub.requests) == 2  # 5 files, 3 a page
    out = run_cli("ls", "hf://datasets/www/wds").stdout.split()
    assert out == [f"shard-{i:06d}.tar" for i in range(5)]


def test_hub_errors_say_what_to_check_and_never_show_the_token(
    hub: WebServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(NotFoundError, match="HF_TOKEN") as missing:
        fastload.open("hf://datasets/www/ds/nope.tar").read()
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(AccessDeniedError, match="set HF_TOKEN") as denied:
        fastload.open("hf://datasets/www/ds/shard-000000.tar").read()
    for exc in (missing.value, denied.value):
        assert TOKEN not in str(exc) and "hf_wrong" not in str(exc)
    proc = run_cli("inspect", "hf://datasets/www/ds", check=1, HF_TOKEN="hf_wrong")
    assert "access denied" in proc.stderr and "hf_wrong" not in proc.stderr + proc.stdout
    proc = run_cli("cp", "-r", "hf://datasets/www/ds", tmp_path / "copy", HF_TOKEN=TOKEN)
    run_cli("verify", tmp_path / "copy")
