"""benchmarks/gpu_feed.py (the script for a GPU machine) runs end to end on the CPU in its smoke mode."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_feed.py"


def test_smoke_on_cpu(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    script = runpy.run_path(str(SCRIPT))

    def broken(files: Path, device: object) -> None:
        raise RuntimeError("nvjpeg exploded")

    script["main"].__globals__["decode_agreement"] = (
        broken  # one failing section must not lose the others' figures
    )
    md, js = tmp_path / "results.md", tmp_path / "results.json"
    md.write_text("# Benchmark results\n")
    assert script["main"](["--device", "cpu", "--smoke", "--markdown", str(md), "--json", str(js)]) == 1
    report = json.loads(js.read_text())
    assert [r["variant"] for r in report["feed"]] == ["plain", "pinned", "prefetch", "data-only"]
    assert all(r["bytes_ok"] for r in report["feed"])  # every batch's sum equals the packed bytes' sum
    assert [r["variant"] for r in report["training"]] == [
        "per-file",
        "fastload cpu-decode",
        'fastload decode="cuda"',
    ]
    assert all(r["steps"] >= 1 and r["gpu_pattern"] == "not-measured" for r in report["training"])
    assert report["copy"]["pinned"]["via_slot"] != "0/4"  # the copies did come out of a shared-memory slot
    text = md.read_text()
    assert text.startswith("# Benchmark results\n\n## Feeding a GPU: cpu") and "| per-file |" in text
    assert "decode_agreement: FAILED: RuntimeError: nvjpeg exploded" in text
