"""The phases of ``benchmarks/s3_read.py``'s throughput workloads: the proxies' ceilings (``--probe``) and
the readers' interleaved repetitions after a SHA-256 pass."""

from __future__ import annotations

import argparse
import functools
import statistics
from collections.abc import Sequence
from typing import Any

from s3_read_core import GIB, MIB, PART_BYTES, Run, markdown_table, rotated
from s3_read_world import World, run_reader


def probe_proxies(world: World, objects: list[list[Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Ceiling reader at several connection counts: direct, through each proxy uncapped, and capped."""
    budget, chosen = args.probe_mib * MIB, []
    for key, size, sha in objects:
        if budget <= 0:
            break
        chosen.append([key, size, sha])
        budget -= size
    counts = [int(c) for c in args.probe_concurrency.split(",")]
    targets = [
        ("direct RGW", None),
        ("latency_proxy, no caps (splice)", "lean"),
        ("latency_proxy, no caps (copy)", "lean-copy"),
        ("FaultProxy, no rules", "fault"),
        (f"latency_proxy, {args.latency_ms:g} ms + {args.conn_mbps:g} MB/s", "capped"),
    ]
    configs = [(label, name, n) for label, name in targets for n in counts]
    runs: dict[tuple[str, int], list[Run]] = {(label, n): [] for label, _, n in configs}
    errors: dict[tuple[str, int], str] = {}
    for rep in range(args.probe_reps):  # interleaved like the readers: every config once per repetition
        for label, proxy_name, n in rotated(configs, rep):
            if (label, n) in errors:
                continue
            proxy = world.proxies[proxy_name] if proxy_name else None
            spec = {
                "endpoint_url": proxy.endpoint_url if proxy else world.rgw.endpoint_url,
                "objects": chosen,
                "verify": False,
                "chunk_bytes": args.chunk_mib * MIB,
                "concurrency": n,
                "part_bytes": PART_BYTES,
                "proxy_pids": [proxy.pid] if proxy else [],
            }
            try:
                run = run_reader(world, "ceiling", spec, rep=rep, position=0)
            except RuntimeError as exc:
                print(f"  probe {label} x{n}: FAILED {exc}", flush=True)
                errors[(label, n)] = str(exc)
                continue
            runs[(label, n)].append(run)
            print(
                f"  probe rep {rep} {label:38s} x{n:<3d} {run.mib_s:7.0f} MiB/s  proxy CPU "
                f"{(run.proxy_cpu_s or 0.0) / (run.bytes / GIB):.2f} s/GiB  load {run.load_1min:.1f}",
                flush=True,
            )
    results: list[dict[str, Any]] = []
    for label, _, n in configs:
        rs = runs[(label, n)]
        if not rs:
            results.append({"target": label, "connections": n, "error": errors.get((label, n), "no run")})
            continue
        gib = rs[0].bytes / GIB
        med = functools.partial(_median_per_gib, gib=gib)
        results.append(
            {
                "target": label,
                "connections": n,
                "mib_s": rs[0].bytes / MIB / statistics.median(r.seconds for r in rs),
                "mib_s_per_rep": [r.mib_s for r in rs],
                "client_cpu_s_per_gib": med([r.cpu_s for r in rs]),
                "proxy_cpu_s_per_gib": med([r.proxy_cpu_s or 0.0 for r in rs]),
                "origin_cpu_s_per_gib": med([r.origin_cpu_s for r in rs]),
                "other_cpu_s_per_gib": med([r.other_cpu_s for r in rs]),
                "load_1min": [r.load_1min for r in rs],
            }
        )
    return results


def _median_per_gib(values: Sequence[float | None], *, gib: float) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) / gib if known and len(known) == len(values) else None


def format_probe(rows: list[dict[str, Any]]) -> str:
    counts = sorted({r["connections"] for r in rows})
    targets = list(dict.fromkeys(r["target"] for r in rows))
    table = []
    for target in targets:
        cells = [target]
        for n in counts:
            row = next((r for r in rows if r["target"] == target and r["connections"] == n), None)
            if row is None or "error" in row:
                cells.append("failed")
            else:
                cells.append(f"{row['mib_s']:.0f} ({row['proxy_cpu_s_per_gib']:.2f})")
        table.append(cells)
    return markdown_table(["MiB/s (proxy CPU s/GiB) at N connections", *(f"N={n}" for n in counts)], table)


def interleave(
    world: World,
    readers: list[str],
    specs: dict[str, dict[str, Any]],
    reps: int,
    verify_pass: bool,
    failures: dict[str, str],
) -> list[Run]:
    """A SHA-256 pass (rep -1) that drops readers that cannot run, then ``reps`` rotated repetitions."""
    runs: list[Run] = []
    if verify_pass:
        for position, reader in enumerate(list(readers)):
            try:
                run = run_reader(world, reader, {**specs[reader], "verify": True}, rep=-1, position=position)
            except RuntimeError as exc:
                failures[reader] = str(exc)
                readers.remove(reader)
                print(f"  verify {reader}: FAILED, left out\n{_indent(str(exc))}", flush=True)
                continue
            runs.append(run)
            print(f"  verify {reader:18s} sha256 ok  {run.mib_s:7.0f} MiB/s", flush=True)
    for rep in range(reps):
        for position, reader in enumerate(rotated(readers, rep)):
            run = run_reader(world, reader, {**specs[reader], "verify": False}, rep=rep, position=position)
            runs.append(run)
            print(
                f"  rep {rep} #{position} {reader:18s} {run.seconds:7.2f} s {run.mib_s:7.0f} MiB/s "
                f"{run.objects / run.seconds:9.0f} obj/s  CPU {run.cpu_s:6.2f} s  load {run.load_1min:.1f}",
                flush=True,
            )
    return runs


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
