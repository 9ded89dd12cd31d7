"""CPU and wall time of ``fastload.open(url).read()``: one object read whole from the embedded S3 endpoint
(``fastload.testing.s3serve``, in this process: its CPU counts too), ``--reads`` times, the first dropped;
medians.

    python benchmarks/readall.py --mib 256 --label after
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import fastload
from fastload.testing.s3serve import S3Server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--reads", type=int, default=6)
    parser.add_argument("--label", default="fastload")
    args = parser.parse_args()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(name, "bench")
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "obj"), "wb") as f:
            f.write(os.urandom(args.mib << 20))
        with S3Server(tmp, bucket="b") as server:
            config = fastload.S3Config(endpoint_url=server.endpoint_url)
            cpu, wall = [], []
            for _ in range(args.reads):
                c0, w0 = time.process_time(), time.perf_counter()
                with fastload.open("s3://b/obj", config=config) as src:
                    data = src.read()
                cpu.append(time.process_time() - c0)
                wall.append(time.perf_counter() - w0)
                assert len(data) == args.mib << 20
                del data
    print(
        f"{args.label}: cpu {statistics.median(cpu[1:]):.3f} s, wall {statistics.median(wall[1:]):.3f} s "
        f"per {args.mib} MiB read"
    )


if __name__ == "__main__":
    main()
