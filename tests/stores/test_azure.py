"""``az://`` (issue 32) against Azurite (``AZURE_STORAGE_CONNECTION_STRING``): a dataset kept in a container
is read by every reader and read-side command with the same bytes as a local copy; Shared Key signing,
ranges, If-Match and faults through the proxy."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fastload
from fastload.errors import ConfigError, NotFoundError, ObjectChangedError
from fastload.testing.faultproxy import Fault as PFault
from fastload.testing.faultproxy import FaultProxy, Rule

from .helpers import run_cli

_CONTAINERS = itertools.count()


@pytest.fixture
def az(azurite: Any, www: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, str]]:
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    container = f"fl{os.getpid()}x{next(_CONTAINERS)}"
    azurite.make_container(container)
    for path in sorted((www / "ds").iterdir()):
        azurite.put(container, f"ds/{path.name}", path.read_bytes())
    yield azurite, container


def test_open_shard_and_map_datasets_read_what_a_local_copy_reads(www: Path, az: tuple[Any, str]) -> None:
    _, container = az
    want = (www / "ds" / "shard-000002.tar").read_bytes()
    with fastload.open(f"az://{container}/ds/shard-000002.tar", part_size_bytes=4096) as f:
        f.seek(1000)
        assert f.read(5000) == want[1000:6000]
        f.seek(0)
        assert f.read() == want
    got = list(fastload.ShardDataset(f"az://{container}/ds", decode=False))
    local = list(fastload.ShardDataset(str(www / "ds"), decode=False))
    assert [(s["__key__"], s["bin"]) for s in got] == [(s["__key__"], s["bin"]) for s in local]
    ds = fastload.MapDataset(f"az://{container}/ds")
    assert len(ds) == 120 and ds[57]["bin"] == fastload.MapDataset(str(www / "ds"))[57]["bin"]


def test_verify_inspect_ls_cp_to_local(www: Path, az: tuple[Any, str], tmp_path: Path) -> None:
    _, container = az
    url = f"az://{container}/ds"
    assert fastload.verify(url).problems == []
    assert "samples:  120" in run_cli("inspect", url).stdout
    assert sorted(run_cli("ls", url).stdout.split()) == sorted(os.listdir(www / "ds"))
    run_cli("cp", "-r", url, tmp_path / "copy")
    for name in os.listdir(www / "ds"):
        assert (tmp_path / "copy" / name).read_bytes() == (www / "ds" / name).read_bytes(), name


def test_a_blob_replaced_while_read_is_an_error_not_a_mix(azurite: Any, az: tuple[Any, str]) -> None:
    """Azure honours If-Match: the ETag of the first answer pins every later range."""
    _, container = az
    azurite.put(container, "pin/x.bin", b"a" * 60_000)
    with fastload.open(f"az://{container}/pin/x.bin", part_size_bytes=8192, max_concurrency=1) as f:
        assert f.read(8192) == b"a" * 8192
        azurite.put(container, "pin/x.bin", b"b" * 60_000)
        with pytest.raises(ObjectChangedError, match=r"pin/x\.bin"):
            f.read()


def test_faults_cost_retries_not_bytes(
    azurite: Any, az: tuple[Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, container = az
    data = os.urandom(150_000)
    azurite.put(container, "f/x.bin", data)
    with FaultProxy(("127.0.0.1", azurite.port), seed=32) as proxy:
        conn = azurite.connection_string_via(proxy.endpoint_url)
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", conn)
        proxy.add(Rule(PFault.slowdown(), method="GET", key="x.bin", times=2))
        proxy.add(Rule(PFault.reset_mid_body(after_bytes=1000), has_range=True, nth={3}))
        proxy.add(Rule(PFault.wrong_content_range(shift_bytes=7), has_range=True, nth={5}))
        with fastload.open(f"az://{container}/f/x.bin", part_size_bytes=16384, max_concurrency=2) as f:
            assert f.read() == data
        assert sum(fastload.s3_stats()["retries"].values()) >= 3


def test_missing_blob_and_configuration_errors(az: tuple[Any, str], monkeypatch: pytest.MonkeyPatch) -> None:
    _, container = az
    with pytest.raises(NotFoundError, match=f"az://{container}/nope.tar"):
        fastload.open(f"az://{container}/nope.tar").read(1)
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT", raising=False)
    with pytest.raises(ConfigError, match="AZURE_STORAGE_CONNECTION_STRING"):
        fastload.open(f"az://{container}/ds/shard-000001.tar")


def test_pack_cp_and_index_to_az(www: Path, az: tuple[Any, str], tmp_path: Path) -> None:
    """pack SRC az://..., cp -r FOLDER az://..., index az://...: what is read back is what was written."""
    _, container = az
    src = tmp_path / "src"
    for i in range(40):
        (src / f"d{i % 2}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 2}" / f"{i:03d}.bin").write_bytes(os.urandom(100 + i * 37))
    fastload.pack(str(src), str(tmp_path / "local"), max_samples=16)
    run_cli("pack", src, f"az://{container}/packed", "--max-samples", "16")
    assert fastload.verify(f"az://{container}/packed").problems == []
    for name in os.listdir(tmp_path / "local"):
        if name.endswith(".tar"):
            with fastload.open(f"az://{container}/packed/{name}") as f:
                assert f.read() == (tmp_path / "local" / name).read_bytes(), name
    run_cli("cp", "-r", www / "ds", f"az://{container}/up/ds")
    assert fastload.verify(f"az://{container}/up/ds").problems == []
    for name in os.listdir(www / "ds"):
        if name.endswith(".tar"):
            run_cli("cp", www / "ds" / name, f"az://{container}/wds/")
    run_cli("index", f"az://{container}/wds")
    keys = sorted(s["__key__"] for s in fastload.ShardDataset(f"az://{container}/wds", decode=False))
    assert keys == sorted(s["__key__"] for s in fastload.ShardDataset(str(www / "ds"), decode=False))


def test_account_is_read_from_the_environment_as_azure_clients_read_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fastload.s3.azstore import azure_account

    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "UseDevelopmentStorage=true")
    dev = azure_account()
    assert (dev.name, dev.endpoint) == ("devstoreaccount1", "http://127.0.0.1:10000/devstoreaccount1")
    monkeypatch.setenv(
        "AZURE_STORAGE_CONNECTION_STRING",
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=c2VjcmV0;EndpointSuffix=core.windows.net",
    )
    acct = azure_account()
    assert acct.endpoint == "https://acct.blob.core.windows.net" and acct.key == b"secret"
    assert "secret" not in repr(acct) and "c2VjcmV0" not in repr(acct)
    signed = acct.sign("GET", acct.url("c", "a b/x.tar"), {"Range": "bytes=0-9"})
    assert signed["Authorization"].startswith("SharedKey acct:") and "x-ms-date" in signed
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", "pub")
    monkeypatch.setenv("AZURE_STORAGE_SAS_TOKEN", "?sv=2021&sig=abc")
    sas = azure_account()
    assert (
        sas.key is None
        and sas.with_sas(sas.url("c", "x")) == "https://pub.blob.core.windows.net/c/x?sv=2021&sig=abc"
    )
    assert "Authorization" not in sas.sign("GET", "https://pub.blob.core.windows.net/c/x", {})
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", "acct")
    monkeypatch.delenv("AZURE_STORAGE_SAS_TOKEN")
    monkeypatch.setenv("AZURE_STORAGE_KEY", "not base64!")
    with pytest.raises(ConfigError, match="not base64"):
        azure_account()


def test_writes_retry_503s_and_resets_and_a_refusal_fails_at_once_naming_the_blob(
    www: Path, azurite: Any, az: tuple[Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Put Blob, a blob's size and Delete Blob go through ``s3.httpcall``: 503s and a reset cost retries,
    not files; a 403 (a wrong key) is raised on the first answer, naming the ``az://`` URL."""
    from fastload.errors import AccessDeniedError
    from fastload.s3 import azwrite

    _, container = az
    with FaultProxy(("127.0.0.1", azurite.port), seed=32) as proxy:
        conn = azurite.connection_string_via(proxy.endpoint_url)
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", conn)
        proxy.add(Rule(PFault.slowdown(), method="PUT", times=2))
        proxy.add(Rule(PFault.reset_before_response(), method="PUT", nth={4}))
        fastload.copy(str(www / "ds"), f"az://{container}/w", recursive=True, jobs=2)
        assert proxy.stats().injected["slowdown"] == 2
        config = fastload.S3Config()
        size = (www / "ds" / "index.json").stat().st_size
        assert azwrite.blob_size(container, "w/index.json", config) == size
        assert azwrite.blob_size(container, "w/nope", config) is None
        azwrite.delete(container, "w/index.json", config)
        azwrite.delete(container, "w/index.json", config)  # (gone already: nothing happens)
        assert azwrite.blob_size(container, "w/index.json", config) is None
        requests = len(proxy.requests())
        wrong_key = conn.replace("AccountKey=Eby8", "AccountKey=Xby8")
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", wrong_key)
        with pytest.raises(AccessDeniedError, match=f"az://{container}/w/x.bin"):
            azwrite.upload(b"x", container, "w/x.bin", config)
        assert len(proxy.requests()) == requests + 1
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    for name in os.listdir(www / "ds"):
        if name != "index.json":
            with fastload.open(f"az://{container}/w/{name}") as f:
                assert f.read() == (www / "ds" / name).read_bytes(), name
