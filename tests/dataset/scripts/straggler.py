"""One rank of a torchrun job that reads a dataset over S3 with telemetry every N steps; each rank its own
endpoint (rank 1's through a fault proxy that delays every response, in the test).

    python -m torch.distributed.run --standalone --nproc-per-node 2 straggler.py URL OUT EVERY URL0 URL1
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch.distributed as dist

import fastload


def main() -> None:
    url, outdir, every = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    endpoints = sys.argv[4:]
    dist.init_process_group("gloo")
    try:
        rank = dist.get_rank()
        config = fastload.S3Config(endpoint_url=endpoints[rank], addressing_style="path")
        loader = fastload.loader(
            url,
            batch_size=4,
            num_workers=0,
            s3_config=config,
            prefetch_bytes=64 << 10,
            telemetry=outdir / "telemetry",
            telemetry_every=every,
        )
        steps = 0
        for _ in loader:
            time.sleep(0.01)  # the step
            steps += 1
        out = {"rank": rank, "steps": steps, "report": loader.report()}
        (outdir / f"rank{rank}.json").write_text(json.dumps(out), encoding="utf-8")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
