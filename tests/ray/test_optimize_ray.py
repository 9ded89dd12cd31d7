"""``fastload.optimize(engine="ray")`` on a local 2-CPU Ray cluster: the bytes of the process engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ray_helpers import snapshot

import fastload
from fastload.errors import InputFailedError, PackError

pytestmark = pytest.mark.usefixtures("ray_cluster")


def test_ray_tasks_write_the_bytes_of_worker_processes(tmp_path: Path) -> None:
    def make(n: int) -> Any:  # (defined here: Ray workers get it by value, as a user's script's would be)
        if n % 5 == 4:
            return None
        return [
            {"__key__": f"{n:04d}-{i}", "txt": f"{n} {i} " * 40, "json": {"n": n}} for i in range(n % 3 + 1)
        ]

    options: dict[str, Any] = {"shard_size_bytes": 8 << 10, "progress": False}
    fastload.optimize(make, range(50), tmp_path / "proc", workers=2, **options)
    report = fastload.optimize(
        make, range(50), tmp_path / "ray", workers=2, engine="ray", chunk_size=3, **options
    )
    assert len(report.index.shards) > 3
    assert snapshot(tmp_path / "ray") == snapshot(tmp_path / "proc")


def test_an_exception_in_a_ray_task_names_the_input(tmp_path: Path) -> None:
    def bad(n: int) -> Any:
        if n == 7:
            raise KeyError("seven")
        return {"__key__": f"{n:04d}", "txt": str(n)}

    with pytest.raises(InputFailedError, match=r"input #7 \(7\): KeyError: 'seven'"):
        fastload.optimize(bad, range(20), tmp_path / "ds", engine="ray", progress=False)
    assert not (tmp_path / "ds" / "index.json").exists()


def test_a_function_the_workers_cannot_import_is_named_with_the_fix(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A function of a module only this process can import (pickled by reference): the task fails in the
    worker, and the error says which chunk and what to do, not Ray's bare traceback."""
    folder = tmp_path / "private"
    folder.mkdir()
    (folder / "only_here_fns.py").write_text(
        "def make(n):\n    return {'__key__': f'{n:04d}', 'txt': str(n)}\n"
    )
    monkeypatch.syspath_prepend(str(folder))
    import only_here_fns  # type: ignore[import-not-found]

    with pytest.raises(PackError, match=r"inputs from #0 failed.*runtime_env"):
        fastload.optimize(only_here_fns.make, range(6), tmp_path / "ds", engine="ray", progress=False)
    assert not (tmp_path / "ds" / "index.json").exists()


def test_an_append_with_ray_tasks_writes_the_bytes_of_worker_processes(tmp_path: Path) -> None:
    def make(n: int) -> Any:
        return {"__key__": f"{n:04d}", "txt": f"{n} " * (n % 9 + 1) * 60}

    options: dict[str, Any] = {"shard_size_bytes": 4 << 10, "progress": False, "workers": 2}
    for name, engine in (("proc", "process"), ("ray", "ray")):
        fastload.optimize(make, range(20), tmp_path / name, **options)
        fastload.optimize(make, range(20, 40), tmp_path / name, engine=engine, mode="append", **options)
    shards = {
        name: [
            (tmp_path / name / s.name).read_bytes()
            for s in fastload.ShardDataset(tmp_path / name).index.shards
        ]
        for name in ("proc", "ray")
    }
    assert shards["ray"] == shards["proc"] and len(shards["ray"]) > 2  # (the names differ by their tag)
