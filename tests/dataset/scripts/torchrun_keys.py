"""One rank of a torchrun job: join the gloo group, read this rank's share with one DataLoader worker, and
write the keys plus the epoch report to ``OUTDIR/rank{RANK}.json``. Then read it again where rank 0 meets a
whole batch of undecodable samples (on_error="skip"): every rank must still take the same number of steps
(else DDP hangs); written to ``OUTDIR/rank{RANK}-skip.json``. Last, a ``fastload.Mix`` of two sources:
``OUTDIR/rank{RANK}-mix.json``. With DAMAGED (a copy of the dataset where rank 0's second batch of
samples fail their CRC32C), that read with on_error="skip": ``OUTDIR/rank{RANK}-damaged.json``.

    python -m torch.distributed.run --standalone --nproc-per-node 2 torchrun_keys.py DATASET OUTDIR [DAMAGED]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist

import fastload

SEED, SHUFFLE_BUFFER, BATCH = 5, 8, 4


def main() -> None:
    dataset_root, outdir = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    # From here on the rank and world size are known only to torch.distributed (not the environment).
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        os.environ.pop(name, None)
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        dataset = fastload.ShardDataset(dataset_root, seed=SEED, shuffle_buffer=SHUFFLE_BUFFER)
        loader = fastload.DataLoader(dataset, batch_size=BATCH, num_workers=1, timeout=60)
        batches = [list(batch["__key__"]) for batch in loader]
        # Every rank must take the same number of steps, or DDP would hang: check it across the group.
        steps = [0] * world
        dist.all_gather_object(steps, len(batches))
        out = {
            "rank": rank,
            "world_size": world,
            "rank_world": list(dataset.rank_world()),
            "batches": batches,
            "steps": steps,
            "report": dataset.epoch_report(),
        }
        (outdir / f"rank{rank}.json").write_text(json.dumps(out), encoding="utf-8")
        skip_run(dataset_root, outdir, rank, world)
        mix_run(dataset_root, outdir, rank, world)
        if len(sys.argv) > 3:
            damaged_run(sys.argv[3], outdir, rank, world)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def skip_run(dataset_root: str, outdir: Path, rank: int, world: int) -> None:
    probe = fastload.ShardDataset(dataset_root, seed=SEED)
    names = [s.name for s in probe.index.shards]
    bad = {(names[s], i) for s, i in probe.plan().samples[BATCH : 2 * BATCH]} if rank == 0 else set()

    def check(sample: dict[str, Any]) -> dict[str, Any]:  # rank 0's second batch does not decode
        if (sample["__shard__"], int(sample["__index__"])) in bad:
            raise ValueError("undecodable")
        return sample

    dataset = fastload.ShardDataset(dataset_root, seed=SEED, map=check, on_error="skip")
    loader = fastload.DataLoader(dataset, batch_size=BATCH, num_workers=1, timeout=60)
    batches = [list(batch["__key__"]) for batch in loader]
    steps = [0] * world
    dist.all_gather_object(steps, len(batches))
    out = {
        "steps": steps,
        "batches": batches,
        "repeated": loader.repeated_batches,
        "skipped": dataset.skipped,
    }
    (outdir / f"rank{rank}-skip.json").write_text(json.dumps(out), encoding="utf-8")


def damaged_run(damaged_root: str, outdir: Path, rank: int, world: int) -> None:
    """Rank 0's second batch fails its CRC32C: skipped, a step all the same, named in the report."""
    dataset = fastload.ShardDataset(damaged_root, seed=SEED, decode=False, on_error="skip")
    loader = fastload.DataLoader(dataset, batch_size=BATCH, num_workers=1, timeout=60)
    batches = [list(batch["__key__"]) for batch in loader]
    steps = [0] * world
    dist.all_gather_object(steps, len(batches))
    out = {
        "steps": steps,
        "batches": batches,
        "repeated": loader.repeated_batches,
        "skipped": dataset.skipped,
        "named": [list(s) for s in dataset.epoch_report()["skipped_samples"]],
    }
    (outdir / f"rank{rank}-damaged.json").write_text(json.dumps(out), encoding="utf-8")


def mix_run(dataset_root: str, outdir: Path, rank: int, world: int) -> None:
    """A fastload.Mix of the dataset with itself (two seeds, weights 0.7/0.3), rank and world size from
    torch.distributed: written to ``OUTDIR/rank{RANK}-mix.json``."""
    sources = {
        "x": fastload.ShardDataset(dataset_root, seed=1),
        "y": fastload.ShardDataset(dataset_root, seed=2),
    }
    mix = fastload.Mix(sources, {"x": 0.7, "y": 0.3}, seed=3)
    loader = fastload.DataLoader(mix, batch_size=BATCH)  # in-process: the ranks are the point here
    batches = [list(zip(batch["__source__"], batch["__key__"], strict=True)) for batch in loader]
    steps = [0] * world
    dist.all_gather_object(steps, len(batches))
    out = {"steps": steps, "batches": batches, "report": mix.epoch_report()}
    (outdir / f"rank{rank}-mix.json").write_text(json.dumps(out), encoding="utf-8")


if __name__ == "__main__":
    main()
