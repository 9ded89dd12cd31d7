"""Per-stage telemetry summed over real DataLoader workers: fastload.DataLoader, fastload.loader, a torch
DataLoader over a ShardDataset and over a Mix, and S3 counters from the workers (moto)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.utils.data

import fastload

from .helpers import Packed

TOTAL_SMALL = 30


def stage(report: dict, name: str) -> dict:
    return report["stages"][name]


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_report_sums_the_workers_stages(small: Packed, workers: int) -> None:
    ds = fastload.ShardDataset(small.root)
    dl = fastload.DataLoader(ds, batch_size=4, num_workers=workers)
    batches = sum(1 for _ in dl)
    r = dl.report()
    assert r["counters"]["samples"] == TOTAL_SMALL
    assert r["counters"]["batches"] == batches == 8
    assert stage(r, "parse")["items"] == stage(r, "decode")["items"] == TOTAL_SMALL
    assert stage(r, "collate")["calls"] == 8 and stage(r, "collate")["items"] == TOTAL_SMALL
    shards = list(small.root.glob("*.tar"))
    shard_bytes = sum(p.stat().st_size for p in shards)  # each read once but for its end-of-archive blocks
    assert shard_bytes - 1024 * len(shards) <= stage(r, "fetch")["items"] < shard_bytes
    assert stage(r, "plan")["items"] == TOTAL_SMALL  # the workers' shares add up to the epoch
    for name in ("plan", "fetch", "parse", "decode", "collate"):
        assert stage(r, name)["s"] > 0, name
    assert r["slowest_stage"] in r["stages"]
    assert r["latency"]["fetch"]["p50_ms"] is not None
    # a second epoch adds to the counts
    sum(1 for _ in dl)
    assert dl.report()["counters"]["samples"] == 2 * TOTAL_SMALL


def test_map_time_is_its_own_stage(small: Packed) -> None:
    ds = fastload.ShardDataset(small.root, map=_slow_map)
    dl = fastload.DataLoader(ds, batch_size=5, num_workers=2)
    sum(1 for _ in dl)
    r = dl.report()
    assert stage(r, "map")["items"] == TOTAL_SMALL
    assert stage(r, "map")["s"] >= TOTAL_SMALL * 0.015  # (estimated from one sample in 8 per task)
    assert r["slowest_stage"] == "map"


def _slow_map(sample: dict) -> dict:
    import time

    time.sleep(0.02)
    return sample


def test_torch_dataloader_workers_report_through_the_dataset(small: Packed) -> None:
    ds = fastload.ShardDataset(small.root, batch_size=4)
    sum(1 for _ in torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2))
    r = ds.report()
    assert r["counters"]["samples"] == TOTAL_SMALL
    assert stage(r, "plan")["calls"] == 2


def test_a_mix_read_by_workers(small: Packed) -> None:
    mix = fastload.Mix(
        {"a": fastload.ShardDataset(small.root), "b": fastload.ShardDataset(small.root)}, batch_size=5
    )
    got = sum(len(b["__key__"]) for b in torch.utils.data.DataLoader(mix, batch_size=5, num_workers=2))
    r = mix.report()
    assert r["counters"]["samples"] >= got > 0
    assert stage(r, "fetch")["calls"] > 0


def test_loader_records_wait_step_and_exports_json_lines(small: Packed, tmp_path: Path) -> None:
    ld = fastload.loader(
        small.root, batch_size=2, num_workers=2, telemetry=tmp_path / "tel", telemetry_every=5
    )
    steps = sum(1 for _ in ld)
    r = ld.report()
    assert stage(r, "wait")["calls"] == steps == 15
    assert stage(r, "step")["calls"] == steps  # (the last: until the loop asked for one more)
    assert r["counters"]["samples"] == TOTAL_SMALL
    assert r["loop"]["batches"] == steps
    lines = (tmp_path / "tel" / "telemetry-rank0.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [rec["step"] for rec in records] == [5, 10, 15]
    assert records[0]["rank"] == 0 and records[0]["world"] == 1 and records[0]["stragglers"] == []
    assert 0 <= records[-1]["wait_share"] <= 1
    assert records[-1]["total"]["stages"]["wait"]["calls"] == 15


def test_workers_s3_counters_reach_the_report(uploaded: str, moto_url: str, s3_env: None) -> None:
    config = fastload.S3Config(endpoint_url=moto_url, addressing_style="path", part_size_bytes=64 << 10)
    fastload.s3_stats(reset=True)
    ds = fastload.ShardDataset(uploaded, s3_config=config)
    dl = fastload.DataLoader(ds, batch_size=8, num_workers=2)
    sum(1 for _ in dl)
    r = dl.report()
    s3 = fastload.s3_stats()
    assert r["counters"]["s3_requests"] > 0
    assert r["counters"]["s3_requests"] <= s3["requests"]  # (s3_stats also counts this process's reads)
    assert r["counters"]["s3_bytes"] >= stage(r, "fetch")["items"] > 0
    assert r["latency"]["first_byte"]["p50_ms"] is not None
    assert r["s3"]["requests"] == s3["requests"]


def test_torch_dataloader_workers_s3_counters_reach_the_dataset(
    uploaded: str, moto_url: str, s3_env: None
) -> None:
    config = fastload.S3Config(endpoint_url=moto_url, addressing_style="path", part_size_bytes=64 << 10)
    ds = fastload.ShardDataset(uploaded, s3_config=config, batch_size=8)
    sum(1 for _ in torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2))
    r = ds.report()
    assert r["counters"]["s3_requests"] > 0
    assert r["counters"]["s3_bytes"] >= stage(r, "fetch")["items"] > 0


def test_map_dataset_read_by_workers(small: Packed) -> None:
    ds = fastload.MapDataset(small.root)
    batches = list(torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=list))
    assert sum(len(b) for b in batches) == TOTAL_SMALL
    r = ds.report()
    assert r["counters"]["samples"] == TOTAL_SMALL
    assert stage(r, "fetch")["items"] == TOTAL_SMALL and stage(r, "fetch")["s"] > 0
    assert stage(r, "decode")["items"] == TOTAL_SMALL


def test_spawned_workers_add_into_the_same_block_and_a_plain_copy_gets_its_own(small: Packed) -> None:
    import pickle

    ds = fastload.ShardDataset(small.root)
    dl = fastload.DataLoader(ds, batch_size=8, num_workers=1, multiprocessing_context="spawn")
    sum(1 for _ in dl)
    assert dl.report()["counters"]["samples"] == TOTAL_SMALL
    mapped = fastload.MapDataset(small.root)
    mapped[0]
    copy = pickle.loads(pickle.dumps(mapped))  # (e.g. sent to Ray): counts of its own from zero
    assert copy.report()["counters"]["samples"] == 0 and mapped.report()["counters"]["samples"] == 1


def test_the_loaders_gets_and_bytes_equal_the_servers_own(uneven: Packed, s3_env: None) -> None:
    from fastload.testing.s3serve import S3Server

    with S3Server(str(uneven.root.parent), bucket="data") as server:
        config = fastload.S3Config(endpoint_url=server.endpoint_url, addressing_style="path")
        ds = fastload.ShardDataset(f"s3://data/{uneven.root.name}", s3_config=config)
        dl = fastload.DataLoader(ds, batch_size=8, num_workers=2)
        before = server.stats()
        sum(1 for _ in dl)
        after = server.stats()
    r = dl.report()["counters"]
    assert r["s3_requests"] == after.requests.get("GET", 0) - before.requests.get("GET", 0) > 0
    assert r["s3_bytes"] == after.body_bytes - before.body_bytes
