"""Packing benchmark: ``fastload pack`` (tar and Parquet) against its peers on one generated tree.

Peers, each run in a subprocess of its own so that peak RSS is per tool:

- ``gnu-tar``: ``tar -cf archive.tar -C SRC .`` (one archive), the physical reference;
- ``fastload-tar``: ``fastload.pack(src, dst, progress=False)`` (256 MiB tar shards, index, CRC32C);
- ``fastload-parquet``: the same with ``shard_format="parquet"``;
- ``wds-shardwriter``: list the tree, group files into samples, read each file and write the samples with
  ``webdataset.ShardWriter(maxsize=256 MiB)``;
- ``pyarrow-parquet``: list and group the same way, read every 256 MiB of samples into a table and write it
  with ``pq.write_table(table, path, compression="none")`` (the files are incompressible, as images are).

The tree: ``--files`` files of 30-120 KiB of random bytes (fixed seed), as samples of two files each, a
``.jpg`` and a ``.seg.png`` (the last sample has only a ``.jpg`` when the count is odd), 1,000 samples per
folder. The tools run interleaved: every repetition runs every tool once, in an order rotated by one per
repetition. Before every run the source tree is read whole, so every tool starts with it in the page cache
(``mincore`` counts the resident pages, reported); each output is removed after its run and the file
system synced (neither is timed). A Python tool's time
covers its whole job (listing, reading, writing, fastload's index and checksums) but not its imports; GNU
tar's time is its process's wall time.

    python benchmarks/pack.py                               # 20,000 files, 3 repetitions
    python benchmarks/pack.py --files 2000 --reps 1 --json /tmp/pack.json --keep-tree
    python benchmarks/pack.py --child fastload-tar SRC DST    # one tool alone, e.g. under a profiler
    python benchmarks/pack.py --engine ray                    # local engine vs Ray engine, tar and Parquet
    python benchmarks/pack.py --workers 1                     # fastload with 1 shard-writing thread

With ``--engine ray`` the parent starts a Ray cluster of this machine (one CPU per usable core) and each
``*-ray`` tool connects to it and warms one worker per CPU before its clock starts (Ray starts workers per
job; a long-running job has them); that untimed setup and the driver's listing + planning time are
reported beside the ratio to the local engine.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import importlib.metadata
import json
import logging
import mmap
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

SEED = 20240611
MIN_FILE_BYTES = 30 << 10
MAX_FILE_BYTES = 120 << 10
SAMPLES_PER_FOLDER = 1000
SHARD_BYTES = 256 << 20
FIELDS = ("jpg", "seg.png")
TOOLS = ("gnu-tar", "fastload-tar", "fastload-parquet", "wds-shardwriter", "pyarrow-parquet")
LABELS = {
    "gnu-tar": "GNU tar -cf",
    "fastload-tar": "fastload pack (tar)",
    "fastload-parquet": "fastload pack --format parquet",
    "wds-shardwriter": "webdataset ShardWriter",
    "pyarrow-parquet": "pyarrow pq.write_table",
    "fastload-tar-ray": "fastload pack --engine ray (tar)",
    "fastload-parquet-ray": "fastload pack --engine ray --format parquet",
}
# --engine ray: each Ray tool against the local engine on the same options, on a Ray cluster of this machine
RAY_LOCAL = {"fastload-tar-ray": "fastload-tar", "fastload-parquet-ray": "fastload-parquet"}
ENGINE_TOOLS = {
    "local": TOOLS,
    "ray": ("fastload-tar", "fastload-tar-ray", "fastload-parquet", "fastload-parquet-ray"),
}
RAY_MAX_TIME_RATIO = 1.3  # target: the Ray engine takes at most 1.3x the local engine's time
REFERENCE, PEER = "gnu-tar", "wds-shardwriter"
TARGETS = {"fastload-tar": 0.8, "fastload-parquet": 0.6}  # minimum throughput as a fraction of GNU tar's
TREE_VERSION = 1  # bump when the tree's layout or contents change, so cached trees are rebuilt
WARM_BUFFER_BYTES = 1 << 20
TIME = "/usr/bin/time"
WORKERS_ENV = "FASTLOAD_BENCH_WORKERS"  # the parent's --workers, for the fastload tools it runs


# ---------------------------------------------------------------------------------------------- pure core


def tree_layout(files: int, seed: int = SEED) -> list[tuple[str, int]]:
    """``(relpath, size)`` of every file of the benchmark tree, in the order their bytes are drawn."""
    if files < 1:
        raise ValueError(f"{files=} must be >= 1")
    rng = np.random.default_rng(seed)
    sizes = rng.integers(MIN_FILE_BYTES, MAX_FILE_BYTES, size=files, endpoint=True).tolist()
    paths = []
    for i in range(files):
        sample = i // len(FIELDS)
        paths.append(f"{sample // SAMPLES_PER_FOLDER:03d}/{sample:07d}.{FIELDS[i % len(FIELDS)]}")
    return list(zip(paths, sizes, strict=True))


def rotated(tools: Sequence[str], rep: int) -> list[str]:
    """The run order of repetition ``rep``: ``tools`` rotated left by ``rep``."""
    k = rep % len(tools)
    return [*tools[k:], *tools[:k]]


@dataclass
class Run:
    """One tool's run in one repetition."""

    rep: int
    position: int  # place in that repetition's order, from 0
    tool: str
    seconds: float  # the tool's own job (Python tools: without imports)
    wall_s: float  # the whole subprocess, from launch to exit
    files: int
    samples: int
    output_bytes: int
    output_files: int
    max_rss_bytes: int
    user_s: float
    sys_s: float
    warm_read_gbps: float  # the page-cache read of the source tree just before this run
    resident: float | None  # the fraction of the source tree in the page cache after that read (mincore)
    load_1min: float  # the 1-minute load average just before this run (other processes mean noise)
    ray_setup_s: float = 0.0  # Ray tools: ray.init + one warm-up task per CPU, before the clock (not timed)
    plan_s: float = 0.0  # Ray tools: listing + planning alone, measured after the timed run (not timed)


def summarize(runs: Sequence[Run], tools: Sequence[str], *, files: int, payload_bytes: int) -> dict[str, Any]:
    """Medians per tool, throughput ratios (of medians, and paired per repetition) and target checks."""
    by_tool = {t: sorted((r for r in runs if r.tool == t), key=lambda r: r.rep) for t in tools}
    median_s = {t: statistics.median(r.seconds for r in rs) for t, rs in by_tool.items()}
    out: dict[str, Any] = {}
    for tool, rs in by_tool.items():
        secs = [r.seconds for r in rs]
        row: dict[str, Any] = {
            "label": LABELS[tool],
            "reps": len(rs),
            "seconds": secs,
            "median_s": median_s[tool],
            "min_s": min(secs),
            "max_s": max(secs),
            "files_per_s": files / median_s[tool],
            "mb_per_s": payload_bytes / 1e6 / median_s[tool],
            "max_rss_mib": statistics.median(r.max_rss_bytes for r in rs) / 2**20,
            "cpu_s": statistics.median(r.user_s + r.sys_s for r in rs),
            "output_bytes": rs[0].output_bytes,
            "output_files": rs[0].output_files,
        }
        for ref, name in ((REFERENCE, "gnu_tar"), (PEER, "shardwriter")):
            if ref not in by_tool:
                continue
            # throughput ratio = inverse time ratio; paired = within each repetition (cancels slow drift)
            row[f"x_{name}"] = median_s[ref] / median_s[tool]
            row[f"x_{name}_per_rep"] = [b.seconds / a.seconds for a, b in zip(rs, by_tool[ref], strict=True)]
        out[tool] = row
    targets = {}
    for tool, minimum in TARGETS.items():
        if tool in out and REFERENCE in out:
            got = out[tool]["x_gnu_tar"]
            targets[tool] = {"min_x_gnu_tar": minimum, "x_gnu_tar": got, "met": got >= minimum}
    ray_targets = {}
    for tool, local in RAY_LOCAL.items():
        if tool in out and local in out:
            pairs = zip(by_tool[tool], by_tool[local], strict=True)
            out[tool]["x_local_time"] = got = median_s[tool] / median_s[local]
            out[tool]["x_local_time_per_rep"] = [a.seconds / b.seconds for a, b in pairs]
            out[tool]["ray_setup_s"] = statistics.median(r.ray_setup_s for r in by_tool[tool])
            out[tool]["plan_s"] = statistics.median(r.plan_s for r in by_tool[tool])
            ray_targets[tool] = {"max_x_local_time": RAY_MAX_TIME_RATIO, "x_local_time": got}
    return {"tools": out, "targets": targets, "ray_targets": ray_targets}


def format_table(summary: dict[str, Any]) -> str:
    """The summary as a Markdown table (medians; ratios are throughput relative to the named tool)."""
    rows = [
        (
            "tool",
            "median s",
            "files/s",
            "MB/s",
            "x GNU tar",
            "x tar, rep range",
            "x ShardWriter",
            "peak RSS MiB",
            "CPU s",
        )
    ]
    for row in summary["tools"].values():
        per_rep = row.get("x_gnu_tar_per_rep")
        rows.append(
            (
                row["label"],
                f"{row['median_s']:.2f}",
                f"{row['files_per_s']:,.0f}",
                f"{row['mb_per_s']:,.0f}",
                f"{row['x_gnu_tar']:.2f}" if "x_gnu_tar" in row else "-",
                f"{min(per_rep):.2f}-{max(per_rep):.2f}" if per_rep else "-",
                f"{row['x_shardwriter']:.2f}" if "x_shardwriter" in row else "-",
                f"{row['max_rss_mib']:,.0f}",
                f"{row['cpu_s']:.2f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]

    def line(cells: Sequence[str]) -> str:
        return (
            "| "
            + " | ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )
            + " |"
        )

    sep = "|" + "|".join("-" * (w + 1) + ("-" if i == 0 else ":") for i, w in enumerate(widths)) + "|"
    lines = [line(rows[0]), sep, *(line(r) for r in rows[1:])]
    for tool, t in summary["targets"].items():
        lines.append(
            f"target {LABELS[tool]}: >= {t['min_x_gnu_tar']:.2f}x GNU tar, measured "
            f"{t['x_gnu_tar']:.2f}x -> {'met' if t['met'] else 'MISSED'}"
        )
    for tool, t in summary.get("ray_targets", {}).items():
        row = summary["tools"][tool]
        per_rep = row["x_local_time_per_rep"]
        lines.append(
            f"{LABELS[tool]}: {t['x_local_time']:.2f}x the local engine's time (reps {min(per_rep):.2f}-"
            f"{max(per_rep):.2f}); target <= {t['max_x_local_time']:.2f}x -> "
            f"{'met' if t['x_local_time'] <= t['max_x_local_time'] else 'MISSED'}; untimed: Ray connect + "
            f"worker warm-up {row['ray_setup_s']:.2f} s, listing + planning alone {row['plan_s']:.2f} s "
            "(peak RSS and CPU s of Ray tools are the driver's only)"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------- the tools (child processes)


def _samples(src: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """The tree's samples in key order by WebDataset's rule (key = folder + name up to the first dot)."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for folder, dirs, names in os.walk(src):
        dirs.sort()
        rel = os.path.relpath(folder, src)
        for name in sorted(names):
            stem, _, field = name.partition(".")
            key = stem if rel == "." else f"{rel}/{stem}"
            groups.setdefault(key, []).append((field, os.path.join(folder, name)))
    return sorted(groups.items())


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _wds_shardwriter(src: str, dst: str) -> tuple[int, int]:
    import webdataset as wds

    files = samples = 0
    with wds.ShardWriter(os.path.join(dst, "shard-%06d.tar"), maxsize=SHARD_BYTES, verbose=0) as sink:
        for key, members in _samples(src):
            sample: dict[str, Any] = {"__key__": key}
            for field, path in members:
                sample[field] = _read(path)
            sink.write(sample)
            files += len(members)
            samples += 1
    return files, samples


def _pyarrow_parquet(src: str, dst: str) -> tuple[int, int]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    samples = _samples(src)
    fields = sorted({f for _, members in samples for f, _ in members})
    schema = pa.schema([pa.field("__key__", pa.string())] + [pa.field(f, pa.binary()) for f in fields])
    files = shard = size = 0
    keys: list[str] = []
    columns: dict[str, list[bytes | None]] = {f: [] for f in fields}

    def flush() -> None:
        table = pa.table({"__key__": keys, **columns}, schema=schema)
        pq.write_table(table, os.path.join(dst, f"shard-{shard:06d}.parquet"), compression="none")
        keys.clear()
        for values in columns.values():
            values.clear()

    for key, members in samples:
        data = dict(members)
        keys.append(key)
        for f in fields:
            value = _read(data[f]) if f in data else None
            columns[f].append(value)
            size += len(value or b"")
        files += len(members)
        if size >= SHARD_BYTES:
            flush()
            shard, size = shard + 1, 0
    if keys:
        flush()
    return files, len(samples)


def _fastload(src: str, dst: str, shard_format: str, engine: str = "local") -> tuple[int, int]:
    import fastload

    workers = int(os.environ.get(WORKERS_ENV, "0")) or None  # (--workers, from the parent)
    report = fastload.pack(
        src, dst, progress=False, shard_format=shard_format, engine=engine, workers=workers
    )
    return report.files, report.index.samples


def _ray_connect(modules: Sequence[str]) -> float:
    """Connect to the cluster at ``RAY_ADDRESS`` (set by the parent) and run one task per CPU that imports
    ``modules``, so that this job's workers (Ray starts them per job) are up before the clock, as they are
    in a long-running job; return the seconds that took."""
    import ray

    began = time.perf_counter()
    ray.init(include_dashboard=False, logging_level=logging.WARNING)

    @ray.remote(num_cpus=1)
    def warm(names: list[str]) -> int:
        for name in names:
            importlib.import_module(name)
        time.sleep(0.5)  # hold the CPU, so that every task starts a worker of its own
        return os.getpid()

    cpus = int(ray.cluster_resources().get("CPU", 1))
    ray.get([warm.remote(list(modules)) for _ in range(cpus)])
    return time.perf_counter() - began


def _plan_seconds(src: str, shard_format: str) -> float:
    """Listing and planning alone (the driver's serial part), as ``fastload.pack`` does them."""
    import gc

    from fastload.config import PackConfig
    from fastload.packing.plan import plan_pack

    gc.disable()
    try:
        began = time.perf_counter()
        plan_pack([src], PackConfig(shard_format=shard_format), None)
        return time.perf_counter() - began
    finally:
        gc.enable()


# Imported before the clock starts, as a long-running job has them already (fastload may import its writers
# lazily). pyarrow imports pandas, when installed, on the first pa.array() or pa.table() call (0.2-0.6 s
# here), so the Parquet tools import it up front too.
IMPORTS = {
    "fastload-tar": ("fastload", "fastload.formats.tar.writer"),
    "fastload-parquet": ("fastload", "fastload.formats.parquet.writer", "pyarrow.parquet"),
    "wds-shardwriter": ("webdataset",),
    "pyarrow-parquet": ("pyarrow.parquet",),
    "fastload-tar-ray": ("fastload", "fastload.formats.tar.writer", "fastload.packing.ray_engine", "ray"),
    "fastload-parquet-ray": (
        "fastload",
        "fastload.formats.parquet.writer",
        "fastload.packing.ray_engine",
        "pyarrow.parquet",
        "ray",
    ),
}
IMPORTS_IF_INSTALLED = {
    "fastload-parquet": ("pandas",),
    "pyarrow-parquet": ("pandas",),
    "fastload-parquet-ray": ("pandas",),
}
CHILDREN = {
    "fastload-tar": lambda src, dst: _fastload(src, dst, "tar"),
    "fastload-parquet": lambda src, dst: _fastload(src, dst, "parquet"),
    "wds-shardwriter": _wds_shardwriter,
    "pyarrow-parquet": _pyarrow_parquet,
    "fastload-tar-ray": lambda src, dst: _fastload(src, dst, "tar", engine="ray"),
    "fastload-parquet-ray": lambda src, dst: _fastload(src, dst, "parquet", engine="ray"),
}


def run_child(tool: str, src: str, dst: str, result_path: str | None) -> int:
    """Run one Python tool in this process (``dst`` must not exist) and write what it did as JSON."""
    for module in IMPORTS[tool]:  # peak RSS still counts them (webdataset imports torch)
        importlib.import_module(module)
    for module in IMPORTS_IF_INSTALLED.get(tool, ()):
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    if not tool.startswith("fastload"):
        os.makedirs(dst)
    ray_setup_s = _ray_connect(IMPORTS[tool]) if tool in RAY_LOCAL else 0.0
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    began = time.perf_counter()
    files, samples = CHILDREN[tool](src, dst)
    seconds = time.perf_counter() - began
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    result = {
        "tool": tool,
        "seconds": seconds,
        "files": files,
        "samples": samples,
        "user_s": cpu_after.ru_utime - cpu_before.ru_utime,
        "sys_s": cpu_after.ru_stime - cpu_before.ru_stime,
    }
    if tool in RAY_LOCAL:
        result["ray_setup_s"] = ray_setup_s
        result["plan_s"] = _plan_seconds(src, "parquet" if "parquet" in tool else "tar")
    text = json.dumps(result)
    if result_path:
        with open(result_path, "w") as f:
            f.write(text)
    else:
        print(text)
    return 0


# ------------------------------------------------------------------------------------ the parent's I/O


def make_tree(root: str, files: int, seed: int = SEED) -> int:
    """Write the benchmark tree under ``root``; return its payload bytes."""
    rng = np.random.default_rng(seed + 1)
    total = 0
    for relpath, size in tree_layout(files, seed):
        path = os.path.join(root, relpath)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(rng.bytes(size))
        total += size
    return total


def tree_stats(root: str) -> tuple[int, int]:
    """``(files, bytes)`` under ``root``."""
    files = total = 0
    for folder, _, names in os.walk(root):
        for name in names:
            files += 1
            total += os.path.getsize(os.path.join(folder, name))
    return files, total


def prepare_tree(workdir: str, files: int, keep: bool) -> tuple[str, int, bool]:
    """The source tree's folder, its payload bytes, and whether it was reused from an earlier run."""
    expected = sum(size for _, size in tree_layout(files))
    if keep:
        base = os.path.join(workdir, f"tree-v{TREE_VERSION}-{files}files-seed{SEED}")
        src, marker = os.path.join(base, "src"), os.path.join(base, "complete.json")
        if os.path.exists(marker) and tree_stats(src) == (files, expected):
            return src, expected, True
        shutil.rmtree(base, ignore_errors=True)
    else:
        base = tempfile.mkdtemp(prefix="tree-", dir=workdir)
        src, marker = os.path.join(base, "src"), os.path.join(base, "complete.json")
    print(f"generating {files:,} files ({expected / 1e6:,.0f} MB) in {src} ...", file=sys.stderr, flush=True)
    try:
        make_tree(src, files)
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise
    os.sync()  # so the tree's write-back does not land in the first runs
    with open(marker, "w") as f:
        json.dump({"files": files, "bytes": expected, "seed": SEED, "version": TREE_VERSION}, f)
    return src, expected, False


def warm(root: str) -> float:
    """Read every file under ``root`` (into the page cache); return the read's GB/s."""
    buf = bytearray(WARM_BUFFER_BYTES)
    total = 0
    began = time.perf_counter()
    for folder, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(folder, name), "rb", buffering=0) as f:
                while n := f.readinto(buf):
                    total += n
    return total / 1e9 / (time.perf_counter() - began)


def resident_fraction(root: str) -> float | None:
    """The fraction of the pages of the files under ``root`` that are in the page cache (``mincore``), or
    None where that cannot be asked."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    except (OSError, AttributeError):
        return None
    page = mmap.PAGESIZE
    resident = pages = 0
    for folder, _, names in os.walk(root):
        for name in names:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                size = os.fstat(fd).st_size
                if not size:
                    continue
                addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
                if addr in (None, ctypes.c_void_p(-1).value):
                    return None
                n = (size + page - 1) // page
                vec = ctypes.create_string_buffer(n)
                ok = libc.mincore(addr, size, vec) == 0
                libc.munmap(addr, size)
                if not ok:
                    return None
                resident += n - vec.raw.count(0)  # the low bit says resident; the others are 0
                pages += n
            finally:
                os.close(fd)
    return resident / pages if pages else None


def run_tool(tool: str, src: str, dst: str, scratch: str) -> dict[str, Any]:
    """Run ``tool`` in a subprocess; return its figures.

    Peak RSS comes from ``wait4``, except GNU tar's: a child's peak includes the moment before ``exec``,
    when it is a copy of this process, so tar is measured by ``/usr/bin/time`` (when installed), which
    forks it from a small process. A Python tool's time and CPU seconds cover its job, not its imports.
    """
    result_path = os.path.join(scratch, "result.json")
    log_path = os.path.join(scratch, "child.log")
    rss_path = os.path.join(scratch, "rss.txt")
    if tool == "gnu-tar":
        os.makedirs(dst)
        cmd = ["tar", "-cf", os.path.join(dst, "archive.tar"), "-C", src, "."]
        if os.access(TIME, os.X_OK):
            cmd = [TIME, "-f", "%M", "-o", rss_path, *cmd]
    else:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", tool, src, dst, result_path]
    with open(log_path, "wb") as log:
        began = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - began
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        with open(log_path, errors="replace") as f:
            tail = f.read()[-4000:]
        raise RuntimeError(f"{tool} failed with exit status {proc.returncode}:\n{tail}")
    if tool == "gnu-tar":
        child = {
            "seconds": wall,
            "files": -1,
            "samples": -1,
            "user_s": usage.ru_utime,
            "sys_s": usage.ru_stime,
        }
    else:
        with open(result_path) as f:
            child = json.load(f)
        os.unlink(result_path)
    max_rss_bytes = usage.ru_maxrss * 1024
    if os.path.exists(rss_path):
        with open(rss_path) as f:
            max_rss_bytes = int(f.read().split()[-1]) * 1024
        os.unlink(rss_path)
    out_files, out_bytes = tree_stats(dst)
    return {
        "seconds": child["seconds"],
        "wall_s": wall,
        "files": child["files"],
        "samples": child["samples"],
        "output_bytes": out_bytes,
        "output_files": out_files,
        "max_rss_bytes": max_rss_bytes,
        "user_s": child["user_s"],
        "sys_s": child["sys_s"],
        "ray_setup_s": child.get("ray_setup_s", 0.0),
        "plan_s": child.get("plan_s", 0.0),
    }


def _first_line(cmd: Sequence[str], cwd: str | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=30, cwd=cwd).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0] if out else ""


def machine_info() -> dict[str, Any]:
    """CPU, cores, memory, OS, Python, package versions, GNU tar, and fastload's git commit."""
    info: dict[str, Any] = {
        "cpu_model": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "os": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
    }
    try:
        with open("/proc/cpuinfo") as f:
            models = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        info["cpu_model"] = models[0] if models else info["cpu_model"]
        with open("/proc/meminfo") as f:
            mem = {ln.split(":")[0]: int(ln.split()[1]) * 1024 for ln in f}
        info["ram_bytes"] = mem["MemTotal"]
        info["ram_available_bytes"] = mem.get("MemAvailable")
    except OSError:
        pass
    info["packages"] = {}
    for name in ("fastload", "pyarrow", "webdataset", "crc32c", "numpy", "ray"):
        try:
            info["packages"][name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            info["packages"][name] = None
    info["gnu_tar"] = _first_line(["tar", "--version"])
    # the fastload the tool processes import (PYTHONPATH may point at another checkout) and its commit
    where = _first_line(
        [sys.executable, "-c", "import fastload, os; print(os.path.dirname(fastload.__file__))"], cwd=os.sep
    )
    info["fastload_path"] = where
    commit = _first_line(["git", "-C", where, "rev-parse", "HEAD"]) if where else None
    if commit:
        dirty = _first_line(["git", "-C", where, "status", "--porcelain", "--", "."])
        info["fastload_git"] = {"commit": commit, "uncommitted_changes": bool(dirty)}
    return info


def describe(info: dict[str, Any]) -> str:
    """One line naming the machine and the software measured."""
    cores = f"{info['cpu_model']}, {info['cpus_usable']} usable of {info['cpu_count']} cores"
    if info.get("ram_bytes"):
        cores += f", {info['ram_bytes'] / 2**30:.0f} GiB RAM"
    packages = ", ".join(f"{k} {v}" for k, v in info["packages"].items())
    where = f"fastload from {info.get('fastload_path')}"
    git = info.get("fastload_git")
    if git:
        where += (
            f" (git {git['commit'][:10]}{', with uncommitted changes' if git['uncommitted_changes'] else ''})"
        )
    return "; ".join([cores, info["os"], info["python"], packages, str(info["gnu_tar"]), where])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/pack.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--files", type=int, default=20_000, help="files in the tree (default 20,000)")
    parser.add_argument(
        "--reps", type=int, default=3, help="repetitions, each running every tool once (default 3)"
    )
    parser.add_argument(
        "--workdir",
        default=os.path.join(tempfile.gettempdir(), "fastload-bench"),
        help="where the tree and the outputs go (default %(default)s)",
    )
    parser.add_argument(
        "--keep-tree",
        action="store_true",
        help="reuse the tree from an earlier --keep-tree run if there is one, and keep it",
    )
    parser.add_argument(
        "--tools",
        default=None,
        help=f"comma-separated subset of {','.join(TOOLS + tuple(RAY_LOCAL))} (default: the --engine's set)",
    )
    parser.add_argument(
        "--engine",
        choices=tuple(ENGINE_TOOLS),
        default="local",
        help="local (default): fastload against its peers; ray: each fastload format on the local engine "
        "and on Ray (a Ray cluster of this machine is started for the run)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write every figure and the machine to FILE")
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="fastload pack's workers (shard-writing threads; default: one per core)",
    )
    args = parser.parse_args(argv)
    known = TOOLS + tuple(RAY_LOCAL)
    tools = ",".join(ENGINE_TOOLS[args.engine]) if args.tools is None else args.tools
    args.tools = [t.strip() for t in tools.split(",") if t.strip()]
    unknown = sorted(set(args.tools) - set(known))
    if unknown or not args.tools:
        parser.error(f"--tools {','.join(unknown) or '(empty)'}: choose from {','.join(known)}")
    if args.files < 1 or args.reps < 1:
        parser.error(f"--files {args.files} and --reps {args.reps} must both be >= 1")
    return args


def run_rounds(
    tools: Sequence[str], reps: int, src: str, scratch: str, files: int, payload: int
) -> list[Run]:
    """Every repetition runs every tool once, in rotated order, each from a warm page cache."""
    dst = os.path.join(scratch, "out")
    runs: list[Run] = []
    print(f"warming the page cache: {warm(src):.2f} GB/s", file=sys.stderr, flush=True)
    for rep in range(reps):
        for position, tool in enumerate(rotated(tools, rep)):
            gbps = warm(src)
            resident = resident_fraction(src)
            load = os.getloadavg()[0]
            figures = run_tool(tool, src, dst, scratch)
            shutil.rmtree(dst)
            os.sync()
            if figures["files"] not in (-1, files):
                raise RuntimeError(f"{tool} packed {figures['files']} files, expected {files}")
            run = Run(
                rep=rep,
                position=position,
                tool=tool,
                warm_read_gbps=gbps,
                resident=resident,
                load_1min=load,
                **figures,
            )
            runs.append(run)
            print(
                f"rep {rep + 1}/{reps} {tool:17s} {run.seconds:7.2f} s "
                f"{payload / 1e6 / run.seconds:7.0f} MB/s "
                f"rss {run.max_rss_bytes / 2**20:6.0f} MiB (source read before it: {gbps:.1f} GB/s, "
                f"load {load:.1f})",
                file=sys.stderr,
                flush=True,
            )
    return runs


@contextlib.contextmanager
def ray_cluster(needed: bool) -> Iterator[None]:
    """A Ray cluster of this machine (one CPU per usable core) for the Ray tools, which connect to it through
    ``RAY_ADDRESS``; shut down (only it) afterwards."""
    if not needed:
        yield
        return
    import ray

    cpus = len(os.sched_getaffinity(0))
    ray.init(num_cpus=cpus, include_dashboard=False, logging_level=logging.WARNING)
    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    print(f"Ray cluster at {os.environ['RAY_ADDRESS']} with {cpus} CPUs", file=sys.stderr, flush=True)
    try:
        yield
    finally:
        del os.environ["RAY_ADDRESS"]
        ray.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        tool, src, dst, *rest = argv[1:]
        return run_child(tool, src, dst, rest[0] if rest else None)
    args = parse_args(argv)
    if args.workers is not None:
        if args.workers < 1:
            raise SystemExit(f"--workers {args.workers} must be >= 1")
        os.environ[WORKERS_ENV] = str(args.workers)
    os.makedirs(args.workdir, exist_ok=True)
    info = machine_info()
    load_before = os.getloadavg()
    src, payload, reused = prepare_tree(args.workdir, args.files, args.keep_tree)
    if info.get("ram_available_bytes") and payload * 2 > info["ram_available_bytes"]:
        print(
            f"warning: the tree ({payload / 1e9:.1f} GB) and an output may not both fit in the page cache",
            file=sys.stderr,
        )
    scratch = tempfile.mkdtemp(prefix="run-", dir=args.workdir)
    try:
        with ray_cluster(any(t in RAY_LOCAL for t in args.tools)):
            runs = run_rounds(args.tools, args.reps, src, scratch, args.files, payload)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if not args.keep_tree:
            shutil.rmtree(os.path.dirname(src), ignore_errors=True)
    load_after = os.getloadavg()
    summary = summarize(runs, args.tools, files=args.files, payload_bytes=payload)
    min_gbps = min(r.warm_read_gbps for r in runs)
    residency = [r.resident for r in runs if r.resident is not None]
    in_cache = f"; at least {min(residency):.2%} of its pages were in the cache" if residency else ""
    command = "python benchmarks/pack.py" + "".join(f" {a}" for a in argv)
    print(f"\n{command}\n{describe(info)}")
    print(
        f"tree: {args.files:,} files of 30-120 KiB random bytes ({payload / 1e6:,.0f} MB), "
        f"{(args.files + 1) // 2:,} samples of .jpg + .seg.png, seed {SEED}" + (" (reused)" if reused else "")
    )
    print(
        "page cache: the source tree was read whole before every run "
        f"(slowest such read: {min_gbps:.1f} GB/s{in_cache})"
    )
    print(
        f"medians of {args.reps} interleaved repetition(s); MB = 1e6 bytes of file payload; ratios are "
        f"throughput; load average before {load_before[0]:.2f}, after {load_after[0]:.2f}\n"
    )
    print(format_table(summary))
    if args.json:
        tree = {
            "files": args.files,
            "samples": (args.files + 1) // 2,
            "payload_bytes": payload,
            "min_file_bytes": MIN_FILE_BYTES,
            "max_file_bytes": MAX_FILE_BYTES,
            "fields": list(FIELDS),
            "seed": SEED,
            "reused": reused,
        }
        settings = {
            "reps": args.reps,
            "tools": args.tools,
            "shard_bytes": SHARD_BYTES,
            "page_cache": "source tree read whole before every run",
            "min_warm_read_gbps": min_gbps,
            "min_resident_fraction": min(residency) if residency else None,
        }
        record = {
            "benchmark": "pack",
            "command": command,
            "machine": info,
            "tree": tree,
            "settings": settings,
            "load_average": {"before": load_before, "after": load_after},
            "runs": [asdict(r) for r in runs],
            "summary": summary,
        }
        with open(args.json, "w") as f:
            json.dump(record, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
