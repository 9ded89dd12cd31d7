"""Opening a foreign Parquet dataset on S3 (issue 18): fastload's in-memory index from the footers against
``pyarrow.dataset`` discovering the same files (``count_rows``, which reads every footer), on a real Ceph RGW
(``tests/servers/rgw.py``) on 127.0.0.1.

The dataset: ``--months`` hive folders ``year=Y/month=MM/part-0.parquet`` of ``--rows`` rows each (a short
key, a small int and 2,000 random bytes a row; row groups of 500 rows, uncompressed), written by pyarrow.
Measured, interleaved, ``--runs`` times: fastload's footer index (time, GETs, bytes fetched), the same with
``key_column`` (its column chunks fetched too), and ``pyarrow.dataset(..., partitioning="hive")
.count_rows()`` over pyarrow's ``S3FileSystem``. DuckDB's ``httpfs`` is left out: it downloads its
extension from the internet at first use.

    python benchmarks/parquet_foreign_index.py [--months 24] [--rows 2000] [--runs 3]
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

BUCKET = "fastload-bench-foreign"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--months", type=int, default=24)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    import pyarrow.dataset as pads
    import pyarrow.fs as pafs
    from servers.rgw import RadosGateway

    import fastload
    from fastload.stats import s3_stats
    from fastload.train.source import open_index

    rng = np.random.default_rng(0)
    with RadosGateway() as rgw:
        client = rgw.client()
        client.create_bucket(Bucket=BUCKET)
        total = 0
        for m in range(args.months):
            table = pa.table(
                {
                    "uid": [f"m{m}-{i}" for i in range(args.rows)],
                    "y": rng.integers(0, 10, args.rows),
                    "blob": [rng.bytes(2000) for _ in range(args.rows)],
                }
            )
            out = io.BytesIO()
            pq.write_table(table, out, row_group_size=500, compression="none")
            total += out.tell()
            key = f"ev/year={2023 + m // 12}/month={m % 12 + 1:02d}/part-0.parquet"
            client.put_object(Bucket=BUCKET, Key=key, Body=out.getvalue())
        client.close()
        os.environ.update(AWS_ACCESS_KEY_ID=rgw.access_key, AWS_SECRET_ACCESS_KEY=rgw.secret_key)
        config = fastload.S3Config(endpoint_url=rgw.endpoint_url, region=rgw.region, addressing_style="path")
        fs = pafs.S3FileSystem(
            access_key=rgw.access_key,
            secret_key=rgw.secret_key,
            endpoint_override=rgw.endpoint_url,
            region=rgw.region,
            scheme="http",
        )
        url = f"s3://{BUCKET}/ev"
        warnings.simplefilter("ignore")  # (the in-memory index's warning)
        print(f"{args.months} files, {total / 1e6:.1f} MB; load {os.getloadavg()[0]:.1f}")
        for _ in range(args.runs):
            s3_stats(reset=True)
            began = time.perf_counter()
            _, index = open_index(url, s3_config=config)
            footers = time.perf_counter() - began
            plain = s3_stats(reset=True)
            began = time.perf_counter()
            open_index(url, s3_config=config, key_column="uid")
            keyed = time.perf_counter() - began
            with_keys = s3_stats()
            began = time.perf_counter()
            rows = pads.dataset(
                f"{BUCKET}/ev", filesystem=fs, format="parquet", partitioning="hive"
            ).count_rows()
            arrow = time.perf_counter() - began
            assert rows == index.samples
            print(
                f"fastload footers {footers * 1e3:.0f} ms ({plain['requests']} GETs, "
                f"{plain['bytes'] / 1e3:.0f} kB, {plain['bytes'] / total:.1%} of the data); "
                f"with key_column {keyed * 1e3:.0f} ms "
                f"({with_keys['requests']} GETs, {with_keys['bytes'] / 1e3:.0f} kB); "
                f"pyarrow.dataset count_rows {arrow * 1e3:.0f} ms"
            )


if __name__ == "__main__":
    main()
