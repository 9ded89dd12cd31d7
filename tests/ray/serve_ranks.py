"""One rank of a two-rank torchrun job fed by ``fastload.serve``: join the gloo group, take the batches of
this rank from feeders on the Ray cluster at RAY_ADDRESS (shared by both ranks), and save them to
``OUTDIR/rank{RANK}.pt`` with the rank and world size the dataset saw::

    python -m torch.distributed.run --standalone --nproc-per-node 2 serve_ranks.py ROOT RAY_ADDRESS OUTDIR
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import fastload

BATCH = 4
OPTIONS: dict[str, Any] = {"seed": 3, "shuffle_buffer": 8}


def add_length(sample: dict[str, Any]) -> dict[str, Any]:
    return {**sample, "length": torch.tensor(len(sample["bin"]))}


def main() -> None:
    root, address, outdir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    dist.init_process_group("gloo")
    # From here on the rank and world size are known only to torch.distributed (not the environment).
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        os.environ.pop(name, None)
    try:
        rank = dist.get_rank()
        loader = fastload.serve(
            root, BATCH, feeders=1, feeder_cpus=0.5, ray_address=address, map=add_length, **OPTIONS
        )
        try:
            batches = list(loader)
            out = {"rank_world": loader.dataset.rank_world(), "batches": batches}
            torch.save(out, outdir / f"rank{rank}.pt")
        finally:
            loader.close()
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
