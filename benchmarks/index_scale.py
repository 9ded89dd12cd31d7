"""Index scale benchmark (issue 15): what one rank pays to open and plan a dataset, from 1M to 1B samples.

Cases, each measured in a fresh child process after ``import torch, fastload`` (time, and RSS as the
VmRSS delta and the peak (VmHWM) delta over that point):

- ``real``: a real 1,000,000-sample dataset, 20 tar shards x 50,000 one-byte samples, written directly
  (a minimal ustar writer: one member ``NNN/KKKKKKK.cls`` per sample) and indexed by ``fastload index``
  (index v1), then a hard-linked copy upgraded to v2 by ``fastload.packing.upgrade.upgrade_index``.
  ``ShardDataset(rank=3, world_size=8)`` construction, its epoch plan (``len(ds)``), and the time to the
  first sample of a fresh dataset (construction + plan + first read), v1 against v2 interleaved.
- ``synthetic``: manifests written directly with ``fastload.core.index`` (no shard files: nothing is read
  but ``index.json``), 5,000 samples a shard, 1M to 1B samples (200 to 200,000 shards), index v2; and v1
  at 1M and 10M (every sample's key, offset and size listed, as v1 does) for the "before".
  Construction; the epoch plan of rank 3 of 1,024 without and with ``shuffle_buffer=10_000``; resuming
  rank 3 from a checkpoint of the same world size, of world 512 (to 1,024) and, at the bottom, 1,024 ->
  512 and 1,024 -> 1,016 (a node of 8 lost: the new rank reads from 128 old ranks).

Every figure is the range over ``--runs`` runs (cases interleaved, one child each).

    python benchmarks/index_scale.py --data /tmp/fl-scale            # everything (~10 minutes, 2 cores)
    python benchmarks/index_scale.py --data /tmp/fl-scale --only synthetic --runs 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PER_SHARD = 5_000
SYNTHETIC = [1_000_000, 10_000_000, 100_000_000, 1_000_000_000]
V1_SYNTHETIC = [1_000_000, 10_000_000]


# -- data ----------------------------------------------------------------------------------------------


def _ustar_template() -> tuple[bytearray, int]:
    """A 512-byte ustar header with a 15-byte name and a 1-byte size, and its checksum without the name."""
    h = bytearray(512)
    h[100:108] = b"0000644\0"
    h[108:116] = b"0000000\0"
    h[116:124] = b"0000000\0"
    h[124:136] = b"00000000001\0"
    h[136:148] = b"00000000000\0"
    h[148:156] = b" " * 8
    h[156:157] = b"0"
    h[257:263] = b"ustar\0"
    h[263:265] = b"00"
    return h, sum(h)


def write_tar_shard(path: Path, shard: int, count: int) -> None:
    """``count`` samples ``SSS/KKKKKKK.cls`` of one byte each, as a plain ustar file (two zero blocks end)."""
    template, base = _ustar_template()
    data = bytearray(512)
    out = bytearray()
    for i in range(count):
        name = b"%03d/%07d.cls" % (shard, i)
        h = bytearray(template)
        h[: len(name)] = name
        h[148:156] = b"%06o\0 " % (base + sum(name))
        data[0] = 48 + i % 10
        out += h
        out += data
    out += bytes(1024)
    path.write_bytes(out)


def make_real(folder: Path, shards: int = 20, per: int = 50_000) -> tuple[Path, Path]:
    """The real dataset as index v1 and v2 (made once; reused when present)."""
    v1, v2 = folder / "real-v1", folder / "real-v2"
    if (v1 / "index.json").exists() and (v2 / "index.json").exists():
        return v1, v2
    shutil.rmtree(v1, ignore_errors=True)
    shutil.rmtree(v2, ignore_errors=True)
    v1.mkdir(parents=True)
    started = time.monotonic()
    for s in range(shards):
        write_tar_shard(v1 / f"shard-{s:05d}.tar", s, per)
    wrote = time.monotonic() - started
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-m", "fastload", "index", str(v1)], check=True, env=env)
    indexed = time.monotonic() - started - wrote
    v2.mkdir()
    for f in v1.iterdir():
        os.link(f, v2 / f.name)  # upgrade writes sidecars and a new index.json, never the shards
    os.unlink(v2 / "index.json")
    shutil.copy(v1 / "index.json", v2 / "index.json")
    from fastload.packing.upgrade import upgrade_index

    upgrade_index(v2)
    upgraded = time.monotonic() - started - wrote - indexed
    print(f"real data: wrote {wrote:.1f}s, fastload index {indexed:.1f}s, upgrade_index {upgraded:.1f}s")
    return v1, v2


def make_synthetic(folder: Path, samples: int, *, version: int) -> Path:
    """A manifest of ``samples`` samples in shards of PER_SHARD, no shard files (made once)."""
    from fastload.core.index import DatasetIndex, ShardEntry, TableRef
    from fastload.formats.tar.layout import TarLayout

    root = folder / f"synthetic-v{version}-{samples}"
    if (root / "index.json").exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    head = DatasetIndex(shard_format="tar", fields=["cls"], shards=[]).to_dict()
    head["version"] = version
    shard_bytes = 1024 * PER_SHARD + 1024
    head["totals"].update(
        shards=samples // PER_SHARD, samples=samples, bytes=samples // PER_SHARD * shard_bytes
    )
    with open(root / "index.json", "w", encoding="utf-8") as f:  # one shard at a time: v1 is big
        text = json.dumps(head, separators=(",", ":"))
        f.write(text[: -len("[]}")] + "[")
        for s in range(samples // PER_SHARD):
            name = f"shard-{s:06d}.tar"
            if version == 2:
                table = TableRef(name + ".fltable", 24 * PER_SHARD, "00000000")
                entry = ShardEntry(name, shard_bytes, "00000000", keys=[], count=PER_SHARD)
                entry.table, entry.format = table, "tar"
                item = entry.manifest_dict()
            else:
                keys = [f"{s:06d}/{i:07d}" for i in range(PER_SHARD)]
                offsets = [1024 * i for i in range(PER_SHARD)]
                entry = ShardEntry(name, shard_bytes, "00000000", keys=keys, offsets=offsets)
                entry.sizes = [512 + 512] * PER_SHARD
                entry.payload = TarLayout(["cls"], [[1]] * PER_SHARD)
                item = entry.to_dict()
            f.write(("," if s else "") + json.dumps(item, separators=(",", ":")))
        f.write("]}")
    return root


# -- measurements (in a child process) ----------------------------------------------------------------


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(field)


def child(spec: dict[str, Any]) -> dict[str, Any]:
    import torch  # noqa: F401  (the baseline includes torch and fastload)

    import fastload

    rss0, hwm0 = _status_mib("VmRSS"), _status_mib("VmHWM")
    out: dict[str, Any] = {}
    kw = {"seed": 0, "shuffle_buffer": spec.get("buffer", 0), "rank": 3, "world_size": spec["world"]}
    t = time.perf_counter()
    ds = fastload.ShardDataset(spec["root"], **kw)
    out["construct_s"] = time.perf_counter() - t
    out["construct_mib"] = _status_mib("VmRSS") - rss0
    task = spec["task"]
    t = time.perf_counter()
    if task == "plan":
        out["samples"] = len(ds)
        out["plan_s"] = time.perf_counter() - t
        from fastload.core.sharding import worker_position_array
        from fastload.gcpause import gc_paused

        t = time.perf_counter()  # what DataLoader worker 0 of 8 reads, batches of 256, as (shard, i) tuples
        with gc_paused():  # as ShardDataset does when it makes them
            positions = worker_position_array(len(ds), worker=0, workers=8, chunk=256)
            out["worker_refs"] = len(ds.plan().samples.pairs(positions))
        out["worker_refs_s"] = time.perf_counter() - t
        task = "done"
    elif task == "first":
        try:
            out["key"] = next(iter(ds))["__key__"]
        except Exception as exc:  # index v2 before its read path landed: say so, no figure
            out["first_error"] = repr(exc)[:200]
    elif task == "resume":
        ds.load_state_dict(spec["state"])
        out["samples"] = len(ds)
    elif task == "state":  # (untimed) the checkpoint a rank of the old world wrote a quarter into epoch 1
        ds.set_epoch(1)
        out["state"] = {**ds.state_dict(), "delivered": len(ds) // 4}
    if task != "done":
        out[f"{task}_s"] = time.perf_counter() - t
    if task == "first":
        out["first_s"] += out["construct_s"]
        if "first_error" in out:
            del out["first_s"]
    out["rss_mib"] = _status_mib("VmRSS") - rss0
    out["peak_mib"] = _status_mib("VmHWM") - hwm0
    return out


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"{spec}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# -- the run -------------------------------------------------------------------------------------------


def span(values: list[float], fmt: str = "{:.2f}") -> str:
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}-{fmt.format(hi)}"


def with_states(cases: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """Resume cases with the checkpoint of their old world, written once by a child of its own (so the
    resuming child holds one dataset, as a resuming rank does)."""
    states: dict[tuple[str, int, int], Any] = {}
    out = []
    for name, spec in cases:
        if spec["task"] == "resume":
            key = (spec["root"], spec["old_world"], spec.get("buffer", 0))
            if key not in states:
                old = {"root": key[0], "world": key[1], "buffer": key[2], "task": "state"}
                states[key] = run_child(old)["state"]
            spec = {**spec, "state": states[key]}
        out.append((name, spec))
    return out


def measure(cases: list[tuple[str, dict[str, Any]]], runs: int) -> dict[str, list[dict[str, Any]]]:
    cases = with_states(cases)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in cases}
    for r in range(runs):
        for name, spec in cases[r % len(cases) :] + cases[: r % len(cases)]:  # rotated each run
            results[name].append(run_child(spec))
            shown = {k: v for k, v in results[name][-1].items() if k != "state"}
            print(f"  run {r + 1} {name}: {json.dumps(shown)}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=Path("/tmp/fl-index-scale"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", choices=["real", "synthetic"])
    parser.add_argument("--child")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--quick", action="store_true", help="a check of the script: tiny sizes, one run")
    args = parser.parse_args()
    global SYNTHETIC, V1_SYNTHETIC
    if args.quick:
        SYNTHETIC, V1_SYNTHETIC, args.runs, args.data = [50_000, 500_000], [50_000], 1, args.data / "quick"
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    args.data.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {}
    if args.only in (None, "real"):
        v1, v2 = make_real(args.data, *((2, 1000) if args.quick else ()))
        cases = []
        for label, root in (("v1", v1), ("v2", v2)):
            for task in ("plan", "first"):
                cases.append((f"real-{label}-{task}", {"root": str(root), "world": 8, "task": task}))
        res = measure(cases, args.runs)
        report["real"] = res
        shards = sorted(v1.glob("*.tar"))
        each = shards[0].stat().st_size
        print(f"\nreal data ({len(shards)} tar shards, {each:,} bytes each), rank 3 of 8:")
        print("| index | construct s | construct MiB | plan s | first sample s | peak MiB, plan / first |")
        print("|---|---|---|---|---|---|")
        for label in ("v1", "v2"):
            p, f = res[f"real-{label}-plan"], res[f"real-{label}-first"]
            print(
                f"| {label} | {span([x['construct_s'] for x in p + f])} | "
                f"{span([x['construct_mib'] for x in p + f], '{:.0f}')} | "
                f"{span([x['plan_s'] for x in p], '{:.3f}')} "
                f"| {span([x['first_s'] for x in f]) if all('first_s' in x for x in f) else 'n/a'} | "
                f"{span([x['peak_mib'] for x in p], '{:.0f}')} / "
                f"{span([x['peak_mib'] for x in f], '{:.0f}')} |"
            )
    if args.only in (None, "synthetic"):
        cases = []
        for samples in SYNTHETIC:
            root = str(make_synthetic(args.data, samples, version=2))
            base = {"root": root, "world": 1024}
            cases.append((f"v2-{samples}-plan", {**base, "task": "plan"}))
            cases.append((f"v2-{samples}-plan-shuffle", {**base, "task": "plan", "buffer": 10_000}))
            for old in (1024, 512):
                for buf in (0, 10_000):
                    spec = {**base, "task": "resume", "old_world": old, "buffer": buf}
                    cases.append((f"v2-{samples}-resume-{old}-{buf}", spec))
        big = str(make_synthetic(args.data, SYNTHETIC[-1], version=2))
        for new, buf in ((512, 0), (512, 10_000), (1016, 0), (1016, 10_000)):
            spec = {"root": big, "world": new, "task": "resume", "old_world": 1024}
            cases.append((f"v2-{SYNTHETIC[-1]}-to-{new}-{buf}", {**spec, "buffer": buf}))
        for samples in V1_SYNTHETIC:
            root = str(make_synthetic(args.data, samples, version=1))
            cases.append((f"v1-{samples}-plan", {"root": root, "world": 1024, "task": "plan"}))
        res = measure(cases, args.runs)
        report["synthetic"] = res
        print("\nsynthetic manifests, 5,000 samples a shard, rank 3 of 1,024 (MiB over torch+fastload):")
        print(
            "| index | samples | shards | construct s | construct MiB | plan s | worker 0/8 refs s | plan s, "
            "shuffle 10k | resume same world s | resume 512 -> 1,024 s | resume 512 -> 1,024, shuffle s | "
            "peak MiB |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for version, sizes in (("v1", V1_SYNTHETIC), ("v2", SYNTHETIC)):
            for samples in sizes:
                p = res[f"{version}-{samples}-plan"]
                row = [version, f"{samples:,}", f"{samples // PER_SHARD:,}"]
                row += [span([x["construct_s"] for x in p]), span([x["construct_mib"] for x in p], "{:.0f}")]
                row += [
                    span([x["plan_s"] for x in p], "{:.3f}"),
                    span([x["worker_refs_s"] for x in p], "{:.3f}"),
                ]
                if version == "v2":
                    row.append(span([x["plan_s"] for x in res[f"v2-{samples}-plan-shuffle"]], "{:.3f}"))
                    for key in ("1024-0", "512-0", "512-10000"):
                        row.append(span([x["resume_s"] for x in res[f"v2-{samples}-resume-{key}"]], "{:.3f}"))
                else:
                    row += ["", "", "", ""]
                row.append(span([max(x["peak_mib"] for x in p)], "{:.0f}"))
                print("| " + " | ".join(row) + " |")
        top = f"{SYNTHETIC[-1]:,}"
        print(f"\n{top} (v2): rank 3 resumes from a checkpoint of world 1,024 on another world size:")
        for new, buf in ((512, 0), (512, 10_000), (1016, 0), (1016, 10_000)):
            r = res[f"v2-{SYNTHETIC[-1]}-to-{new}-{buf}"]
            print(
                f"  1,024 -> {new:,}, shuffle_buffer={buf}: {span([x['resume_s'] for x in r], '{:.3f}')} s, "
                f"peak {span([x['peak_mib'] for x in r], '{:.0f}')} MiB, {r[0]['samples']:,} samples"
            )
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
