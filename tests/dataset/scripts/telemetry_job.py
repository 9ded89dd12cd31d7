"""One rank of a torchrun job whose loader telemetry goes to a store URL (its endpoint: AWS_ENDPOINT_URL),
as the ranks of a multi-node job each write theirs under one prefix; the last records at the rank's exit.

    python -m torch.distributed.run --standalone --nproc-per-node 2 telemetry_job.py DATASET URL
"""

from __future__ import annotations

import sys

import torch.distributed as dist

import fastload


def main() -> None:
    dist.init_process_group("gloo")
    try:
        loader = fastload.loader(
            sys.argv[1], batch_size=2, num_workers=1, telemetry=sys.argv[2], telemetry_every=2
        )
        print(f"rank {dist.get_rank()}: {sum(1 for _ in loader)} steps", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
