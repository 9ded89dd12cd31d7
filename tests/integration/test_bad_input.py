"""Nothing dropped silently: every unusable input gets a message naming its path, exit 1 without
--allow-skip, and with it a pack of everything else plus the skip recorded in index.json. A sample with one
bad member is left out whole."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import fastload
from fastload.errors import SkippedInputError
from fastload.storage import listing

from .helpers import cli_env, read_index, run_cli, shard_paths, webdataset_samples

GOOD = {
    f"good/{i:04d}.{f}": (b"%s-%d-" % (f.encode(), i)) * (i * 37 + 1)
    for i in range(8)
    for f in ("cls", "jpg")
}


@dataclass
class Case:
    """A bad input added to a tree of good samples."""

    sources: list[Path]
    skipped: list[str]  # paths (as fastload prints them) that must be reported
    reason: str  # words the message must hold
    gone_keys: set[str] = field(default_factory=set)  # samples that must be left out whole
    good: dict[str, bytes] = field(default_factory=dict)  # files that must come through intact


def _write(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def _base(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    root = tmp_path / "src"
    _write(root, GOOD)
    return root, dict(GOOD)


def broken_symlink(tmp_path: Path) -> Case:
    root, good = _base(tmp_path)
    (root / "bad").mkdir()
    (root / "bad/0100.cls").write_bytes(b"7")
    os.symlink("nowhere.jpg", root / "bad/0100.jpg")
    return Case(
        [root], [f"{root}/bad/0100.jpg", f"{root}/bad/0100.cls"], "broken symlink", {"bad/0100"}, good
    )


def folder_symlink_loop(tmp_path: Path) -> Case:
    root, good = _base(tmp_path)
    (root / "good/deeper").mkdir()
    os.symlink("../..", root / "good/deeper/loop")  # points at the source root, an ancestor
    return Case([root], [f"{root}/good/deeper/loop"], "symlink loop", set(), good)


def file_symlink_loop(tmp_path: Path) -> Case:
    root, good = _base(tmp_path)
    (root / "bad").mkdir()
    (root / "bad/0101.cls").write_bytes(b"7")
    os.symlink("0101.jpg", root / "bad/0101.jpg")  # a.jpg -> a.jpg
    return Case([root], [f"{root}/bad/0101.jpg", f"{root}/bad/0101.cls"], "symlink loop", {"bad/0101"}, good)


def not_utf8_name(tmp_path: Path) -> Case:
    root, good = _base(tmp_path)
    (root / "bad").mkdir()
    with open(os.path.join(os.fsencode(root), b"bad", b"bad\xff.jpg"), "wb") as f:
        f.write(b"data")
    return Case([root], [f"{root}/bad/bad\\xff.jpg"], "UTF-8", set(), good)


def no_extension(tmp_path: Path) -> Case:
    root, good = _base(tmp_path)
    _write(root, {"good/README": b"hello"})
    return Case([root], [f"{root}/good/README"], "extension", set(), good)


def fifo(tmp_path: Path) -> Case:
    root, good = _base(tmp_path)
    (root / "bad").mkdir()
    (root / "bad/0103.cls").write_bytes(b"7")
    os.mkfifo(root / "bad/0103.jpg")
    return Case([root], [f"{root}/bad/0103.jpg", f"{root}/bad/0103.cls"], "FIFO", {"bad/0103"}, good)


def duplicate_key_and_field(tmp_path: Path) -> Case:
    root, good = _base(tmp_path)
    other = tmp_path / "src2"
    _write(other, {"good/0001.jpg": b"the other 0001.jpg", "more/0200.jpg": b"fine"})
    for f in ("good/0001.jpg", "good/0001.cls"):
        del good[f]
    good["more/0200.jpg"] = b"fine"
    paths = [f"{root}/good/0001.jpg", f"{root}/good/0001.cls", f"{other}/good/0001.jpg"]
    return Case([root, other], paths, "duplicate", {"good/0001"}, good)


LISTING_CASES: dict[str, Callable[[Path], Case]] = {
    f.__name__: f
    for f in (
        broken_symlink,
        folder_symlink_loop,
        file_symlink_loop,
        not_utf8_name,
        no_extension,
        fifo,
        duplicate_key_and_field,
    )
}


def _assert_packed_without(dst: Path, case: Case) -> None:
    """The pack holds exactly the good files, byte for byte, and records every skipped path."""
    samples = webdataset_samples(shard_paths(dst))
    got = {f"{s['__key__']}.{k}": v for s in samples for k, v in s.items() if not k.startswith("__")}
    assert got == case.good
    keys = {k for s in read_index(dst)["shards"] for k in s["keys"]}
    assert not keys & case.gone_keys, "a sample with a bad member must be left out whole"
    recorded = {s["path"]: s["reason"] for s in read_index(dst)["skipped"]}
    for path in case.skipped:
        assert path in recorded, f"{path} missing from index.json skipped: {sorted(recorded)}"
    assert fastload.verify(dst).ok


@pytest.mark.parametrize("make_case", LISTING_CASES.values(), ids=LISTING_CASES.keys())
def test_listing_problem_stops_the_pack_with_a_message_naming_the_path(tmp_path, make_case):
    case = make_case(tmp_path)
    dst = tmp_path / "dst"
    proc = run_cli("pack", *case.sources, dst, "--quiet", check=1)
    assert "Traceback" not in proc.stderr, proc.stderr
    for path in case.skipped:
        assert path in proc.stderr, f"{path} not named in:\n{proc.stderr}"
    assert case.reason.lower() in proc.stderr.lower()
    assert "--allow-skip" in proc.stderr
    assert not dst.exists() or not any(dst.iterdir()), "problems found while listing must stop before writing"


@pytest.mark.parametrize("make_case", LISTING_CASES.values(), ids=LISTING_CASES.keys())
def test_listing_problem_raises_skipped_input_error_from_the_api(tmp_path, make_case):
    case = make_case(tmp_path)
    with pytest.raises(SkippedInputError) as info:
        fastload.pack([str(s) for s in case.sources], tmp_path / "dst", workers=1)
    reported = {s.path: s.reason for s in info.value.skipped}
    for path in case.skipped:
        assert path in reported, f"{path} not in {sorted(reported)}"
    assert any(case.reason.lower() in r.lower() for r in reported.values())
    assert info.value.written is False
    assert not (tmp_path / "dst").exists()


@pytest.mark.parametrize("make_case", LISTING_CASES.values(), ids=LISTING_CASES.keys())
def test_allow_skip_packs_the_rest_and_records_the_skip(tmp_path, make_case):
    case = make_case(tmp_path)
    dst = tmp_path / "dst"
    proc = run_cli("pack", *case.sources, dst, "--quiet", "--allow-skip", check=0)
    for path in case.skipped:
        assert path in proc.stdout, "the summary lists what was skipped"
    _assert_packed_without(dst, case)


# --- unreadable files: a real permission error -------------------------------------------------------------

# Root reads any file, so a root test run gives up the two capabilities that let it (CAP_DAC_OVERRIDE,
# CAP_DAC_READ_SEARCH) with `setpriv` rather than becoming another user: it stays uid 0, so it can still
# import everything lazily from wherever the checkout and the interpreter live (e.g. under /root, mode 0700),
# while an input file of mode 0 cannot be opened. `api` runs fastload.pack() and prints the
# SkippedInputError it raised as JSON; anything else runs the CLI.
_UNPRIVILEGED = """
import json, sys
import fastload, fastload.cli
from fastload.errors import SkippedInputError
if sys.argv[1] == "api":
    try:
        fastload.pack(sys.argv[2], sys.argv[3], workers=1, progress=False)
    except SkippedInputError as exc:
        print(json.dumps({"written": exc.written, "skipped": [[s.path, s.reason] for s in exc.skipped]}))
        sys.exit(1)
    sys.exit(0)
sys.exit(fastload.cli.main(sys.argv[1:]))
"""
DROP_READ_CAPS = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


@pytest.fixture
def shared_tmp(tmp_path: Path) -> Path:
    return tmp_path


def _run_unprivileged(*args: str | Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", _UNPRIVILEGED, *(os.fspath(a) for a in args)]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv (util-linux): cannot make a file unreadable")
        cmd = DROP_READ_CAPS + cmd
    return subprocess.run(cmd, capture_output=True, text=True, env=cli_env(), timeout=120)


@pytest.mark.parametrize("how", ["cli", "cli-allow-skip", "api"])
def test_unreadable_file_is_reported_and_its_sample_left_out(shared_tmp, how):
    root = shared_tmp / "src"
    _write(root, GOOD)
    _write(root, {"bad/0104.cls": b"7", "bad/0104.jpg": b"secret"})
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    (root / "bad/0104.jpg").chmod(0)
    dst = shared_tmp / "out" / "dst"
    (shared_tmp / "out").mkdir()
    if os.geteuid() != 0:
        assert not os.access(root / "bad/0104.jpg", os.R_OK)
    bad = f"{root}/bad/0104.jpg"

    if how == "api":
        proc = _run_unprivileged("api", root, dst)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        raised = json.loads(proc.stdout)
        assert raised["written"] is False  # found while listing: nothing is written
        assert [path for path, _ in raised["skipped"]] == [bad]
        assert "permission denied" in raised["skipped"][0][1]
    else:
        proc = _run_unprivileged("pack", root, dst, "--quiet", *(["--allow-skip"] if how != "cli" else []))
        assert "Traceback" not in proc.stderr, proc.stderr
        if how == "cli":
            assert proc.returncode == 1, proc.stdout + proc.stderr
            assert bad in proc.stderr and "permission denied" in proc.stderr
            assert "--allow-skip" in proc.stderr
        else:
            assert proc.returncode == 0, proc.stderr
            assert bad in proc.stdout
    if how != "cli-allow-skip":  # found while listing, with every other problem: nothing written
        assert not dst.exists() or not any(dst.iterdir())
        return
    _assert_packed_without(dst, Case([root], [bad], "permission denied", {"bad/0104"}, dict(GOOD)))
    assert "permission denied" in {s["path"]: s["reason"] for s in read_index(dst)["skipped"]}[bad]


# --- files that change after they were listed (in-process, LocalSource.open patched) ---------------------


def _patch_open(monkeypatch: pytest.MonkeyPatch, relpath: str, action: Callable[[str], None]) -> list[str]:
    """Run ``action(path)`` on the real file right before fastload opens ``relpath``."""
    original = listing.LocalSource.open
    hits: list[str] = []

    def patched(self, entry):
        if entry.relpath == relpath:
            hits.append(entry.path)
            action(entry.path)
        return original(self, entry)

    monkeypatch.setattr(listing.LocalSource, "open", patched)
    return hits


def _shrink(path: str) -> None:
    os.truncate(path, os.path.getsize(path) // 2)


CHANGES = {"vanished": (os.unlink, "vanished"), "shrank": (_shrink, "shr")}


def _read_back(dst: Path, fmt: str) -> dict[str, bytes]:
    if fmt == "tar":
        samples = webdataset_samples(shard_paths(dst))
        return {f"{s['__key__']}.{k}": v for s in samples for k, v in s.items() if not k.startswith("__")}
    out = {}
    for shard in shard_paths(dst):
        for row in pq.read_table(shard).to_pylist():
            out.update(
                {f"{row['__key__']}.{k}": v for k, v in row.items() if k != "__key__" and v is not None}
            )
    return out


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
@pytest.mark.parametrize("member", ["jpg", "cls"], ids=["second-member", "first-member"])
@pytest.mark.parametrize("change", CHANGES, ids=CHANGES.keys())
@pytest.mark.parametrize("allow_skip", [False, True], ids=["strict", "allow-skip"])
def test_file_changed_after_listing_leaves_its_sample_out_whole(
    tmp_path, monkeypatch, fmt, member, change, allow_skip
):
    root, good = _base(tmp_path)
    target = f"good/0005.{member}"
    action, reason = CHANGES[change]
    hits = _patch_open(monkeypatch, target, action)
    dst = tmp_path / "dst"
    options = {"workers": 1, "shard_format": fmt, "shard_size_bytes": 8192, "progress": False}
    if allow_skip:
        skipped = fastload.pack(str(root), dst, allow_skip=True, **options).skipped
    else:
        with pytest.raises(SkippedInputError) as info:
            fastload.pack(str(root), dst, **options)
        assert info.value.written is True
        skipped = info.value.skipped
    assert hits, "the patched open was not used"
    bad = f"{root}/{target}"
    assert [s.path for s in skipped] == [bad]
    assert reason in skipped[0].reason

    expected = {k: v for k, v in good.items() if not k.startswith("good/0005.")}
    assert _read_back(dst, fmt) == expected
    index = read_index(dst)
    assert "good/0005" not in {k for s in index["shards"] for k in s["keys"]}
    assert [s["path"] for s in index["skipped"]] == [bad]
    assert fastload.verify(dst).ok


def test_file_shrinking_while_being_read_leaves_its_sample_out(tmp_path, monkeypatch):
    """The file shrinks after it was opened and stat'ed: the short read must be noticed."""
    root, good = _base(tmp_path)
    target = root / "good/0006.jpg"
    original = listing.LocalSource.open

    class ShrinksOnRead:
        def __init__(self, f):
            self.f = f

        def fileno(self):
            return self.f.fileno()

        def readinto(self, buf):
            os.truncate(target, 10)
            return self.f.readinto(buf)

        def close(self):
            self.f.close()

    def patched(self, entry):
        opened = original(self, entry)
        if entry.path != str(target):
            return opened
        # LocalSource.open returns the file, or (file, size now) in newer versions; wrap the file either way.
        if isinstance(opened, tuple):
            return (ShrinksOnRead(opened[0]), *opened[1:])
        return ShrinksOnRead(opened)

    monkeypatch.setattr(listing.LocalSource, "open", patched)
    dst = tmp_path / "dst"
    report = fastload.pack(str(root), dst, workers=1, allow_skip=True)
    assert [s.path for s in report.skipped] == [str(target)]
    assert "shr" in report.skipped[0].reason
    expected = {k: v for k, v in good.items() if not k.startswith("good/0006.")}
    assert _read_back(dst, "tar") == expected
    assert fastload.verify(dst).ok


def test_an_unknown_pack_option_is_named_with_the_known_ones(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.bin").write_bytes(b"x")
    with pytest.raises(fastload.errors.ConfigError, match=r"row_group_size.*row_group_bytes"):
        fastload.pack(tmp_path / "src", tmp_path / "dst", row_group_size=1 << 20, progress=False)
    assert not (tmp_path / "dst").exists()


# --- empty files are data ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["tar", "parquet", "tfrecord"])
def test_empty_files_are_packed_as_empty_values(tmp_path: Path, fmt: str) -> None:
    """An empty caption or label is a value, as GNU tar and webdataset keep it: packed (and counted), read
    back as b"" (text as ""), never a reason to drop the sample."""
    src = tmp_path / "src"
    good = {f"g/{i:04d}.{f}": b"%d" % i for i in range(8) for f in ("cls", "txt")}
    _write(src, {**good, "e/0001.jpg": b"image", "e/0001.txt": b"", "e/0002.cls": b"", "e/0002.jpg": b"x"})
    proc = run_cli("pack", src, tmp_path / "ds", "--format", fmt, "--quiet", check=0)
    assert proc.returncode == 0, proc.stderr
    assert "2 empty file(s) packed as empty values" in proc.stdout and "skipped nothing" in proc.stdout
    raw = {s["__key__"]: s for s in fastload.ShardDataset(tmp_path / "ds", decode=False)}
    assert raw["e/0001"]["txt"] == b"" and raw["e/0001"]["jpg"] == b"image"
    assert raw["e/0002"]["cls"] == b"" and raw["e/0002"]["jpg"] == b"x"
    assert len(raw) == 10
    decoded = {s["__key__"]: s for s in fastload.ShardDataset(tmp_path / "ds", images=False)}
    assert decoded["e/0001"]["txt"] == "" and decoded["e/0002"]["cls"] == b""
    assert run_cli("verify", tmp_path / "ds", check=0).returncode == 0
    if fmt == "tar":
        by_key = {s["__key__"]: s for s in webdataset_samples(shard_paths(tmp_path / "ds"))}
        assert by_key["e/0001"]["txt"] == b"" and by_key["e/0002"]["cls"] == b""
