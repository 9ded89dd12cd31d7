"""One rank of a torchrun job: join the gloo group, read this rank's share with one DataLoader worker, and
write the keys plus the epoch report to ``OUTDIR/rank{RANK}.json``.

    python -m torch.distributed.run --standalone --nproc-per-node 2 torchrun_keys.py DATASET OUTDIR
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

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
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
