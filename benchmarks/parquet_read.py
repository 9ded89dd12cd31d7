"""Parquet read benchmark (issue 18): bytes fetched and rows/s of fastload's projection and filters against
``pyarrow.dataset`` over ``pyarrow.fs.S3FileSystem`` and DuckDB's ``httpfs``, reading the same files on a
real Ceph RADOS Gateway (``tests/servers/rgw.py``, memstore) through a byte-counting pass-through proxy
(``fastload.testing.faultproxy.FaultProxy`` without rules: ``bytes_to_client`` is what a reader fetched,
response heads included, every request counted: listings, index.json, sample tables, footers).

The dataset: ``--months`` (12) hive partitions ``month=1..12`` packed by ``fastload pack --format parquet
--partition-by 0:month``, ``--rows`` (400) rows a month, each with a ``date`` (``2024-MM-DDTHH:MM:SS``,
sorted: keys are in date order), a ``cls`` digit and an ``img`` of ``--img-bytes`` (8,000) random bytes;
``--shard-mib`` (2) shards of ``--row-group-kib`` (256) row groups. Four reads, each by each reader:

- ``full``: every row, every column;
- ``column``: every row, ``__key__`` and ``cls`` only (fastload always returns ``__key__``; the others are
  asked for it too, so all three return the same);
- ``partition``: ``month == 7``, every column;
- ``dates``: ``"2024-03-10" <= date < "2024-03-20"``, every column (pruned by min/max statistics).

Readers, each run in a child process (its wall time from before opening the dataset to the last row; the
interpreter's start, imports, the S3 client's creation and one request to index.json before the clock),
one run of every (read, reader) per repetition, interleaved, the reader order rotated each repetition;
figures are medians:

- ``fastload``: ``ShardDataset(url, columns=..., filters=..., decode=False)`` iterated in the process (the
  samples as dicts, as a training job gets them), default prefetch;
- ``pyarrow``: ``pyarrow.dataset.dataset(files, filesystem=S3FileSystem, partitioning="hive")``
  ``.to_table(columns=..., filter=...)`` (an Arrow table, no per-row Python objects; the file list given,
  since the prefix also holds fastload's sidecars);
- ``duckdb``: ``read_parquet('s3://.../*/*.parquet', hive_partitioning=true)`` with the ``WHERE`` clause,
  ``.arrow()``; the ``httpfs`` extension comes from PyPI (``duckdb-ext-httpfs``, built for DuckDB 1.4.4):
  ``--duckdb-python`` names an interpreter with ``duckdb==1.4.4`` and it installed, e.g.
  ``python -m venv /tmp/duckvenv && /tmp/duckvenv/bin/pip install duckdb==1.4.4 duckdb-ext-httpfs``.

- ``fastload-before`` (with ``--fastload-before PATH``): the same child with fastload imported from another
  checkout (e.g. ``main``, with its C module built), for before/after in one interleaved run.

    python benchmarks/parquet_read.py --duckdb-python /tmp/duckvenv/bin/python
    python benchmarks/parquet_read.py --reps 3 --json /tmp/parquet_read.json
    python benchmarks/parquet_read.py --reps 5 --fastload-before ../main
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SEED = 20241201
BUCKET = "bench-parquet"
PREFIX = "pq"
REGION = "us-east-1"
READS: dict[str, dict[str, Any]] = {
    "full": {"columns": None, "filters": None, "sql": "TRUE"},
    "column": {"columns": ["__key__", "cls"], "filters": None, "sql": "TRUE"},
    "partition": {"columns": None, "filters": [("month", "==", 7)], "sql": "month = 7"},
    "dates": {
        "columns": None,
        "filters": [("date", ">=", "2024-03-10"), ("date", "<", "2024-03-20")],
        "sql": "date >= '2024-03-10' AND date < '2024-03-20'",
    },
}
READERS = ("fastload", "pyarrow", "duckdb")


# -- children -----------------------------------------------------------------------------------------


def child_fastload(spec: dict[str, Any]) -> dict[str, Any]:
    # fastload's lazily imported modules, before the clock (pyarrow.dataset imports its own at import);
    # multiprocessing's shared values (ShardDataset's position) import theirs on first use
    import multiprocessing.sharedctypes  # noqa: F401

    import pyarrow as pa
    import pyarrow.compute
    import pyarrow.parquet  # (imported lazily by fastload: before the clock, as the others')

    import fastload.formats.parquet.arrowfile
    import fastload.formats.parquet.select
    import fastload.formats.parquet.values
    import fastload.storage.manifest
    import fastload.storage.s3source  # noqa: F401
    from fastload import S3Config, ShardDataset  # (torch imported before the clock)
    from fastload.storage import access

    pa.scalar(0)  # pyarrow imports pandas on its first Python-to-Arrow conversion (pyarrow.dataset at import)
    config = S3Config(endpoint_url=spec["endpoint"], region=REGION, addressing_style="path")
    # client made, one request (a Parquet dataset keeps index.json in _fastload/), before the clock
    access.size_of(f"{spec['url']}/_fastload/index.json", config=config)
    read = READS[spec["read"]]
    columns = None if read["columns"] is None else [c for c in read["columns"] if c != "__key__"]
    started = time.perf_counter()
    ds = ShardDataset(spec["url"], columns=columns, filters=read["filters"], decode=False, s3_config=config)
    rows = sum(1 for _ in ds)
    return {"rows": rows, "seconds": time.perf_counter() - started}


def child_pyarrow(spec: dict[str, Any]) -> dict[str, Any]:
    import pyarrow.dataset as pads
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    read = READS[spec["read"]]
    fs = pafs.S3FileSystem(
        access_key=spec["access_key"],
        secret_key=spec["secret_key"],
        endpoint_override=spec["endpoint"].split("://", 1)[1],
        scheme="http",
        region=REGION,
    )
    base = f"{BUCKET}/{PREFIX}"
    fs.get_file_info(f"{base}/index.json")  # client made, one request, before the clock
    started = time.perf_counter()
    files = [
        f.path
        for f in fs.get_file_info(pafs.FileSelector(base, recursive=True))
        if f.path.endswith(".parquet")
    ]
    ds = pads.dataset(files, filesystem=fs, format="parquet", partitioning="hive", partition_base_dir=base)
    flt = None if read["filters"] is None else pq.filters_to_expression(read["filters"])
    table = ds.to_table(columns=read["columns"], filter=flt)
    return {"rows": table.num_rows, "seconds": time.perf_counter() - started}


def child_duckdb(spec: dict[str, Any]) -> dict[str, Any]:
    import duckdb

    read = READS[spec["read"]]
    con = duckdb.connect()
    found = glob.glob(
        os.path.join(os.path.dirname(duckdb.__file__), "..", "duckdb_ext", "extensions", "*", "*", "httpfs*")
    )
    con.sql(f"LOAD '{found[0]}'" if found else "LOAD httpfs")
    con.sql(
        f"CREATE SECRET (TYPE s3, KEY_ID '{spec['access_key']}', SECRET '{spec['secret_key']}', "
        f"ENDPOINT '{spec['endpoint'].split('://', 1)[1]}', URL_STYLE 'path', USE_SSL false, "
        f"REGION '{REGION}')"
    )
    cols = "*" if read["columns"] is None else ", ".join(f'"{c}"' for c in read["columns"])
    con.sql(f"SELECT count(*) FROM read_blob('s3://{BUCKET}/{PREFIX}/index.json')").fetchall()  # (warm-up)
    started = time.perf_counter()
    table = con.sql(
        f"SELECT {cols} FROM read_parquet('s3://{BUCKET}/{PREFIX}/*/*.parquet', hive_partitioning=true) "
        f"WHERE {read['sql']}"
    ).arrow()
    rows = table.num_rows if hasattr(table, "num_rows") else table.read_all().num_rows
    return {"rows": rows, "seconds": time.perf_counter() - started}


# -- the parent ---------------------------------------------------------------------------------------


def make_source(folder: Path, months: int, rows: int, img_bytes: int) -> None:
    rng = random.Random(SEED)
    for m in range(1, months + 1):
        for i in range(rows):
            seconds = i * (28 * 86400 // rows)
            day, rest = divmod(seconds, 86400)
            stamp = f"2024-{m:02d}-{day + 1:02d}T{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
            base = folder / f"{m:02d}" / f"{i:05d}"
            base.parent.mkdir(parents=True, exist_ok=True)
            base.with_suffix(".date").write_bytes(stamp.encode())
            base.with_suffix(".cls").write_bytes(b"%d" % rng.randrange(10))
            base.with_suffix(".img").write_bytes(rng.randbytes(img_bytes))


def run_child(
    python: str, reader: str, spec: dict[str, Any], pythonpath: str | None = None
) -> dict[str, Any]:
    """One child run of ``reader`` (``fastload-before``: the fastload child, fastload from ``pythonpath``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        PYTHONPATH=pythonpath or str(ROOT),
        AWS_ACCESS_KEY_ID=spec["access_key"],
        AWS_SECRET_ACCESS_KEY=spec["secret_key"],
        AWS_REGION=REGION,
        AWS_EC2_METADATA_DISABLED="true",
    )
    out = subprocess.run(
        [python, __file__, "--child", reader.removesuffix("-before"), json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def duckdb_problem(python: str) -> str | None:
    probe = (
        "import duckdb, glob, os; d = os.path.dirname(duckdb.__file__); "
        "f = glob.glob(os.path.join(d, '..', 'duckdb_ext', 'extensions', '*', '*', 'httpfs*')); "
        "duckdb.connect().sql(f\"LOAD '{f[0]}'\" if f else 'LOAD httpfs')"
    )
    out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
    if out.returncode == 0:
        return None
    return (out.stderr.strip().splitlines() or ["?"])[-1]


def machine() -> str:
    load = os.getloadavg()
    return (
        f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, Python "
        f"{platform.python_version()}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--months", type=int, default=12)
    p.add_argument("--rows", type=int, default=400, help="rows a month")
    p.add_argument("--img-bytes", type=int, default=8000)
    p.add_argument("--shard-mib", type=float, default=2)
    p.add_argument("--row-group-kib", type=int, default=256)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--duckdb-python", default=sys.executable)
    p.add_argument("--json", help="write the results here too")
    p.add_argument("--fastload-before", metavar="PATH", help="also run fastload from this checkout")
    args = p.parse_args(argv)
    if args.child:
        reader, spec = args.child[0], json.loads(args.child[1])
        print(
            json.dumps(
                {"fastload": child_fastload, "pyarrow": child_pyarrow, "duckdb": child_duckdb}[reader](spec)
            )
        )
        return 0

    sys.path.insert(0, str(ROOT))
    import fastload
    from fastload.testing.faultproxy import FaultProxy

    spec_rgw = importlib.util.spec_from_file_location(
        "fastload_bench_rgw", ROOT / "tests" / "servers" / "rgw.py"
    )
    assert spec_rgw is not None and spec_rgw.loader is not None
    rgw_module = importlib.util.module_from_spec(spec_rgw)
    spec_rgw.loader.exec_module(rgw_module)
    readers = list(READERS) + (["fastload-before"] if args.fastload_before else [])
    why_not_duckdb = duckdb_problem(args.duckdb_python)
    if why_not_duckdb:
        readers.remove("duckdb")
        print(f"duckdb: not measured: {why_not_duckdb}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="fastload-parquet-read-"))
    make_source(work / "src", args.months, args.rows, args.img_bytes)
    fastload.pack(
        work / "src",
        work / "ds",
        shard_format="parquet",
        shard_size_bytes=int(args.shard_mib * (1 << 20)),
        row_group_bytes=args.row_group_kib << 10,
        partition_level=0,
        partition_name="month",
        progress=False,
    )
    files = sorted(f for f in (work / "ds").rglob("*") if f.is_file())
    data_bytes = sum(f.stat().st_size for f in files if f.suffix == ".parquet")
    rgw = rgw_module.RadosGateway(memstore_bytes=max(256 << 20, 3 * data_bytes), timeout_s=150)
    began = time.perf_counter()
    rgw.start()
    print(
        f"RGW up in {time.perf_counter() - began:.0f} s; {len(files)} files, "
        f"{data_bytes / 1e6:.1f} MB of Parquet"
    )
    results: list[dict[str, Any]] = []
    try:
        client = rgw.client()
        client.create_bucket(Bucket=BUCKET)
        for f in files:
            client.put_object(
                Bucket=BUCKET, Key=f"{PREFIX}/{f.relative_to(work / 'ds').as_posix()}", Body=f.read_bytes()
            )
        with FaultProxy(rgw.endpoint_url) as proxy:
            base = {
                "endpoint": proxy.endpoint_url,
                "url": f"s3://{BUCKET}/{PREFIX}",
                "access_key": rgw.access_key,
                "secret_key": rgw.secret_key,
            }
            for rep in range(args.reps):
                for read in READS:
                    order = readers[rep % len(readers) :] + readers[: rep % len(readers)]
                    for reader in order:
                        before = proxy.stats()
                        python = args.duckdb_python if reader == "duckdb" else sys.executable
                        before_path = args.fastload_before if reader == "fastload-before" else None
                        got = run_child(python, reader, {**base, "read": read}, before_path)
                        after = proxy.stats()
                        got.update(
                            rep=rep,
                            read=read,
                            reader=reader,
                            bytes=after.bytes_to_client - before.bytes_to_client,
                            requests=after.requests - before.requests,
                        )
                        results.append(got)
                        print(json.dumps(got), flush=True)
    finally:
        rgw.stop()
    report = summarize(results, readers, data_bytes)
    report["why_not_duckdb"] = why_not_duckdb
    report["machine"] = machine()
    report["command"] = "python benchmarks/parquet_read.py " + " ".join(argv or sys.argv[1:])
    print(render(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


def summarize(results: list[dict[str, Any]], readers: list[str], data_bytes: int) -> dict[str, Any]:
    table: dict[str, dict[str, Any]] = {}
    for read in READS:
        for reader in readers:
            runs = [r for r in results if r["read"] == read and r["reader"] == reader]
            ok = [r for r in runs if "error" in r] == []
            cell: dict[str, Any] = {"error": next((r["error"] for r in runs if "error" in r), None)}
            if ok and runs:
                seconds = statistics.median(r["seconds"] for r in runs)
                cell.update(
                    rows=runs[0]["rows"],
                    bytes=statistics.median(r["bytes"] for r in runs),
                    requests=statistics.median(r["requests"] for r in runs),
                    seconds=seconds,
                    rows_s=runs[0]["rows"] / seconds,
                )
            table[f"{read}/{reader}"] = cell
    full = table.get("full/fastload", {}).get("bytes")
    targets = {}
    if full:
        for read, limit in (("column", 0.02), ("partition", 0.1), ("dates", 0.1)):
            b = table.get(f"{read}/fastload", {}).get("bytes")
            targets[read] = {"ratio": None if b is None else b / full, "limit": limit}
    # pyarrow's seconds over each fastload reader's, repetition by repetition (above 1: fastload faster)
    ratios: dict[str, list[float]] = {}
    for read in READS:
        for reader in (r for r in readers if r.startswith("fastload")):
            pairs = [
                (a["seconds"], b["seconds"])
                for a in results
                for b in results
                if a["read"] == b["read"] == read and a["rep"] == b["rep"]
                if a["reader"] == "pyarrow"
                and b["reader"] == reader
                and "error" not in a
                and "error" not in b
            ]
            ratios[f"{read}/{reader}"] = [round(x / y, 3) for x, y in pairs]
    return {
        "cells": table,
        "targets": targets,
        "ratios": ratios,
        "data_bytes": data_bytes,
        "readers": readers,
    }


def render(report: dict[str, Any]) -> str:
    lines = [
        "| read | reader | rows | bytes fetched | requests | s | rows/s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, c in report["cells"].items():
        read, reader = key.split("/")
        if c.get("error"):
            lines.append(f"| {read} | {reader} | error: {c['error'][:80]} | | | | |")
            continue
        lines.append(
            f"| {read} | {reader} | {c['rows']:,} | {c['bytes']:,.0f} | {c['requests']:.0f} | "
            f"{c['seconds']:.2f} | {c['rows_s']:,.0f} |"
        )
    lines.append("")
    for read, t in report["targets"].items():
        ok = t["ratio"] is not None and t["ratio"] <= t["limit"]
        verdict = "met" if ok else "MISSED"
        lines.append(
            f"- {read}: fastload fetched {t['ratio']:.4f} of its full read's bytes (target <= {t['limit']}): "
            f"{verdict}"
        )
    for key, values in report.get("ratios", {}).items():
        if values:
            shown = " / ".join(f"{v:.2f}" for v in values)
            middle = statistics.median(values)
            lines.append(f"- {key}: pyarrow s / fastload s by repetition {shown} (median {middle:.2f})")
    if report.get("why_not_duckdb"):
        lines.append(f"- duckdb: not measured: {report['why_not_duckdb']}")
    lines.append(f"\nMachine: {report.get('machine', '')}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
