"""One rank of a torchrun job: a plain DDP training loop over packed sequences of a skewed token dataset
(rank 0's documents are long, rank 1's short), run through the end of the epoch. At step CUT every rank's
``PackedSequences.state_dict()`` is gathered and rank 0 saves the list (a checkpoint for another world
size). Writes ``OUTDIR/rank{RANK}.json``: steps per rank, the tokens of each block handed out (before and
after the cut), the epoch report, and the blocks of a second DDP run restored from the gathered states.

    python -m torch.distributed.run --standalone --nproc-per-node 2 packed_ddp.py DATASET OUTDIR [EVEN]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import fastload
from fastload.train.collate import blocks as collate_blocks

SEQ_LEN, WINDOW, BLOCKS_PER_STEP, CUT = 64, 16, 4, 5


def main() -> None:
    root, outdir = sys.argv[1], Path(sys.argv[2])
    even = sys.argv[3] if len(sys.argv) > 3 else None
    dist.init_process_group("gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        ds = fastload.ShardDataset(root)  # no seed: rank 0 reads the first half of the documents
        upstream = fastload.DataLoader(ds, batch_size=8, collate_fn=list)
        extra = {} if even is None else {"even": even}
        packed = fastload.PackedSequences(upstream, seq_len=SEQ_LEN, window=WINDOW, **extra)
        loader = torch.utils.data.DataLoader(packed, batch_size=BLOCKS_PER_STEP, collate_fn=collate_blocks)
        torch.manual_seed(0)
        model = DistributedDataParallel(torch.nn.Linear(SEQ_LEN, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        head: list[list[int]] = []
        tail: list[list[int]] = []
        for step, batch in enumerate(loader):
            ids, n = batch["input_ids"], batch["num_tokens"].tolist()
            (head if step < CUT else tail).extend(row[:k].tolist() for row, k in zip(ids, n, strict=True))
            loss = model((ids % 7).float()).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step + 1 == CUT:
                states: list[object] = [None] * world
                dist.all_gather_object(states, packed.state_dict())
                if rank == 0:
                    torch.save(states, outdir / "states.pt")
                dist.barrier()
        steps = [0] * world
        dist.all_gather_object(steps, len(head) + len(tail))
        resumed = resume_run(root, outdir, even)
        out = {
            "steps": steps,
            "head": head,
            "tail": tail,
            "report": packed.epoch_report(),
            "resumed": resumed,
        }
        (outdir / f"rank{rank}.json").write_text(json.dumps(out), encoding="utf-8")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def resume_run(root: str, outdir: Path, even: str | None) -> list[list[int]]:
    """A new packer on every rank restored from the gathered states (the same world size: each takes its
    own), run through the end of the epoch under DDP again: the blocks after the cut."""
    ds = fastload.ShardDataset(root)
    upstream = fastload.DataLoader(ds, batch_size=8, collate_fn=list)
    extra = {} if even is None else {"even": even}
    packed = fastload.PackedSequences(upstream, seq_len=SEQ_LEN, window=WINDOW, **extra)
    packed.load_state_dict(torch.load(outdir / "states.pt", weights_only=True))
    loader = torch.utils.data.DataLoader(packed, batch_size=BLOCKS_PER_STEP, collate_fn=collate_blocks)
    model = DistributedDataParallel(torch.nn.Linear(SEQ_LEN, 1))
    rows: list[list[int]] = []
    for batch in loader:
        ids, n = batch["input_ids"], batch["num_tokens"].tolist()
        rows.extend(row[:k].tolist() for row, k in zip(ids, n, strict=True))
        model((ids % 7).float()).square().mean().backward()
    return rows


if __name__ == "__main__":
    main()
