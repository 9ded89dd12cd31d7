"""Per-sample CRC32C on read: CPU and wall seconds of in-process raw epochs of a ShardDataset.

    PYTHONPATH=<tree> python benchmarks/read_crc.py <dataset> on|off [--epochs 4] [--consume sum|none]

One line per run: ``on``/``off`` (``verify_samples``), then ``wall/cpu`` seconds of each epoch and the bytes
read. Run it as fresh processes interleaved with ``cat <shards> > /dev/null``, and compare CPU seconds when
the machine is loaded (RESULTS.md, "Index v2 read path"). ``--consume sum`` (the default, as recorded
before) adds up each sample's value sizes in a generator expression, a per-sample cost of the benchmark's
own (~1.3 us a sample); ``none`` only takes the samples (fastload's cost alone; bytes counted from the index).
"""

from __future__ import annotations

import argparse
import time

import torch  # noqa: F401 (imported as in training: the cyclic GC then walks its objects)

import fastload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset")
    parser.add_argument("crc", choices=("on", "off"))
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--consume", choices=("sum", "none"), default="sum")
    args = parser.parse_args()
    kw = {} if args.crc == "on" else {"verify_samples": False}
    ds = fastload.ShardDataset(args.dataset, decode=False, **kw)
    out, nbytes = [], 0
    for _ in range(args.epochs):
        t0, c0, nbytes = time.perf_counter(), time.process_time(), 0
        if args.consume == "sum":
            for s in ds:
                nbytes += sum(len(v) for k, v in s.items() if not k.startswith("__"))
        else:
            for _s in ds:
                pass
            nbytes = ds.index.payload_bytes
        out.append((time.perf_counter() - t0, time.process_time() - c0))
    print(args.crc, " ".join(f"{w:.3f}/{c:.3f}" for w, c in out), f"{nbytes / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
