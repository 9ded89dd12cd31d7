"""One pack driver (``fastload.packing.driver``) under ``pack``, ``pack`` of tables and ``pack_tokens``: what
had drifted between the three hand-written drivers now behaves as ``fastload.pack`` does for all of them
(a progress bar, the same option checks, the "already complete" report with its skips, skips refused)."""

from __future__ import annotations

import csv
import itertools
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import fastload
from fastload.cli import main
from fastload.config import PackConfig
from fastload.core.index import DatasetIndex
from fastload.core.plan import ShardPlan
from fastload.errors import ConfigError, Skip, SkippedInputError
from fastload.formats.shard import ShardResult
from fastload.packing.dest import Destination
from fastload.packing.driver import Plan, Target, run
from fastload.packing.engine import Engine, LocalEngine, ShardJob
from fastload.packing.journal import STATE_DIR, PackJournal
from fastload.packing.ray_sink import _InMemory, to_samples
from fastload.packing.report import PackReport
from fastload.packing.write import FileShard


def write_tokens(path: Path, docs: int = 60, *, broken: bool = False) -> Path:
    lines = [json.dumps({"input_ids": list(range(d, d + 20))}) for d in range(docs)]
    if broken:
        lines.insert(3, "{broken")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_pack_tokens_shows_the_progress_bar_pack_shows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_tokens(tmp_path / "a.jsonl")
    fastload.pack_tokens(src, tmp_path / "ds", shard_size_bytes=4096, row_group_bytes=1000, progress=True)
    err = capsys.readouterr().err
    assert "packing 1 file(s) of tokens" in err, err
    fastload.pack_tokens(src, tmp_path / "ds2", progress=False)
    assert "packing" not in capsys.readouterr().err
    assert main(["pack-tokens", str(src), str(tmp_path / "ds3"), "--quiet"]) == 0
    assert "packing" not in capsys.readouterr().err
    a, b = (tmp_path / d / "_fastload" / "index.json" for d in ("ds2", "ds3"))
    assert a.read_bytes() == b.read_bytes(), "the bar does not change the output"


@pytest.mark.parametrize(
    "option", [{"prefix": ".x"}, {"shard_size_bytes": 100}, {"compression": "lz9"}, {"row_group_bytes": 0}]
)
def test_pack_tokens_checks_its_options_as_every_pack_does(tmp_path: Path, option: dict[str, object]) -> None:
    src = write_tokens(tmp_path / "a.jsonl")
    with pytest.raises(ConfigError) as pack_says:
        PackConfig(**option)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as tokens_say:
        fastload.pack_tokens(src, tmp_path / "ds", **option)  # type: ignore[arg-type]
    assert str(tokens_say.value) == str(pack_says.value)
    assert not (tmp_path / "ds").exists(), "refused before anything is written"


def test_a_finished_pack_tokens_with_skips_is_complete_as_a_pack_is(tmp_path: Path) -> None:
    src = write_tokens(tmp_path / "a.jsonl", broken=True)
    first = fastload.pack_tokens(src, tmp_path / "ds", allow_skip=True, progress=False)
    assert len(first.skipped) == 1
    with pytest.raises(SkippedInputError) as refused:  # as the first run without --allow-skip would
        fastload.pack_tokens(src, tmp_path / "ds", resume=True, progress=False)
    assert refused.value.written and [s.path for s in refused.value.skipped] == [first.skipped[0].path]
    again = fastload.pack_tokens(src, tmp_path / "ds", resume=True, allow_skip=True, progress=False)
    assert again.already_complete and again.documents == 60 and again.skipped == first.skipped
    assert "nothing to do" in again.summary() and "skipped 1 document(s) or file(s)" in again.summary()


def test_a_finished_table_pack_reports_its_skips_as_a_pack_of_files_does(tmp_path: Path) -> None:
    root = tmp_path / "m"
    (root / "img").mkdir(parents=True)
    rows = [{"path": f"img/{i}.jpg", "label": i} for i in range(6)]
    for r in rows:
        (root / r["path"]).write_bytes(b"x" * (10 + int(r["label"])))
    with open(root / "manifest.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["path", "label"])
        writer.writeheader()
        writer.writerows(rows)
    gone = root / "img" / "2.jpg"
    gone.unlink()
    options = {"shard_format": "parquet", "file_columns": ["path"], "progress": False}
    first = fastload.pack(root / "manifest.csv", tmp_path / "out", allow_skip=True, **options)
    assert [s.path for s in first.skipped] == [str(gone)]
    with pytest.raises(SkippedInputError) as refused:  # (seen while planning, as a pack of files sees it)
        fastload.pack(root / "manifest.csv", tmp_path / "out", resume=True, **options)
    assert [s.path for s in refused.value.skipped] == [str(gone)]
    again = fastload.pack(root / "manifest.csv", tmp_path / "out", resume=True, allow_skip=True, **options)
    assert again.already_complete and [s.path for s in again.skipped] == [str(gone)]
    assert "nothing to do" in again.summary() and "skipped 1 input(s)" in again.summary()


class SamplesPlan(Plan[PackReport]):
    """A plan fed by a Python generator of sample dicts, cut every ``per_shard`` samples while they stream
    in (the shape of issue 30's ShardWriter / optimize): written to show the driver needs nothing more."""

    def __init__(self, url: str, samples: Iterator[dict[str, Any]], *, per_shard: int) -> None:
        self.samples, self.per_shard = samples, per_shard
        self.config = PackConfig(progress=False)
        self.target = Target(url=url, fingerprint="toy", layout="toy", shards=None, progress=False)

    def name_of(self, number: int) -> str:
        return f"shard-{number:06d}.tar"

    def engine(self, dest: Destination, journal: PackJournal, todo: int | None) -> Engine:
        return LocalEngine(dest, journal, workers=2)

    def jobs(self, dest: Destination, kept: Mapping[int, ShardResult]) -> Iterator[ShardJob]:
        for number in itertools.count():
            chunk = list(itertools.islice(self.samples, self.per_shard))
            if not chunk:
                return
            samples = to_samples(chunk, _InMemory())
            shard = ShardPlan(number, 0, len(samples), self.name_of(number))
            yield FileShard(plan=shard, samples=samples, fields=["cls", "txt"], config=self.config)

    def index(self, results: Mapping[int, ShardResult]) -> DatasetIndex:
        return DatasetIndex(
            shard_format="tar",
            fields=["cls", "txt"],
            shards=[results[n].entry for n in sorted(results)],
            options={"layout": "toy"},
            payload_bytes=sum(r.payload_bytes for r in results.values()),
        )

    def report(
        self, url: str, index: DatasetIndex, results: Mapping[int, ShardResult], *, kept: int, seconds: float
    ) -> PackReport:
        return PackReport(
            url, index, shards_written=len(results), files=sum(r.files for r in results.values())
        )

    def complete(self, url: str, index: DatasetIndex, *, skipped: list[Skip], seconds: float) -> PackReport:
        return PackReport(url, index, already_complete=True)


def test_a_plan_fed_by_a_generator_of_samples_runs_on_the_same_driver(tmp_path: Path) -> None:
    made = ({"__key__": f"s{i:04d}", "txt": f"sample {i}", "cls": i % 3} for i in range(25))
    report = run(SamplesPlan(str(tmp_path / "ds"), made, per_shard=10))
    assert len(report.index.shards) == 3 and report.files == 50 and report.index.samples == 25
    assert not (tmp_path / "ds" / STATE_DIR).exists(), "the journal is removed once index.json is"
    assert fastload.verify(tmp_path / "ds").ok
    got = [(s["__key__"], s["txt"], s["cls"]) for s in fastload.ShardDataset(tmp_path / "ds", decode=False)]
    assert sorted(got) == [(f"s{i:04d}", f"sample {i}".encode(), b"%d" % (i % 3)) for i in range(25)]
