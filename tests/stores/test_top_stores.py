"""Loader telemetry to ``gs://`` (the GCS emulator) and ``az://`` (Azurite) and ``fastload top`` reading it
back: the same segment objects as on S3 (tests/dataset/test_top_store.py), through each store's own API."""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

import pytest

from fastload.train.exporters import JsonLines

from .helpers import run_cli

_NAMES = itertools.count()


def record(rank: int, step: int) -> dict[str, Any]:
    return {"time": time.time(), "rank": rank, "step": step, "samples_per_s": 50.0, "wait_share": 0.5}


def write_and_show(url: str) -> list[str]:
    """Two ranks' records to ``url`` (rank 1 in two runs: two segments), then ``fastload top --once``."""
    for rank, steps in ((0, [4, 8]), (1, [4]), (1, [8, 12])):
        exporter = JsonLines(url, interval_s=0.0)
        for step in steps:
            exporter.export(record(rank, step))
        exporter.close()
        assert exporter.failures == 0 and exporter.dropped == 0
    return run_cli("top", url, "--once").stdout.splitlines()


@pytest.mark.parametrize("store", ["gs", "az"])
def test_telemetry_to_a_store_and_top_reads_it(
    store: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"tel{os.getpid()}x{next(_NAMES)}"
    if store == "gs":
        gcs = request.getfixturevalue("gcs_emulator")
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.host)
        gcs.make_bucket(name)
    else:
        azurite = request.getfixturevalue("azurite")
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
        azurite.make_container(name)
    rows = write_and_show(f"{store}://{name}/runs/7")
    assert [r.split()[:3] for r in rows[1:]] == [["0", "8", "50"], ["1", "12", "50"]]
    assert "50%" in rows[2]
