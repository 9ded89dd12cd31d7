"""Each telemetry exporter over a real loader: Prometheus (textfile and HTTP endpoint), TensorBoard
scalars (read back with tensorboard's event reader), OpenTelemetry gauges (the SDK's in-memory reader)."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import fastload
from fastload.errors import ConfigError
from fastload.train.exporters import OpenTelemetry, Prometheus, TensorBoard, exporters_from

from .helpers import Packed


def run(small: Packed, telemetry: Any) -> Any:
    ld = fastload.loader(small.root, batch_size=3, num_workers=0, telemetry=telemetry, telemetry_every=4)
    assert sum(1 for _ in ld) == 10
    return ld


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_prometheus_textfile_and_endpoint(small: Packed, tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    port = free_port()
    prom = Prometheus(textfile=tmp_path / "fastload.prom", port=port, addr="127.0.0.1")
    try:
        run(small, prom)
        text = (tmp_path / "fastload.prom").read_text()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            served = response.read().decode()
    finally:
        prom.close()
    for body in (text, served):
        assert 'fastload_stage_seconds_total{rank="0",stage="decode"}' in body
        assert 'fastload_straggler{rank="0"} 0.0' in body
        assert 'fastload_step{rank="0"} 8.0' in body  # records at steps 4 and 8


def test_tensorboard_scalars(small: Packed, tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = TensorBoard(tmp_path / "tb")
    run(small, tb)
    tb.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert "fastload/wait_share" in tags and "fastload/stage_seconds_total/parse" in tags
    assert [e.step for e in events.Scalars("fastload/wait_share")] == [4, 8]


def test_opentelemetry_gauges(small: Packed) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    run(small, OpenTelemetry(provider.get_meter("fastload")))
    data = reader.get_metrics_data()
    points = {
        m.name: list(m.data.data_points)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert points["fastload.step"][0].value == 8
    stages = {p.attributes["stage"] for p in points["fastload.stage_seconds_total"]}
    assert {"fetch", "parse", "decode", "wait"} <= stages
    provider.shutdown()


def test_a_bad_telemetry_argument_says_what_to_pass() -> None:
    with pytest.raises(ConfigError, match="pass a folder"):
        exporters_from(42)
    with pytest.raises(ConfigError, match="telemetry_every=0"):
        fastload.loader([1, 2, 3], telemetry_every=0, num_workers=0)


def test_ranks_without_a_process_group_write_a_file_each(
    small: Packed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchrun's processes that never join a process group: each writes its own telemetry file, named by
    the launcher's RANK, not all rank 0's (nothing is compared across them: world 1)."""
    import json

    monkeypatch.setenv("WORLD_SIZE", "4")  # (as torchrun sets them: the dataset reads its rank's share)
    for rank in ("1", "3"):
        monkeypatch.setenv("RANK", rank)
        ld = fastload.loader(small.root, batch_size=1, num_workers=0, telemetry=tmp_path, telemetry_every=2)
        assert sum(1 for _ in ld) >= 2
        ld.close()
    assert sorted(p.name for p in tmp_path.glob("telemetry-rank*.jsonl")) == [
        "telemetry-rank1.jsonl",
        "telemetry-rank3.jsonl",
    ]
    records = [json.loads(line) for line in (tmp_path / "telemetry-rank3.jsonl").read_text().splitlines()]
    assert records and {(r["rank"], r["world"]) for r in records} == {(3, 1)}
