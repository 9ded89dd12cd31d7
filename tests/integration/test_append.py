"""``fastload pack --append`` into a local dataset: new shards after the existing ones as a new version, the
existing files untouched, refusals that name what differs, resume of an interrupted append, and appenders at
the same time that both land (nothing lost)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fastload
from fastload.errors import AppendConflictError, ConfigError, PackError
from fastload.packing import append as append_module

from .helpers import cli_env, pack_cli, read_manifest, run_cli, snapshot

OPTS = ("--max-samples", "2", "--workers", "1")


def tree(root: Path, first: int, count: int, *, tag: str = "") -> Path:
    """``count`` samples numbered from ``first`` (a .txt and a .json each) under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(first, first + count):
        (root / f"s{i:04d}.txt").write_bytes(f"text {tag}{i} ".encode() * (i % 7 + 1))
        (root / f"s{i:04d}.json").write_bytes(json.dumps({"i": i, "tag": tag}).encode())
    return root


def pack(src: Path, dst: Path, **options: object) -> fastload.PackReport:
    return fastload.pack(src, dst, max_samples=2, workers=1, progress=False, **options)  # type: ignore[arg-type]


def samples_of(dst: Path, **kwargs: object) -> list[tuple[str, bytes]]:
    ds = fastload.ShardDataset(dst, decode=False, **kwargs)
    return [(s["__key__"], s["txt"]) for s in ds]


def test_append_adds_a_version_and_leaves_existing_files_alone(tmp_path: Path) -> None:
    a, b = tree(tmp_path / "a", 0, 5), tree(tmp_path / "b", 5, 3)
    dst = tmp_path / "ds"
    pack(a, dst)
    before = snapshot(dst)
    inodes = {p.name: p.stat().st_ino for p in dst.iterdir() if p.is_file()}
    first = read_manifest(dst)
    assert "versions" not in first  # a plain pack writes the index it always wrote

    out = pack_cli(b, dst, "--append", *OPTS).stdout
    assert "appended as version 2" in out
    after = snapshot(dst)
    for name, data in before.items():
        if name != "index.json":
            assert after[name] == data, f"{name} was rewritten by the append"
    assert {
        p.name: p.stat().st_ino for p in dst.iterdir() if p.name in inodes and p.name != "index.json"
    } == {n: i for n, i in inodes.items() if n != "index.json"}
    index = read_manifest(dst)
    names = [s["name"] for s in index["shards"]]
    assert names[:3] == [s["name"] for s in first["shards"]]
    tag = names[3].split("-")[2].split(".")[0]
    assert names[3:] == [f"shard-000003-{tag}.tar", f"shard-000004-{tag}.tar"]
    v1, v2 = index["versions"]
    assert (v1["version"], v1["shards"], v1["samples"], v1["added"], v1["created"]) == (1, 3, 5, 3, None)
    assert (v2["version"], v2["shards"], v2["samples"], v2["added"]) == (2, 5, 8, 2)
    assert v2["created"].endswith("Z") and len(v2["fingerprint"]) == 32
    assert index["totals"]["shards"] == 5 and index["totals"]["samples"] == 8
    assert not (dst / ".fastload-pack").exists()  # journal and locks removed

    keys = sorted(k for k, _ in samples_of(dst))
    assert keys == [f"s{i:04d}" for i in range(8)]
    assert sorted(k for k, _ in samples_of(dst, version=1)) == [f"s{i:04d}" for i in range(5)]
    run_cli("verify", dst, check=True)
    listed = run_cli("inspect", dst, "--versions", check=True).stdout
    assert "(not recorded)" in listed and v2["created"] in listed

    # a third append goes after both
    c = tree(tmp_path / "c", 8, 1)
    pack(c, dst, append=True)
    assert [v["shards"] for v in read_manifest(dst)["versions"]] == [3, 5, 6]


def test_an_append_of_the_same_inputs_is_refused_naming_the_version(tmp_path: Path) -> None:
    a, b = tree(tmp_path / "a", 0, 3), tree(tmp_path / "b", 3, 3)
    dst = tmp_path / "ds"
    pack(a, dst)
    pack(b, dst, append=True)
    before = snapshot(dst)
    again = pack_cli(b, dst, "--append", *OPTS, check=1)
    assert "already holds these inputs as version 2" in again.stderr
    with pytest.raises(AppendConflictError, match="as version 1") as caught:
        pack(a, dst, append=True)
    assert caught.value.version == 1
    assert snapshot(dst) == before
    done = pack(b, dst, append=True, resume=True)  # "finish it": nothing to do
    assert "nothing to do" in done.summary()
    assert snapshot(dst) == before


def test_an_append_of_another_format_or_option_is_refused_naming_it(tmp_path: Path) -> None:
    a, b = tree(tmp_path / "a", 0, 3), tree(tmp_path / "b", 3, 3)
    dst = tmp_path / "ds"
    pack(a, dst)
    before = snapshot(dst)
    wrong = pack_cli(b, dst, "--append", "--format", "parquet", *OPTS, check=2)
    assert "shard_format: the dataset is tar, this append writes parquet" in wrong.stderr
    with pytest.raises(ConfigError, match="partition_level"):
        (tmp_path / "b2" / "x").mkdir(parents=True)
        (tmp_path / "b2" / "x" / "k.txt").write_bytes(b"1")
        fastload.pack(tmp_path / "b2", dst, append=True, partition_level=0)
    assert snapshot(dst) == before
    with pytest.raises(ConfigError, match="local engine"):
        fastload.pack(b, dst, append=True, engine="ray")
    # what only cuts shards differently may differ
    fastload.pack(b, dst, append=True, max_samples=1, shard_size_bytes=1 << 20)
    assert len(read_manifest(dst)["versions"]) == 2


def test_an_append_to_an_empty_folder_starts_a_dataset_and_to_other_files_is_refused(tmp_path: Path) -> None:
    a, b = tree(tmp_path / "a", 0, 3), tree(tmp_path / "b", 3, 2)
    dst = tmp_path / "ds"
    pack(a, dst, append=True)
    index = read_manifest(dst)
    assert [v["version"] for v in index["versions"]] == [1]
    assert index["shards"][0]["name"].startswith("shard-000000-")
    with pytest.raises(AppendConflictError):  # its fingerprint is recorded: refused
        pack(a, dst, append=True)
    pack(b, dst, append=True)
    assert [v["samples"] for v in read_manifest(dst)["versions"]] == [3, 5]
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.md").write_text("hi")
    with pytest.raises(PackError, match=r"no index\.json, so there is no dataset to append to"):
        pack(a, other, append=True)


def test_tables_append_too(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    def table(path: Path, first: int, n: int) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"x": list(range(first, first + n)), "y": [f"v{i}" for i in range(n)]}), path)
        return path

    dst = tmp_path / "ds"
    fastload.pack(table(tmp_path / "t1" / "a.parquet", 0, 10), dst, shard_format="parquet", max_samples=4)
    fastload.pack(
        table(tmp_path / "t2" / "b.parquet", 10, 5), dst, shard_format="parquet", max_samples=4, append=True
    )
    index = read_manifest(dst)
    assert [v["samples"] for v in index["versions"]] == [10, 15]
    rows = [int(s["x"]) for s in fastload.ShardDataset(dst)]
    assert sorted(rows) == list(range(15))


def test_an_interrupted_append_finishes_with_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = tree(tmp_path / "a", 0, 4), tree(tmp_path / "b", 4, 7)
    clean, dst = tmp_path / "clean", tmp_path / "ds"
    for d in (clean, dst):
        fastload.pack(a, d, max_samples=2, workers=1)
    fastload.pack(b, clean, max_samples=2, workers=1, append=True)

    calls = {"n": 0}
    real = append_module.AppendedJob.write

    def failing(self, tmp_path, **kw):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(5, "injected failure")
        return real(self, tmp_path, **kw)

    monkeypatch.setattr(append_module.AppendedJob, "write", failing)
    with pytest.raises(OSError, match="injected"):
        fastload.pack(b, dst, max_samples=2, workers=1, append=True)
    monkeypatch.undo()
    assert "versions" not in read_manifest(dst)  # not published
    assert [s["samples"] for s in read_manifest(dst)["shards"]] == [2, 2]
    with pytest.raises(PackError, match="--resume"):
        fastload.pack(b, dst, max_samples=2, workers=1, append=True)
    report = fastload.pack(b, dst, max_samples=2, workers=1, append=True, resume=True)
    assert report.shards_kept == 2
    got, want = read_manifest(dst), read_manifest(clean)
    for v in (*got["versions"], *want["versions"]):
        v.pop("created")
    assert got == want
    assert {k: v for k, v in snapshot(dst).items() if k != "index.json"} == {
        k: v for k, v in snapshot(clean).items() if k != "index.json"
    }


def test_an_append_killed_by_sigkill_resumes(tmp_path: Path) -> None:
    a, b = tree(tmp_path / "a", 0, 2), tree(tmp_path / "b", 2, 60)
    dst = tmp_path / "ds"
    pack(a, dst)
    for _ in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-m", "fastload", "pack", b, dst, "--append", "--quiet", "--max-samples", "1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=cli_env(),
        )
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            if len(list(dst.glob("shard-*-*.tar"))) >= 3:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.0005)
        proc.wait(timeout=60)
        if proc.returncode == -signal.SIGKILL:
            break
    else:
        pytest.fail("could not interrupt the append")
    assert "versions" not in read_manifest(dst)
    assert sorted(k for k, _ in samples_of(dst)) == ["s0000", "s0001"]  # readers still read version 1
    # every shard journaled before the kill is kept (with 2 writers, up to 2 published shards may not be)
    journaled = len(list(dst.glob(".fastload-pack/append-*/done/[0-9]*.json")))
    assert journaled >= 1
    report = fastload.pack(b, dst, max_samples=1, append=True, resume=True, progress=False)
    assert report.shards_kept == journaled
    assert sorted(k for k, _ in samples_of(dst)) == [f"s{i:04d}" for i in range(62)]


def test_another_append_published_meanwhile_is_joined_not_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deterministic race: another appender publishes between this one's start and its publishing;
    this one joins its shards after the other's (re-reading index.json under the lock)."""
    a, b, c = (
        tree(tmp_path / "a", 0, 3),
        tree(tmp_path / "b", 3, 3, tag="b"),
        tree(tmp_path / "c", 6, 4, tag="c"),
    )
    dst = tmp_path / "ds"
    pack(a, dst)
    real = append_module.AppendPlan.publish

    def racing(self, dest, index):  # type: ignore[no-untyped-def]
        pack_cli(c, dst, "--append", *OPTS)  # another process lands first
        return real(self, dest, index)

    monkeypatch.setattr(append_module.AppendPlan, "publish", racing)
    report = fastload.pack(b, dst, max_samples=2, append=True)
    assert report.appended is not None and report.appended[0].version == 3
    index = read_manifest(dst)
    assert [(v["added"], v["shards"], v["samples"]) for v in index["versions"]] == [
        (2, 2, 3),
        (2, 4, 7),
        (2, 6, 10),
    ]
    # both started after 2 shards: numbered from 2, told apart by their tags
    assert sorted(s["name"][:12] for s in index["shards"][2:]) == ["shard-000002"] * 2 + ["shard-000003"] * 2
    assert sorted(k for k, _ in samples_of(dst)) == [f"s{i:04d}" for i in range(10)]
    assert sorted(k for k, _ in samples_of(dst, version=2)) == [
        "s0000",
        "s0001",
        "s0002",
        "s0006",
        "s0007",
        "s0008",
        "s0009",
    ]


def test_appenders_at_the_same_time_both_land(tmp_path: Path) -> None:
    base = tree(tmp_path / "a", 0, 2)
    dst = tmp_path / "ds"
    pack(base, dst)
    sources = [tree(tmp_path / f"in{j}", 100 * (j + 1), 20, tag=str(j)) for j in range(3)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "fastload", "pack", s, dst, "--append", "--quiet", "--max-samples", "1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=cli_env(),
            text=True,
        )
        for s in sources
    ]
    for p in procs:
        _out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    index = read_manifest(dst)
    assert [v["version"] for v in index["versions"]] == [1, 2, 3, 4]
    assert index["totals"]["samples"] == 62
    keys = sorted(k for k, _ in samples_of(dst))
    assert keys == sorted(
        ["s0000", "s0001", *(f"s{100 * (j + 1) + i:04d}" for j in range(3) for i in range(20))]
    )


def test_a_second_run_of_the_same_append_exits_naming_the_first(tmp_path: Path) -> None:
    a, b = tree(tmp_path / "a", 0, 2), tree(tmp_path / "b", 2, 2)
    dst = tmp_path / "ds"
    pack(a, dst)
    plan_tag = _tag_of(b, dst, tmp_path)
    lock = dst / ".fastload-pack" / f"append-{plan_tag}.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from fastload.storage.locks import FileLock; "
            f"FileLock({str(lock)!r}).acquire(); print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        env=cli_env(),
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(AppendConflictError, match="another run is appending the same inputs") as caught:
            pack(b, dst, append=True)
        assert f"pid {holder.pid} on" in str(caught.value)
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    pack(b, dst, append=True)  # the lock died with its holder


def _tag_of(src: Path, dst: Path, tmp_path: Path) -> str:
    """The tag an append of ``src`` names its shards with (learned from an append elsewhere)."""
    probe = tmp_path / "probe"
    pack(src, probe, append=True)
    name = read_manifest(probe)["shards"][0]["name"]
    return os.path.splitext(name)[0].rsplit("-", 1)[1]


def test_the_same_inputs_appended_first_elsewhere_leave_no_orphan_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs of one append at once where no lock keeps them apart (S3, or hosts without shared locks):
    the one that publishes second finds its inputs already a version, removes its own unpublished shards
    and journal, and says so."""
    import dataclasses

    from fastload.core.index import parse_index
    from fastload.core.versions import fingerprint_digest, joined

    a, b = tree(tmp_path / "a", 0, 3), tree(tmp_path / "b", 3, 3)
    dst = tmp_path / "ds"
    pack(a, dst)
    real = append_module.AppendPlan.publish

    def other_first(self, dest, index):  # type: ignore[no-untyped-def]
        # the other run started when the dataset had 7 shards: same tag, other numbers
        other = [dataclasses.replace(s, name=s.name.replace("-00000", "-00007", 1)) for s in index.shards]
        now = parse_index((dst / "index.json").read_bytes())
        done = joined(
            now,
            dataclasses.replace(index, shards=other),
            created="2026-01-01T00:00:00Z",
            fingerprint=fingerprint_digest(self.target.fingerprint),
            layout=self.target.layout,
        )
        (dst / "index.json").write_bytes(done.to_json())
        return real(self, dest, index)

    monkeypatch.setattr(append_module.AppendPlan, "publish", other_first)
    with pytest.raises(
        AppendConflictError, match=r"appended these inputs to .* first \(version 2\)"
    ) as caught:
        pack(b, dst, append=True)
    assert caught.value.version == 2
    listed = {s["name"] for s in read_manifest(dst)["shards"]}
    on_disk = {p.name for p in dst.glob("shard-*.tar")}
    assert on_disk <= listed, f"unpublished shards left behind: {sorted(on_disk - listed)}"
    assert (
        not list(dst.glob("*.fltable"))
        or {p.name[: -len(".fltable")] for p in dst.glob("*.fltable")} <= listed
    )
    assert not (dst / ".fastload-pack").exists()
