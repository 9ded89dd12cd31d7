"""LocalEngine stopping early: every job taken from the stream that never ran has ``discard()`` called (a
pack-tokens shard is written while the stream produces its job: a job cancelled before a writer took it,
or taken while another job's failure surfaced, must not leave its file behind)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from fastload.packing import engine
from fastload.packing.engine import LocalEngine


class Boom(Exception):
    pass


class Job:
    shard_format = "tar"

    def __init__(self, number: int, *, fails: bool = False) -> None:
        self.number, self.name, self.fails = number, f"s{number}.tar", fails
        self.discarded = False

    def write(self, tmp_path: str, **kw: Any) -> Any:
        raise Boom(f"job {self.number}")

    def local_folders(self) -> set[str]:
        return set()

    def discard(self) -> None:
        self.discarded = True


def run(jobs: Iterator[Job], workers: int, tmp_path: Path) -> None:
    class Dest:
        tmp_dir = str(tmp_path)

    LocalEngine(Dest(), None, workers=workers).write(jobs, advance=lambda b, f: None, done=lambda n, r: None)  # type: ignore[arg-type]


def test_a_job_taken_while_another_fails_is_discarded(tmp_path: Path) -> None:
    made: list[Job] = []

    def stream() -> Iterator[Job]:
        for n in range(3):
            made.append(Job(n))
            yield made[-1]

    with pytest.raises(Boom, match="job 0"):
        run(stream(), 1, tmp_path)
    assert [j.number for j in made] == [0, 1]  # the stream was not asked for a third
    assert [j.discarded for j in made] == [False, True]  # job 0 ran (and failed); job 1 never did


class NeverRuns:
    """An executor whose tasks stay queued (as when every writer thread is still busy, or not scheduled
    yet on a loaded machine)."""

    def __init__(self, **kw: Any) -> None:
        pass

    def submit(self, fn: Any, *args: Any, **kw: Any) -> Future[Any]:
        return Future()

    def __enter__(self) -> NeverRuns:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def test_jobs_cancelled_before_a_writer_took_them_are_discarded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine, "ThreadPoolExecutor", NeverRuns)
    made = [Job(0), Job(1)]

    def stream() -> Iterator[Job]:
        yield from made
        raise Boom("the reader failed")

    with pytest.raises(Boom, match="reader failed"):
        run(stream(), 4, tmp_path)
    assert all(j.discarded for j in made)


def test_a_token_shard_discarded_removes_its_file(tmp_path: Path) -> None:
    from fastload.packing.token_shards import TokenShard

    part = tmp_path / "000001.tokens"
    part.write_bytes(b"PAR1")
    shard = TokenShard(
        number=1,
        name="t-000001.parquet",
        part_path=str(part),
        rows_per_group=[1],
        keys=["k"],
        payload_bytes=1,
    )
    shard.discard()
    assert not part.exists()
    shard.discard()  # (twice: nothing left to remove, no error)
