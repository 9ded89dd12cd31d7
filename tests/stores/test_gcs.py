"""``gs://`` (issue 32) against a GCS emulator (``gcp-storage-emulator``, ``STORAGE_EMULATOR_HOST``): every
reader and command that takes a dataset URL reads one kept in a bucket, with the same bytes as a local copy;
the range contract and the generation pin hold."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import fastload
from fastload.errors import ConfigError, NotFoundError
from fastload.s3.gcsstore import gcs_endpoint
from fastload.testing.faultproxy import Fault as PFault
from fastload.testing.faultproxy import FaultProxy, Rule

from .helpers import run_cli

_BUCKETS = itertools.count()


@pytest.fixture
def gcs(gcs_emulator: Any, www: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, str]]:
    """A fresh bucket holding ``ds/`` (the packed dataset) and ``wds/`` (its shards, no index); the
    emulator named by ``STORAGE_EMULATOR_HOST``."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.host)
    bucket = f"fl-{os.getpid()}-{next(_BUCKETS)}"
    gcs_emulator.make_bucket(bucket)
    for path in sorted((www / "ds").iterdir()):
        gcs_emulator.put(bucket, f"ds/{path.name}", path.read_bytes())
    for path in sorted((www / "wds").iterdir()):
        gcs_emulator.put(bucket, f"wds/{path.name}", path.read_bytes())
    yield gcs_emulator, bucket


def test_endpoint_follows_storage_emulator_host_as_google_clients_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    assert gcs_endpoint() == "https://storage.googleapis.com"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "localhost:9023")
    assert gcs_endpoint() == "http://localhost:9023"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "https://gcs.internal:443/")
    assert gcs_endpoint() == "https://gcs.internal:443"


def test_open_reads_exact_ranges_of_an_object(www: Path, gcs: tuple[Any, str]) -> None:
    _, bucket = gcs
    want = (www / "ds" / "shard-000002.tar").read_bytes()
    with fastload.open(f"gs://{bucket}/ds/shard-000002.tar", part_size_bytes=4096) as f:
        assert f.size == len(want)
        f.seek(1000)
        assert f.read(5000) == want[1000:6000]
        f.seek(0)
        assert f.read() == want
    assert fastload.s3_stats()["requests"] > 1


def test_shard_and_map_datasets_read_what_a_local_copy_reads(www: Path, gcs: tuple[Any, str]) -> None:
    _, bucket = gcs
    got = list(fastload.ShardDataset(f"gs://{bucket}/ds/", decode=False))
    want = list(fastload.ShardDataset(str(www / "ds"), decode=False))
    assert [s["__key__"] for s in got] == [s["__key__"] for s in want]
    assert all(a["bin"] == b["bin"] and a["cls"] == b["cls"] for a, b in zip(got, want, strict=True))
    ds, local = fastload.MapDataset(f"gs://{bucket}/ds"), fastload.MapDataset(str(www / "ds"))
    assert len(ds) == len(local) == 120
    for i in (0, 57, 119, 23):
        assert ds[i]["__key__"] == local[i]["__key__"] and ds[i]["bin"] == local[i]["bin"]


def test_dataloader_workers_read_each_sample_once(www: Path, gcs: tuple[Any, str]) -> None:
    _, bucket = gcs
    ds = fastload.ShardDataset(f"gs://{bucket}/ds", seed=3, batch_size=5)
    loader = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=2, collate_fn=list, timeout=60)
    seen = [s["__key__"] for batch in loader for s in batch]
    assert sorted(seen) == sorted(s["__key__"] for s in fastload.ShardDataset(str(www / "ds"), decode=False))


def test_a_folder_without_index_is_listed_and_indexed_in_memory(www: Path, gcs: tuple[Any, str]) -> None:
    _, bucket = gcs
    with pytest.warns(UserWarning, match="no index.json"):
        ds = fastload.ShardDataset(f"gs://{bucket}/wds", decode=False)
    assert sorted(s["__key__"] for s in ds) == sorted(
        s["__key__"] for s in fastload.ShardDataset(str(www / "ds"), decode=False)
    )


def test_verify_inspect_ls_and_cp_to_local(www: Path, gcs: tuple[Any, str], tmp_path: Path) -> None:
    _, bucket = gcs
    url = f"gs://{bucket}/ds"
    assert fastload.verify(url).problems == []
    run_cli("verify", url)
    assert "samples:  120" in run_cli("inspect", url).stdout
    listed = run_cli("ls", url).stdout.split()
    assert sorted(listed) == sorted(os.listdir(www / "ds")), listed
    run_cli("cp", "-r", url, tmp_path / "copy")
    assert sorted(os.listdir(tmp_path / "copy")) == sorted(os.listdir(www / "ds"))
    for name in os.listdir(www / "ds"):
        assert (tmp_path / "copy" / name).read_bytes() == (www / "ds" / name).read_bytes(), name
    run_cli("cp", f"{url}/shard-000001.tar", tmp_path)
    assert (tmp_path / "shard-000001.tar").read_bytes() == (www / "ds" / "shard-000001.tar").read_bytes()


def test_a_missing_object_names_it(gcs: tuple[Any, str]) -> None:
    _, bucket = gcs
    with pytest.raises(NotFoundError, match=f"gs://{bucket}/ds/nope.tar"):
        fastload.open(f"gs://{bucket}/ds/nope.tar").read(1)
    with pytest.raises(ConfigError, match="names a folder"):
        fastload.open(f"gs://{bucket}/ds/")


def test_faults_through_the_proxy_cost_retries_not_bytes_and_requests_pin_the_generation(
    gcs_emulator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """503s, a reset mid-body, a shifted Content-Range and a 200 ignoring Range, injected by the fault proxy
    in front of the emulator: the bytes come back exact, with retries counted. After the first answer every
    request carries ``ifGenerationMatch`` with the object's generation (GCS's If-Match)."""
    bucket = f"fl-{os.getpid()}-{next(_BUCKETS)}"
    gcs_emulator.make_bucket(bucket)
    data = os.urandom(200_000)
    meta = gcs_emulator.put(bucket, "f/x.bin", data)
    with FaultProxy(("127.0.0.1", gcs_emulator.port), seed=32) as proxy:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.endpoint_url)
        proxy.add(Rule(PFault.slowdown(), method="GET", key="x.bin", times=2))
        proxy.add(Rule(PFault.reset_mid_body(after_bytes=1000), has_range=True, nth={3}))
        proxy.add(Rule(PFault.wrong_content_range(shift_bytes=7), has_range=True, nth={5}))
        with fastload.open(f"gs://{bucket}/f/x.bin", part_size_bytes=16384, max_concurrency=2) as f:
            assert f.size == len(data)
            assert f.read() == data
        assert sum(fastload.s3_stats()["retries"].values()) >= 3, fastload.s3_stats()["retries"]
        targets = [r.target for r in proxy.requests()]
        pinned = [t for t in targets[1:] if "alt=media" in t]
        assert pinned and all(f"ifGenerationMatch={meta['generation']}" in t for t in pinned), targets
        proxy.clear()
        proxy.add(Rule(PFault.ignore_range(), method="GET", key="x.bin"))
        with fastload.open(f"gs://{bucket}/f/x.bin", part_size_bytes=16384) as f:
            f.seek(150_000)
            assert f.read(1000) == data[150_000:151_000]


def test_gs_hints_and_gcs_scheme() -> None:
    with pytest.raises(ConfigError, match="write gs://bucket"):
        fastload.open("gcs://b/x.tar")


def test_pack_to_gs_writes_a_dataset_read_back_whole(
    www: Path, gcs_emulator: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``fastload pack SRC gs://...``: shards uploaded, index.json last; what is read back (the index, every
    shard's bytes, verify) is what a local pack writes."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.host)
    bucket = f"fl-{os.getpid()}-{next(_BUCKETS)}"
    gcs_emulator.make_bucket(bucket)
    src = tmp_path / "src"
    for i in range(40):
        (src / f"d{i % 2}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 2}" / f"{i:03d}.bin").write_bytes(os.urandom(100 + i * 37))
    fastload.pack(str(src), str(tmp_path / "local"), max_samples=16)
    run_cli("pack", src, f"gs://{bucket}/packed", "--max-samples", "16")
    url = f"gs://{bucket}/packed"
    assert fastload.verify(url).problems == []
    for name in os.listdir(tmp_path / "local"):
        if name.endswith(".tar"):
            with fastload.open(f"{url}/{name}") as f:
                assert f.read() == (tmp_path / "local" / name).read_bytes(), name
    got = sorted((s["__key__"], s["bin"]) for s in fastload.ShardDataset(url, decode=False))
    want = sorted(
        (s["__key__"], s["bin"]) for s in fastload.ShardDataset(str(tmp_path / "local"), decode=False)
    )
    assert got == want


def test_shardwriter_into_gs_and_its_append(
    gcs_emulator: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``ShardWriter("gs://...")`` writes there (its URL was taken for a local path: a folder ``gs:``), and
    ``mode="append"`` adds a version there (tests/stores/test_store_append.py: the conditional publish)."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.host)
    monkeypatch.chdir(tmp_path)
    bucket = f"fl-{os.getpid()}-{next(_BUCKETS)}"
    gcs_emulator.make_bucket(bucket)
    url = f"gs://{bucket}/written"
    with fastload.ShardWriter(url, max_samples_per_shard=2) as w:
        for i in range(5):
            w.write({"__key__": f"{i:04d}", "txt": f"t{i}"})
    assert "index.json" in run_cli("ls", url).stdout
    with fastload.ShardWriter(url, mode="append", max_samples_per_shard=2) as w:
        w.write({"__key__": "0005", "txt": "t5"})
    got = {s["__key__"]: s["txt"] for s in fastload.ShardDataset(url, decode=False)}
    assert got == {f"{i:04d}": f"t{i}".encode() for i in range(6)}
    assert fastload.ShardDataset(url, decode=False).view.version == 2
    assert not (tmp_path / "gs:").exists()


def test_cp_local_to_gs_and_back(
    www: Path, gcs_emulator: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``fastload cp -r FOLDER gs://...`` uploads every file (index.json after the shards); one file to a
    folder URL keeps its name; the copy reads back byte for byte."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.host)
    bucket = f"fl-{os.getpid()}-{next(_BUCKETS)}"
    gcs_emulator.make_bucket(bucket)
    run_cli("cp", "-r", www / "ds", f"gs://{bucket}/up/ds")
    assert sorted(run_cli("ls", f"gs://{bucket}/up/ds").stdout.split()) == sorted(os.listdir(www / "ds"))
    assert fastload.verify(f"gs://{bucket}/up/ds").problems == []
    report = fastload.copy(str(www / "ds" / "shard-000003.tar"), f"gs://{bucket}/one/")
    assert report.copied == [f"gs://{bucket}/one/shard-000003.tar"]
    with fastload.open(f"gs://{bucket}/one/shard-000003.tar") as f:
        assert f.read() == (www / "ds" / "shard-000003.tar").read_bytes()
    with pytest.raises(ConfigError, match="with -r"):
        fastload.copy(str(www / "ds"), f"gs://{bucket}/x")


def test_uploads_retry_503s_and_resets_and_send_the_index_last(
    www: Path, gcs_emulator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = f"fl-{os.getpid()}-{next(_BUCKETS)}"
    gcs_emulator.make_bucket(bucket)
    with FaultProxy(("127.0.0.1", gcs_emulator.port), seed=32) as proxy:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.endpoint_url)
        proxy.add(Rule(PFault.slowdown(), method="POST", times=2))
        proxy.add(Rule(PFault.reset_before_response(), method="POST", nth={4}))
        fastload.copy(str(www / "ds"), f"gs://{bucket}/ds", recursive=True, jobs=2)
        posts = [r.target for r in proxy.requests() if r.method == "POST" and r.status == 200]
        assert len(posts) == len(os.listdir(www / "ds")), posts
        assert "index.json" in posts[-1] and all("index.json" not in t for t in posts[:-1]), posts
        assert proxy.stats().injected["slowdown"] == 2
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.host)
    for name in os.listdir(www / "ds"):
        with fastload.open(f"gs://{bucket}/ds/{name}") as f:
            assert f.read() == (www / "ds" / name).read_bytes(), name


def test_cp_from_a_gs_url_to_another_is_copied_in_gcs_not_written_locally(
    www: Path, gcs: tuple[Any, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gs:// to gs:// was once taken as a download to a local folder named "gs:"; it is GCS's own copy
    (``rewriteTo``); to s3:// and az://: ``test_store_copy.py``."""
    _, bucket = gcs
    monkeypatch.chdir(tmp_path)
    run_cli("cp", f"gs://{bucket}/ds/shard-000001.tar", f"gs://{bucket}/copy/")
    with fastload.open(f"gs://{bucket}/copy/shard-000001.tar") as f:
        assert f.read() == (www / "ds" / "shard-000001.tar").read_bytes()
    assert os.listdir(tmp_path) == []


def test_index_writes_index_json_into_a_gs_folder(www: Path, gcs: tuple[Any, str]) -> None:
    _, bucket = gcs
    run_cli("index", f"gs://{bucket}/wds")
    ds = fastload.ShardDataset(f"gs://{bucket}/wds", decode=False)  # no in-memory indexing warning now
    assert sorted(s["__key__"] for s in ds) == sorted(
        s["__key__"] for s in fastload.ShardDataset(str(www / "ds"), decode=False)
    )


def test_application_default_credentials_give_a_bearer_token_refreshed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GOOGLE_APPLICATION_CREDENTIALS (a service account's key file, its token_uri a local server) -> one
    token request, then the cached token on every header; a missing file is a ConfigError saying what to
    set."""
    pytest.importorskip("google.auth")
    import http.server
    import json
    import threading

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    from fastload.s3.gcsstore import GcsAuth

    asked: list[str] = []

    class Token(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            asked.append(self.rfile.read(int(self.headers["Content-Length"])).decode())
            body = json.dumps({"access_token": "tok-32", "expires_in": 3600, "token_type": "Bearer"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Token)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        info = {
            "type": "service_account",
            "client_email": "loader@test.iam.gserviceaccount.com",
            "private_key": key.decode(),
            "private_key_id": "k1",
            "token_uri": f"http://127.0.0.1:{server.server_address[1]}/token",
        }
        (tmp_path / "adc.json").write_text(json.dumps(info))
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "adc.json"))
        auth = GcsAuth(anonymous=False)
        assert auth.headers() == {"Authorization": "Bearer tok-32"}
        assert auth.headers() == {"Authorization": "Bearer tok-32"}
        assert len(asked) == 1 and "assertion=" in asked[0]  # a JWT signed with the account's key
        assert "tok-32" not in repr(auth)
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(fastload.errors.S3Error, match="token service") as caught:
        GcsAuth(anonymous=False).headers()  # the token server is gone
    assert "BEGIN PRIVATE KEY" not in str(caught.value)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match="GOOGLE_APPLICATION_CREDENTIALS"):
        GcsAuth(anonymous=False).headers()


def test_unreachable_emulator_and_in_memory_warning_name_what_to_do(
    www: Path, gcs: tuple[Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gs:// folder without an index says to run `fastload index` there (it can be written, unlike a web
    server); an endpoint where nothing listens names STORAGE_EMULATOR_HOST."""
    _, bucket = gcs
    with pytest.warns(UserWarning, match="fastload index") as caught:
        fastload.ShardDataset(f"gs://{bucket}/wds", decode=False)
    assert "web server" not in str(caught[0].message)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:1")
    with pytest.raises(fastload.errors.FastloadError, match="STORAGE_EMULATOR_HOST"):
        fastload.open(f"gs://{bucket}/ds/shard-000001.tar", max_attempts=2).read(1)
