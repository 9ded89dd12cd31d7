"""``fastload cp`` between stores of different kinds (``fastload.storecopy``): s3:// (moto), gs:// (the GCS
emulator), az:// (Azurite) to one another, each object streamed from the source's ranged reader into the
destination's upload and checked (the MD5 the store reports, or its size); nothing is written locally."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

import fastload
from fastload.errors import ConfigError, S3Error
from fastload.testing.faultproxy import Fault as PFault
from fastload.testing.faultproxy import FaultProxy, Rule

from .helpers import run_cli

_NAMES = itertools.count()


@dataclass
class Clouds:
    s3: str  # s3://BUCKET
    gs: str  # gs://BUCKET
    az: str  # az://CONTAINER


@pytest.fixture
def clouds(
    moto_url: str, gcs_emulator: Any, azurite: Any, www: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Clouds]:
    """An empty S3 bucket, a GCS bucket holding ``ds/`` (the packed dataset), an empty Azure container;
    the environment names all three (as a subprocess of ``run_cli`` sees it too)."""
    name = f"cp{os.getpid()}x{next(_NAMES)}"  # (not the names test_azure and test_gcs make)
    for key, value in {
        "AWS_ACCESS_KEY_ID": "copy",
        "AWS_SECRET_ACCESS_KEY": "copy-secret",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": moto_url,
        "FASTLOAD_S3_ADDRESSING_STYLE": "path",
        "STORAGE_EMULATOR_HOST": gcs_emulator.host,
        "AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string,
    }.items():
        monkeypatch.setenv(key, value)
    boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1").create_bucket(Bucket=name)
    gcs_emulator.make_bucket(name)
    azurite.make_container(name)
    for path in sorted((www / "ds").iterdir()):
        gcs_emulator.put(name, f"ds/{path.name}", path.read_bytes())
    yield Clouds(f"s3://{name}", f"gs://{name}", f"az://{name}")


def _same_files(www: Path, url: str) -> None:
    for name in sorted(os.listdir(www / "ds")):
        with fastload.open(f"{url}/{name}") as f:
            assert f.read() == (www / "ds" / name).read_bytes(), f"{url}/{name}"


def test_a_dataset_goes_gs_to_s3_to_az_to_gs_with_its_bytes(
    www: Path, clouds: Clouds, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    proc = run_cli("cp", "-r", f"{clouds.gs}/ds", f"{clouds.s3}/ds")
    assert f"{len(os.listdir(www / 'ds'))} file(s)" in proc.stdout + proc.stderr
    _same_files(www, f"{clouds.s3}/ds")
    report = fastload.copy(f"{clouds.s3}/ds", f"{clouds.az}/ds", recursive=True, jobs=3)
    assert report.copied[-1] == f"{clouds.az}/ds/index.json" and report.files == len(os.listdir(www / "ds"))
    _same_files(www, f"{clouds.az}/ds")
    fastload.copy(f"{clouds.az}/ds/", f"{clouds.gs}/back", jobs=2)
    fastload.copy(f"{clouds.gs}/ds/shard-000001.tar", f"{clouds.gs}/one/")  # into a folder, same store
    assert fastload.verify(f"{clouds.gs}/back").problems == []
    _same_files(www, f"{clouds.gs}/back")
    with fastload.open(f"{clouds.gs}/one/shard-000001.tar") as f:
        assert f.read() == (www / "ds" / "shard-000001.tar").read_bytes()
    assert os.listdir(tmp_path) == []  # (gs:// to s3:// was once a download to a folder named "s3:")


def test_a_web_dataset_is_copied_by_its_index_to_s3(www: Path, clouds: Clouds, web: Any) -> None:
    """A web server cannot be listed: the dataset's index.json names what to copy."""
    report = fastload.copy(web.url("ds"), f"{clouds.s3}/web", recursive=True)
    assert report.copied[-1] == f"{clouds.s3}/web/index.json"
    _same_files(www, f"{clouds.s3}/web")


def test_a_brace_pattern_of_web_shards_is_copied_to_s3(www: Path, clouds: Clouds, web: Any) -> None:
    """Index-less shards named by a pattern: each one, under the destination as under their folder."""
    report = fastload.copy(web.url("wds/shard-{000001..000002}.tar"), f"{clouds.s3}/wds/")
    names = ["shard-000001.tar", "shard-000002.tar"]
    assert report.copied == [f"{clouds.s3}/wds/{n}" for n in names]
    for name in names:
        with fastload.open(f"{clouds.s3}/wds/{name}") as f:
            assert f.read() == (www / "wds" / name).read_bytes()


def test_an_upload_retried_streams_the_source_again_and_index_json_goes_last(
    www: Path, clouds: Clouds, azurite: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FaultProxy(("127.0.0.1", azurite.port), seed=32) as proxy:
        conn = azurite.connection_string_via(proxy.endpoint_url)
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", conn)
        proxy.add(Rule(PFault.slowdown(), method="PUT", times=1))
        proxy.add(Rule(PFault.reset_before_response(), method="PUT", nth={3}))
        fastload.copy(f"{clouds.gs}/ds", f"{clouds.az}/ds", recursive=True, jobs=1)
        puts = [r.target for r in proxy.requests() if r.method == "PUT" and r.status == 201]
        assert proxy.stats().injected["slowdown"] == 1
    assert len(puts) == len(os.listdir(www / "ds")) and puts[-1].endswith("/ds/index.json"), puts
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    _same_files(www, f"{clouds.az}/ds")


def test_a_store_holding_other_bytes_than_sent_fails_the_copy_and_deletes_it(
    www: Path, clouds: Clouds, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastload.s3 import azwrite

    real = azwrite.upload

    def misreported(*args: Any) -> str | None:
        real(*args)
        return "AAAAAAAAAAAAAAAAAAAAAA=="  # as if the store had kept other bytes

    monkeypatch.setattr(azwrite, "upload", misreported)
    url = f"{clouds.az}/x/shard-000001.tar"
    with pytest.raises(S3Error, match=f"copying {clouds.gs}/ds/shard-000001.tar to {url}.*run the command"):
        fastload.copy(f"{clouds.gs}/ds/shard-000001.tar", url)
    assert azwrite.blob_size(clouds.az[len("az://") :], "x/shard-000001.tar", fastload.S3Config()) is None
    with pytest.raises(ConfigError, match="--dry-run"):
        fastload.copy(f"{clouds.gs}/ds", f"{clouds.s3}/ds", recursive=True, dry_run=True)


def test_s3serve_answers_gcs_and_azure_reads_of_its_files(www: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The benchmark origin (``fastload.testing.storedialects``): one s3serve read as gs:// and az://, with
    listings, the generation pinned and If-Match honoured, gives the bytes a local read gives."""
    from fastload.s3.azstore import _DEV_ACCOUNT, _DEV_KEY
    from fastload.testing.s3serve import S3Server

    with S3Server(str(www), bucket="bench") as server:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", server.endpoint_url)
        endpoint = f"{server.endpoint_url}/{_DEV_ACCOUNT}"
        conn = f"AccountName={_DEV_ACCOUNT};AccountKey={_DEV_KEY};BlobEndpoint={endpoint};"
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", conn)
        local = [(s["__key__"], s["bin"]) for s in fastload.ShardDataset(str(www / "ds"), decode=False)]
        for url in ("gs://bench/ds", "az://bench/ds"):
            got = [(s["__key__"], s["bin"]) for s in fastload.ShardDataset(url, decode=False)]
            assert got == local, url
        want = fastload.MapDataset(str(www / "ds"))[57]["bin"]
        assert fastload.MapDataset("az://bench/ds")[57]["bin"] == want
        _same_files(www, "gs://bench/ds")
