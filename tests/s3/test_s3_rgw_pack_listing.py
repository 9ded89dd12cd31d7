"""Pack listing rules and the retry of skipped inputs with ``s3://`` ends (RGW): hidden and ``exclude``d keys
of an S3 source are left out and counted; ``--resume`` into an S3 destination writes again the shard of an
input that was skipped and is back, giving the bytes of a fresh pack."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from s3util import objects_under, snapshot

import fastload
from fastload.errors import SkippedInputError
from fastload.storage import listing


def test_hidden_and_excluded_keys_of_an_s3_source_are_left_out(rgw, rgw_env, rgw_client, bucket, tmp_path):
    name = bucket(rgw)
    keys = {"a/0001.jpg": b"j", "a/0001.cls": b"1", ".DS_Store": b"f", ".git/config": b"c", "a/0.tmp": b"t"}
    for key, body in keys.items():
        rgw_client.put_object(Bucket=name, Key=f"raw/{key}", Body=body)
    report = fastload.pack(f"s3://{name}/raw", tmp_path / "out", exclude=["*.tmp"], progress=False)
    assert report.index.samples == 1 and report.skipped == []
    assert sorted(report.notes.hidden) == [f"s3://{name}/raw/.DS_Store", f"s3://{name}/raw/.git/config"]
    assert report.notes.excluded == [f"s3://{name}/raw/a/0.tmp"]


def test_resume_into_s3_retries_an_input_skipped_while_writing(
    rgw, rgw_env, rgw_client, bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "src"
    for i in range(20):
        for f in ("jpg", "cls"):
            (root / "s").mkdir(parents=True, exist_ok=True)
            (root / f"s/{i:04d}.{f}").write_bytes(b"%s%d" % (f.encode(), i) * (i * 61 + 1))
    bad, away = root / "s/0009.jpg", tmp_path / "away"
    original = listing.LocalSource.open

    def vanishing(self: Any, entry: Any) -> Any:
        if entry.path == str(bad) and bad.exists():
            os.rename(bad, away)
        return original(self, entry)

    name = bucket(rgw)
    dst = f"s3://{name}/packed"
    options: dict[str, Any] = {"shard_size_bytes": 8192, "workers": 2, "progress": False}
    monkeypatch.setattr(listing.LocalSource, "open", vanishing)
    with pytest.raises(SkippedInputError):
        fastload.pack(str(root), dst, **options)
    monkeypatch.setattr(listing.LocalSource, "open", original)
    os.rename(away, bad)
    report = fastload.pack(str(root), dst, resume=True, **options)
    assert report.shards_written == 1 and report.skipped == []
    fastload.pack(str(root), tmp_path / "fresh", **options)
    assert objects_under(rgw_client, name, "packed/") == snapshot(tmp_path / "fresh")
