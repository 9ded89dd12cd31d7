"""TFRecord read benchmark (issue 8): fastload's ShardDataset over TFRecord shards against ``cat`` of the same
shards and the ``tfrecord`` package's ``tfrecord.torch.TFRecordDataset``.

Data: the read benchmark's JPEG + ``.cls`` files (``benchmarks/read_data.py``, cached under ``--data-dir``),
packed once by ``fastload.pack(shard_format="tfrecord")`` into shards of ``--shard-mib`` next to the tar
shards, plus the ``tfrecord`` package's index files (``tfrecord2idx``) so that its DataLoader workers can
split the shards between them.

Variants, each run in a fresh child process with the page cache warm: ``cat`` (every shard to /dev/null:
the reference); ``fastload/inproc/raw`` (``ShardDataset(decode=False)`` iterated) and ``fastload/nw2/raw``
(``fastload.DataLoader``, 2 workers); ``tfrecord/inproc/raw`` (a ``TFRecordDataset`` per shard, chained)
and ``tfrecord/nw2/raw`` (``torch.utils.data.DataLoader`` over a ``ChainDataset`` of them, 2 workers, with
index files). Raw bytes: every sample's ``jpg`` and ``cls`` are delivered undecoded; DataLoaders collate
with ``list``. An untimed first pass checks each reader's order-independent CRC32C digest over all keys and
bytes against the manifest; then ``--reps`` repetitions, rotated; figures are medians.

    python benchmarks/read_tfrecord.py --quick        # validation: 2,000 samples, 16 MiB shards, 2 reps
    python benchmarks/read_tfrecord.py                # 20,000 samples, 256 MiB shards, 3 reps
    python benchmarks/read.py --only local --tfrecord # the same rows after read.py's local tables
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MB, MIB = 1e6, 1 << 20
SEED = 20240611  # read.py's, so both use the same cached data
VARIANTS = ("cat", "fastload/inproc/raw", "tfrecord/inproc/raw", "fastload/nw2/raw", "tfrecord/nw2/raw")
TARGET = ("fastload/inproc/raw", "cat", 0.8)  # raw in-process >= 0.8x cat, as for tar shards


def ensure_shards(data: dict[str, Any], shard_bytes: int) -> dict[str, Any]:
    """TFRecord shards of the benchmark's files (made once, next to the tar shards) and their .idx files."""
    from tfrecord.tools.tfrecord2idx import create_index

    import fastload

    root = Path(data["shards"]).parent / f"tfrecord-{shard_bytes >> 20}m"
    if not (root / "index.json").exists():
        began = time.perf_counter()
        fastload.pack(
            data["files"], root, shard_format="tfrecord", shard_size_bytes=shard_bytes, progress=False
        )
        print(f"packed TFRecord shards into {root} in {time.perf_counter() - began:.0f} s", flush=True)
    names = [s["name"] for s in json.loads((root / "index.json").read_bytes())["shards"]]
    for name in names:
        idx = root / "idx" / f"{name}.idx"
        if not idx.exists():
            idx.parent.mkdir(exist_ok=True)
            create_index(str(root / name), str(idx))
    return {"root": str(root), "names": names, "bytes": sum((root / n).stat().st_size for n in names)}


# ------------------------------------------------------------------------------------------- in the child


def _identity(batch: list[Any]) -> list[Any]:
    return batch


def _samples(spec: dict[str, Any]) -> Any:
    """(key, jpg, cls) of every sample, as the variant's reader delivers them."""
    import torch.utils.data

    root, names = Path(spec["root"]), spec["names"]
    reader, mode = spec["variant"].split("/")[:2]
    if reader == "fastload":
        import fastload

        ds = fastload.ShardDataset(root, decode=False)
        if mode == "inproc":
            for s in ds:
                yield s["__key__"], s["jpg"], s["cls"]
            return
        for batch in fastload.DataLoader(
            ds, batch_size=spec["batch_size"], num_workers=2, collate_fn=_identity
        ):
            for s in batch:
                yield s["__key__"], s["jpg"], s["cls"]
        return
    from tfrecord.torch.dataset import TFRecordDataset

    def dataset(name: str) -> Any:
        idx = str(root / "idx" / f"{name}.idx") if mode == "nw2" else None  # workers split by the index
        return TFRecordDataset(str(root / name), idx)

    chain = torch.utils.data.ChainDataset([dataset(n) for n in names])
    if mode == "inproc":
        records: Any = chain
    else:
        loader = torch.utils.data.DataLoader(
            chain, batch_size=spec["batch_size"], num_workers=2, collate_fn=_identity
        )
        records = (r for batch in loader for r in batch)
    for r in records:
        yield bytes(r["__key__"]).decode(), r["jpg"], r["cls"]


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    import importlib

    from read_data import sample_digest

    modules = (
        "torch.utils.data",
        "tfrecord.torch.dataset",
        "fastload.train.dataset",
        "fastload.storage.opener",
    )
    for module in modules:
        importlib.import_module(module)  # imports stay out of the timed part
    sizes = {s[0]: (s[1], s[2]) for s in spec["manifest"]}
    began, cpu0 = time.perf_counter(), _cpu_s()
    samples = nbytes = digest = 0
    if spec["variant"] == "cat":
        paths = [os.path.join(spec["root"], n) for n in spec["names"]]
        subprocess.run(["cat", *paths], stdout=subprocess.DEVNULL, check=True)
        nbytes = sum(os.path.getsize(p) for p in paths)
    else:
        for key, jpg, cls in _samples(spec):
            if (len(jpg), len(cls)) != sizes[key]:
                raise RuntimeError(f"{spec['variant']}: sample {key} has sizes {len(jpg)}, {len(cls)}")
            samples += 1
            nbytes += len(jpg) + len(cls)
            if spec["digest"]:
                digest += sample_digest(key, memoryview(jpg).cast("B"), memoryview(cls).cast("B"))
    seconds = time.perf_counter() - began
    return {
        "seconds": seconds,
        "samples": samples,
        "bytes": nbytes,
        "cpu_s": _cpu_s() - cpu0,
        "digest": digest,
    }


def _cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


# ------------------------------------------------------------------------------------------ in the parent


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="fastload-tfrbench-") as f:
        json.dump(spec, f)
        f.flush()
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--child", f.name],
            capture_output=True,
            text=True,
            cwd=str(HERE),
            timeout=1800,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"{spec['variant']} failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def run(
    data: dict[str, Any],
    *,
    shard_bytes: int,
    reps: int,
    batch_size: int = 64,
    variants: Sequence[str] = VARIANTS,
) -> dict[str, Any]:
    """Make the shards if needed, verify every reader once, time ``reps`` rotated repetitions of
    ``variants`` (``cat`` always among them); print and return the table."""
    from read_data import combine

    chosen = ("cat", *[v for v in variants if v != "cat"])

    shards = ensure_shards(data, shard_bytes)
    base = {**shards, "manifest": data["samples"], "batch_size": batch_size}
    want = (len(data["samples"]), combine(s[4] for s in data["samples"]))
    for variant in chosen[1:]:
        got = _child({**base, "variant": variant, "digest": True})
        if (got["samples"], combine([got["digest"]])) != want:
            raise RuntimeError(f"{variant}: {got['samples']} samples, digest {got['digest']}; want {want}")
        print(f"  verify tfrecord {variant:22s} digest ok {got['samples'] / got['seconds']:9,.0f} samples/s")
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in chosen}
    for rep in range(reps):
        for variant in chosen[rep % len(chosen) :] + chosen[: rep % len(chosen)]:
            r = _child({**base, "variant": variant, "digest": False})
            runs[variant].append(r)
            print(
                f"  rep {rep} tfrecord {variant:22s} {r['seconds']:7.2f} s "
                f"{r['bytes'] / MB / r['seconds']:8,.0f} MB/s"
            )
    table = {}
    for variant, rs in runs.items():
        median_s = statistics.median(r["seconds"] for r in rs)
        table[variant] = {
            "median_s": median_s,
            "samples_s": rs[0]["samples"] / median_s,
            "mb_s": rs[0]["bytes"] / MB / median_s,
            "cpu_s_per_gb": statistics.median(r["cpu_s"] / (r["bytes"] / 1e9) for r in rs),
        }
    a, b, minimum = TARGET
    out = {"shards": len(shards["names"]), "shard_bytes": shards["bytes"], "reps": reps, "table": table}
    if a in table:
        measured = table[a]["mb_s"] / table[b]["mb_s"]
        out["target"] = {
            "target": f"TFRecord raw in-process >= {minimum}x cat",
            "measured": measured,
            "met": measured >= minimum,
        }
    print(render(out), flush=True)
    return out


def render(result: dict[str, Any]) -> str:
    table = result["table"]
    lines = [
        f"TFRecord shards: {result['shards']} ({result['shard_bytes'] / MB:,.0f} MB), medians of "
        f"{result['reps']} repetitions, page cache warm",
        "",
        "| variant | samples/s | MB/s | x cat (MB/s) | x tfrecord pkg (samples/s) | CPU s/GB |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for name, row in table.items():
        peer = name.replace("fastload/", "tfrecord/") if name.startswith("fastload/") else None
        vs_peer = f"{row['samples_s'] / table[peer]['samples_s']:.2f}" if peer in table else "-"
        vs_cat = f"{row['mb_s'] / table['cat']['mb_s']:.2f}" if name != "cat" else "1.00"
        samples = f"{row['samples_s']:,.0f}" if name != "cat" else "-"
        lines.append(
            f"| {name} | {samples} | {row['mb_s']:,.0f} | {vs_cat} | {vs_peer} | {row['cpu_s_per_gb']:.2f} |"
        )
    t = result.get("target")
    if t is not None:
        lines += ["", f"- {t['target']}: {t['measured']:.2f}x -> {'PASS' if t['met'] else 'MISS'}"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/read_tfrecord.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="2,000 samples in 16 MiB shards, 2 repetitions")
    parser.add_argument("--count", type=int, help="samples (default 20,000; --quick 2,000)")
    parser.add_argument("--shard-mib", type=int, help="shard size (default 256; --quick 16)")
    parser.add_argument("--reps", type=int, help="timed repetitions (default 3; --quick 2)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--only",
        metavar="V,V",
        help=f"comma-separated variants to run (cat always runs; default all: {','.join(VARIANTS)})",
    )
    parser.add_argument("--data-dir", default="/tmp/fastload-readbench", help="cache of generated data")
    parser.add_argument("--json", metavar="FILE", help="write the results to FILE")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    if args.child:
        print(json.dumps(run_child(json.loads(Path(args.child).read_text()))))
        return 0
    import read_data

    variants = VARIANTS if args.only is None else tuple(args.only.split(","))
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"--only: unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    count = args.count or (2_000 if args.quick else 20_000)
    shard_bytes = (args.shard_mib or (16 if args.quick else 256)) * MIB
    data = read_data.ensure(Path(args.data_dir), count=count, seed=SEED, shard_bytes=shard_bytes)
    result = run(
        data,
        shard_bytes=shard_bytes,
        reps=args.reps or (2 if args.quick else 3),
        batch_size=args.batch_size,
        variants=variants,
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
