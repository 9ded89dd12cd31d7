"""ShardDataset over Parquet with projection and filters: only the projected column chunks are fetched,
filters keep exactly the rows ``pyarrow.dataset`` keeps (partitions, statistics, rows), exactly once over 2
ranks x DataLoader workers with equal step counts, checkpoints that record the filter and refuse another,
partition folders read as filters, partition values added to samples."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

import fastload
from fastload import formats
from fastload.errors import ConfigError, VerifyError
from fastload.formats.parquet.format import PARQUET
from fastload.formats.parquet.payload import ParquetShard, stats_of

from .helpers import Packed, keys_of, make_loader, pack_files, small_files

MONTHS = 3


def monthly_files(per_month: int = 24, seed: int = 3) -> dict[str, bytes]:
    """Samples in folders ``01``..``03`` (partitions ``month=1..3``), keys in date order, with a short
    ``date`` (sorted), a ``cls`` digit and a ``bin`` payload."""
    rng = random.Random(seed)
    files: dict[str, bytes] = {}
    for m in range(1, MONTHS + 1):
        for i in range(per_month):
            key = f"{m:02d}/{i:04d}"
            files[f"{key}.date"] = f"2024-{m:02d}-{i + 1:02d}".encode()
            files[f"{key}.cls"] = b"%d" % rng.randrange(10)
            files[f"{key}.bin"] = rng.randbytes(rng.randrange(500, 900))
    return files


@pytest.fixture(scope="module")
def monthly(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    packed = pack_files(
        tmp_path_factory.mktemp("monthly"),
        monthly_files(),
        shard_format="parquet",
        max_samples=12,
        row_group_bytes=3000,  # (at least ~2.2 KiB: pack plans a footer's share per row group)
        partition_level=0,
        partition_name="month",
    )
    assert len(packed.counts) == 6 and all(len(s["row_groups"]) > 2 for s in packed.index["shards"])
    return packed


def oracle(packed: Packed, filters: Any) -> list[str]:
    """The keys ``pyarrow.dataset`` (hive partitioning) keeps under ``filters``, in index order."""
    files = sorted(str(p) for p in packed.root.rglob("*.parquet"))
    ds = pads.dataset(files, format="parquet", partitioning="hive", partition_base_dir=str(packed.root))
    kept = set(
        ds.to_table(filter=pq.filters_to_expression(filters), columns=["__key__"])["__key__"].to_pylist()
    )
    return [k for k in packed.keys if k in kept]


FILTERS = [
    [("month", "=", 2)],
    [("date", ">=", "2024-01-20"), ("date", "<", "2024-02-03")],
    [[("month", "in", [1, 3]), ("cls", "in", ["1", "7"])], [("date", "==", b"2024-02-10")]],
    [("cls", "not in", ["0", "1", "2", "3", "4"]), ("month", "!=", 1)],
    [("date", ">", "2025")],
]


@pytest.mark.parametrize("filters", FILTERS)
def test_filters_keep_the_rows_pyarrow_dataset_keeps(monthly: Packed, filters: Any) -> None:
    ds = fastload.ShardDataset(monthly.root, filters=filters, decode=False, columns=["cls"])
    got = [s["__key__"] for s in ds]
    assert got == oracle(monthly, filters)
    assert len(ds) == len(got)


def test_statistics_prune_shards_and_row_groups_before_reading(monthly: Packed) -> None:
    # a date range inside month 1: the manifest's min/max drop other shards, footers other row groups,
    # so deciding fetches only the date column of the boundary row groups
    ds = fastload.ShardDataset(
        monthly.root, filters=[("date", ">=", "2024-01-05"), ("date", "<=", "2024-01-09")]
    )
    assert ds.filtered is not None
    assert ds.filtered.counts.tolist() == [5, 0, 0, 0, 0, 0]
    assert 0 < ds.filtered.fetched_bytes < 2 * 24 * len(b"2024-01-01") + 1000
    index = json.loads((monthly.root / "_fastload" / "index.json").read_bytes())
    assert index["shards"][0]["stats"]["date"] == ["2024-01-01", "2024-01-12", 0]
    assert "bin" not in index["shards"][0]["stats"]  # (long values get no statistics)


@pytest.mark.parametrize("even", ["drop", "pad", "none"])
def test_filtered_rows_exactly_once_over_two_ranks_and_workers(monthly: Packed, even: str) -> None:
    filters = [[("month", "=", 1), ("cls", "<", "5")], [("date", ">", "2024-03-15")]]
    want = oracle(monthly, filters)
    ranks, reports = [], []
    for rank in (0, 1):
        ds, dl = make_loader(
            monthly,
            batch_size=3,
            num_workers=2,
            rank=rank,
            world_size=2,
            seed=7,
            shuffle_buffer=4,
            filters=filters,
            even=even,
            decode=False,
            columns=["date"],
        )
        ranks.append([b["__key__"] for b in dl])
        reports.append(ds.epoch_report())
    keys = [k for r in ranks for b in r for k in b]
    dropped = [k for r in reports for _, k in r["dropped"]]
    repeated = [k for r in reports for _, k in r["repeated"]]
    assert sorted(keys + dropped) == sorted(want + repeated)  # every kept row once, as the policy says
    assert (dropped, repeated) != ([], []) or even == "none"
    if even != "none":
        assert len(ranks[0]) == len(ranks[1])  # equal steps
        assert sum(map(len, ranks[0])) == sum(map(len, ranks[1])) == len(keys) // 2


def test_a_checkpoint_records_the_filter_and_refuses_another(monthly: Packed) -> None:
    filters = [("month", "in", [2, 3]), ("cls", ">=", "3")]
    ds, dl = make_loader(monthly, batch_size=4, filters=filters, columns=["cls"], decode=False)
    it = iter(dl)
    first = keys_of([next(it), next(it)])
    state = dl.state_dict()
    del it
    others = [("filters", {"filters": [("month", "in", [2])], "columns": ["cls"]})]
    others += [("columns", {"filters": filters, "columns": ["date"]}), ("filters", {"columns": ["cls"]})]
    for which, other in others:
        again = fastload.ShardDataset(monthly.root, decode=False, **other)
        with pytest.raises(ConfigError, match=f"checkpoint was taken with {which}="):
            again.load_state_dict(ds.state_dict())
    _, dl2 = make_loader(monthly, batch_size=4, filters=filters, columns=["cls"], decode=False)
    dl2.load_state_dict(state)
    assert first + keys_of(dl2) == oracle(monthly, filters)


def test_a_partition_folder_reads_as_a_filter_with_partition_values(monthly: Packed) -> None:
    ds = fastload.ShardDataset(
        monthly.root / "month=02", decode=False, partition_columns=True, columns=["cls"]
    )
    got = list(ds)
    assert [s["__key__"] for s in got] == oracle(monthly, [("month", "=", 2)])
    assert {s["month"] for s in got} == {2}  # typed as pyarrow's hive partitioning types it
    assert ds.state_dict()["filters"] == [[("month", "==", 2)]]
    assert ds.root == str(monthly.root)


def test_map_dataset_adds_partition_values_as_iteration_does(monthly: Packed) -> None:
    """``MapDataset(partition_columns=True)``: ``ds[i]`` carries its shard's typed partition values, the
    same samples iteration gives (a partition folder as the source included); without it, none."""
    it = list(fastload.ShardDataset(monthly.root, decode=False, partition_columns=True, columns=["cls"]))
    md = fastload.MapDataset(monthly.root, decode=False, partition_columns=True, columns=["cls"])
    assert md[:] == it and {type(s["month"]) for s in it} == {int}
    feb = fastload.MapDataset(monthly.root / "month=02", decode=False, partition_columns=True)
    assert {s["month"] for s in feb[[0, -1, 3]]} == {2}
    assert "month" not in fastload.MapDataset(monthly.root, decode=False)[0]


def test_bad_filters_say_what_is_wrong(monthly: Packed, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'colour', not a column"):
        fastload.ShardDataset(monthly.root, filters=[("colour", "=", "red")])
    with pytest.raises(ConfigError, match="column 'month' holds int"):
        fastload.ShardDataset(monthly.root, filters=[("month", "=", "02")])
    tars = pack_files(tmp_path, small_files(6), max_samples=3)
    with pytest.raises(ConfigError, match="need Parquet shards"):
        fastload.ShardDataset(tars.root, filters=[("cls", "=", "1")])


def counting(entry: Any, path: Path) -> tuple[Any, list[int]]:
    """The read path of ``entry`` (a shard at ``path``) and the sizes of the reads it makes."""
    data = path.read_bytes()
    reads: list[int] = []

    def read(offset: int, size: int) -> bytes:
        reads.append(size)
        return data[offset : offset + size]

    return PARQUET.samples(entry, read=read, file=None, fd=None), reads  # type: ignore[arg-type]


def test_projection_fetches_only_the_projected_column_chunks(monthly: Packed) -> None:
    index = formats.load_index(str(monthly.root), tables=True)
    entry = index.shards[0]
    source, reads = counting(entry, monthly.root / entry.name)
    rows = list(source.load(range(entry.samples), ["cls"])())
    assert len(reads) == 1 and reads[0] < entry.bytes  # (a small shard: one read, gaps coalesced)
    source.gap_bytes, reads[:] = 0, []
    rows = list(source.load(range(entry.samples), ["cls"])())
    meta = source.metadata()
    chunks = [
        meta.row_group(g).column(c).total_compressed_size
        for g in range(meta.num_row_groups)
        for c in range(meta.num_columns)
        if meta.row_group(g).column(c).path_in_schema == "cls"  # (__key__ comes from the index)
    ]
    assert sorted(reads) == sorted(chunks)
    assert [r["__key__"] for r in rows] == list(entry.keys) and all(
        set(r) == {"__key__", "cls", "__index__"} for r in rows
    )
    assert sum(reads) < entry.bytes / 10
    # without the footer in its table (an older pack): read once from the shard's tail
    old = type(entry)(
        **{**entry.__dict__, "payload": ParquetShard(b"", stats_of(entry)), "checksum": "00000000"}
    )
    source, reads = counting(old, monthly.root / entry.name)
    assert [r["cls"] for r in source.load([3, 1], ["cls"])()] == [rows[3]["cls"], rows[1]["cls"]]
    assert reads[0] == min(entry.bytes, 64 << 10)


def test_a_remote_shards_projected_ranges_are_fetched_at_once(monthly: Packed) -> None:
    """Several column-chunk ranges of one load (a remote shard: a round trip each) are in flight together,
    and the rows are the same as fetched one after another (a local shard, fd given)."""
    import threading

    index = formats.load_index(str(monthly.root), tables=True)
    entry = index.shards[0]
    data = (monthly.root / entry.name).read_bytes()
    both = threading.Barrier(2, timeout=10)  # the first read returns once a second one is in flight too
    calls = iter(range(1 << 30))

    def read(offset: int, size: int) -> bytes:
        if next(calls) < 2:
            both.wait()
        return data[offset : offset + size]

    remote = PARQUET.samples(entry, read=read, file=None, fd=None)  # type: ignore[arg-type]
    remote.gap_bytes = 0  # one range per row group
    assert remote.metadata().num_row_groups >= 2
    got = list(remote.load(range(entry.samples), ["cls"])())
    local, _ = counting(entry, monthly.root / entry.name)
    local._concurrent = False
    assert got == list(local.load(range(entry.samples), ["cls"])())


def test_a_damaged_page_of_a_projected_column_raises(monthly: Packed, tmp_path: Path) -> None:
    index = formats.load_index(str(monthly.root), tables=True)
    entry = index.shards[1]
    meta = pq.read_metadata(monthly.root / entry.name)
    col = next(
        meta.row_group(0).column(c)
        for c in range(meta.num_columns)
        if meta.row_group(0).column(c).path_in_schema == "cls"
    )
    data = bytearray((monthly.root / entry.name).read_bytes())
    at = col.data_page_offset + col.total_compressed_size - 2  # inside the page's data
    data[at] ^= 0x40
    path = tmp_path / "damaged.parquet"
    path.write_bytes(bytes(data))
    source, _ = counting(entry, path)
    with pytest.raises(VerifyError, match="fails its checksum"):
        list(source.load([0], ["cls"])())
    assert [r["date"] for r in source.load([0], ["date"])()] == [b"2024-01-13"]  # (other columns fine)


@pytest.mark.filterwarnings("ignore:.*no index.json:UserWarning")
def test_filters_on_a_foreign_hive_folder(tmp_path: Path) -> None:
    """Parquet written by pyarrow into nested hive folders (typed columns, no index, no footer in a table):
    the same rows as pyarrow.dataset keeps, partition values typed and added to samples."""
    import pyarrow as pa

    table = pa.table({"x": list(range(40)), "s": [f"v{i % 7}" for i in range(40)]})
    table = table.append_column("year", pa.array([2024] * 20 + [2025] * 20)).append_column(
        "month", pa.array([1, 2] * 20)
    )
    pq.write_to_dataset(table, tmp_path / "fh", partition_cols=["year", "month"], row_group_size=5)
    filters = [[("year", "=", 2024), ("x", ">", 7)], [("month", "==", 2), ("s", "in", ["v1", "v3"])]]
    ds = fastload.ShardDataset(tmp_path / "fh", filters=filters, decode=False, partition_columns=True)
    got = sorted((s["x"], s["year"], s["month"]) for s in ds)
    want = pads.dataset(tmp_path / "fh", partitioning="hive").to_table(
        filter=pq.filters_to_expression(filters)
    )
    assert got == sorted(zip(*(want[c].to_pylist() for c in ("x", "year", "month")), strict=True))


def test_a_mix_of_filtered_datasets_reads_their_filtered_rows(monthly: Packed) -> None:
    jan = fastload.ShardDataset(monthly.root, filters=[("month", "=", 1)], decode=False, columns=["cls"])
    late = fastload.ShardDataset(
        monthly.root, filters=[("date", ">", "2024-03-20")], decode=False, partition_columns=True
    )
    mix = fastload.Mix({"jan": jan, "late": late}, stop="all_exhausted", seed=3)
    got: dict[str, list[str]] = {"jan": [], "late": []}
    for s in mix:
        got[s["__source__"]].append(s["__key__"])
        assert s["__source__"] == "jan" or s["month"] == 3
    assert sorted(got["jan"]) == oracle(monthly, [("month", "=", 1)])
    assert set(got["late"]) == set(
        oracle(monthly, [("date", ">", "2024-03-20")])
    )  # (repeated: all_exhausted)


def test_tables_fetched_to_decide_are_not_fetched_again_to_read(
    monthly: Packed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shard the manifest leaves undecided has its sample table fetched while planning; reading it (every
    epoch, the epoch report) uses that table instead of fetching it again."""
    from collections import Counter

    from fastload.storage import access

    fetched: Counter[str] = Counter()
    read_bytes = access.read_bytes

    def counting_read(url: str, **kw: Any) -> bytes:
        if url.endswith(".fltable"):
            fetched[url] += 1
        return read_bytes(url, **kw)

    monkeypatch.setattr(access, "read_bytes", counting_read)
    filters = [("cls", "in", ["2", "5"]), ("month", "!=", 3)]  # cls: undecided in every shard of months 1-2
    ds = fastload.ShardDataset(monthly.root, filters=filters, decode=False, columns=["cls"], seed=1)
    assert len(fetched) == 4 and set(fetched.values()) == {1}
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        assert sorted(s["__key__"] for s in ds) == sorted(oracle(monthly, filters))
    ds.epoch_report()
    assert len(fetched) == 4 and set(fetched.values()) == {1}


def test_map_dataset_numbers_the_rows_filters_keep(monthly: Packed) -> None:
    """``MapDataset(filters=...)``: ``len`` and ``ds[i]`` over the rows iteration keeps, in its order (also
    read by DataLoader workers with a shuffling sampler); a partition folder is a filter there too."""
    import torch.utils.data

    filters = [[("month", "=", 1), ("cls", "<", "5")], [("date", ">", "2024-03-15")]]
    want = oracle(monthly, filters)
    assert want == [s["__key__"] for s in fastload.ShardDataset(monthly.root, filters=filters, decode=False)]
    md = fastload.MapDataset(monthly.root, filters=filters, decode=False, columns=["cls"])
    assert len(md) == len(want) < len(monthly.keys)
    assert [s["__key__"] for s in md[:]] == want
    assert [s["__key__"] for s in md[[5, 0, -1, 5]]] == [want[5], want[0], want[-1], want[5]]
    assert set(md[3]) == {"__key__", "cls", "__index__", "__shard__"}
    shard, row = md.locate(len(want) - 1)
    assert md[-1]["__index__"] == row and md[-1]["__shard__"] == shard
    dl = torch.utils.data.DataLoader(md, batch_size=4, shuffle=True, num_workers=2, collate_fn=list)
    assert sorted(s["__key__"] for b in dl for s in b) == sorted(want)
    part = fastload.MapDataset(monthly.root / "month=02", decode=False, columns=["date"])
    assert [s["__key__"] for s in part[:]] == oracle(monthly, [("month", "=", 2)])
