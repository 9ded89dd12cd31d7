"""The pure core of ``benchmarks/s3_read.py``: its constants, the runs' summaries, the targets, the tables."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve().with_name("s3_read.py")  # what the children run, with --child
MIB = 1 << 20
GIB = 1 << 30
SEED = 20240611
BUCKET = "bench"
REGION = "us-east-1"
SMALL_MIN_BYTES, SMALL_MAX_BYTES = 80 << 10, 120 << 10
SMALL_THREADS = 16
PART_BYTES = 8 << 20
READERS = ("fastload", "get_object", "download_fileobj", "s3torchconnector", "ceiling", "ceiling-direct")
SMALL_READERS = ("per-object", "packed", "packed-dataset")
LABELS = {
    "fastload": "fastload.open",
    "fastload-before": "fastload.open, --fastload-before checkout",
    "get_object": "boto3 get_object",
    "download_fileobj": "boto3 download_fileobj",
    "s3torchconnector": "s3torchconnector S3Reader",
    "ceiling": "ceiling (raw ranged GETs)",
    "ceiling-direct": "ceiling, no proxy (RGW)",
    "per-object": "boto3 GET per object, 16 threads",
    "packed": "fastload.open over tar shards",
    "packed-dataset": "fastload.ShardDataset over the shards",
}
# (name, reader, peer, minimum ratio of the medians' MiB/s, strict: the ratio must exceed the minimum)
TARGETS = (
    ("fastload >= 0.8x ceiling", "fastload", "ceiling", 0.8, False),
    ("fastload >= 1.3x download_fileobj", "fastload", "download_fileobj", 1.3, False),
    ("fastload >= 3x get_object", "fastload", "get_object", 3.0, False),
    ("fastload ahead of s3torchconnector", "fastload", "s3torchconnector", 1.0, True),
)
# the packed data read the way a training job reads it (ShardDataset: planned ranged reads, prefetched
# across shards); the "packed" row (one tarfile stream per shard) is shown for reference
SMALL_TARGET = ("packed >= 20x per-object (samples/s)", 20.0)
SMALL_SUBJECT = "packed-dataset"
CHILD_TIMEOUT_S = 1800
T = TypeVar("T")


def rotated(items: Sequence[T], rep: int) -> list[T]:
    """The run order of repetition ``rep``: ``items`` rotated left by ``rep``."""
    k = rep % len(items) if items else 0
    return [*items[k:], *items[:k]]


def part_ranges(size: int, part_bytes: int) -> list[tuple[int, int]]:
    """``[start, end)`` byte ranges of ``part_bytes`` covering ``size`` bytes exactly once."""
    return [(start, min(start + part_bytes, size)) for start in range(0, size, part_bytes)]


def small_sizes(count: int, seed: int = SEED) -> list[int]:
    """Sizes of the small objects: uniform in [80 KiB, 120 KiB], fixed seed."""
    import numpy as np

    rng = np.random.default_rng(seed + 1)
    return [int(s) for s in rng.integers(SMALL_MIN_BYTES, SMALL_MAX_BYTES, size=count, endpoint=True)]


def small_relpath(i: int) -> str:
    """Relative path (and pack key + field) of small object ``i``: 1,000 per folder."""
    return f"{i // 1000:03d}/{i:07d}.bin"


@dataclass
class Run:
    """One reader's run in one repetition (rep -1 is the SHA-256 verification pass)."""

    rep: int
    position: int
    reader: str
    seconds: float
    bytes: int
    objects: int
    cpu_s: float  # the reader's process, all threads (time.process_time)
    proxy_cpu_s: float | None
    origin_cpu_s: float | None  # ceph-mon + ceph-osd + radosgw
    machine_busy_cpu_s: float | None  # every CPU of the machine, busy time (/proc/stat)
    load_1min: float
    verified: str  # "sha256" or "sizes"

    @property
    def mib_s(self) -> float:
        return self.bytes / MIB / self.seconds

    @property
    def other_cpu_s(self) -> float | None:
        if self.machine_busy_cpu_s is None or self.proxy_cpu_s is None or self.origin_cpu_s is None:
            return None
        return max(0.0, self.machine_busy_cpu_s - self.cpu_s - self.proxy_cpu_s - self.origin_cpu_s)


def summarize(runs: Sequence[Run], readers: Sequence[str]) -> dict[str, Any]:
    """Per reader: median throughput (bytes / median seconds), spread, CPU per GiB, paired ratios."""
    timed = [r for r in runs if r.rep >= 0]
    by = {name: sorted((r for r in timed if r.reader == name), key=lambda r: r.rep) for name in readers}
    by = {name: rs for name, rs in by.items() if rs}
    out: dict[str, Any] = {}
    for name, rs in by.items():
        gib = rs[0].bytes / GIB
        median_s = statistics.median(r.seconds for r in rs)
        row: dict[str, Any] = {
            "label": LABELS[name],
            "reps": len(rs),
            "seconds": [r.seconds for r in rs],
            "mib_s_per_rep": [r.mib_s for r in rs],
            "median_s": median_s,
            "mib_s": rs[0].bytes / MIB / median_s,
            "min_mib_s": min(r.mib_s for r in rs),
            "max_mib_s": max(r.mib_s for r in rs),
            "bytes": rs[0].bytes,
            "objects": rs[0].objects,
            "samples_per_s": rs[0].objects / median_s,
            "cpu_s_per_gib": statistics.median(r.cpu_s for r in rs) / gib,
        }
        for field in ("proxy_cpu_s", "origin_cpu_s", "other_cpu_s"):
            values = [getattr(r, field) for r in rs]
            row[f"{field}_per_gib"] = (
                statistics.median(values) / gib if all(v is not None for v in values) else None
            )
        row["load_1min"] = [r.load_1min for r in rs]
        out[name] = row
    for name, row in out.items():
        row["x"] = {}
        for peer, prow in out.items():
            if peer == name:
                continue
            paired = [a.mib_s / b.mib_s for a in by[name] for b in by[peer] if a.rep == b.rep and b.mib_s > 0]
            row["x"][peer] = {
                "of_medians": row["mib_s"] / prow["mib_s"],
                "per_rep": paired,
            }
    return out


def check_targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Pass/fail of each target of the issue; a reader that did not run gives ``met: None``."""
    results = []
    for name, reader, peer, minimum, strict in TARGETS:
        if reader in summary and peer in summary:
            got = summary[reader]["x"][peer]["of_medians"]
            met: bool | None = got > minimum if strict else got >= minimum
        else:
            got, met = None, None
        results.append({"target": name, "minimum": minimum, "strict": strict, "measured": got, "met": met})
    return results


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return (
            "| "
            + " | ".join(
                str(c).ljust(w) if i == 0 else str(c).rjust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )
            + " |"
        )

    sep = "|" + "|".join("-" * (w + 1) + ("-" if i == 0 else ":") for i, w in enumerate(widths)) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in rows)])


def fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def format_large(summary: dict[str, Any]) -> str:
    ceiling = "ceiling" if "ceiling" in summary else None
    header = (
        "reader",
        "MiB/s (median)",
        "min-max",
        "x ceiling",
        "x ceiling per rep",
        "CPU s/GiB",
        "proxy CPU s/GiB",
        "RGW CPU s/GiB",
        "other CPU s/GiB",
    )
    rows = []
    for name, row in summary.items():
        x = row["x"].get(ceiling) if ceiling else None
        per_rep = x["per_rep"] if x else []
        rows.append(
            (
                row["label"],
                f"{row['mib_s']:.0f}",
                f"{row['min_mib_s']:.0f}-{row['max_mib_s']:.0f}",
                "1.00" if name == ceiling else fmt(x["of_medians"] if x else None),
                f"{min(per_rep):.2f}-{max(per_rep):.2f}" if per_rep else "-",
                fmt(row["cpu_s_per_gib"]),
                fmt(row["proxy_cpu_s_per_gib"]),
                fmt(row["origin_cpu_s_per_gib"]),
                fmt(row["other_cpu_s_per_gib"]),
            )
        )
    return markdown_table(header, rows)


def format_ratios(summary: dict[str, Any], subject: str = "fastload") -> str:
    if subject not in summary:
        return f"({subject} did not run)"
    rows = []
    for peer, x in summary[subject]["x"].items():
        per_rep = x["per_rep"]
        rows.append(
            (
                f"{LABELS[subject]} / {LABELS[peer]}",
                f"{x['of_medians']:.2f}",
                f"{min(per_rep):.2f}-{max(per_rep):.2f}" if per_rep else "-",
            )
        )
    return markdown_table(("throughput ratio", "of medians", "paired per rep"), rows)


def format_small(summary: dict[str, Any]) -> str:
    header = ("reader", "samples/s (median)", "MiB/s", "min-max samples/s", "CPU s/GiB", "proxy CPU s/GiB")
    rows = []
    for row in summary.values():
        n, per = row["objects"], [row["objects"] / s for s in row["seconds"]]
        rows.append(
            (
                row["label"],
                f"{n / row['median_s']:,.0f}",
                f"{row['mib_s']:.0f}",
                f"{min(per):,.0f}-{max(per):,.0f}",
                fmt(row["cpu_s_per_gib"]),
                fmt(row["proxy_cpu_s_per_gib"]),
            )
        )
    return markdown_table(header, rows)


def format_targets(targets: Sequence[dict[str, Any]]) -> str:
    lines = []
    for t in targets:
        verdict = {True: "PASS", False: "FAIL", None: "n/a (reader did not run)"}[t["met"]]
        lines.append(f"- {t['target']}: measured {fmt(t['measured'])}x -> {verdict}")
    return "\n".join(lines)
