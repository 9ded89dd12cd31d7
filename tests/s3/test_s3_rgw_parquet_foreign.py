"""Foreign Parquet files on RGW: the in-memory index fetches footers and the key column only (counted
bytes), and ``ShardDataset`` reads every row once (DataLoader workers: tests/parquet_foreign, on moto)."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from s3util import s3_config

import fastload
from fastload.stats import s3_stats
from fastload.train.source import open_index

FILES = 3
ROWS = 40  # per file, in row groups of 10; each row carries 8 KiB of bytes: ~330 KB a file


def parquet_bytes(part: int) -> bytes:
    table = pa.table(
        {
            "uid": [f"p{part}-{i:03d}" for i in range(ROWS)],
            "blob": [bytes([part, i]) * 4096 for i in range(ROWS)],
            "y": list(range(ROWS)),
        }
    )
    out = io.BytesIO()
    pq.write_table(table, out, row_group_size=10, compression="none")
    return out.getvalue()


@pytest.mark.filterwarnings("ignore:.*no index.json:UserWarning")
def test_rgw_prefix_of_foreign_parquet(
    rgw: Any, rgw_env: dict[str, str], rgw_client: Any, bucket: Callable[..., str]
) -> None:
    name = bucket(rgw)
    sizes = 0
    for part in range(FILES):
        data = parquet_bytes(part)
        sizes += len(data)
        rgw_client.put_object(Bucket=name, Key=f"t/date=2024-01-0{part + 1}/part-{part}.parquet", Body=data)
    rgw_client.put_object(Bucket=name, Key="t/_SUCCESS", Body=b"")
    config = s3_config(rgw)
    url = f"s3://{name}/t"

    s3_stats(reset=True)
    _, index = open_index(url, s3_config=config, key_column="uid")
    fetched = s3_stats()["bytes"]
    assert [s.partition for s in index.shards] == [f"date=2024-01-0{p + 1}" for p in range(FILES)]
    assert [list(s.keys)[:1] for s in index.shards] == [[f"p{p}-000"] for p in range(FILES)]
    # each file's tail (64 KiB) and its key column chunks: far less than the files
    assert fetched < sizes / 3, (fetched, sizes)

    ds = fastload.ShardDataset(url, decode=False, s3_config=config, key_column="uid", seed=5)
    samples = list(ds)
    assert sorted(s["__key__"] for s in samples) == sorted(
        f"p{p}-{i:03d}" for p in range(FILES) for i in range(ROWS)
    )
    for s in samples:
        part, i = int(s["__key__"][1]), int(s["__key__"][-3:])
        assert s["blob"] == bytes([part, i]) * 4096 and s["y"] == i
