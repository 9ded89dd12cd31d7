"""One rank of a torchrun job across an append: read 3 batches of epoch 1 of DATASET (version 1) with one
DataLoader worker and checkpoint; rank 0 then appends NEW to DATASET (version 2) while the others wait at a
barrier; every rank restarts (a fresh dataset: the newest version), restores the checkpoint with two workers,
finishes the epoch and reads the next one. Writes ``OUTDIR/rank{RANK}.json``: the keys before, after and of
the next epoch, and the checkpoint's version.

    python -m torch.distributed.run --standalone --nproc-per-node 2 torchrun_append.py DATASET NEW OUTDIR
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

import fastload

SEED, SHUFFLE_BUFFER, BATCH, EPOCH = 7, 8, 4, 1


def keys(batches: object) -> list[str]:
    return [k for batch in batches for k in batch["__key__"]]  # type: ignore[attr-defined]


def main() -> None:
    root, new, outdir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    dist.init_process_group("gloo")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        os.environ.pop(name, None)
    try:
        rank = dist.get_rank()
        dataset = fastload.ShardDataset(root, seed=SEED, shuffle_buffer=SHUFFLE_BUFFER)
        loader = fastload.DataLoader(dataset, batch_size=BATCH, num_workers=1, timeout=60)
        dataset.set_epoch(EPOCH)
        batches = iter(loader)
        before = keys(next(batches) for _ in range(3))
        state = json.loads(json.dumps(loader.state_dict()))
        del batches, loader, dataset  # the job stops here
        dist.barrier()
        if rank == 0:
            fastload.pack(new, root, append=True, max_samples=5, progress=False)
        dist.barrier()
        dataset = fastload.ShardDataset(root, seed=SEED, shuffle_buffer=SHUFFLE_BUFFER)
        loader = fastload.DataLoader(dataset, batch_size=BATCH, num_workers=2, timeout=60)
        loader.load_state_dict(state)
        after = keys(loader)
        following = keys(loader)
        out = {
            "before": before,
            "after": after,
            "next": following,
            "version": state["version"],
            "opened": dataset.view.version,
        }
        (outdir / f"rank{rank}.json").write_text(json.dumps(out), encoding="utf-8")
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
