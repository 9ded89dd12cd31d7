"""The reader's contract over plain HTTP(S) (``s3.httpstore``): the same retries, range checks, whole-object
200 and pinning as for S3, against a range-serving web server (``fastload.testing.httpserve``) with the
fault proxy in front."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

import fastload
from fastload.errors import AccessDeniedError, NotFoundError, ObjectChangedError, S3Error
from fastload.s3 import partfetch
from fastload.testing.faultproxy import Fault, FaultProxy, Rule
from fastload.testing.httpserve import WebServer

from .helpers import PART, sha, timed
from .test_faults import CASES, timeout_for
from .test_fork import in_child

KEY = "obj-2m"
SIZE = 2_000_000 + 77


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "web").mkdir()
    (tmp_path / "web" / KEY).write_bytes(random.Random(32).randbytes(SIZE))
    return tmp_path / "web"


@pytest.fixture
def web(folder: Path) -> Iterator[WebServer]:
    with WebServer(folder) as server:
        yield server


def web_config(**overrides: object) -> fastload.S3Config:
    config = fastload.S3Config(
        part_size_bytes=PART,
        max_concurrency=4,
        read_timeout_s=1.0,
        connect_timeout_s=1.0,
        base_backoff_s=0.01,
        max_backoff_s=0.2,
        deadline_s=10.0,
        hedge=0.0,
    )
    return replace(config, **overrides)  # type: ignore[arg-type]


def read_all(url: str, config: fastload.S3Config) -> bytes:
    with fastload.open(url, config=config) as f:
        return f.read()


@pytest.mark.parametrize("name", list(CASES))
def test_fault_is_retried_and_bytes_are_correct_over_http(web: WebServer, folder: Path, name: str) -> None:
    fault, schedule, causes = CASES[name]
    with FaultProxy(web.endpoint_url, io_timeout_s=10.0) as proxy:
        proxy.add(Rule(fault, method="GET", key=KEY, has_range=True, **schedule))
        config = web_config(read_timeout_s=timeout_for(fault))
        got, _ = timed(lambda: read_all(f"{proxy.endpoint_url}/{KEY}", config))
        assert sha(got) == sha((folder / KEY).read_bytes())
        assert proxy.stats().injected.get(fault.kind, 0) >= 1
    stats = fastload.s3_stats()
    assert stats["retries_total"] >= 1 and set(stats["retries"]) <= causes, stats


@pytest.mark.parametrize("nth", [1, 3])
def test_a_server_that_answers_200_to_a_range_is_read_whole_once(folder: Path, nth: int) -> None:
    data = (folder / KEY).read_bytes()
    with WebServer(folder) as web, FaultProxy(web.endpoint_url) as proxy:
        proxy.add(Rule(Fault.ignore_range(), method="GET", key=KEY, has_range=True, nth={nth}))
        got, _ = timed(lambda: read_all(f"{proxy.endpoint_url}/{KEY}", web_config()))
        assert sha(got) == sha(data)
        assert sum(r.status == 200 for r in proxy.requests()) == 1
    with WebServer(folder, ignore_range=True) as web:  # a server with no range support at all
        with fastload.open(web.url(KEY), config=web_config()) as f:
            f.seek(SIZE - 1000)
            assert f.read() == data[-1000:]
        gets = [r for r in web.requests if r[0] == "GET"]
        assert len(gets) == 1, gets
    assert fastload.s3_stats()["retries_total"] == 0


@pytest.mark.parametrize(
    ("etag", "pinned_by"),
    [("strong", "If-Match"), ("weak", "none"), ("none", "If-Unmodified-Since"), ("bare", "none")],
)
def test_requests_after_the_first_are_pinned_by_the_validator_the_server_gives(
    folder: Path, etag: str, pinned_by: str
) -> None:
    with WebServer(folder, etag=etag) as web:
        got = read_all(web.url(KEY), web_config())
        assert got == (folder / KEY).read_bytes()
        gets = [h for method, _, h in web.requests if method == "GET"]
    assert len(gets) == -(-SIZE // PART)
    later = gets[1:]
    if pinned_by == "none":
        assert not any("If-Match" in h or "If-Unmodified-Since" in h for h in later), later
    else:
        assert all(pinned_by in h for h in later), later


@pytest.mark.parametrize("etag", ["strong", "weak", "none"])
def test_an_object_rewritten_while_read_is_an_error_not_mixed_bytes(folder: Path, etag: str) -> None:
    path = folder / KEY
    with WebServer(folder, etag=etag) as web:
        config = web_config(max_concurrency=1, readahead_bytes=0)
        with fastload.open(web.url(KEY), config=config) as f:
            first = f.read(PART)
            assert first == path.read_bytes()[:PART]
            path.write_bytes(random.Random(33).randbytes(SIZE))  # same size, new bytes
            st = path.stat()
            os.utime(path, (st.st_atime, st.st_mtime + 10))
            with pytest.raises(ObjectChangedError, match=KEY) as caught:
                f.read(PART)
        assert caught.value.url == web.url(KEY)


def test_missing_objects_and_refusals_name_the_url_and_never_the_token(folder: Path) -> None:
    token = "Bearer secret-token-never-shown"
    with WebServer(folder, require={"Authorization": token}) as web:
        with pytest.raises(AccessDeniedError, match="headers") as denied:
            read_all(web.url(KEY), web_config())
        assert web.url(KEY) in str(denied.value)
        config = web_config(headers={"Authorization": token})
        assert read_all(web.url(KEY), config) == (folder / KEY).read_bytes()
        assert "secret-token" not in repr(config)
        with pytest.raises(NotFoundError, match="check the URL") as missing:
            read_all(web.url("nope.bin"), config)
        assert web.url("nope.bin") in str(missing.value) and "secret-token" not in str(missing.value)
    assert fastload.s3_stats()["retries_total"] == 0


def test_a_whole_object_answer_too_big_to_hold_is_a_clear_error(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(partfetch, "WHOLE_OBJECT_MAX_BYTES", SIZE - 1)
    with WebServer(folder, ignore_range=True) as web:
        with pytest.raises(S3Error, match="does not serve byte ranges") as caught:
            read_all(web.url(KEY), web_config())
        assert caught.value.url == web.url(KEY)
        assert len([r for r in web.requests if r[0] == "GET"]) == 1  # not retried
    monkeypatch.setattr(partfetch, "WHOLE_OBJECT_MAX_BYTES", SIZE)
    with WebServer(folder, ignore_range=True) as web:
        assert read_all(web.url(KEY), web_config()) == (folder / KEY).read_bytes()


def test_stalled_gets_are_hedged_over_http(web: WebServer, folder: Path) -> None:
    with FaultProxy(web.endpoint_url, io_timeout_s=10.0) as proxy:
        proxy.add(Rule(Fault.hang(duration_s=20), method="GET", key=KEY, has_range=True, nth={3}))
        config = web_config(hedge=0.5, hedge_floor_s=0.3, read_timeout_s=8.0)
        got, elapsed = timed(lambda: read_all(f"{proxy.endpoint_url}/{KEY}", config))
    assert sha(got) == sha((folder / KEY).read_bytes())
    hedges = fastload.s3_stats()["hedges"]
    assert hedges["sent"] >= 1 and hedges["won"] >= 1, hedges
    assert elapsed < 8.0  # the hung GET was not waited out (read_timeout_s)


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_reader_opened_before_fork_reads_in_the_child(web: WebServer, folder: Path) -> None:
    data = (folder / KEY).read_bytes()
    with fastload.open(web.url(KEY), config=web_config()) as f:
        assert f.read(1000) == data[:1000]
        result = in_child(lambda: {"sha": sha(f.read())})
    assert result == {"sha": sha(data[1000:])}
