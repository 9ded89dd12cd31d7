"""``fastload top FOLDER``: a live terminal view of a running job from its telemetry JSON lines (the
``telemetry-rank{R}.jsonl`` files :class:`fastload.train.exporters.JsonLines` writes, a file per rank):
per rank the last record's step, samples/s, share of the loop's time waiting for data, the slowest stage,
S3 requests, errors and 503s, the first-byte p50, and a straggler's cause. ``--once`` prints one table;
``--plot PNG`` draws each rank's samples/s and wait share over time (matplotlib)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from fastload.errors import ConfigError

PATTERN = "telemetry-rank*.jsonl"


def read_records(folder: str | os.PathLike[str]) -> dict[int, list[dict[str, Any]]]:
    """Every whole record of every rank's file in ``folder``, by rank (a line still being written, or a
    damaged one, is left out)."""
    root = Path(folder)
    if not root.is_dir():
        raise ConfigError(
            f"{os.fspath(folder)!r} is not a folder of telemetry files; pass the folder given as "
            "telemetry= to fastload.loader (it holds telemetry-rank0.jsonl, ...)"
        )
    out: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(root.glob(PATTERN)):
        records = []
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and "rank" in record:
                records.append(record)
        if records:
            out[int(records[-1]["rank"])] = records
    return out


def table(records: dict[int, list[dict[str, Any]]], *, now: float | None = None) -> str:
    """The view: one row per rank from its last record."""
    if not records:
        return "no telemetry records yet (the loader writes one every telemetry_every steps)"
    now = time.time() if now is None else now
    head: tuple[str, ...] = ("rank", "step", "samples/s", "wait", "slowest stage", "S3 req", "errors")
    head += ("503s", "1st byte", "age")
    rows = [head]
    notes = []
    for rank in sorted(records):
        last = records[rank][-1]
        total = last.get("total", {})
        counters = total.get("counters", {})
        p50 = total.get("latency", {}).get("first_byte", {}).get("p50_ms")
        rows.append(
            (
                str(rank),
                str(last.get("step", "")),
                f"{last.get('samples_per_s', 0):.0f}",
                f"{100 * last.get('wait_share', 0):.0f}%",
                str(last.get("slowest_stage") or "-"),
                str(counters.get("s3_requests", 0)),
                str(counters.get("s3_retries", 0) + counters.get("s3_failures", 0)),
                str(counters.get("s3_throttles", 0)),
                "-" if p50 is None else f"{p50:.1f} ms",
                f"{max(0.0, now - last.get('time', now)):.0f}s",
            )
        )
        for s in last.get("stragglers", []):
            if s.get("rank") == rank:
                notes.append(f"rank {rank} is a straggler at step {last.get('step')}: {s.get('cause')}")
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(_cells(r, widths)) for r in rows]
    return "\n".join(lines + notes)


def _cells(row: tuple[str, ...], widths: list[int]) -> list[str]:
    pairs = enumerate(zip(row, widths, strict=True))
    return [cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in pairs]


def plot(records: dict[int, list[dict[str, Any]]], path: str | os.PathLike[str]) -> None:
    """Each rank's samples/s and wait share against time since the first record, as a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("fastload top --plot needs matplotlib: pip install 'fastload[bench]'") from None
    start = min(r[0]["time"] for r in records.values()) if records else 0.0
    fig, (rate, wait) = plt.subplots(2, 1, figsize=(8, 5), sharex=True)
    for rank in sorted(records):
        t = [r["time"] - start for r in records[rank]]
        rate.plot(t, [r["samples_per_s"] for r in records[rank]], label=f"rank {rank}")
        wait.plot(t, [100 * r["wait_share"] for r in records[rank]], label=f"rank {rank}")
    rate.set_ylabel("samples/s")
    wait.set_ylabel("waiting for data (%)")
    wait.set_xlabel("seconds")
    rate.legend(loc="best", fontsize="small")
    fig.savefig(os.fspath(path), format="png", bbox_inches="tight")
    plt.close(fig)


def run(folder: str, *, once: bool, interval_s: float, plot_path: str | None) -> int:
    if plot_path is not None:
        plot(read_records(folder), plot_path)
        print(f"wrote {plot_path}")
        return 0
    if once:
        print(table(read_records(folder)))
        return 0
    while True:  # until Ctrl-C (the CLI answers it)
        text = table(read_records(folder))
        title = f"fastload top {folder}  (every {interval_s:g}s; Ctrl-C quits)"
        sys.stdout.write(f"\x1b[H\x1b[2J{title}\n\n")
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        time.sleep(interval_s)
