"""Workload 3 of ``benchmarks/s3_read.py``, tail latency under stalls (``--tail``, issue 17): per-object
latencies through a seeded FaultProxy, their summary, targets and table."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from s3_read_core import BUCKET, MIB, REGION, ROOT, SCRIPT, SEED, SMALL_THREADS, fmt, markdown_table, rotated
from s3_read_readers import Sink, boto_client
from s3_read_world import ProxyProcess, World, reader_env, upload_client

TAIL_READERS = ("fastload", "fastload-nohedge", "download_fileobj", "s3torchconnector")
TAIL_LABELS = {
    "fastload": "fastload.open (hedging, default)",
    "fastload-nohedge": "fastload.open, S3Config(hedge=0)",
    "fastload-before": "fastload.open, --fastload-before checkout",
    "download_fileobj": "boto3 download_fileobj (s3transfer)",
    "s3torchconnector": "s3torchconnector S3Client.get_object",
}
# scenario -> FaultProxy --stall rules (KIND:FRACTION:SECONDS; PAUSE is --tail-pause-s)
TAIL_SCENARIOS = {
    "clean": (),
    "paused": ("body:0.05:PAUSE",),
    "stopped": ("body:0.02:forever",),
    "first-byte": ("first-byte:0.05:PAUSE",),
}
TAIL_SMALL_THREADS = 16


def latency_summary(seconds: Sequence[float]) -> dict[str, float | None]:
    """p50, p99 (nearest rank) and max of per-object latencies, in seconds."""
    if not seconds:
        return {"p50": None, "p99": None, "max": None}
    ordered = sorted(seconds)

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, math.ceil(len(ordered) * q) - 1))]

    return {"p50": rank(0.50), "p99": rank(0.99), "max": ordered[-1]}


def _tail_fetcher(spec: dict[str, Any]) -> Callable[[str, int], bytes]:
    """``fetch(key, size) -> bytes`` for the spec's reader (peers time out a silent connection after
    ``read_timeout_s`` like fastload, 10 s by default)."""
    reader, endpoint = spec["reader"], spec["endpoint_url"]
    if reader.startswith("fastload"):
        import fastload

        config = fastload.S3Config(
            endpoint_url=endpoint,
            region=REGION,
            addressing_style="path",
            hedge=0.0 if "nohedge" in reader else 0.05,
        )

        def fetch_fastload(key: str, size: int) -> bytes:
            with fastload.open(f"s3://{BUCKET}/{key}", config=config) as f:
                return f.read()

        return fetch_fastload
    if reader == "download_fileobj":
        from boto3.s3.transfer import TransferConfig

        client = boto_client(spec, read_timeout=spec["read_timeout_s"], max_pool_connections=32)
        transfer = TransferConfig(max_concurrency=10)

        def fetch_s3transfer(key: str, size: int) -> bytes:
            sink = Sink(size, keep=True)
            client.download_fileobj(BUCKET, key, sink, Config=transfer)
            return bytes(sink.buf or b"")

        return fetch_s3transfer
    from s3torchconnector import S3ClientConfig
    from s3torchconnector._s3client import S3Client

    s3tc = S3Client(REGION, endpoint=endpoint, s3client_config=S3ClientConfig(force_path_style=True))
    return lambda key, size: s3tc.get_object(BUCKET, key).read()


def run_tail_child(spec: dict[str, Any]) -> dict[str, Any]:
    """After one untimed GET (client set up), small objects read whole by 16 threads, then large objects one
    after another, each timed; bytes are checked (SHA-256) after the clock stops for each object."""
    fetch = _tail_fetcher(spec)

    def one(obj: list[Any]) -> float:
        key, size, sha = obj
        began = time.perf_counter()
        data = fetch(key, size)
        took = time.perf_counter() - began
        if len(data) != size or hashlib.sha256(data).hexdigest() != sha:
            raise RuntimeError(f"{spec['reader']}: {key} came back wrong ({len(data)} of {size} bytes)")
        return took

    result: dict[str, Any] = {}
    one(spec["small"][0])  # untimed: the client, its connection and credentials (as the other workloads)
    began = time.perf_counter()
    with ThreadPoolExecutor(TAIL_SMALL_THREADS) as pool:
        small = list(pool.map(one, spec["small"]))
    result["small"] = {"seconds": time.perf_counter() - began, "latency_s": small}
    began = time.perf_counter()
    large = [one(obj) for obj in spec["large"]]
    result["large"] = {"seconds": time.perf_counter() - began, "latency_s": large}
    if spec["reader"].startswith("fastload"):
        import fastload

        result["s3_stats"] = fastload.s3_stats()
    return result


def run_tail(world: World, args: argparse.Namespace, small: list[Any], large: list[Any]) -> dict[str, Any]:
    """Every (scenario, reader) pair, ``--reps`` times, readers rotated; a fresh FaultProxy (seeded by the
    repetition) in front of the capped proxy for each run, so every reader meets the same fault schedule."""
    readers = [r for r in args.tail_readers.split(",") if r]
    scenarios = [s for s in args.tail_scenarios.split(",") if s]
    if "fastload-before" in readers and not args.fastload_before:
        raise SystemExit("--tail-readers fastload-before needs --fastload-before PATH")
    capped = world.proxies["capped"]
    runs: list[dict[str, Any]] = []
    for rep in range(args.reps):
        for scenario in scenarios:
            stalls = [rule.replace("PAUSE", f"{args.tail_pause_s:g}") for rule in TAIL_SCENARIOS[scenario]]
            for reader in rotated(readers, rep):
                argv = ["--faultproxy", "--seed", str(SEED + rep)]
                for rule in stalls:
                    argv += ["--stall", rule]
                fault = ProxyProcess(capped.endpoint_url, *argv).start()
                spec = {
                    "workload": "tail",
                    "reader": reader,
                    "endpoint_url": fault.endpoint_url,
                    "small": small,
                    "large": large,
                    "read_timeout_s": 10.0,
                }
                if reader == "fastload-before":  # the same reader from another checkout (before/after)
                    spec["pythonpath"] = str(Path(args.fastload_before).resolve())
                try:
                    out = _tail_child(world, spec, args.tail_timeout_s)
                finally:
                    fault.stop()
                out |= {"rep": rep, "scenario": scenario, "reader": reader}
                runs.append(out)
                print(f"  rep {rep} {scenario:10s} {reader:16s} {_tail_line(out)}", flush=True)
    return {"runs": runs, "summary": summarize_tail(runs), "readers": readers, "scenarios": scenarios}


def _tail_child(world: World, spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=world.workdir) as tmp:
        spec = {**spec, "result_path": str(Path(tmp) / "result.json")}
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        try:
            done = subprocess.run(
                [sys.executable, str(SCRIPT), "--child", str(spec_path)],
                env=reader_env(world, spec["reader"], spec),
                capture_output=True,
                text=True,
                timeout=timeout_s,
                cwd=str(ROOT),
            )
        except subprocess.TimeoutExpired:
            return {"error": f"did not finish in {timeout_s:g} s"}
        if done.returncode != 0:
            tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
            return {"error": " | ".join(tail)[-300:]}
        return dict(json.loads(Path(spec["result_path"]).read_text()))


def _tail_line(out: dict[str, Any]) -> str:
    if "error" in out:
        return f"FAILED: {out['error']}"
    parts = []
    for what in ("small", "large"):
        lat = latency_summary(out[what]["latency_s"])
        parts.append(
            f"{what} {out[what]['seconds']:6.2f} s (p50 {lat['p50'] or 0:.3f} p99 {lat['p99'] or 0:.3f} "
            f"max {lat['max'] or 0:.3f})"
        )
    hedges = out.get("s3_stats", {}).get("hedges")
    if hedges:
        parts.append(f"hedges {hedges['sent']}/{hedges['won']} of {out['s3_stats']['requests']} GETs")
    return "  ".join(parts)


def summarize_tail(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per ``scenario/reader``: medians over repetitions of total seconds and of p50/p99/max (small and
    large), their ranges, failures, and fastload's hedge counts."""
    out: dict[str, dict[str, Any]] = {}
    for key in dict.fromkeys(f"{r['scenario']}/{r['reader']}" for r in runs):
        group = [r for r in runs if f"{r['scenario']}/{r['reader']}" == key]
        ok = [r for r in group if "error" not in r]
        row: dict[str, Any] = {"runs": len(group), "failed": [r["error"] for r in group if "error" in r]}
        for what in ("small", "large"):
            figures = {"seconds": [r[what]["seconds"] for r in ok]}
            for name in ("p50", "p99", "max"):
                figures[name] = [latency_summary(r[what]["latency_s"])[name] for r in ok]
            row[what] = {
                name: {"median": statistics.median(v), "min": min(v), "max": max(v)} if v else None
                for name, v in figures.items()
            }
        stats = [r["s3_stats"] for r in ok if "s3_stats" in r]
        if stats:
            row["hedges_sent"] = [s["hedges"]["sent"] for s in stats]
            row["hedges_won"] = [s["hedges"]["won"] for s in stats]
            row["requests"] = [s["requests"] for s in stats]
        out[key] = row
    return out


def tail_targets(summary: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets, on medians: fastload under each stall scenario <= 1.5x its fault-free time
    (small and large), p99 under 5% paused bodies <= 3x the fault-free p99, fault-free hedges <= 1%."""

    def fig(key: str, what: str, name: str) -> float | None:
        row = summary.get(key, {}).get(what)
        return None if not row or row.get(name) is None else float(row[name]["median"])

    targets = []
    for scenario in ("paused", "stopped", "first-byte"):
        for what in ("small", "large"):
            base, got = fig("clean/fastload", what, "seconds"), fig(f"{scenario}/fastload", what, "seconds")
            ratio = None if base is None or got is None else got / base
            targets.append(
                {"target": f"{scenario}: {what} <= 1.5x fault-free time", "measured": ratio, "minimum": 1.5}
            )
    for what in ("small", "large"):
        base, got = fig("clean/fastload", what, "p99"), fig("paused/fastload", what, "p99")
        ratio = None if base is None or got is None else got / base
        targets.append(
            {"target": f"paused: {what} p99 <= 3x fault-free p99", "measured": ratio, "minimum": 3.0}
        )
    clean = summary.get("clean/fastload", {})
    share = None
    if clean.get("requests"):
        share = max(s / max(r, 1) for s, r in zip(clean["hedges_sent"], clean["requests"], strict=True))
    targets.append({"target": "fault-free hedges <= 1% of GETs", "measured": share, "minimum": 0.01})
    for t in targets:  # here the figure must stay at or below its bound
        t["met"] = None if t["measured"] is None else t["measured"] <= t["minimum"]
    return targets


def format_tail(report: dict[str, Any]) -> str:
    tail = report["tail"]
    rows = []
    for key, row in tail["summary"].items():
        scenario, reader = key.split("/")
        cells = [scenario, TAIL_LABELS.get(reader, reader)]
        for what in ("small", "large"):
            data = row[what]
            if data["seconds"] is None:
                cells += ["-", "-"]
                continue
            sec = data["seconds"]
            cells.append(f"{sec['median']:.2f} ({sec['min']:.2f}-{sec['max']:.2f})")
            cells.append(" / ".join(f"{data[n]['median'] * 1000:.0f}" for n in ("p50", "p99", "max")))
        hedges = (
            f"{statistics.median(row['hedges_sent']):.0f}/{statistics.median(row['requests']):.0f}"
            if row.get("requests")
            else ""
        )
        cells.append(
            hedges + (f" FAILED {len(row['failed'])}x: {row['failed'][0][:60]}" if row["failed"] else "")
        )
        rows.append(cells)
    header = [
        "stalls",
        "reader",
        "small: all s (range)",
        "small p50/p99/max ms",
        "large: all s (range)",
        "large p50/p99/max ms",
        "hedges/GETs",
    ]
    lines = [markdown_table(header, rows), "", "Targets:"]
    for t in tail["targets"]:
        verdict = "n/a" if t["met"] is None else ("met" if t["met"] else "NOT met")
        lines.append(f"- {t['target']}: {fmt(t['measured'], '.3f')} ({verdict})")
    return "\n".join(lines)


def make_tail_objects(world: World, args: argparse.Namespace) -> tuple[list[Any], list[Any]]:
    """``--tail-small`` objects of ``--tail-small-kib`` and ``--tail-large`` of ``--tail-large-mib``."""
    import numpy as np

    client = upload_client(world, max_pool_connections=SMALL_THREADS)
    rng = np.random.default_rng(SEED + 17)
    small = []
    for i in range(args.tail_small):
        data = rng.bytes(args.tail_small_kib << 10)
        key = f"tail/small-{i:05d}.bin"
        client.put_object(Bucket=BUCKET, Key=key, Body=data)
        small.append([key, len(data), hashlib.sha256(data).hexdigest()])
    large = []
    for i in range(args.tail_large):
        data = rng.bytes(args.tail_large_mib * MIB)
        key = f"tail/large-{i:03d}.bin"
        client.put_object(Bucket=BUCKET, Key=key, Body=data)
        large.append([key, len(data), hashlib.sha256(data).hexdigest()])
    return small, large
