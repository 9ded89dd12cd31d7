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

from fastload import formats

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


def main(argv: list[str] | None = None) -> int:
    """``python -m fastload.bench.ceiling ROOT``: the endpoint's ceiling over ``ROOT/files`` and
    ``ROOT/packed`` at several connection counts, raw and with the emulation (a cached bench dataset, e.g.
    ``~/.cache/fastload/bench/synthetic-v1-3000-s0``)."""
    import argparse
    import json

    from fastload.bench.workload import BUCKET, Endpoint

    parser = argparse.ArgumentParser(prog="python -m fastload.bench.ceiling", description=main.__doc__)
    parser.add_argument("root", help="folder with files/ and packed/ (a cached fastload bench dataset)")
    parser.add_argument("--connections", default="1,4,16,64")
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--conn-mbps", type=float, default=50.0)
    args = parser.parse_args(argv)
    keys: dict[str, list[str]] = {}
    for kind in ("files", "packed"):
        base = os.path.join(args.root, kind)
        keys[kind] = sorted(
            os.path.relpath(os.path.join(here, f), args.root).replace(os.sep, "/")
            for here, _, names in os.walk(base)
            for f in names
            if kind == "files" or formats.for_path(f) is not None
        )
    out: dict[str, Any] = {}
    for label, latency, cap in (
        ("raw", 0.0, None),
        ("emulated", args.latency_ms / 1000, args.conn_mbps * 1e6),
    ):
        endpoint = Endpoint(args.root, latency_s=latency, conn_bytes_per_s=cap or None)
        try:
            for kind, names in keys.items():
                for conns in (int(c) for c in args.connections.split(",")):
                    figures = probe_endpoint(
                        endpoint.endpoint_url, BUCKET, names, connections=conns, seconds=args.seconds
                    )
                    out[f"{label} {kind} {conns}"] = figures
                    print(
                        f"{label:<9}{kind:<7}{conns:>4} connections: {figures['requests_per_s']:>9,.0f} GET/s"
                        f"{figures['mb_per_s']:>9,.0f} MB/s  errors {figures['errors']}",
                        flush=True,
                    )
            out[f"{label} server_cpu_s"] = endpoint.cpu_s()
        finally:
            endpoint.close()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
