"""Fork-safety: a child process reads through fastload with a client of its own, never the parent's."""

from __future__ import annotations

import json
import os
import select
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

import fastload
from fastload.s3 import runtime
from fastload.s3 import transport as s3get
from fastload.testing.faultproxy import FaultProxy

from .helpers import PART, sha, url

KEY = "obj-2m"
CHILD_TIMEOUT_S = 15.0
SHORT_TIMEOUT_S = 5.0  # reading 2 MiB over loopback takes well under a second

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork"),
    # Python >= 3.12 warns about fork() in a process with threads (moto, the proxy): that is the point here.
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]


def in_child(work: Callable[[], dict[str, Any]], timeout_s: float = CHILD_TIMEOUT_S) -> dict[str, Any]:
    """Run ``work()`` in a forked child and return its JSON-able result; the child is killed if it takes
    longer than ``timeout_s`` (then the result says ``{"hung": True}``)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 0
        try:
            os.close(read_fd)
            try:
                result = work()
            except BaseException as exc:
                result = {"error": repr(exc)}
            os.write(write_fd, json.dumps(result).encode())
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    out = b""
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([read_fd], [], [], 0.1)
            if ready:
                chunk = os.read(read_fd, 1 << 16)
                if not chunk:
                    break
                out += chunk
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return {"hung": True}
    finally:
        os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return json.loads(out)  # type: ignore[no-any-return]


def test_child_opens_and_reads_with_a_client_of_its_own(
    proxy: FaultProxy, config: fastload.S3Config, objects: dict[str, bytes]
) -> None:
    data = objects[KEY]
    parent = fastload.open(url(KEY), config=config)
    try:
        assert parent.read(PART + 1) == data[: PART + 1]  # client, pool and connections exist
        parent_client = parent._client  # type: ignore[attr-defined]
        parent_transport = s3get.direct_transport(config)
        parent_runtime = runtime.current()

        def child() -> dict[str, Any]:
            with fastload.open(url(KEY), config=config) as f:
                got = f.read()
                client = f._client  # type: ignore[attr-defined]
            transport = s3get.direct_transport(config)
            return {
                "pid": os.getpid(),
                "sha": sha(got),
                "runtime_pid": runtime.current().pid,
                "parents_runtime": runtime.current() is parent_runtime,
                "own_client": client is runtime.current().clients.peek(config),
                "parents_client": client is parent_client,
                "parents_transport": transport is parent_transport,
                "connections": transport.pool(config.endpoint_url or "").created,
            }

        result = in_child(child)
        assert "error" not in result and "hung" not in result, result
        assert result["sha"] == sha(data)
        assert result["pid"] != os.getpid()
        assert result["runtime_pid"] == result["pid"] and not result["parents_runtime"]
        assert runtime.current() is parent_runtime and parent_runtime.clients.peek(config) is parent_client
        assert result["own_client"] and not result["parents_client"]
        assert not result["parents_transport"] and result["connections"] >= 1  # connections of its own
        assert parent.read() == data[PART + 1 :]  # the parent's reader still works
    finally:
        parent.close()


def test_reader_opened_in_the_parent_keeps_working_in_the_child(
    proxy: FaultProxy, config: fastload.S3Config, objects: dict[str, bytes]
) -> None:
    """A DataLoader pattern: the dataset opens the file (and reads a header) in the parent, workers are
    forked and go on reading. docs/s3.md: "Fork-safe. Clients are created lazily per process, so DataLoader
    workers never share a parent's client." The child must get the right bytes, through a client of its
    own, in bounded time."""
    data = objects[KEY]
    f = fastload.open(url(KEY), config=config)
    try:
        head = f.read(1000)  # the first part is fetched and the read-ahead pool has started
        assert head == data[:1000]

        def child() -> dict[str, Any]:
            rest = f.read()
            return {
                "sha": sha(head + rest),
                "own_client": f._client is runtime.current().clients.peek(config),  # type: ignore[attr-defined]
                "own_transport": f._object._transport is s3get.direct_transport(config),  # type: ignore[attr-defined]
            }

        result = in_child(child, SHORT_TIMEOUT_S)
        assert result.get("hung") is not True, "the child's read of the inherited reader never returned"
        assert "error" not in result, result
        assert result["sha"] == sha(data)
        assert result["own_client"], "the child used the parent's client"
        assert result["own_transport"], "the child used the parent's connections"
    finally:
        f.close()
