"""S3 read benchmark: ``fastload.open`` against boto3, s3transfer, s3torchconnector and the origin's ceiling.

The origin is a real Ceph RADOS Gateway on 127.0.0.1 (``tests/servers/rgw.py``, objects in memstore) behind
``benchmarks/latency_proxy.py``, which adds ``--latency-ms`` (20) before each response head, S3's first-byte
latency, and paces each response body to ``--conn-mbps`` (50 MB/s = 50e6 bytes/s), S3's per-connection
bandwidth. The proxy runs in a process of its own. Everything stays on loopback; the script starts and stops
RGW and the proxies itself.

Workload 1, large objects: ``--total-mib`` (1024) made of ``--object-mib`` (256) objects of random bytes,
each read whole, in key order, by

- ``fastload``: ``fastload.open(url).read(8 MiB)`` until EOF, default part size and concurrency;
- ``get_object``: boto3 ``get_object`` per object, its body read in 8 MiB chunks (one GET per object);
- ``download_fileobj``: boto3 ``download_fileobj`` (s3transfer, ``max_concurrency=10``) into a discarding,
  seekable file object, as ``/dev/null`` is (a non-seekable one makes s3transfer reorder parts in memory,
  measured 20-25% slower here);
- ``s3torchconnector``: AWS's ``S3Reader`` (``S3Client.get_object``, the client its datasets use) read in
  8 MiB chunks, ``S3ClientConfig(force_path_style=True)`` otherwise default;
- ``ceiling``: the physical reference: ``--ceiling-concurrency`` (32) threads with raw ``http.client``
  connections doing signed (botocore SigV4) ranged GETs of 8 MiB parts over all objects at once, no retry,
  no validation beyond status and length, bodies read into a reused buffer;
- ``ceiling-direct``: the same straight at RGW, without the proxy (context: what the box can do).

Workload 2, small objects: ``--small-count`` (20,000) objects of 80-120 KiB fetched with one GET each
(boto3, a thread pool of 16) against the same bytes packed into tar shards (``fastload.pack`` locally,
uploaded with ``fastload.copy``) read two ways: shard by shard with ``fastload.open`` and ``tarfile``
streaming (``packed``), and with ``fastload.ShardDataset`` over the uploaded folder (``packed-dataset``:
ranged reads of runs of samples planned from ``index.json``, prefetched across shards, as a training job
reads). The 20x target is measured on ``packed-dataset``.

Every run is a child process (so ``time.process_time()`` covers exactly one reader, all its threads, CRT
threads included; the proxy and RGW are charged separately from ``/proc``). Clients are created and one
HEAD is sent before the clock starts. A first, untimed pass checks every reader's bytes with SHA-256 per
object; every timed run checks each object's byte count. Repetitions interleave the readers, the order
rotated by one each repetition; figures are medians.

    python benchmarks/s3_read.py                                          # the issue's configuration
    python benchmarks/s3_read.py --total-mib 256 --object-mib 64 --small-count 2000 --json /tmp/r.json
    python benchmarks/s3_read.py --probe only                             # only the proxy ceilings

Workload 3, tail latency (``--tail``, run alone; issue 17): ``--tail-small`` (200) objects of
``--tail-small-kib`` (100) read whole by 16 threads, then ``--tail-large`` (8) objects of ``--tail-large-mib``
(64) one after another, every object timed (per-object latency p50/p99/max) and checked (SHA-256 after its
clock stops), through ``FaultProxy`` (``latency_proxy.py --faultproxy --stall``) in front of the capped
proxy, in four scenarios: ``clean`` (no rule), ``paused`` (5% of GETs: the body pauses ``--tail-pause-s``
(12) s after 16 KiB, then the connection closes), ``stopped`` (2%: the body stops for good) and
``first-byte`` (5%: no response head for the pause). Readers: ``fastload`` (defaults: hedging on),
``fastload-nohedge`` (``S3Config(hedge=0)``: the retry path alone), ``download_fileobj`` (s3transfer,
``read_timeout=10`` like fastload's), ``s3torchconnector`` (when importable; a directory holding it can
be named by ``FASTLOAD_BENCH_S3TC_PATH``) and, on request, ``fastload-before`` (fastload from the checkout
``--fastload-before`` names: before/after, interleaved). A run still going after ``--tail-timeout-s``
counts as failed.
Each run gets a fresh proxy seeded by the repetition: every reader meets the same sequence of fault draws::

    python benchmarks/s3_read.py --tail --reps 2 --json /tmp/tail.json
    python benchmarks/s3_read.py --tail --tail-readers fastload,fastload-before --fastload-before ../main

Before the readers, ``--probe`` (on by default) measures what the proxies can forward: the ceiling reader at
1-64 connections straight at RGW, through ``latency_proxy`` without caps (splice and copy modes), through
``fastload.testing.faultproxy.FaultProxy`` without rules, and through the capped proxy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# this benchmark's modules (s3_read_*.py); BUCKET and upload_client (noqa) are imported for read.py,
# which uses s3_read.BUCKET, machine_info, upload_client and world_up
from s3_read_core import (
    BUCKET,  # noqa: F401
    MIB,
    PART_BYTES,
    READERS,
    SMALL_MAX_BYTES,
    SMALL_MIN_BYTES,
    SMALL_READERS,
    SMALL_SUBJECT,
    SMALL_TARGET,
    SMALL_THREADS,
    check_targets,
    fmt,
    format_large,
    format_ratios,
    format_small,
    format_targets,
    markdown_table,  # noqa: F401  (benchmarks/read.py uses it through this module)
    summarize,
)
from s3_read_host import cpu_delta, describe, machine_busy_s, machine_info, proc_cpu_s
from s3_read_phases import format_probe, interleave, probe_proxies
from s3_read_readers import PREPARE
from s3_read_tail import (
    TAIL_READERS,
    TAIL_SCENARIOS,
    format_tail,
    make_tail_objects,
    run_tail,
    run_tail_child,
    tail_targets,
)
from s3_read_world import (
    make_large,
    make_small,
    upload_client,  # noqa: F401
    world_up,
)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/s3_read.py",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--total-mib", type=int, default=1024, help="large-object data read by each reader (default 1024)")
    add("--object-mib", type=int, default=256, help="size of each large object (default 256)")
    add("--reps", type=int, default=3, help="timed repetitions, each running every reader once (default 3)")
    add("--latency-ms", type=float, default=20.0, help="added by the proxy before each response (default 20)")
    add("--conn-mbps", type=float, default=50.0, help="per-response cap in MB/s, 1e6 bytes (default 50)")
    add("--chunk-mib", type=int, default=8, help="read() size of the streaming readers (default 8)")
    add("--ceiling-concurrency", type=int, default=32, help="connections of the ceiling reader (default 32)")
    add("--small-count", type=int, default=20_000, help="small objects (default 20,000; 0 skips workload 2)")
    add("--readers", default=",".join(READERS), help=f"comma-separated subset of {','.join(READERS)}")
    add("--no-verify-pass", action="store_true", help="skip the SHA-256 pass (timed runs still check sizes)")
    add("--probe", choices=("yes", "no", "only"), default="yes", help="measure the proxies' ceilings")
    add("--probe-mib", type=int, default=512, help="data read per probe run (default 512)")
    add("--probe-reps", type=int, default=3, help="probe repetitions, medians reported (default 3)")
    add("--probe-concurrency", default="1,4,16,32,64", help="connection counts of the probe")
    add("--memstore-gib", type=float, default=None, help="RGW memstore size (default: 2x the data + 1 GiB)")
    add("--json", metavar="FILE", help="write every figure and the machine description to FILE")
    add("--fastload-before", metavar="PATH", help="also run fastload from this checkout (before/after)")
    add("--tail", action="store_true", help="only the tail-latency workload (stalls; see the docstring)")
    add("--tail-small", type=int, default=200, help="tail: small objects (default 200)")
    add("--tail-small-kib", type=int, default=100, help="tail: size of each small object (default 100)")
    add("--tail-large", type=int, default=8, help="tail: large objects (default 8)")
    add("--tail-large-mib", type=int, default=64, help="tail: size of each large object (default 64)")
    add("--tail-pause-s", type=float, default=12.0, help="tail: how long a paused body stalls (default 12)")
    add("--tail-readers", default=",".join(TAIL_READERS), help=f"tail: subset of {','.join(TAIL_READERS)}")
    add("--tail-scenarios", default=",".join(TAIL_SCENARIOS), help=f"tail: of {','.join(TAIL_SCENARIOS)}")
    add("--tail-timeout-s", type=float, default=180.0, help="tail: a run still going then counts as failed")
    add("--child", metavar="SPEC", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.total_mib < 1 or args.object_mib < 1 or args.reps < 1 or args.chunk_mib < 1:
        parser.error("--total-mib, --object-mib, --reps and --chunk-mib must be >= 1")
    unknown = set(args.readers.split(",")) - set(READERS)
    if unknown:
        parser.error(f"unknown readers {sorted(unknown)}; choose from {', '.join(READERS)}")
    return args


def run_child(spec_path: str) -> int:
    """Run one reader once as described by the JSON spec; write the result JSON next to it."""
    spec = json.loads(Path(spec_path).read_text())
    if spec.get("workload") == "tail":
        Path(spec["result_path"]).write_text(json.dumps(run_tail_child(spec)))
        return 0
    run = PREPARE[spec["reader"]](spec)
    proxy_pids, origin_pids = spec["proxy_pids"], spec["origin_pids"]
    load = os.getloadavg()[0]
    proxy0, origin0, busy0 = proc_cpu_s(proxy_pids), proc_cpu_s(origin_pids), machine_busy_s()
    cpu0, t0 = time.process_time(), time.perf_counter()
    tally = run()
    seconds, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    proxy1, origin1, busy1 = proc_cpu_s(proxy_pids), proc_cpu_s(origin_pids), machine_busy_s()
    result = {
        "seconds": seconds,
        "cpu_s": cpu_s,
        "bytes": tally.bytes,
        "objects": tally.objects,
        "proxy_cpu_s": cpu_delta(proxy0, proxy1) if proxy_pids else 0.0,
        "origin_cpu_s": cpu_delta(origin0, origin1),
        "machine_busy_cpu_s": cpu_delta(busy0, busy1),
        "load_1min": load,
    }
    Path(spec["result_path"]).write_text(json.dumps(result))
    return 0


def main_tail(args: argparse.Namespace, report: dict[str, Any]) -> int:
    args.probe = "no"
    data_bytes = args.tail_small * (args.tail_small_kib << 10) + args.tail_large * args.tail_large_mib * MIB
    began = time.perf_counter()
    with world_up(args, data_bytes) as world:
        small, large = make_tail_objects(world, args)
        print(f"uploaded {len(small)} small and {len(large)} large objects", flush=True)
        report["tail"] = run_tail(world, args, small, large)
    report["tail"]["targets"] = tail_targets(report["tail"]["summary"])
    report["elapsed_s"] = time.perf_counter() - began
    s = report["settings"]
    print(
        f"\nMachine: {describe(report['machine'])}\nOrigin: Ceph RGW (memstore) behind latency_proxy "
        f"({s['latency_ms']:g} ms, {s['conn_mbps']:g} MB/s per response) behind FaultProxy; "
        f"{s['tail_small']} objects of {s['tail_small_kib']} KiB (16 threads), then {s['tail_large']} x "
        f"{s['tail_large_mib']} MiB one by one; pauses {s['tail_pause_s']:g} s; medians of {s['reps']} "
        f"repetition(s) (range)\n\n{format_tail(report)}",
        flush=True,
    )
    _write_json(args.json, report)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return run_child(args.child)
    readers = [r for r in READERS if r in args.readers.split(",")]
    total, object_bytes = args.total_mib * MIB, args.object_mib * MIB
    small_payload = args.small_count * (SMALL_MIN_BYTES + SMALL_MAX_BYTES) // 2
    data_bytes = total + 2 * small_payload  # the small objects, and their shards
    info = machine_info()
    print(describe(info), flush=True)
    report: dict[str, Any] = {
        "command": " ".join(
            ["python", "benchmarks/s3_read.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "machine": info,
        "settings": vars(args) | {"part_bytes_ceiling": PART_BYTES, "small_threads": SMALL_THREADS},
    }
    if args.tail:
        return main_tail(args, report)
    failures: dict[str, str] = {}
    began = time.perf_counter()
    with world_up(args, data_bytes) as world:
        large, upload_s = make_large(world, total, object_bytes)
        print(f"uploaded {len(large)} large objects ({total / MIB:.0f} MiB) in {upload_s:.1f} s", flush=True)
        report["large_upload_s"] = upload_s
        if args.probe != "no":
            print("proxy ceilings (ceiling reader, one run each):", flush=True)
            report["probe"] = probe_proxies(world, large, args)
            print(format_probe(report["probe"]), flush=True)
            if args.probe == "only":
                _write_json(args.json, report)
                return 0
        capped = world.proxies["capped"]
        base = {
            "endpoint_url": capped.endpoint_url,
            "objects": large,
            "chunk_bytes": args.chunk_mib * MIB,
            "concurrency": args.ceiling_concurrency,
            "part_bytes": PART_BYTES,
            "proxy_pids": [capped.pid],
        }
        if args.fastload_before:
            readers.insert(1, "fastload-before")
        specs = {r: dict(base) for r in readers}
        if args.fastload_before:
            specs["fastload-before"]["pythonpath"] = str(Path(args.fastload_before).resolve())
        if "ceiling-direct" in specs:
            specs["ceiling-direct"].update(endpoint_url=world.rgw.endpoint_url, proxy_pids=[])
        print(
            f"large objects: {len(large)} x {args.object_mib} MiB, readers {', '.join(readers)}", flush=True
        )
        runs = interleave(world, readers, specs, args.reps, not args.no_verify_pass, failures)
        summary = summarize(runs, readers)
        targets = check_targets(summary)
        report |= {"runs": [r.__dict__ | {"mib_s": r.mib_s} for r in runs], "summary": summary}
        report |= {"targets": targets, "failures": dict(failures)}
        if args.small_count > 0:
            print(f"small objects: {args.small_count:,}, uploading and packing ...", flush=True)
            small = make_small(world, args.small_count)
            print(
                f"  PUT {args.small_count:,} objects in {small['put_s']:.0f} s "
                f"({small['puts_per_s']:.0f}/s); pack {small['pack_s']:.1f} s; "
                f"copy {len(small['shards'])} shards {small['copy_s']:.1f} s",
                flush=True,
            )
            small_spec = {
                **base,
                "objects": small["objects"],
                "shards": small["shards"],
                "small_prefix": "small/",
            }
            small_readers = list(SMALL_READERS)
            small_runs = interleave(
                world,
                small_readers,
                dict.fromkeys(small_readers, small_spec),
                args.reps,
                not args.no_verify_pass,
                failures,
            )
            small_summary = summarize(small_runs, small_readers)
            ratio = None
            if SMALL_SUBJECT in small_summary and "per-object" in small_summary:
                ratio = small_summary[SMALL_SUBJECT]["x"]["per-object"]["of_medians"]
            report["small"] = {key: value for key, value in small.items() if key not in ("objects",)} | {
                "count": args.small_count,
                "runs": [r.__dict__ | {"mib_s": r.mib_s} for r in small_runs],
                "summary": small_summary,
                "packed_x_per_object": ratio,
            }
            report["targets"].append(
                {
                    "target": SMALL_TARGET[0],
                    "minimum": SMALL_TARGET[1],
                    "strict": False,
                    "measured": ratio,
                    "met": None if ratio is None else ratio >= SMALL_TARGET[1],
                }
            )
            report["failures"] = dict(failures)
    report["elapsed_s"] = time.perf_counter() - began
    print(render(report), flush=True)
    _write_json(args.json, report)
    return 1 if failures.keys() - {"s3torchconnector"} else 0


def render(report: dict[str, Any]) -> str:
    s = report["settings"]
    out = [
        f"Machine: {describe(report['machine'])}",
        f"Origin: Ceph RGW (memstore) on 127.0.0.1 behind latency_proxy ({s['latency_ms']:g} ms before each "
        f"response, {s['conn_mbps']:g} MB/s per response); medians of {s['reps']} interleaved repetitions.",
        "",
    ]
    if "probe" in report:
        out += [
            f"Proxy ceilings: the ceiling reader over {s['probe_mib']} MiB, median of {s['probe_reps']} "
            "interleaved repetitions (proxy CPU s/GiB in brackets)",
            "",
            format_probe(report["probe"]),
            "",
        ]
    out += [
        f"Large objects: {s['total_mib']} MiB as {s['object_mib']} MiB objects",
        "",
        format_large(report["summary"]),
        "",
        format_ratios(report["summary"]),
    ]
    if "small" in report:
        small = report["small"]
        out += [
            "",
            f"Small objects: {small['count']:,} objects of 80-120 KiB "
            f"({small['payload_bytes'] / MIB:.0f} MiB), {len(small['shards'])} tar shards",
            "",
            format_small(small["summary"]),
            "",
            f"{SMALL_SUBJECT} / per-object samples/s: {fmt(small['packed_x_per_object'])}",
        ]
    loads = [r["load_1min"] for r in report.get("runs", []) + report.get("small", {}).get("runs", [])]
    if loads:
        out += [
            "",
            f"Noise: 1-minute load average before the runs {min(loads):.1f}-{max(loads):.1f} on "
            f"{report['machine']['cpus_usable']} cores; 'other CPU' is the machine's busy time minus the "
            "reader's, the proxy's and RGW's during each run (other processes).",
        ]
    out += ["", "Targets:", format_targets(report["targets"])]
    for reader, why in report.get("failures", {}).items():
        out += [f"- {reader} left out: {why.splitlines()[-1] if why else ''}"]
    return "\n".join(out)


def _write_json(path: str | None, report: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(report, indent=1, default=str))
        print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
