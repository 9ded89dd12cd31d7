"""One runner over the benchmark scripts: each in a process of its own, fixed seeds, one JSON document out.

    python benchmarks/run.py --all --json /tmp/all.json      # every benchmark at its issue configuration
    python benchmarks/run.py --all --quick                   # validation sizes (minutes, not tens of them)
    python benchmarks/run.py pack bench --json /tmp/two.json # some of them
    python benchmarks/run.py --list

Each benchmark script keeps its own fixed seeds (the data it generates is the same on every run);
``fastload bench`` gets ``--seed 0``; every child runs with ``PYTHONHASHSEED=0``. A child writes its figures
with ``--json`` into ``--out`` (default: a new temporary folder), with its output in ``NAME.log`` beside it.
The document written to ``--json`` holds the machine, the git commit, and per benchmark the command, exit
status, wall time and the child's own JSON. A benchmark whose prerequisite is missing (``radosgw`` for the
S3 ones) is recorded as skipped, not failed. Exit status: 0 when every benchmark that ran succeeded.

The tables of record are kept in ``benchmarks/RESULTS.md`` (command, machine, medians, ratios).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


@dataclass(frozen=True)
class Benchmark:
    """A benchmark: the command (a script in this folder, or ``-m MODULE ...``), its arguments at the issue's
    configuration and at validation size, and the programs it needs."""

    name: str
    command: tuple[str, ...]
    quick: tuple[str, ...]
    what: str
    needs: tuple[str, ...] = ()

    def argv(self, *, quick: bool, json_path: str, out: Path) -> list[str]:
        head = list(self.command)
        if head[0] != "-m":
            head[0] = str(HERE / head[0])
        extra = ["--plot", str(out / f"{self.name}.png")] if self.name == "bench" else []
        return [sys.executable, *head, *(self.quick if quick else ()), *extra, "--json", json_path]


BENCHMARKS = (
    Benchmark(
        "pack",
        ("pack.py",),
        ("--files", "2000", "--reps", "1"),
        "fastload pack vs GNU tar, ShardWriter, pyarrow",
    ),
    Benchmark(
        "s3_read",
        ("s3_read.py",),
        ("--total-mib", "256", "--object-mib", "64", "--small-count", "2000", "--reps", "1", "--probe", "no"),
        "fastload.open vs boto3, s3transfer, s3torchconnector over RGW + latency proxy",
        needs=("radosgw",),
    ),
    Benchmark(
        "read",
        ("read.py",),
        ("--quick",),
        "ShardDataset vs webdataset, litdata, per-file Dataset (local and S3)",
        needs=("radosgw",),
    ),
    Benchmark(
        "read_tfrecord", ("read_tfrecord.py",), ("--quick",), "TFRecord shards vs the tfrecord package"
    ),
    Benchmark("tokens", ("tokens.py",), ("--docs", "20000", "--reps", "1"), "token packing: padding share"),
    Benchmark(
        "bench",
        ("-m", "fastload", "bench", "--seed", "0", "--quiet"),
        ("--quick",),
        "fastload bench: the embedded default (per-file vs packed, local vs S3, workers sweep)",
    ),
)


def available(bench: Benchmark) -> str | None:
    """Why ``bench`` cannot run here (a missing script or program), or None."""
    if bench.command[0] != "-m" and not (HERE / bench.command[0]).exists():
        return f"benchmarks/{bench.command[0]} is not in this checkout"
    missing = [p for p in bench.needs if shutil.which(p) is None]
    return f"needs {', '.join(missing)}" if missing else None


def git_state() -> dict[str, Any]:
    def git(*args: str) -> str | None:
        try:
            return subprocess.run(
                ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None

    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(status) if status is not None else None}


def machine() -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    try:
        from fastload.bench.runner import machine as describe

        return describe()
    except ImportError as exc:  # fastload not importable: still record what the runner knows
        import platform

        return {
            "cpu": platform.processor(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "error": str(exc),
        }


def run_one(bench: Benchmark, *, quick: bool, out: Path, timeout_s: float) -> dict[str, Any]:
    json_path = out / f"{bench.name}.json"
    log_path = out / f"{bench.name}.log"
    argv = bench.argv(quick=quick, json_path=str(json_path), out=out)
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    record: dict[str, Any] = {"what": bench.what, "command": argv[1:], "log": str(log_path)}
    began = time.monotonic()
    with open(log_path, "w") as log:
        try:
            proc = subprocess.run(
                argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s
            )
            record["rc"] = proc.returncode
        except subprocess.TimeoutExpired:
            record["rc"] = None
            record["error"] = f"timed out after {timeout_s:.0f} s"
    record["seconds"] = round(time.monotonic() - began, 3)
    try:
        record["result"] = json.loads(json_path.read_text())
    except (OSError, ValueError):
        record["result"] = None
    return record


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help="benchmarks to run (see --list)")
    parser.add_argument("--all", action="store_true", help="run every benchmark")
    parser.add_argument(
        "--quick", action="store_true", help="validation sizes instead of the issue configurations"
    )
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--json", metavar="FILE", help="write the combined document here")
    parser.add_argument("--out", metavar="DIR", help="folder for each benchmark's JSON, log and plot")
    parser.add_argument("--timeout-s", type=float, default=3 * 3600, help="per benchmark (default 3 h)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    known = {b.name: b for b in BENCHMARKS}
    if args.list:
        for b in BENCHMARKS:
            why = available(b)
            print(f"{b.name:<14} {b.what}" + (f"  [unavailable: {why}]" if why else ""))
        return 0
    unknown = [n for n in args.names if n not in known]
    if unknown:
        print(f"run.py: unknown benchmark(s) {unknown}; choose from {', '.join(known)}", file=sys.stderr)
        return 2
    chosen = list(BENCHMARKS) if args.all else [known[n] for n in args.names]
    if not chosen:
        print("run.py: name benchmarks to run, or --all (see --list)", file=sys.stderr)
        return 2
    out = Path(args.out or tempfile.mkdtemp(prefix="fastload-benchmarks-"))
    out.mkdir(parents=True, exist_ok=True)
    document: dict[str, Any] = {
        "runner": 1,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "quick": args.quick,
        "git": git_state(),
        "machine": machine(),
        "benchmarks": {},
    }
    failed = []
    for bench in chosen:
        why = available(bench)
        if why:
            document["benchmarks"][bench.name] = {"what": bench.what, "skipped": why}
            print(f"{bench.name}: skipped ({why})", flush=True)
            continue
        print(f"{bench.name}: running ({bench.what}) ...", flush=True)
        record = run_one(bench, quick=args.quick, out=out, timeout_s=args.timeout_s)
        document["benchmarks"][bench.name] = record
        ok = record.get("rc") == 0
        if not ok:
            failed.append(bench.name)
        print(
            f"{bench.name}: {'ok' if ok else 'FAILED'} in {record['seconds']:.0f} s (log: {record['log']})",
            flush=True,
        )
        if args.json:  # written after each benchmark, so a long run that is stopped keeps what it measured
            Path(args.json).write_text(json.dumps(document, indent=1, default=str))
    if args.json:
        Path(args.json).write_text(json.dumps(document, indent=1, default=str))
        print(f"combined figures: {args.json}")
    print(f"outputs: {out}")
    if failed:
        print(f"run.py: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
