"""The documented token pipeline against the baselines pretraining people use (issue 35), and the bytes a
shuffled epoch reads.

Data: ``--docs`` (8,000) documents of 10-2,500 token ids (uniform lengths, vocab 50,257, fixed seed), about
10M tokens, 20 MB as uint16, written three ways:

- ``fastload pack-tokens`` (Parquet shards, 1 MiB row groups, the defaults);
- nanoGPT's ``train.bin`` (every document's ids end to end, uint16);
- litdata's ``optimize(..., item_loader=TokensLoader())`` (16 MB chunks), if ``litdata`` imports.

Readers, each taking one epoch's worth of tokens (the dataset's count) in blocks of 2,048:

- ``fastload``: docs/tokens.md's recipe: ``ShardDataset(seed=0, shuffle_buffer=10_000, decode=False)`` ->
  ``fastload.DataLoader(batch_size=256, collate_fn=list, num_workers=W)`` -> ``PackedSequences(seq_len=2048,
  window=1000)`` -> ``torch.utils.data.DataLoader(batch_size=8, collate_fn=fastload.collate.blocks)``
  (input ids, positions, labels and cu_seqlens of every block);
- ``memmap``: nanoGPT's ``get_batch`` (``np.memmap`` of ``train.bin``, 8 random offsets, ``x`` and ``y`` as
  int64 tensors), in this process (it has no workers);
- ``litdata``: ``StreamingDataset(item_loader=TokensLoader(block_size=2049), shuffle=True)`` through
  ``StreamingDataLoader(batch_size=8, num_workers=W)`` (int32 blocks, no labels or positions).

``W`` is 0 (in-process) and ``--workers`` (2). Repetitions (``--reps``, 3) interleave the readers, the order
rotated each time, after one untimed pass of each; figures are tokens per wall second (medians, ranges over
repetitions) and, in-process, per CPU second of this process (what a core of its own would give on a loaded
machine); the ratios are per repetition. Then the bytes read (``/proc/self/io`` ``rchar``) by one
in-process epoch of ``ShardDataset`` unshuffled and shuffled (``shuffle_buffer=10_000``): on this dataset
with the default ``PrefetchConfig.hold_bytes`` and with holding off (``hold_bytes=0``: how every shuffled
read went before), and on one larger than every cache: ``--bytes-docs`` (40,000) documents, about 100 MB,
more than the shuffle buffer's 10,000 documents, read with ``hold_bytes`` of ``--hold-mib`` (64) MiB.

Targets (issue 35): fastload >= 0.5x memmap in-process; >= 1x litdata in-process and with workers; a
shuffled epoch reads <= 2x the bytes of an unshuffled one.

    python benchmarks/tokens_pipeline.py
    python benchmarks/tokens_pipeline.py --docs 2000 --reps 1      # a quick look
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

SEED = 35
SEQ_LEN, BATCH = 2048, 8


def lengths(n: int) -> np.ndarray:
    return np.random.default_rng(SEED).integers(10, 2501, n)


def doc_tokens(i: int, n: int) -> np.ndarray:
    return np.random.default_rng((SEED, i)).integers(0, 50_257, n, dtype=np.uint16)


def write_fastload(lens: np.ndarray, root: str) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    import fastload

    offsets = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
    flat = np.concatenate([doc_tokens(i, int(n)) for i, n in enumerate(lens)]).astype(np.int64)
    os.makedirs(root, exist_ok=True)
    src = os.path.join(root, "src.parquet")
    pq.write_table(
        pa.table({"input_ids": pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat))}), src
    )
    fastload.pack_tokens(src, os.path.join(root, "ds"), vocab_size=50_257)
    os.remove(src)
    return os.path.join(root, "ds")


def write_memmap(lens: np.ndarray, root: str) -> str:
    path = os.path.join(root, "train.bin")
    np.concatenate([doc_tokens(i, int(n)) for i, n in enumerate(lens)]).tofile(path)
    return path


def _litdata_docs(first: int, lens: list[int]) -> Iterator[Any]:
    import torch

    for k, n in enumerate(lens):
        yield torch.from_numpy(doc_tokens(first + k, n).astype(np.int32))


def _litdata_fn(item: tuple[int, list[int]]) -> Iterator[Any]:
    yield from _litdata_docs(*item)


def write_litdata(lens: np.ndarray, root: str) -> str | None:
    try:
        from litdata import TokensLoader, optimize
    except ImportError as exc:
        print(f"litdata: not measured ({exc})")
        return None
    out = os.path.join(root, "litdata")
    step = 500
    items = [(a, [int(n) for n in lens[a : a + step]]) for a in range(0, len(lens), step)]
    optimize(fn=_litdata_fn, inputs=items, output_dir=out, chunk_bytes="16MB", item_loader=TokensLoader(),
             num_workers=1, mode="overwrite")  # fmt: skip
    return out


def fastload_reader(ds_root: str, workers: int) -> Callable[[int], int]:
    import torch

    import fastload

    def run(tokens: int) -> int:
        ds = fastload.ShardDataset(ds_root, seed=0, shuffle_buffer=10_000, decode=False)
        samples = fastload.DataLoader(ds, batch_size=256, collate_fn=list, num_workers=workers)
        packed = fastload.PackedSequences(samples, seq_len=SEQ_LEN, window=1000)
        loader = torch.utils.data.DataLoader(packed, batch_size=BATCH, collate_fn=fastload.collate.blocks)
        got = 0
        for batch in loader:
            got += batch["input_ids"].numel()
            if got >= tokens:
                break
        return got

    return run


def memmap_reader(path: str) -> Callable[[int], int]:
    import torch

    def run(tokens: int) -> int:
        data = np.memmap(path, dtype=np.uint16, mode="r")  # as nanoGPT: a fresh memmap per batch call
        got = 0
        while got < tokens:
            ix = torch.randint(len(data) - SEQ_LEN, (BATCH,))
            x = torch.stack([torch.from_numpy(data[i : i + SEQ_LEN].astype(np.int64)) for i in ix])
            y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + SEQ_LEN].astype(np.int64)) for i in ix])
            got += x.numel() + 0 * y.numel()
        return got

    return run


def litdata_reader(out: str, workers: int) -> Callable[[int], int]:
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    def run(tokens: int) -> int:
        ds = StreamingDataset(
            out, item_loader=TokensLoader(block_size=SEQ_LEN + 1), shuffle=True, drop_last=True
        )
        got = 0
        while got < tokens:  # (an epoch of whole blocks is a little short of the tokens: go on into the next)
            for batch in StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers):
                got += batch[:, :-1].numel()
                if got >= tokens:
                    break
        return got

    return run


def proc_read_bytes() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def bytes_read(ds_root: str, **kw: Any) -> int:
    import fastload

    before = proc_read_bytes()
    for _ in fastload.ShardDataset(ds_root, decode=False, **kw):
        pass
    return proc_read_bytes() - before


def _range(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}" if len(values) > 1 else f"{values[0]:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=8000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--bytes-docs", type=int, default=40_000)
    parser.add_argument("--hold-mib", type=int, default=64)
    parser.add_argument("--no-litdata", action="store_true")
    args = parser.parse_args()
    from fastload.train.options import PrefetchConfig

    OFF = PrefetchConfig(hold_bytes=0)

    lens = lengths(args.docs)
    tokens = int(lens.sum())
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="fastload-tokens-pipeline-") as root:
        t = time.perf_counter()
        ds_root, bin_path = write_fastload(lens, root), write_memmap(lens, root)
        lit = None if args.no_litdata else write_litdata(lens, root)
        size = sum(os.path.getsize(os.path.join(ds_root, n)) for n in os.listdir(ds_root))
        print(
            f"{args.docs:,} documents, {tokens:,} tokens, {size / 1e6:.1f} MB as fastload shards "
            f"(written in {time.perf_counter() - t:.0f} s); python {platform.python_version()}, "
            f"{os.cpu_count()} CPUs, load average {load[0]:.1f}"
        )
        readers: dict[str, Callable[[int], int]] = {
            "fastload": fastload_reader(ds_root, 0),
            "memmap": memmap_reader(bin_path),
            f"fastload w{args.workers}": fastload_reader(ds_root, args.workers),
        }
        if lit is not None:
            readers["litdata"] = litdata_reader(lit, 0)
            readers[f"litdata w{args.workers}"] = litdata_reader(lit, args.workers)
        for run in readers.values():  # untimed: imports, page cache, first workers
            run(tokens // 4)
        wall: dict[str, list[float]] = {k: [] for k in readers}
        cpu: dict[str, list[float]] = {k: [] for k in readers}
        names = list(readers)
        for rep in range(args.reps):
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                w, c = time.perf_counter(), time.process_time()
                got = readers[name](tokens)
                wall[name].append(got / (time.perf_counter() - w))
                cpu[name].append(got / (time.process_time() - c))
        print(f"\n| reader | tokens/s (median, range over {args.reps}) | tokens per CPU s (in-process) |")
        print("|---|---:|---:|")
        for name in names:
            per_cpu = "" if " w" in name else f"{statistics.median(cpu[name]) / 1e6:.1f}M"
            print(
                f"| {name} | {statistics.median(wall[name]) / 1e6:.1f}M "
                f"({_range([v / 1e6 for v in wall[name]])}) | {per_cpu} |"
            )

        def ratio(a: str, b: str, of: dict[str, list[float]]) -> list[float]:
            return [x / y for x, y in zip(of[a], of[b], strict=True)]

        pairs = [("fastload", "memmap", 0.5)]
        if lit is not None:
            pairs += [
                ("fastload", "litdata", 1.0),
                (f"fastload w{args.workers}", f"litdata w{args.workers}", 1.0),
            ]
        print("\n| ratio | wall (median, range) | CPU (in-process) | target |\n|---|---:|---:|---:|")
        for a, b, target in pairs:
            rw = ratio(a, b, wall)
            rc = "" if " w" in a else f"{statistics.median(ratio(a, b, cpu)):.2f}x"
            print(f"| {a} / {b} | {statistics.median(rw):.2f}x ({_range(rw)}) | {rc} | >= {target}x |")
        shuffled = {"seed": 0, "shuffle_buffer": 10_000}
        rows = [(f"{args.docs:,} documents", "unshuffled", bytes_read(ds_root))]
        rows.append(
            (rows[0][0], "shuffled, hold_bytes=0 (as before)", bytes_read(ds_root, **shuffled, prefetch=OFF))
        )
        rows.append((rows[0][0], "shuffled", bytes_read(ds_root, **shuffled)))
        # larger than every cache: more documents than the shuffle buffer, more bytes than hold_bytes
        big = write_fastload(lengths(args.bytes_docs), os.path.join(root, "big"))
        big_size = sum(os.path.getsize(os.path.join(big, n)) for n in os.listdir(big))
        hold = PrefetchConfig(hold_bytes=args.hold_mib << 20)
        what = f"{args.bytes_docs:,} documents ({big_size / 1e6:.0f} MB)"
        rows.append((what, "unshuffled", bytes_read(big)))
        rows.append(
            (what, f"shuffled, hold_bytes={args.hold_mib} MiB", bytes_read(big, **shuffled, prefetch=hold))
        )
        print("\n| dataset | epoch (in-process, shuffle_buffer=10,000) | MB read | x unshuffled |")
        print("|---|---|---:|---:|")
        base = {}
        for data, epoch, n in rows:
            base.setdefault(data, n)
            print(f"| {data} | {epoch} | {n / 1e6:.1f} | {n / base[data]:.2f} |")
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}; command: python {' '.join(sys.argv)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
