"""A Parquet shard of files is written in pages of about 1 MiB: pyarrow checks a page's size only after each
batch of values (1,024 by default), so with image-sized values a whole column chunk (~30 MB) was one page,
built in fresh memory and written in one cold write (20-30% of a pack's CPU)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import fastload
from fastload.formats.parquet import writer
from fastload.formats.parquet.writer import PAGE_BYTES, page_batch


def test_page_batch_keeps_pages_near_a_mebibyte() -> None:
    assert page_batch(100_000 * 50, 50) == PAGE_BYTES // 100_000 == 10
    assert page_batch(3 * (5 << 20), 3) == 1  # values over a page: one a page
    assert page_batch(20 * 1000, 1000) == 1024  # small values: pyarrow's default
    assert page_batch(0, 0) == 1024


def test_a_pack_of_files_writes_batches_of_a_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(30):
        (src / f"{i:03d}.bin").write_bytes(os.urandom(200_000))
    options: list[dict[str, Any]] = []

    class Recording(pq.ParquetWriter):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            options.append(kwargs)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(writer.pq, "ParquetWriter", Recording)
    fastload.pack(src, tmp_path / "ds", shard_format="parquet", progress=False)
    assert [o.get("write_batch_size") for o in options] == [PAGE_BYTES // 200_000]
    ds = fastload.MapDataset(tmp_path / "ds")
    assert bytes(ds[7]["bin"]) == (src / "007.bin").read_bytes()
    assert fastload.verify(tmp_path / "ds").ok
