"""The pictures of docs/observe.md: a real torchrun job (2 ranks, gloo) with telemetry, rank 1's store made
slow part-way through by the fault proxy, then ``fastload top --once`` and ``fastload top --plot``.

A dataset of ``--samples`` (12,000) samples of 16 KiB is served by the embedded S3 endpoint; each rank reads
it with ``fastload.loader(..., telemetry=DIR, telemetry_every=8)`` and a 10 ms step. Rank 1 reads through
the fault proxy, which adds 60 ms to each response once rank 1 has taken ``--slow-after`` (240) steps.

    python benchmarks/observe_images.py --out docs/top.png     # ~40 s; prints the table for the docs
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import fastload

STEP_S = 0.01
EVERY = 8


def rank_main(url: str, folder: str, endpoints: list[str]) -> None:
    """One rank of the job (run by torchrun)."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        rank = dist.get_rank()
        config = fastload.S3Config(endpoint_url=endpoints[rank], addressing_style="path")
        loader = fastload.loader(
            url,
            batch_size=8,
            num_workers=1,
            s3_config=config,
            prefetch_bytes=1 << 20,
            telemetry=folder,
            telemetry_every=EVERY,
        )
        for _ in loader:
            time.sleep(STEP_S)
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("top.png"))
    parser.add_argument("--samples", type=int, default=12000)
    parser.add_argument("--slow-after", type=int, default=240, help="steps before rank 1's store slows")
    args = parser.parse_args()
    from fastload.testing.faultproxy import Fault, FaultProxy, Rule
    from fastload.testing.s3serve import S3Server

    with tempfile.TemporaryDirectory(prefix="fastload-top-") as tmp:
        root = Path(tmp) / "data" / "ds"
        with fastload.ShardWriter(root, shard_size_bytes=4 << 20, keys="ordered") as writer:
            for i in range(args.samples):
                writer.write({"__key__": f"{i:06d}", "bin": os.urandom(16 << 10)})
        folder = Path(tmp) / "telemetry"
        with (
            S3Server(os.fspath(root.parent), bucket="data") as server,
            FaultProxy(server.endpoint_url) as proxy,
        ):

            def slow_down() -> None:  # once rank 1 has written --slow-after steps' records
                path = folder / "telemetry-rank1.jsonl"
                while not path.exists() or path.read_text().count("\n") < args.slow_after // EVERY:
                    time.sleep(0.05)
                proxy.add(Rule(Fault.latency(delay_s=0.06), method="GET"))

            slow = threading.Thread(target=slow_down, daemon=True)
            slow.start()
            env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "AWS_ACCESS_KEY_ID": "x"}
            env |= {"AWS_SECRET_ACCESS_KEY": "y", "AWS_REGION": "us-east-1"}
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
            cmd += [__file__, "--rank", "s3://data/ds", os.fspath(folder), server.endpoint_url]
            subprocess.run([*cmd, proxy.endpoint_url], check=True, env=env)
        top = [sys.executable, "-m", "fastload", "top", os.fspath(folder)]
        subprocess.run([*top, "--once"], check=True)
        subprocess.run([*top, "--plot", os.fspath(args.out)], check=True, stdout=subprocess.DEVNULL)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        rank_main(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        main()
