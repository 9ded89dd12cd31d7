"""Resume after a change of world size with the sample shuffle at 1B samples (issue 15): the C loop of the
buffer shuffle (``fastload._native.buffer_shuffle``) against the numpy version, interleaved.

Rank 3 of 1,016 resumes from a checkpoint of 1,024 ranks a quarter into epoch 0 (a node of 8 lost: it reads
what 128 old ranks had left, each old rank's ~1M-sample shuffled order replayed), 200,000 shards x 5,000
samples, ``shuffle_buffer=10_000``. No data: ``resumed_rank_order`` over the per-shard counts.

    python benchmarks/resume_shuffle.py [--reps 3] [--impls C,numpy]

(``--impls C``: the C loop only, e.g. to compare two trees run as ``PYTHONPATH=<tree>``, interleaved.)
"""

import argparse
import time

import numpy as np

import fastload.formats  # noqa: F401  (registers the C loop)
from fastload import _native
from fastload.core import shuffle
from fastload.core.sharding import EpochLayout, resumed_rank_order

counts = np.full(200_000, 5000, dtype=np.int64)
lay = EpochLayout(counts, world_size=1024, seed=0, epoch=0, even="split")
delivered = lay.length(0) // 4
plans: dict[str, list[int]] = {}
parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--reps", type=int, default=3)
parser.add_argument("--impls", default="C,numpy", help="comma-separated: C, numpy")
args = parser.parse_args()
impls = [i for i in ("C", "numpy") if i in args.impls.split(",")]
res: dict[str, list[tuple[float, float]]] = {name: [] for name in impls}
for rep in range(args.reps):
    for name in impls if rep % 2 == 0 else impls[::-1]:
        shuffle.use_native(_native.buffer_shuffle if name == "C" else None)
        t = time.perf_counter()
        c = time.process_time()
        p = resumed_rank_order(
            counts,
            rank=3,
            world_size=1016,
            old_world_size=1024,
            delivered=delivered,
            seed=0,
            epoch=0,
            shuffle_buffer=10_000,
        )
        plans.setdefault(name, list(p.samples))
        res[name].append((time.perf_counter() - t, time.process_time() - c))
for k, v in res.items():
    print(k, " ".join(f"{w:.2f}/{c:.2f}" for w, c in v), "wall/cpu s")
if len(plans) == 2:
    assert plans["C"] == plans["numpy"], "the C loop and numpy gave different plans"
    print(f"same plan from both ({len(plans['C']):,} samples)")
