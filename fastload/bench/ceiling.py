"""Physical references: what the embedded endpoint itself can serve (many connections, no client logic),
and what ``cat`` reads from local disk. A loader's figures are read against these."""

from __future__ import annotations

import http.client
import os
import shutil
import subprocess
import threading
import time
from typing import Any
from urllib.parse import quote, urlsplit

BUFFER_BYTES = 1 << 20


def probe_endpoint(
    endpoint_url: str, bucket: str, keys: list[str], *, connections: int, seconds: float
) -> dict[str, Any]:
    """Whole-object GETs of ``keys`` (round robin) on ``connections`` keep-alive connections for ``seconds``;
    bodies read into a reused buffer, nothing checked but status and length. Unsigned: the embedded endpoint
    accepts any request."""
    split = urlsplit(endpoint_url)
    host, port = split.hostname or "127.0.0.1", split.port or 80
    lock = threading.Lock()
    totals = {"requests": 0, "bytes": 0, "errors": 0}
    start = threading.Event()
    deadline = [0.0]

    def worker(offset: int) -> None:
        conn = http.client.HTTPConnection(host, port, timeout=30)
        buf = bytearray(BUFFER_BYTES)
        view = memoryview(buf)
        requests = got = errors = 0
        i = offset
        start.wait()
        try:
            while time.perf_counter() < deadline[0]:
                key = keys[i % len(keys)]
                i += connections
                try:
                    conn.request("GET", f"/{bucket}/{quote(key)}")
                    resp = conn.getresponse()
                    while True:
                        n = resp.readinto(view)
                        if not n:
                            break
                        got += n
                    if resp.status != 200:
                        errors += 1
                    requests += 1
                except (OSError, http.client.HTTPException):
                    errors += 1
                    conn.close()
                    conn = http.client.HTTPConnection(host, port, timeout=30)
        finally:
            conn.close()
            with lock:
                totals["requests"] += requests
                totals["bytes"] += got
                totals["errors"] += errors

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(connections)]
    for t in threads:
        t.start()
    began = time.perf_counter()
    deadline[0] = began + seconds
    start.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    return {
        "connections": connections,
        "seconds": round(elapsed, 4),
        "requests": totals["requests"],
        "errors": totals["errors"],
        "requests_per_s": round(totals["requests"] / elapsed, 2),
        "mb_per_s": round(totals["bytes"] / elapsed / 1e6, 3),
        "object_bytes_mean": round(totals["bytes"] / totals["requests"]) if totals["requests"] else None,
    }


def cat_files(paths: list[str]) -> dict[str, Any] | None:
    """``xargs -0 cat > /dev/null`` over ``paths``, once to warm the page cache, then timed."""
    if not paths or shutil.which("cat") is None or shutil.which("xargs") is None:
        return None
    data = b"\0".join(p.encode() for p in paths)
    timings = []
    for _ in range(2):
        began = time.perf_counter()
        subprocess.run(["xargs", "-0", "cat"], input=data, stdout=subprocess.DEVNULL, check=True)
        timings.append(time.perf_counter() - began)
    total = sum(os.path.getsize(p) for p in paths)
    elapsed = timings[-1]
    return {
        "files": len(paths),
        "bytes": total,
        "seconds": round(elapsed, 4),
        "files_per_s": round(len(paths) / elapsed, 1),
        "mb_per_s": round(total / elapsed / 1e6, 3),
    }
