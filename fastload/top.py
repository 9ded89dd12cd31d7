"""``fastload top FOLDER_OR_URL``: a live terminal view of a running job from its telemetry JSON lines
(what :class:`fastload.train.exporters.JsonLines` writes, a log per rank, in a folder or an ``s3://``,
``gs://`` or ``az://`` prefix; read by :mod:`fastload.topread`) or the ranks' Prometheus endpoints
(:mod:`fastload.topprom`):
per rank the last record's step, samples/s, share of the loop's time waiting for data, the slowest stage,
S3 requests, errors and 503s, the first-byte p50, and a straggler's cause. ``--once`` prints one table;
``--plot PNG`` draws each rank's samples/s and wait share over time (matplotlib)."""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from fastload.config import S3Config
from fastload.errors import ConfigError, FastloadError
from fastload.storage.objectlog import is_store
from fastload.topprom import Endpoints, is_endpoints
from fastload.topread import Records, no_records, read_records


def table(records: Records, *, now: float | None = None) -> str:
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


def plot(records: Records, path: str | os.PathLike[str]) -> None:
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


def add_parser(sub: Any, s3_options: Any) -> None:
    """``fastload top``'s arguments (with the S3 options: a store URL is read as other commands read it)."""
    t = sub.add_parser(
        "top",
        parents=[s3_options],
        help="a live view of a running job's loader telemetry (a folder or s3://, gs://, az:// URL)",
        description="Per rank: samples/s, share of time waiting for data, slowest stage, S3 requests, "
        "errors and 503s, first-byte p50, stragglers; from the JSON lines fastload.loader(..., "
        "telemetry=FOLDER_OR_URL) writes (an s3://, gs:// or az:// prefix: every rank of a job in one).",
    )
    t.add_argument(
        "folder",
        metavar="FOLDER_OR_URL",
        help="the folder or URL given as telemetry= to the loader, or the ranks' Prometheus endpoints "
        "(http://HOST:PORT/metrics,...)",
    )
    t.add_argument("--once", action="store_true", help="print the table once and exit")
    t.add_argument("--interval", type=float, default=2.0, metavar="S", help="seconds between refreshes")
    t.add_argument("--plot", default=None, metavar="PNG", help="write samples/s and wait share over time")


def run(source: str, *, once: bool, interval_s: float, plot_path: str | None) -> int:
    config = S3Config.from_env() if is_store(source) or is_endpoints(source) else None
    read: Callable[[], Records] = functools.partial(read_records, source, latest=True, config=config)
    if is_endpoints(source):
        if plot_path is not None:
            raise ConfigError(
                f"{source}: --plot draws the history that JSON lines keep, a Prometheus endpoint serves only "
                "the present; pass the folder or store URL given as telemetry= to fastload.loader"
            )
        read = Endpoints(source, config=config or S3Config()).read
    if plot_path is not None or once:
        records = read_records(source, config=config) if plot_path is not None else read()
        if not records and is_store(source):
            raise no_records(source)
        if plot_path is not None:
            plot(records, plot_path)
            print(f"wrote {plot_path}")
        else:
            print(table(records))
        return 0
    view = text = table(read())  # a bad source: fails at once
    while True:  # until Ctrl-C (the CLI answers it)
        title = f"fastload top {source}  (every {interval_s:g}s; Ctrl-C quits)"
        sys.stdout.write(f"\x1b[H\x1b[2J{title}\n\n")
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        time.sleep(interval_s)
        try:
            view = text = table(read())
        except (FastloadError, OSError) as exc:  # a store failing for a moment: say so, keep the last view
            text = f"{view}\n(refreshing failed at {time.strftime('%H:%M:%S')}: {exc})"
