"""Token batches: padding share of pad-to-max vs dynamic padding vs packing, and packer throughput.

Documents have log-normal lengths (median 150 tokens, sigma 0.9, clipped to 1..2,000; fixed seed). For each
``seq_len`` (512 and 2048) the same stream is batched three ways, and the share of padding in what reaches
the model is reported:

- ``pad-to-max``: every document (split into pieces of at most ``seq_len`` first, so no token is lost)
  padded to ``seq_len``;
- ``dynamic``: the same pieces in stream order, batches of ``--batch`` (32) padded to the longest in the
  batch by ``fastload.train.collate.pad``;
- ``packed (window W)``: ``fastload.PackedSequences(docs, seq_len=..., window=W)``: blocks of exactly
  ``seq_len`` tokens, best-fit decreasing over a look-ahead window of W documents.

Throughput is ``PackedSequences`` end to end (documents in, block tensors out) on one core (the process is
pinned to one CPU), from documents already in memory as ``uint16`` arrays (what a token shard holds); the
median of ``--reps`` runs (tokens per wall second, and per CPU second of this process, which is what a
core of its own would give on a shared machine), with the planning step alone (``core.seqpack.plan_round``)
for reference. A last row reads the documents back from a ``fastload pack-tokens`` dataset on local disk
(``ShardDataset(decode=False)`` -> ``PackedSequences``), still on one core.

    python benchmarks/tokens.py                   # 200,000 documents (about 41M tokens), 3 repetitions
    python benchmarks/tokens.py --docs 20000 --reps 1 --json /tmp/tokens.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from typing import Any

import numpy as np

SEED = 20240917
MEDIAN, SIGMA, MAX_LEN = 150, 0.9, 2000
SEQ_LENS = (512, 2048)
WINDOWS = (1, 100, 1000)
TARGET_WASTE = 0.01  # packing at seq_len 2048 with a 1,000-document window
TARGET_TOKENS_S = 20e6


def lengths(n: int, seed: int = SEED) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.lognormal(np.log(MEDIAN), SIGMA, n)), 1, MAX_LEN).astype(np.int64)


def documents(lens: np.ndarray, seed: int = SEED) -> list[np.ndarray]:
    rng = np.random.default_rng(seed + 1)
    flat = rng.integers(0, 50_257, size=int(lens.sum()), dtype=np.uint16)
    return np.split(flat, np.cumsum(lens)[:-1])


def pieces(lens: np.ndarray, seq_len: int) -> np.ndarray:
    """Lengths after splitting every document into pieces of at most ``seq_len``."""
    full = lens // seq_len
    tails = lens - full * seq_len
    out = np.concatenate([np.full(int(full.sum()), seq_len), tails[tails > 0]])
    return out


def padding_rows(docs: list[np.ndarray], lens: np.ndarray, seq_len: int, batch: int) -> list[dict[str, Any]]:
    import fastload

    rows: list[dict[str, Any]] = []
    piece_lens = pieces(lens, seq_len)
    real = int(piece_lens.sum())
    rows.append(
        {"seq_len": seq_len, "method": "pad-to-max", "padding": 1 - real / (piece_lens.size * seq_len)}
    )
    split = [d[i : i + seq_len] for d in docs for i in range(0, d.size, seq_len)]
    padded = 0
    for i in range(0, len(split), batch):
        out = fastload.train.collate.pad(split[i : i + batch])
        padded += int(out["attention_mask"].numel())
    rows.append({"seq_len": seq_len, "method": f"dynamic (batch {batch})", "padding": 1 - real / padded})
    for window in WINDOWS:
        packer = fastload.PackedSequences(docs, seq_len=seq_len, window=window)
        for _ in packer:
            pass
        assert packer.stats.tokens == real
        rows.append(
            {"seq_len": seq_len, "method": f"packed (window {window})", "padding": packer.stats.waste}
        )
    return rows


def _timed(fn: Any, reps: int) -> tuple[float, float]:
    """Median (wall s, CPU s) of ``reps`` runs."""
    walls, cpus = [], []
    for _ in range(reps):
        w, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return statistics.median(walls), statistics.median(cpus)


def throughput_rows(docs: list[np.ndarray], lens: np.ndarray, reps: int) -> list[dict[str, Any]]:
    import fastload
    from fastload.core.seqpack import plan_round

    tokens = int(lens.sum())
    rows = []
    for seq_len in SEQ_LENS:

        def pack(seq_len: int = seq_len) -> None:
            for _ in fastload.PackedSequences(docs, seq_len=seq_len, window=1000):
                pass

        def plan(seq_len: int = seq_len) -> None:
            for start in range(0, lens.size, 1000):
                plan_round(lens[start : start + 1000], seq_len=seq_len, final=True)

        for what, fn in (("PackedSequences (docs -> block tensors)", pack), ("plan only (plan_round)", plan)):
            wall, cpu = _timed(fn, reps)
            rows.append(
                {"seq_len": seq_len, "what": what, "wall_s": wall, "cpu_s": cpu, "tokens_s": tokens / wall}
            )
    return rows


def dataset_row(docs: list[np.ndarray], lens: np.ndarray, reps: int) -> dict[str, Any]:
    """pack_tokens to a temporary folder (Parquet input), then ShardDataset -> PackedSequences."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import fastload

    with tempfile.TemporaryDirectory(prefix="fastload-tokens-bench-") as tmp:
        offsets = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
        values = pa.array(np.concatenate(docs))
        column = pa.LargeListArray.from_arrays(pa.array(offsets), values)
        pq.write_table(pa.table({"input_ids": column}), os.path.join(tmp, "src.parquet"))
        t = time.perf_counter()
        fastload.pack_tokens(os.path.join(tmp, "src.parquet"), os.path.join(tmp, "ds"), vocab_size=50_257)
        pack_s = time.perf_counter() - t

        def read() -> None:
            ds = fastload.ShardDataset(os.path.join(tmp, "ds"), decode=False)
            for _ in fastload.PackedSequences(ds, seq_len=2048, window=1000):
                pass

        wall, cpu = _timed(read, reps)
    tokens = int(lens.sum())
    return {
        "seq_len": 2048,
        "what": "ShardDataset(decode=False) -> PackedSequences, local disk",
        "wall_s": wall,
        "cpu_s": cpu,
        "tokens_s": tokens / wall,
        "pack_tokens_s": pack_s,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=32, help="batch size for dynamic padding")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--cpu", type=int, default=None, help="CPU to pin to (default: the first allowed)")
    parser.add_argument("--no-dataset", action="store_true", help="skip the ShardDataset row")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        cpu = args.cpu if args.cpu is not None else min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
    lens = lengths(args.docs)
    docs = documents(lens)
    tokens = int(lens.sum())
    print(
        f"{args.docs:,} documents, {tokens:,} tokens: log-normal lengths, median {int(np.median(lens))}, "
        f"mean {lens.mean():.0f}, p99 {int(np.percentile(lens, 99))}, max {int(lens.max())} (seed {SEED})"
    )
    padding = [r for s in SEQ_LENS for r in padding_rows(docs, lens, s, args.batch)]
    print("\n| seq_len | method | padding share |\n|---:|---|---:|")
    for r in padding:
        print(f"| {r['seq_len']} | {r['method']} | {100 * r['padding']:.2f}% |")
    speed = throughput_rows(docs, lens, args.reps)
    if not args.no_dataset:
        speed.append(dataset_row(docs, lens, args.reps))
    print(
        f"\n| seq_len | what (one core, median of {args.reps}) | wall s | CPU s | tokens/s | tokens/CPU s |"
    )
    print("|---:|---|---:|---:|---:|---:|")
    for r in speed:
        rate, per_cpu = f"{r['tokens_s'] / 1e6:.1f}M", f"{tokens / r['cpu_s'] / 1e6:.1f}M"
        print(f"| {r['seq_len']} | {r['what']} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | {rate} | {per_cpu} |")
    if not args.no_dataset:
        print(f"\n(pack_tokens wrote the dataset from Parquet in {speed[-1]['pack_tokens_s']:.1f} s)")
    waste = next(
        r["padding"] for r in padding if r["seq_len"] == 2048 and r["method"] == "packed (window 1000)"
    )
    rate = min(r["tokens_s"] for r in speed if r["what"].startswith("PackedSequences"))
    ok_waste, ok_rate = waste < TARGET_WASTE, rate >= TARGET_TOKENS_S
    verdict = {True: "met", False: "MISSED"}
    print(
        f"\ntargets: packing waste at 2048 / window 1000 {100 * waste:.2f}% (< 1%: {verdict[ok_waste]}); "
        f"packer {rate / 1e6:.1f}M tokens/s (>= 20M: {verdict[ok_rate]})"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "docs": args.docs,
                    "tokens": tokens,
                    "padding": padding,
                    "throughput": speed,
                    "python": platform.python_version(),
                    "numpy": np.__version__,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
