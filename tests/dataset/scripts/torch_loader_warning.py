"""Read a dataset with torch's DataLoader in several ways, marking each on stderr (``== case NAME``), so
that a test can count the order warning each way gave (workers' warnings go to the same stderr).

    python torch_loader_warning.py DATASET
"""

from __future__ import annotations

import sys
import warnings

import torch.utils.data

import fastload


def case(name: str) -> None:
    print(f"== case {name}", file=sys.stderr, flush=True)


def main() -> None:
    root = sys.argv[1]
    warnings.simplefilter("default")  # as a training script runs: each warning shown once per place
    case("no batch_size, 2 workers, 2 epochs")
    ds = fastload.ShardDataset(root, decode=False)
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=list, timeout=60)
    for epoch in range(2):  # new worker processes each epoch
        ds.set_epoch(epoch)
        assert sum(len(b) for b in loader) == ds.index.samples
    case("no batch_size, 1 worker")
    ds = fastload.ShardDataset(root, decode=False)
    list(torch.utils.data.DataLoader(ds, batch_size=4, num_workers=1, collate_fn=list, timeout=60))
    case("no batch_size, in process")
    ds = fastload.ShardDataset(root, decode=False)
    list(torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=list))
    case("batch_size=4, 2 workers")
    ds = fastload.ShardDataset(root, decode=False, batch_size=4)
    list(torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=list, timeout=60))
    case("fastload.DataLoader, 2 workers")
    ds = fastload.ShardDataset(root, decode=False)
    list(fastload.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=list, timeout=60))
    sys.stderr.flush()


if __name__ == "__main__":
    main()
