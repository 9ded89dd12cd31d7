"""Writer benchmark: ``fastload.ShardWriter`` against webdataset's ``ShardWriter`` and MosaicML's
``MDSWriter`` on the same samples, written from one Python loop.

Each sample is ``{"__key__": "%08d", "jpg": <random bytes, 80-120 KiB>, "json": {"label": i}, "txt": a
caption}`` (JPEG-sized, incompressible; the byte buffers come from a pool of 64 generated once, so the
loop does no generating). Every writer gets the same objects and encodes ``json``/``txt`` itself:

- ``fastload``: ``fastload.ShardWriter(dst, shard_size_bytes=256 MiB)`` (tar shards, sample tables with
  every sample's CRC32C, ``index.json``), ``workers=1`` (one background writer thread);
- ``fastload-w2``: the same with ``workers=2`` (the default);
- ``wds``: ``webdataset.ShardWriter(pattern, maxsize=256 MiB)`` (tar shards through Python's tarfile);
- ``mds``: ``streaming.MDSWriter(out=dst, columns={jpg: bytes, json: json, txt: str, __key__: str},
  size_limit=256 MiB)``, uncompressed, no hashes (if ``mosaicml-streaming`` is installed; it is imported
  without its package ``__init__``, which needs ``transformers`` for its multimodal datasets).

A run's time is from opening the writer to its ``close()`` returning (every shard and index on disk); the
output is removed and the file system synced after each run (not timed). Tools run interleaved, in an order
rotated by one each repetition; medians and ranges are reported, and each tool's ratio to ``wds``; also
the CPU seconds of the process (every thread) per run, the better measure on a loaded machine.

    python benchmarks/writer.py                      # 20,000 samples, 3 repetitions
    python benchmarks/writer.py --samples 5000 --reps 3 --json /tmp/writer.json
    python benchmarks/writer.py --only fastload      # one tool, e.g. under py-spy
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

SEED = 20240611
SHARD_BYTES = 256 << 20
TOOLS = ("fastload", "fastload-w2", "wds", "mds")


def sample_stream(n: int, seed: int = SEED) -> Iterator[dict[str, Any]]:
    import random

    rng = random.Random(seed)
    pool = [rng.randbytes(rng.randrange(80 << 10, 120 << 10)) for _ in range(64)]
    for i in range(n):
        yield {
            "__key__": f"{i:08d}",
            "jpg": pool[i % len(pool)],
            "json": {"label": i % 1000, "source": "bench"},
            "txt": f"a photo of thing number {i}",
        }


def payload_bytes(n: int) -> int:
    return sum(len(s["jpg"]) for s in sample_stream(n))


def _fastload(dst: str, n: int, workers: int) -> None:
    import fastload

    with fastload.ShardWriter(dst, shard_size_bytes=SHARD_BYTES, workers=workers) as w:
        for s in sample_stream(n):
            w.write(s)


def _wds(dst: str, n: int) -> None:
    import webdataset as wds

    os.makedirs(dst)
    with wds.ShardWriter(os.path.join(dst, "shard-%06d.tar"), maxsize=SHARD_BYTES, verbose=0) as w:
        for s in sample_stream(n):
            w.write(s)


def mds_writer() -> type | None:
    """MDSWriter, imported without ``streaming/__init__`` (see the module docstring); None if absent."""
    if "streaming" in sys.modules:
        from streaming.base.format.mds.writer import MDSWriter

        return MDSWriter  # type: ignore[no-any-return]
    spec = importlib.util.find_spec("streaming")
    if spec is None or spec.origin is None:
        return None
    root = os.path.dirname(spec.origin)
    for name, path in (("streaming", root), ("streaming.base", os.path.join(root, "base"))):
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = [path]
            sys.modules[name] = module
    from streaming.base.format.mds.writer import MDSWriter

    return MDSWriter  # type: ignore[no-any-return]


def _mds(dst: str, n: int) -> None:
    writer = mds_writer()
    assert writer is not None
    columns = {"__key__": "str", "jpg": "bytes", "json": "json", "txt": "str"}
    with writer(out=dst, columns=columns, size_limit=SHARD_BYTES, progress_bar=False) as w:
        for s in sample_stream(n):
            w.write(s)


RUNNERS: dict[str, Callable[[str, int], None]] = {
    "fastload": lambda dst, n: _fastload(dst, n, 1),
    "fastload-w2": lambda dst, n: _fastload(dst, n, 2),
    "wds": _wds,
    "mds": _mds,
}


def cpu_s() -> float:
    """CPU seconds of this process, every thread, user + system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_once(tool: str, n: int, scratch: str) -> tuple[float, float]:
    """Wall and CPU seconds of one run of ``tool``."""
    dst = os.path.join(scratch, f"out-{tool}")
    began, cpu = time.perf_counter(), cpu_s()
    RUNNERS[tool](dst, n)
    seconds, cpu = time.perf_counter() - began, cpu_s() - cpu
    shutil.rmtree(dst)
    os.sync()
    return seconds, cpu


def rotated(tools: Sequence[str], rep: int) -> list[str]:
    k = rep % len(tools)
    return list(tools[k:]) + list(tools[:k])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--only", choices=TOOLS, action="append")
    parser.add_argument("--scratch", default=None, help="folder for the outputs (default: a temporary one)")
    parser.add_argument("--json", default=None, help="write the results here too")
    args = parser.parse_args(argv)
    tools = [t for t in (args.only or TOOLS) if t != "mds" or mds_writer() is not None]
    if "mds" not in tools and not args.only:
        print("mds: mosaicml-streaming is not installed; left out")
    import webdataset  # noqa: F401

    import fastload  # noqa: F401  (imports before the clock)

    scratch = args.scratch or tempfile.mkdtemp(prefix="fastload-writer-bench-")
    total = payload_bytes(args.samples)
    times: dict[str, list[float]] = {t: [] for t in tools}
    cpus: dict[str, list[float]] = {t: [] for t in tools}
    try:
        for rep in range(args.reps):
            for tool in rotated(tools, rep):
                wall, cpu = run_once(tool, args.samples, scratch)
                times[tool].append(wall)
                cpus[tool].append(cpu)
                print(f"rep {rep} {tool:12s} {wall:.2f}s wall, {cpu:.2f}s CPU", flush=True)
    finally:
        if args.scratch is None:
            shutil.rmtree(scratch, ignore_errors=True)
    base = statistics.median(times["wds"]) if "wds" in times else None
    print(
        f"\n{args.samples:,} samples, {total / 1e6:,.0f} MB of jpg payload, {args.reps} rep(s); "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'tool':12s} {'median s':>9s} {'range s':>13s} {'samples/s':>10s} {'MB/s':>7s} {'vs wds':>7s} "
        f"{'CPU s':>6s} {'CPU vs wds':>10s}"
    )
    base_cpu = statistics.median(cpus["wds"]) if "wds" in cpus else None
    results = {}
    for tool in tools:
        med = statistics.median(times[tool])
        ratio = base / med if base else None
        cpu = statistics.median(cpus[tool])
        results[tool] = {
            "seconds": times[tool],
            "cpu_seconds": cpus[tool],
            "median_s": med,
            "samples_per_s": args.samples / med,
        }
        ratio_s = f"{ratio:.2f}x" if ratio else "-"
        cpu_ratio = f"{base_cpu / cpu:.2f}x" if base_cpu else "-"
        print(
            f"{tool:12s} {med:9.2f} {min(times[tool]):6.2f}-{max(times[tool]):<6.2f} "
            f"{args.samples / med:10,.0f} {total / med / 1e6:7,.0f} {ratio_s:>7s} {cpu:6.2f} {cpu_ratio:>10s}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"samples": args.samples, "payload_bytes": total, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
