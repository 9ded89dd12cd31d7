"""``fastload bench`` end to end on the embedded default (tiny sizes) and on a user's folder, read-only."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from fastload.cli import main

TINY = ["--quick", "--reps", "1", "--budget-s", "0.1", "--train-s", "0.3", "--batch-size", "16", "--quiet"]


@pytest.fixture(autouse=True)
def creds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials the bench would otherwise set for its embedded endpoint (restored after the test)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "any")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "any")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)


def _sane_run(run: dict[str, object]) -> None:
    assert run["error"] is None, run
    for name in ("samples", "batches", "bytes"):
        assert isinstance(run[name], int) and run[name] > 0, (name, run)
    for name in ("samples_per_s", "batches_per_s", "mb_per_s", "first_batch_s", "wall_s"):
        value = run[name]
        assert isinstance(value, float | int) and value >= 0, (name, run)
    assert run["samples_per_s"] > 0


def test_quick_bench_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    argv = ["bench", *TINY, "--images", "96", "--workers", "0,1", "--num-workers", "1", "--latency-ms", "5"]
    argv += ["--compare", "naive,webdataset", "--cache-dir", str(tmp_path / "cache")]
    argv += ["--json", str(out), "--plot", str(png)]
    assert main(argv) == 0
    table = capsys.readouterr().out
    for heading in ("loader alone", "training loop", "stages", "advice for per-file s3", "delivery check"):
        assert heading in table
    doc = json.loads(out.read_text())

    assert doc["machine"]["cores"] >= 1 and doc["machine"]["python"] and doc["machine"]["versions"]["torch"]
    names = {v["name"] for v in doc["variants"]}
    assert {"per-file local", "fastload local", "per-file s3", "fastload s3"} <= names
    assert {"webdataset local", "webdataset s3"} <= names
    for run in doc["runs"]:
        _sane_run(run)
    for v in doc["variants"]:
        workers = set(doc["summary"][v["name"]])
        assert workers == ({"0", "1"} if v["sweep"] else {"1"}), v

    # the packed data delivers every sample once, with the files' bytes
    check = doc["checks"]["fastload s3"]
    assert check["ok"] and check["delivered"] == check["expected"] == check["unique"] == 96
    assert check["bytes"] == check["expected_bytes"] == doc["workload"]["file_bytes"]
    full = [r for r in doc["runs"] if r["variant"].startswith("fastload") and r["complete"]]
    assert all(r["unique_keys"] in (None, 96) and r["samples"] == 96 for r in full)

    training = {r["variant"]: r for r in doc["training"]["runs"]}
    assert {"per-file s3", "fastload s3"} <= set(training)
    for run in training.values():
        _sane_run(run)
        assert 0 <= run["wait_share"] <= 1
        assert all(w >= 0 and c >= 0.025 * 0.9 for w, c in run["timeline"])  # the 25 ms step slept
    for name, stages in doc["stages"].items():
        assert stages["samples"] > 0
        assert stages["decode_s"] > 0 and stages["fetch_s"] > 0, name
        assert all(stages[f"{s}_s"] >= 0 for s in ("parse", "collate"))
    assert doc["ratios"]["fastload s3 / per-file s3"] > 1
    assert doc["endpoint"]["raw"]["small_objects"]["requests_per_s"] > 0
    assert doc["endpoint"]["emulated"]["shards"]["mb_per_s"] > 0
    advice = doc["advice"]["per-file s3"]
    assert advice["verdict"] in ("loader-bound", "compute-bound") and advice["lines"]
    assert any("these 96 files average" in line for line in advice["lines"])

    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) < 150_000
    import matplotlib.image

    assert matplotlib.image.imread(str(png)).shape[2] in (3, 4)


def test_bench_on_a_folder_of_files_leaves_it_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from PIL import Image

    src = tmp_path / "photos"
    for i in range(40):
        folder = src / ("cats" if i % 2 else "dogs")
        folder.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (40 + i, 30), (i * 5, 100, 200)).save(folder / f"{i:03d}.jpg", quality=80)
    (src / "dogs" / "999.jpg").write_bytes(b"not a jpeg")  # one unreadable image: named, counted, skipped
    before = sorted((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in src.rglob("*"))
    out = tmp_path / "b.json"
    argv = ["bench", str(src), *TINY, "--workers", "0", "--num-workers", "0", "--latency-ms", "0"]
    assert main([*argv, "--json", str(out)]) == 0
    assert sorted((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in src.rglob("*")) == before
    doc = json.loads(out.read_text())
    assert doc["workload"]["kind"] == "files" and doc["workload"]["files"] == 41
    assert doc["checks"]["fastload s3"]["ok"]
    for run in doc["runs"]:
        _sane_run(run)
        assert run["bad_samples"] <= 1 and all(b.startswith("dogs/999.jpg: ") for b in run["bad"]), run
        if run["complete"]:
            assert run["bad_samples"] == 1 and run["samples"] == 40, run
    table = capsys.readouterr().out
    assert "these 41 files average" in table
    assert "did not decode" in table and "dogs/999.jpg: ValueError: not an image Pillow can read" in table


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "/no/such/folder"], "is not a folder or s3:// prefix"),
        (["bench", "--plot", "out.jpg"], "ending in .png"),
        (["bench", "--endpoint", "http://127.0.0.1:1"], "--endpoint applies to an s3:// SOURCE"),
        (["bench", "--compare", "torchdata"], "choose from naive, webdataset"),
        (["bench", "--batch-size", "0"], "batch_size=0 must be >= 1"),
    ],
)
def test_bad_input_gets_a_message_not_a_traceback(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_bad_workers_list_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--workers", "a,b"])
    assert exc.value.code == 2
    assert "write num_workers values like 0,2,4" in capsys.readouterr().err


def test_default_cache_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from fastload.bench.options import default_cache_dir

    assert default_cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == os.path.join(tmp_path, "fastload", "bench")
    assert default_cache_dir({}).endswith(os.path.join(".cache", "fastload", "bench"))


def test_benchmarks_runner_lists_and_refuses_unknown_names(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "run.py"
    spec = importlib.util.spec_from_file_location("benchmarks_run", path)
    assert spec is not None and spec.loader is not None
    runner = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = runner  # dataclasses look their module up there
    try:
        spec.loader.exec_module(runner)
    finally:
        del sys.modules[spec.name]
    assert runner.main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in ("pack", "s3_read", "bench"))
    assert runner.main(["no-such-benchmark"]) == 2
    assert "unknown benchmark" in capsys.readouterr().err
    argv = runner.BENCHMARKS[-1].argv(quick=True, json_path="/x.json", out=Path("/o"))
    assert (
        argv[1:4] == ["-m", "fastload", "bench"] and "--quick" in argv and argv[-2:] == ["--json", "/x.json"]
    )


def test_bench_on_a_folder_without_images_says_so_and_plots_next_to_the_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 28 item 19: the header said "decode to 64x64" for audio-like samples, and no PNG came without
    --plot; now the header names the fields, the plot is written next to the JSON, and the run ends with
    its one-line conclusion (on the plot too)."""
    src = tmp_path / "clips"
    for i in range(24):
        folder = src / f"speaker{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:03d}.wav").write_bytes(b"RIFF" + bytes([i]) * (2000 + 37 * i))
        (folder / f"{i:03d}.json").write_text(json.dumps({"id": i}))
    out = tmp_path / "run.json"
    argv = ["bench", str(src), *TINY, "--workers", "0", "--num-workers", "0", "--latency-ms", "0"]
    assert main([*argv, "--json", str(out)]) == 0
    table = capsys.readouterr().out
    header = table.splitlines()[0]
    assert "decode to" not in header and "no image fields to decode (fields: json, wav)" in header, header
    png = tmp_path / "run.png"
    assert f"plot written to {png}" in table
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    doc = json.loads(out.read_text())
    assert doc["workload"]["fields"] == ["json", "wav"] and doc["workload"]["image_fields"] == []
    assert doc["conclusion"].startswith("fastload reads ") and f"conclusion: {doc['conclusion']}" in table


def test_where_the_plot_goes() -> None:
    from fastload.bench.args import NO_PLOT, plot_path_for

    assert plot_path_for("p.png", "r.json") == "p.png"
    assert plot_path_for(None, "out/run.json") == "out/run.png"
    assert plot_path_for(None, None) is None  # then the run says how to get one:
    assert "--plot FILE.png" in NO_PLOT and "--json" in NO_PLOT
