"""The process's S3 runtime (``fastload.s3.runtime``): one object per process holding clients, transports,
gates, part buffers and counters; bounded caches; a fresh runtime after fork; ``reset()`` for tests."""

from __future__ import annotations

import json
import os
import select
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import fastload
from fastload.s3 import runtime
from fastload.s3.client import get_client
from fastload.s3.runtime import KeyedCache, S3Runtime

JOIN_S = 10.0


class Closeable:
    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


@pytest.fixture(autouse=True)
def fresh_runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Dummy credentials (clients are built, never used) and a runtime of the test's own."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    runtime.reset()
    yield
    runtime.reset()


def in_child(body: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``body()`` run in a forked child; its JSON result, or ``{"hung": True}`` after JOIN_S."""
    read_fd, write_fd = os.pipe()
    with warnings.catch_warnings():  # Python >= 3.12 warns of fork() with threads: that is the point here
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read_fd)
        try:
            out = json.dumps(body()).encode()
        except BaseException as exc:
            out = json.dumps({"error": repr(exc)}).encode()
        os.write(write_fd, out)
        os._exit(0)
    os.close(write_fd)
    try:
        ready, _, _ = select.select([read_fd], [], [], JOIN_S)
        if not ready:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return {"hung": True}
        data = b""
        while chunk := os.read(read_fd, 1 << 16):
            data += chunk
    finally:
        os.close(read_fd)
    os.waitpid(pid, 0)
    return json.loads(data)  # type: ignore[no-any-return]


# --- KeyedCache ---------------------------------------------------------------------------------------


def test_cache_builds_each_value_once() -> None:
    cache: KeyedCache[str, Closeable] = KeyedCache(4)
    built: list[str] = []

    def make(key: str) -> Callable[[], Closeable]:
        def build() -> Closeable:
            built.append(key)
            return Closeable(key)

        return build

    a = cache.get("a", make("a"))
    assert cache.get("a", make("a")) is a
    assert cache.get("b", make("b")) is not a
    assert built == ["a", "b"]
    assert cache.peek("a") is a and cache.peek("c") is None
    assert sorted(cache.keys()) == ["a", "b"] and len(cache) == 2


def test_cache_evicts_and_closes_the_least_recently_used() -> None:
    cache: KeyedCache[str, Closeable] = KeyedCache(2, close=Closeable.close)
    a = cache.get("a", lambda: Closeable("a"))
    b = cache.get("b", lambda: Closeable("b"))
    assert cache.get("a", lambda: Closeable("a2")) is a  # a used last: b is now the oldest
    c = cache.get("c", lambda: Closeable("c"))
    assert sorted(cache.keys()) == ["a", "c"]
    assert (a.closed, b.closed, c.closed) == (0, 1, 0)
    assert cache.get("b", lambda: Closeable("b2")).name == "b2"  # rebuilt; a is evicted now
    assert a.closed == 1 and sorted(cache.keys()) == ["b", "c"]


def test_cache_discard_and_clear_close_what_they_drop() -> None:
    cache: KeyedCache[str, Closeable] = KeyedCache(4, close=Closeable.close)
    values = [cache.get(k, lambda k=k: Closeable(k)) for k in "abc"]  # type: ignore[misc]
    cache.discard("b")
    cache.discard("missing")
    assert [v.closed for v in values] == [0, 1, 0] and sorted(cache.keys()) == ["a", "c"]
    cache.clear()
    assert [v.closed for v in values] == [1, 1, 1] and len(cache) == 0


def test_cache_rejects_a_bound_below_one() -> None:
    with pytest.raises(ValueError, match="max_entries=0 must be >= 1"):
        KeyedCache(0)


def test_cache_builds_once_under_concurrent_first_use() -> None:
    cache: KeyedCache[str, object] = KeyedCache(4)
    built: list[object] = []
    start = threading.Barrier(8)

    def make() -> object:
        value = object()
        built.append(value)
        return value

    got: list[object] = []

    def worker() -> None:
        start.wait(JOIN_S)
        got.append(cache.get("k", make))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S)
    assert len(built) == 1 and got == built * 8


# --- the runtime ---------------------------------------------------------------------------------------


def test_gates_are_shared_per_limit() -> None:
    process = runtime.current()
    assert process.gate(7) is process.gate(7)
    assert process.gate(7) is not process.gate(9)
    assert process.gate(9).limit == 9


def test_a_gate_reports_to_the_process_counters() -> None:
    gate = runtime.current().gate(5)
    gate.acquire()
    try:
        stats = fastload.s3_stats()
        assert (stats["concurrency_limit"], stats["in_flight"]) == (5, 1)
    finally:
        gate.release(succeeded=True)
    assert fastload.s3_stats()["in_flight"] == 0


def test_one_client_per_config_until_forgotten() -> None:
    one = fastload.S3Config(endpoint_url="http://127.0.0.1:9", region="us-east-1")
    two = fastload.S3Config(endpoint_url="http://127.0.0.1:10", region="us-east-1")
    client = get_client(one)
    assert get_client(one) is client
    assert get_client(two) is not client
    assert runtime.current().clients.peek(one) is client
    runtime.current().forget(one)
    assert runtime.current().clients.peek(one) is None
    assert get_client(one) is not client


def test_the_caches_are_bounded() -> None:
    process = runtime.current()
    assert process.clients.max_entries == process.transports.max_entries == runtime.MAX_CONFIGS
    small = S3Runtime(max_configs=2)
    made = [small.clients.get(i, lambda i=i: Closeable(str(i))) for i in range(3)]  # type: ignore[misc]
    assert [m.closed for m in made] == [1, 0, 0] and len(small.clients) == 2


def test_reset_closes_the_old_runtime_and_starts_a_fresh_one() -> None:
    old = runtime.current()
    client = old.clients.get("key", lambda: Closeable("client"))
    transport = old.transports.get("key", lambda: Closeable("transport"))
    old.stats.add_bytes(123)
    assert fastload.s3_stats()["bytes"] == 123
    new = runtime.reset()
    assert new is runtime.current() and new is not old
    assert (client.closed, transport.closed) == (1, 1)
    assert fastload.s3_stats()["bytes"] == 0 and len(new.clients) == 0


def test_close_keeps_gates_and_counters() -> None:
    process = runtime.current()
    gate = process.gate(3)
    client = process.clients.get("key", lambda: Closeable("client"))
    process.stats.add_bytes(5)
    process.close()
    assert client.closed == 1 and len(process.clients) == 0
    assert process.gate(3) is gate and fastload.s3_stats()["bytes"] == 5


def test_a_forked_child_gets_a_runtime_of_its_own() -> None:
    parent = runtime.current()
    parent.stats.add_bytes(10)
    client = get_client(fastload.S3Config(endpoint_url="http://127.0.0.1:9", region="us-east-1"))

    def child() -> dict[str, Any]:
        mine = runtime.current()
        return {
            "pid": os.getpid(),
            "runtime_pid": mine.pid,
            "same": mine is parent,
            "clients": len(mine.clients),
            "bytes": fastload.s3_stats()["bytes"],
            "same_buffers": mine.buffers is parent.buffers,
        }

    result = in_child(child)
    assert result["pid"] != os.getpid() and result["runtime_pid"] == result["pid"], result
    assert not result["same"] and not result["same_buffers"]
    assert (result["clients"], result["bytes"]) == (0, 0)
    assert runtime.current() is parent and len(parent.clients) == 1 and parent.stats.bytes == 10
    assert client is not None


def test_a_forked_child_knows_which_endpoints_answered_its_parent() -> None:
    """A DataLoader worker's first request may meet a restarting server the parent would ride out: the
    child starts with its parent's answered endpoints (refusals there are retried in full; issue 28 #9)."""
    runtime.current().answered.add("http://127.0.0.1:9")
    result = in_child(lambda: {"answered": sorted(runtime.current().answered)})
    assert result == {"answered": ["http://127.0.0.1:9"]}
    assert runtime.reset().answered == set()  # a reset (tests) starts afresh


def test_a_fork_while_another_thread_builds_a_client_does_not_hang_the_child() -> None:
    """A parent thread is inside the client cache (its lock held) at the moment of the fork: the child's
    runtime is fresh, so its first client does not wait for a lock no thread of the child will release."""
    inside, release = threading.Event(), threading.Event()

    def slow_make() -> Closeable:
        inside.set()
        release.wait(JOIN_S)
        return Closeable("slow")

    builder = threading.Thread(target=lambda: runtime.current().clients.get("slow", slow_make))
    builder.start()
    try:
        assert inside.wait(JOIN_S)
        config = fastload.S3Config(endpoint_url="http://127.0.0.1:9", region="us-east-1")

        def child() -> dict[str, Any]:
            return {"client": get_client(config) is not None, "n": len(runtime.current().clients)}

        result = in_child(child)
        assert result == {"client": True, "n": 1}
    finally:
        release.set()
        builder.join(JOIN_S)
