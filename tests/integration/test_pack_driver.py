"""One pack driver (``fastload.packing.driver``) under ``pack``, ``pack`` of tables and ``pack_tokens``: what
had drifted between the three hand-written drivers now behaves as ``fastload.pack`` does for all of them
(a progress bar, the same option checks, the "already complete" report with its skips, skips refused)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

import fastload
from fastload.cli import main
from fastload.config import PackConfig
from fastload.errors import ConfigError, SkippedInputError


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
