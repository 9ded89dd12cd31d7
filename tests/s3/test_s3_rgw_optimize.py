"""``fastload.optimize`` into an ``s3://`` prefix on RGW: the objects are the files of a local run, and a
run stopped by an error resumes there to the same bytes."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from s3util import objects_under, open_uploads, snapshot

import fastload
from fastload.errors import InputFailedError

OPTIONS: dict[str, Any] = {"shard_size_bytes": 8 << 10, "workers": 2, "progress": False}


def make(n: int) -> Any:
    if os.environ.get("OPTIMIZE_FAIL_AT") == str(n):
        raise ValueError(f"refusing input {n}")
    return [{"__key__": f"{n:04d}-{i}", "txt": f"{n}/{i} " * 50, "json": {"n": n}} for i in range(n % 3 + 1)]


def test_optimize_to_s3_gives_the_local_bytes_and_resumes(
    rgw: Any,
    rgw_env: dict[str, str],
    rgw_client: Any,
    bucket: Callable[..., str],
    tmp_path: Path,
    monkeypatch: Any,
) -> None:
    fastload.optimize(make, range(40), tmp_path / "local", **OPTIONS)
    local = snapshot(tmp_path / "local")
    name = bucket(rgw)
    monkeypatch.setenv("OPTIMIZE_FAIL_AT", "31")
    with contextlib.suppress(InputFailedError):
        fastload.optimize(make, range(40), f"s3://{name}/ds/", **OPTIONS)
    monkeypatch.delenv("OPTIMIZE_FAIL_AT")
    assert "index.json" not in objects_under(rgw_client, name, "ds/")
    report = fastload.optimize(make, range(40), f"s3://{name}/ds/", resume=True, **OPTIONS)
    assert report.shards_kept > 0
    assert objects_under(rgw_client, name, "ds/") == local
    assert not open_uploads(rgw_client, name)
