"""``fastload verify`` on Parquet aborted at exit in about 0.4% of runs ("terminate called without an active
exception", exit 134) after printing OK. A core dump showed why: pyarrow pre-buffers with ``ReadAsync`` on
its I/O thread pool, and on a Python file object the pool thread later released a buffer wrapping Python
bytes while the interpreter was exiting; Python ends such a thread with ``pthread_exit`` and the forced
unwind through arrow's C++ frames calls ``std::terminate``. Every fastload Parquet read now goes through
``formats.parquet.arrowfile.open_parquet`` (no pre-buffering), so no pyarrow thread ever holds a Python
object. A failure that rare cannot be caught by a few runs, so these tests check its precondition instead:
verify and reading leave no pyarrow I/O thread behind, and nothing opens Parquet another way."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import fastload

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import os, sys
def threads():
    return len(os.listdir("/proc/self/task"))
import pyarrow, pyarrow.parquet, numpy, fastload
from fastload.cli import main
before = threads()
assert main(["verify", sys.argv[1]]) == 0
for sample in fastload.ShardDataset(sys.argv[1], decode=False):
    pass
print("THREADS", before, threads())
"""


def test_verify_and_reading_parquet_start_no_pyarrow_io_threads(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(30):
        (src / f"{i:03d}.txt").write_text(f"sample {i}" * 50)
    fastload.pack(str(src), str(tmp_path / "ds"), progress=False, shard_format="parquet", max_samples=10)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "ds")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("THREADS"))
    before, after = map(int, line.split()[1:])
    assert after == before, f"{after - before} thread(s) started by pyarrow while reading Parquet"


def test_parquet_is_opened_only_through_open_parquet() -> None:
    pattern = re.compile(r"\b(pq|parquet)\.(ParquetFile|read_table|ParquetDataset)\(")
    found = []
    for path in (ROOT / "fastload").rglob("*.py"):
        if path.name == "arrowfile.py":
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "open Parquet through fastload.formats.parquet.arrowfile.open_parquet:\n" + "\n".join(
        found
    )
