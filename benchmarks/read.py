"""Read benchmark (issue 4): fastload's ShardDataset against webdataset, litdata and a per-file Dataset.

Data (``benchmarks/read_data.py``, made once and cached under ``--data-dir``): ``--count`` (20,000) real
JPEGs of about 75 KiB plus ``.cls`` labels as small files; the same packed by ``fastload.pack`` into tar
shards of ``--shard-mib`` (256), which webdataset reads too; and litdata's own format made by
``litdata.optimize`` (64 MB chunks).

Variants (``benchmarks/read_variants.py``), each run in a fresh child process (so its peak memory is its
own): the reference ``cat`` of the shards (page cache warm); fastload ``ShardDataset(decode=False)``,
``webdataset.WebDataset``, litdata ``StreamingDataset`` and a naive per-file ``Dataset``, each in-process
(``inproc``: iterating the dataset) and through ``DataLoader(num_workers=2, batch_size=64)`` (``nw2``;
fastload through ``fastload.DataLoader``, litdata through ``StreamingDataLoader``); raw bytes, and with the
JPEG decoded and center-cropped to a 224x224 uint8 tensor (the first ``--decode-samples`` samples), against
``decode-only``: one process doing nothing but decoding the same JPEGs from memory.

Over S3 (``--only s3``, or both by default): Ceph RGW on 127.0.0.1 behind ``benchmarks/latency_proxy.py``
(``--latency-ms`` 20 before each response, each response paced to ``--conn-mbps`` 50 MB/s), started as in
``benchmarks/s3_read.py``: fastload from ``s3://`` against webdataset streaming the same shards (a boto3
``get_object`` body per shard, registered as webdataset's ``s3`` gopen handler) and the per-file Dataset
doing two boto3 GETs per sample (over the first ``--s3-per-file-samples`` samples: at about 15 samples/s
it would take minutes to read them all).

Honesty: every run checks each sample's size (or decoded shape and label) against the manifest; a first,
untimed pass checks every raw variant's order-independent CRC32C digest over all keys and bytes (and warms
the page cache). Repetitions interleave the variants, rotated by one each time; figures are medians.
Peak memory: the main process's peak RSS (VmHWM) and the peak PSS of the whole process tree (main plus
DataLoader workers), sampled every 100 ms by the parent.

    python benchmarks/read.py --quick                       # validation: 2,000 samples, one checked run each
    python benchmarks/read.py --json /tmp/read.json         # the issue's configuration
    python benchmarks/read.py --only local --variants fastload,cat
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MB = 1e6
MIB = 1 << 20
SEED = 20240611
CHILD_TIMEOUT_S = 1800
# fastload-nocrc: fastload with verify_samples=False (index v2's per-sample CRC32C not checked)
LOCAL_READERS = ("cat", "decode-only", "fastload", "fastload-nocrc", "webdataset", "litdata", "perfile")
S3_READERS = ("fastload", "fastload-nocrc", "webdataset", "perfile")
# (name, location, subject variant, peer variant, minimum ratio, measure)
TARGETS = (
    ("raw in-process >= 0.8x cat", "local", "fastload/inproc/raw", "cat", 0.8, "mb_s"),
    ("raw num_workers=2 >= 2x litdata", "local", "fastload/nw2/raw", "litdata/nw2/raw", 2.0, "samples_s"),
    (
        "decode num_workers=2 >= 1.5x decode-only",
        "local",
        "fastload/nw2/decode",
        "decode-only",
        1.5,
        "samples_s",
    ),
    ("S3 num_workers=2 >= 3x webdataset", "s3", "fastload/nw2/raw", "webdataset/nw2/raw", 3.0, "samples_s"),
    (
        "S3 in-process >= 3x webdataset",
        "s3",
        "fastload/inproc/raw",
        "webdataset/inproc/raw",
        3.0,
        "samples_s",
    ),
    ("S3 num_workers=2 >= 20x per-file", "s3", "fastload/nw2/raw", "perfile/nw2/raw", 20.0, "samples_s"),
    ("S3 in-process >= 20x per-file", "s3", "fastload/inproc/raw", "perfile/inproc/raw", 20.0, "samples_s"),
)


# ---------------------------------------------------------------------------------------------- pure parts


def variants(
    location: str,
    readers: Sequence[str],
    payloads: Sequence[str] = ("raw", "decode"),
    modes: Sequence[str] = ("inproc", "nw2"),
    candidate: bool = False,
) -> list[str]:
    """Variant names ``reader/mode/payload`` (or a bare reference name) of one location, in run order."""
    out = []
    for payload in [p for p in payloads if location == "local" or p == "raw"]:
        for reader in readers:
            if reader == "cat":
                out += ["cat"] if payload == "raw" else []
            elif reader == "decode-only":
                out += ["decode-only"] if payload == "decode" else []
            else:
                out += [f"{reader}/{mode}/{payload}" for mode in modes]
                if reader == "fastload" and candidate:
                    out += [f"candidate/{mode}/{payload}" for mode in modes]
    return out


def rotated(items: Sequence[str], rep: int) -> list[str]:
    k = rep % len(items) if items else 0
    return [*items[k:], *items[:k]]


@dataclass
class Run:
    location: str
    variant: str
    rep: int
    seconds: float
    samples: int
    bytes: int
    cpu_s: float
    maxrss_main_mib: float
    peak_pss_mib: float | None
    load_1min: float
    fastload_file: str | None = None

    @property
    def samples_s(self) -> float:
        return self.samples / self.seconds

    @property
    def mb_s(self) -> float:
        return self.bytes / MB / self.seconds


def summarize(runs: Sequence[Run]) -> dict[str, dict[str, Any]]:
    """Per variant: medians over the timed repetitions (rep >= 0), spread and the peak memory seen."""
    out: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(r.variant for r in runs if r.rep >= 0):
        rs = [r for r in runs if r.variant == name and r.rep >= 0]
        median_s = statistics.median(r.seconds for r in rs)
        pss = [r.peak_pss_mib for r in rs if r.peak_pss_mib is not None]
        out[name] = {
            "reps": len(rs),
            "median_s": median_s,
            "samples": rs[0].samples,
            "bytes": rs[0].bytes,
            "samples_s": rs[0].samples / median_s,
            "mb_s": rs[0].bytes / MB / median_s,
            "samples_s_range": [min(r.samples_s for r in rs), max(r.samples_s for r in rs)],
            "cpu_s_per_gb": statistics.median(r.cpu_s / (r.bytes / 1e9) for r in rs),
            "maxrss_main_mib": max(r.maxrss_main_mib for r in rs),
            "peak_pss_mib": max(pss) if pss else None,
            "by_rep": {r.rep: {"samples_s": r.samples_s, "mb_s": r.mb_s} for r in rs},
        }
    return out


def ratio(summary: dict[str, dict[str, Any]], a: str, b: str, measure: str) -> dict[str, Any] | None:
    """``a`` over ``b`` in ``measure``: of the medians, and paired per repetition (min-max)."""
    if a not in summary or b not in summary:
        return None
    ra, rb = summary[a], summary[b]
    paired = [ra["by_rep"][k][measure] / rb["by_rep"][k][measure] for k in ra["by_rep"] if k in rb["by_rep"]]
    return {"of_medians": ra[measure] / rb[measure], "paired": [min(paired), max(paired)] if paired else None}


def check_targets(results: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each target of the issue for fastload, and for the candidate (``--candidate``) where it ran."""
    out = []
    for target, location, subject, b, minimum, measure in TARGETS:
        for who in ("fastload", "candidate"):
            a = subject.replace("fastload/", f"{who}/", 1)
            if who == "candidate" and a not in results.get(location, {}):
                continue
            r = ratio(results.get(location, {}), a, b, measure)
            got = r["of_medians"] if r else None
            name = target if who == "fastload" else f"{target} (candidate)"
            out.append(
                {
                    "target": name,
                    "location": location,
                    "measured": got,
                    "paired": r["paired"] if r else None,
                    "minimum": minimum,
                    "met": None if got is None else got >= minimum,
                }
            )
    return out


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    return str(_s3bench().markdown_table(header, rows))


def _f(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_summary(summary: dict[str, dict[str, Any]], location: str) -> str:
    rows = []
    for name, row in summary.items():
        ref = "cat" if name.endswith("/raw") or name == "cat" else "decode-only"
        x = ratio(summary, name, ref, "mb_s" if ref == "cat" else "samples_s")
        if location == "s3":
            x = None
        lo, hi = row["samples_s_range"]
        rows.append(
            (
                name,
                f"{row['samples_s']:,.0f}",
                f"{lo:,.0f}-{hi:,.0f}",
                f"{row['mb_s']:,.0f}",
                _f(x["of_medians"] if x else None, ".2f") + (f" ({ref})" if x and name != ref else ""),
                f"{row['cpu_s_per_gb']:.2f}",
                f"{row['maxrss_main_mib']:,.0f}",
                _f(row["peak_pss_mib"], ",.0f"),
            )
        )
    header = ("variant", "samples/s", "min-max", "MB/s", "x ref", "CPU s/GB", "RSS main MiB", "PSS all MiB")
    return markdown_table(header, rows)


def format_peers(summary: dict[str, dict[str, Any]]) -> str:
    rows = []
    for name in summary:
        if not name.startswith(("fastload/", "candidate/")):
            continue
        _, mode, payload = name.split("/")
        for peer in ("fastload", "webdataset", "litdata", "perfile"):
            if name.startswith(peer + "/"):
                continue
            r = ratio(summary, name, f"{peer}/{mode}/{payload}", "samples_s")
            if r:
                lo, hi = r["paired"] or (None, None)
                rows.append(
                    (f"{name} / {peer}", f"{r['of_medians']:.2f}", f"{_f(lo, '.2f')}-{_f(hi, '.2f')}")
                )
    return markdown_table(("fastload / peer, samples/s", "of medians", "paired per rep"), rows)


def format_targets(targets: Sequence[dict[str, Any]]) -> str:
    lines = []
    for t in targets:
        verdict = {True: "PASS", False: "MISS", None: "n/a (not run)"}[t["met"]]
        paired = f" (paired reps {t['paired'][0]:.2f}-{t['paired'][1]:.2f})" if t["paired"] else ""
        lines.append(f"- {t['target']}: {_f(t['measured'], '.2f')}x{paired} -> {verdict}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------- running one child


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
    return out


def _pss_mib(pids: Sequence[int]) -> float:
    total = 0
    for p in pids:
        with contextlib.suppress(OSError), open(f"/proc/{p}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
                    break
    return total / 1024


class PeakPss:
    """Samples the summed PSS of a process and its descendants every ``interval_s``; keeps the peak."""

    def __init__(self, pid: int, interval_s: float = 0.1) -> None:
        self.pid, self.interval_s, self.peak = pid, interval_s, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, _pss_mib(_descendants(self.pid)))

    def stop(self) -> float | None:
        self._stop.set()
        self._thread.join()
        return self.peak or None


def run_variant(
    location: str, variant: str, spec: dict[str, Any], env: dict[str, str], rep: int
) -> tuple[Run, dict[str, Any]]:
    """One variant, once, in a fresh child process; raises with the child's output if it fails."""
    with tempfile.TemporaryDirectory(prefix="fastload-readbench-run-") as tmp:
        spec_path = Path(tmp) / "spec.json"
        spec = {**spec, "result_path": str(Path(tmp) / "result.json")}
        spec_path.write_text(json.dumps(spec))
        out_path = Path(tmp) / "out.txt"
        with open(out_path, "w+") as out:
            if spec.get("pythonpath"):
                env = {**env, "PYTHONPATH": spec["pythonpath"]}
            proc = subprocess.Popen(
                [sys.executable, str(HERE / "read.py"), "--child", str(spec_path)],
                env=env,
                cwd=str(ROOT),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
            sampler = PeakPss(proc.pid)
            try:
                code = proc.wait(timeout=CHILD_TIMEOUT_S)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                pss = sampler.stop()
        if code != 0:
            tail = "\n".join(out_path.read_text(errors="replace").strip().splitlines()[-25:])
            raise RuntimeError(f"{location} {variant} failed (exit {code}):\n{tail}")
        result = json.loads(Path(spec["result_path"]).read_text())
    return Run(
        location=location,
        variant=variant,
        rep=rep,
        seconds=result["seconds"],
        samples=result["samples"],
        bytes=result["bytes"],
        cpu_s=result["cpu_s"],
        maxrss_main_mib=result["maxrss_main_kib"] / 1024,
        peak_pss_mib=pss,
        load_1min=result["load_1min"],
        fastload_file=result.get("fastload_file"),
    ), result


# ------------------------------------------------------------------------------------------ the phases


def spec_of(variant: str, base: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The child's spec for ``variant`` from the location's ``base`` (paths or S3 URLs)."""
    reader, mode, payload = [*variant.split("/"), "-", "-"][:3] if "/" in variant else (variant, "-", "-")
    if variant == "decode-only":
        payload = "decode"
    elif variant == "cat":
        payload = "raw"
    pythonpath = None
    if reader == "candidate":
        reader, pythonpath = "fastload", args.candidate
    spec = {
        **base,
        "pythonpath": pythonpath,
        "reader": reader,
        "mode": mode,
        "payload": payload,
        "batch_size": args.batch_size,
        "digest": False,
        "limit": None,
    }
    if reader == "perfile":
        spec["source"], spec["keys"] = base["perfile_root"], base["perfile_keys"]
    elif reader == "litdata":
        spec["source"] = base["litdata"]
    elif reader == "decode-only":
        spec["source"] = base["perfile_root"]
        spec["keys"] = base["keys"][: args.decode_samples]
    if payload == "decode":
        spec["limit"] = args.decode_samples
    keys = set(spec["keys"])
    spec["manifest"] = [s for s in base["manifest"] if s[0] in keys]
    return spec


def expected(spec: dict[str, Any]) -> tuple[int, int]:
    """(samples, digest) a raw variant must deliver: all of its keys."""
    from read_data import combine

    return len(spec["manifest"]), combine(s[4] for s in spec["manifest"])


def verify(
    location: str,
    name: str,
    spec: dict[str, Any],
    run: Run,
    result: dict[str, Any],
    base: dict[str, Any],
    args: argparse.Namespace,
) -> str:
    """Check what a run delivered: every sample's bytes (digest) or its decoded label, or cat's byte count."""
    want_n, want_digest = expected(spec)
    if spec["payload"] == "raw" and name != "cat":
        if (run.samples, result["digest"]) != (want_n, want_digest):
            raise RuntimeError(
                f"{location} {name}: delivered {run.samples} samples with digest {result['digest']}, "
                f"the data has {want_n} with digest {want_digest}"
            )
        return "digest ok"
    if spec["payload"] == "decode":
        want = min(spec["limit"] or want_n, len(base["keys"]))  # batched: up to a batch more
        if not want <= run.samples < want + args.batch_size or result["keys_seen"] != run.samples:
            raise RuntimeError(f"{location} {name}: {run.samples} samples, {result['keys_seen']} distinct")
        return "labels ok"
    if run.bytes != base["shard_bytes"]:
        raise RuntimeError(f"{location} cat: read {run.bytes} bytes, the shards hold {base['shard_bytes']}")
    return "bytes ok"


def interleave(
    location: str, names: list[str], base: dict[str, Any], env: dict[str, str], args: argparse.Namespace
) -> list[Run]:
    """An untimed verification pass (digests; warms the page cache), then ``reps`` rotated repetitions."""
    runs: list[Run] = []
    specs = {n: spec_of(n, base, args) for n in names}
    if not args.no_verify_pass:
        for name in names:
            spec = {**specs[name], "digest": name != "cat"}
            run, result = run_variant(location, name, spec, env, rep=-1)
            verdict = verify(location, name, spec, run, result, base, args)
            runs.append(run)
            print(f"  verify {location} {name:24s} {verdict:9s} {run.samples_s:9,.0f} samples/s", flush=True)
    for rep in range(args.reps):
        for name in rotated(names, rep):
            spec = {**specs[name], "digest": args.touch and name != "cat"}
            run, result = run_variant(location, name, spec, env, rep=rep)
            if spec["digest"]:
                verify(location, name, spec, run, result, base, args)
            runs.append(run)
            print(
                f"  rep {rep} {location} {name:24s} {run.seconds:7.2f} s {run.samples_s:9,.0f} samples/s "
                f"{run.mb_s:7,.0f} MB/s  RSS {run.maxrss_main_mib:6,.0f} MiB  PSS "
                f"{_f(run.peak_pss_mib, '6,.0f')} MiB  load {run.load_1min:.1f}",
                flush=True,
            )
    return runs


def local_base(data: dict[str, Any]) -> dict[str, Any]:
    keys = [s[0] for s in data["samples"]]
    return {
        "source": data["shards"],
        "urls": [os.path.join(data["shards"], n) for n in data["tars"]],
        "litdata": data["litdata"],
        "keys": keys,
        "perfile_root": data["files"],
        "perfile_keys": keys,
        "manifest": data["samples"],
        "shard_bytes": data["shard_bytes"],
    }


def _s3bench() -> Any:
    sys.path.insert(0, str(HERE))
    import s3_read

    return s3_read


@contextlib.contextmanager
def s3_world(
    args: argparse.Namespace, data: dict[str, Any]
) -> Iterator[tuple[dict[str, Any], dict[str, str]]]:
    """RGW + the capped proxy (as in s3_read.py), the shards and the per-file subset uploaded."""
    s3bench = _s3bench()
    import fastload

    per_file = data["samples"][: args.s3_per_file_samples]
    data_bytes = data["shard_bytes"] + sum(s[1] + s[2] for s in per_file)
    world_args = SimpleNamespace(
        memstore_gib=None, latency_ms=args.latency_ms, conn_mbps=args.conn_mbps, probe="no"
    )
    with s3bench.world_up(world_args, data_bytes) as world:
        bucket = s3bench.BUCKET
        config = fastload.S3Config(
            endpoint_url=world.rgw.endpoint_url, region="us-east-1", addressing_style="path"
        )
        began = time.perf_counter()
        fastload.copy(data["shards"] + "/", f"s3://{bucket}/packed/", recursive=True, config=config)
        client = s3bench.upload_client(world, max_pool_connections=16)
        files = Path(data["files"])

        def put(name: str) -> None:
            client.put_object(Bucket=bucket, Key=f"files/{name}", Body=(files / name).read_bytes())

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(put, [f"{s[0]}.{ext}" for s in per_file for ext in ("jpg", "cls")]))
        print(
            f"uploaded shards and {len(per_file):,} per-file samples in {time.perf_counter() - began:.0f} s"
        )
        base = local_base(data) | {
            "source": f"s3://{bucket}/packed",
            "urls": [f"s3://{bucket}/packed/{n}" for n in data["tars"]],
            "perfile_root": "files",
            "perfile_keys": [s[0] for s in per_file],
            "s3": {"endpoint_url": world.proxies["capped"].endpoint_url, "bucket": bucket},
        }
        yield base, world.env


def tfrecord_rows(args: argparse.Namespace, data: dict[str, Any]) -> dict[str, Any]:
    """Issue 8's TFRecord rows on the same data: fastload over TFRecord shards vs ``cat`` and the
    ``tfrecord`` package (see ``benchmarks/read_tfrecord.py``); printed there, returned for the JSON."""
    import read_tfrecord

    result: dict[str, Any] = read_tfrecord.run(
        data, shard_bytes=args.shard_mib * MIB, reps=args.reps, batch_size=args.batch_size
    )
    return result


def machine() -> dict[str, Any]:
    info: dict[str, Any] = _s3bench().machine_info()
    info["packages"] = {}
    for name in ("fastload", "torch", "webdataset", "litdata", "pillow", "numpy", "boto3"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            info["packages"][name] = importlib.metadata.version(name)
    from fastload.formats import native

    # "C" (fastload._native) or "Python", for tar and TFRecord shards
    info["packages"]["fastload reader"] = f"{native.in_use()} (TFRecord {native.in_use('tfrecord')})"
    return info


# ------------------------------------------------------------------------------------------------ main

# what each reader needs, and how to get it (litdata: without its torch and torchvision requirements)
NEEDS = {
    "webdataset": ("webdataset", "pip install webdataset"),
    "litdata": (
        "litdata",
        "pip install --no-deps litdata && pip install lightning-utilities tifffile obstore",
    ),
    "decode-only": ("PIL", "pip install pillow"),
}


def missing_packages(readers: Sequence[str], only: str | None) -> str | None:
    """A message naming what the chosen readers need and is not installed (None when all is there)."""
    import importlib.util
    import shutil

    lines = []
    for reader in readers:
        module, how = NEEDS.get(reader, (None, ""))
        if module and importlib.util.find_spec(module) is None:
            lines.append(f"{reader} needs {module}: {how} (or leave it out with --variants)")
    if importlib.util.find_spec("PIL") is None and "pip install pillow" not in " ".join(lines):
        lines.append("making the JPEGs needs Pillow: pip install pillow")
    if only != "local" and shutil.which("radosgw") is None:
        lines.append("the S3 phase needs Ceph RGW: bash .ci/install-s3-servers (as root), or --only local")
    return "; ".join(lines) or None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/read.py",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add(
        "--quick",
        action="store_true",
        help="validation: 2,000 samples in 16 MiB shards, one digest-checked run per variant",
    )
    add("--only", choices=("local", "s3"), help="run one location (default: both)")
    add("--json", metavar="FILE", help="write every run, the summaries and the machine to FILE")
    add("--count", type=int, help="samples (default 20,000; --quick 2,000)")
    add("--shard-mib", type=int, help="tar shard size (default 256; --quick 16)")
    add("--reps", type=int, help="timed repetitions (default 3; --quick 1)")
    add("--batch-size", type=int, default=64, help="DataLoader batch size (default 64)")
    add("--decode-samples", type=int, help="samples per decode run (default 5,000; --quick 500)")
    add("--s3-per-file-samples", type=int, help="S3 per-file samples (default 500; --quick 100)")
    add("--variants", help="comma-separated readers to run (default all): " + ",".join(LOCAL_READERS))
    add("--payloads", default="raw,decode", help="comma-separated subset of raw,decode")
    add("--modes", default="inproc,nw2", help="comma-separated subset of inproc,nw2")
    add("--latency-ms", type=float, default=20.0, help="proxy latency before each response (default 20)")
    add("--conn-mbps", type=float, default=50.0, help="proxy cap per response in MB/s (default 50)")
    add(
        "--candidate",
        metavar="PATH",
        help="also run fastload's variants with PYTHONPATH=PATH (a patched copy) as 'candidate', interleaved",
    )
    add("--touch", action="store_true", help="timed runs also CRC32C every delivered byte")
    add("--no-verify-pass", action="store_true", help="skip the untimed digest pass")
    add("--data-dir", default="/tmp/fastload-readbench", help="cache of generated data")
    add("--tfrecord", action="store_true", help="also the TFRecord rows (benchmarks/read_tfrecord.py)")
    add("--child", metavar="SPEC", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    quick = args.quick
    args.count = args.count or (2_000 if quick else 20_000)
    args.shard_mib = args.shard_mib or (16 if quick else 256)
    args.reps = args.reps or (1 if quick else 3)
    args.decode_samples = args.decode_samples or (500 if quick else 5_000)
    if quick:  # one run per variant, which also checks every byte (no separate verification pass)
        args.no_verify_pass, args.touch = True, True
    args.s3_per_file_samples = args.s3_per_file_samples or (100 if quick else 500)
    readers = args.variants.split(",") if args.variants else list(LOCAL_READERS)
    unknown = set(readers) - set(LOCAL_READERS)
    if unknown:
        parser.error(f"unknown readers {sorted(unknown)}; choose from {', '.join(LOCAL_READERS)}")
    args.readers = readers
    args.payload_list, args.mode_list = args.payloads.split(","), args.modes.split(",")
    if set(args.payload_list) - {"raw", "decode"} or set(args.mode_list) - {"inproc", "nw2"}:
        parser.error("--payloads takes raw,decode and --modes inproc,nw2")
    if min(args.count, args.shard_mib, args.reps, args.batch_size, args.decode_samples) < 1:
        parser.error("--count, --shard-mib, --reps, --batch-size and --decode-samples must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        from read_variants import run_child

        return run_child(args.child)
    missing = missing_packages(args.readers, args.only)
    if missing:
        print(f"read.py: {missing}", file=sys.stderr)
        return 2
    import read_data

    info = machine()
    report: dict[str, Any] = {
        "command": " ".join(["python", "benchmarks/read.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": info,
        "settings": {k: v for k, v in vars(args).items() if k != "child"},
    }
    print(_s3bench().describe(info), flush=True)
    began = time.perf_counter()
    data = read_data.ensure(
        Path(args.data_dir), count=args.count, seed=SEED, shard_bytes=args.shard_mib * MIB
    )
    report["data"] = {k: v for k, v in data.items() if k != "samples"}
    print(
        f"data: {data['count']:,} samples, {data['payload_bytes'] / MB:,.0f} MB payload, "
        f"{len(data['tars'])} tar shards ({data['shard_bytes'] / MB:,.0f} MB), litdata "
        f"{data['litdata_bytes'] / MB:,.0f} MB",
        flush=True,
    )
    runs: list[Run] = []
    summaries: dict[str, dict[str, dict[str, Any]]] = {}
    if args.only in (None, "local"):
        names = variants("local", args.readers, args.payload_list, args.mode_list, bool(args.candidate))
        runs += interleave("local", names, local_base(data), dict(os.environ), args)
        summaries["local"] = summarize([r for r in runs if r.location == "local"])
        if args.tfrecord:
            report["tfrecord"] = tfrecord_rows(args, data)
    if args.only in (None, "s3"):
        s3_readers = [r for r in args.readers if r in S3_READERS]
        names = variants("s3", s3_readers, ["raw"], args.mode_list, bool(args.candidate))
        with s3_world(args, data) as (base, env):
            runs += interleave("s3", names, base, env, args)
        summaries["s3"] = summarize([r for r in runs if r.location == "s3"])
    report["runs"] = [asdict(r) for r in runs]
    report["summary"] = summaries
    report["targets"] = check_targets(summaries)
    report["elapsed_s"] = time.perf_counter() - began
    print(render(report), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
        print(f"wrote {args.json}")
    return 0


def render(report: dict[str, Any]) -> str:
    s, d = report["settings"], report["data"]
    out = [
        f"Data: {d['count']:,} JPEG samples, {d['payload_bytes'] / MB:,.0f} MB, {len(d['tars'])} tar shards; "
        f"batch size {s['batch_size']}; decode runs take the first {s['decode_samples']:,} samples; "
        f"medians of {s['reps']} interleaved repetitions, each variant in a fresh process.",
    ]
    for location, summary in report["summary"].items():
        title = (
            "Local (page cache warm)"
            if location == "local"
            else f"S3: RGW behind a proxy adding {s['latency_ms']:g} ms per response, "
            f"{s['conn_mbps']:g} MB/s per response; per-file reads the first "
            f"{s['s3_per_file_samples']:,} samples"
        )
        out += ["", title, "", format_summary(summary, location), "", format_peers(summary)]
    files = sorted({r["fastload_file"] for r in report["runs"] if r.get("fastload_file")})
    if files:
        out += [
            "",
            "fastload imported from: " + ", ".join(os.path.dirname(os.path.dirname(f)) for f in files),
        ]
    loads = [r["load_1min"] for r in report["runs"]]
    if loads:
        out += ["", f"Noise: 1-minute load average at the end of each run {min(loads):.1f}-{max(loads):.1f}."]
    out += ["", "Targets (issue 4):", format_targets(report["targets"])]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
