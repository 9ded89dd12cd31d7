"""What a pack lists: hidden files and folders left out by default and counted, ``--exclude`` globs,
sources with the same relative names (named, and kept apart by ``--prefix-sources``), symlinks followed
(counted), and hints about fields no decoder knows."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import fastload
from fastload.errors import ConfigError, SkippedInputError

from .helpers import read_index, run_cli, shard_paths, webdataset_samples


def _write(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def _packed(dst: Path) -> dict[str, bytes]:
    samples = webdataset_samples(shard_paths(dst))
    return {f"{s['__key__']}.{k}": v for s in samples for k, v in s.items() if not k.startswith("__")}


GOOD = {f"a/{i:04d}.{f}": b"%s%d" % (f.encode(), i) for i in range(4) for f in ("jpg", "cls")}


def test_hidden_files_and_folders_are_left_out_and_counted(tmp_path):
    hidden = {".DS_Store": b"finder", "a/.DS_Store": b"finder", ".git/config": b"x", ".git/objects/ab": b"y"}
    root = _write(tmp_path / "src", {**GOOD, **hidden, ".extra/0009.jpg": b"kept on request"})
    dst = tmp_path / "dst"
    proc = run_cli("pack", root, dst, "--quiet", check=0)
    assert _packed(dst) == GOOD
    assert "left out 4 hidden file(s)/folder(s)" in proc.stdout  # .DS_Store, .extra/, .git/, a/.DS_Store
    assert f"{root}/.git/" in proc.stdout and "--include-hidden" in proc.stdout
    assert read_index(dst)["skipped"] == []

    # --include-hidden: hidden names are listed like any other; a .DS_Store has no key, and says so
    strict = run_cli("pack", root, tmp_path / "dst2", "--quiet", "--include-hidden", check=1)
    assert f"{root}/.DS_Store" in strict.stderr and "hidden file" in strict.stderr
    run_cli("pack", root, tmp_path / "dst3", "--quiet", "--include-hidden", "--allow-skip", check=0)
    only_hidden = _write(tmp_path / "only", hidden)
    empty = run_cli("pack", only_hidden, tmp_path / "dst4", "--quiet", check=1)
    assert "no samples found" in empty.stderr and "left out: 3 hidden" in empty.stderr
    assert _packed(tmp_path / "dst3") == {**GOOD, ".extra/0009.jpg": b"kept on request"}


def test_exclude_globs_leave_paths_out_from_the_cli_and_python(tmp_path):
    extra = {"a/0001.tmp": b"t", "raw/0100.wav": b"w", "b/raw/0101.wav": b"kept", "cache/x/0102.jpg": b"c"}
    root = _write(tmp_path / "src", {**GOOD, **extra, "notcache/0103.jpg": b"kept"})
    dst = tmp_path / "dst"
    proc = run_cli(
        "pack",
        root,
        dst,
        "--quiet",
        "--exclude",
        "*.tmp",
        "--exclude",
        "raw/*.wav",
        "--exclude",
        "cache/",
        check=0,
    )
    assert _packed(dst) == {**GOOD, "b/raw/0101.wav": b"kept", "notcache/0103.jpg": b"kept"}
    assert "left out 3 path(s) matching --exclude" in proc.stdout and f"{root}/cache/" in proc.stdout

    report = fastload.pack(
        str(root), tmp_path / "py", exclude=["*.tmp", "raw/*.wav", "cache/"], progress=False
    )
    assert sorted(report.notes.excluded) == sorted(
        f"{root}/{p}" for p in ("a/0001.tmp", "raw/0100.wav", "cache/")
    )
    assert _packed(tmp_path / "py") == _packed(dst)
    with pytest.raises(ConfigError, match="exclude"):
        fastload.pack(str(root), tmp_path / "bad", exclude=[""])


def test_sources_with_the_same_names_are_named_and_prefix_sources_keeps_both(tmp_path):
    one = _write(tmp_path / "one", GOOD)
    two = _write(tmp_path / "two", {k: v + b"-two" for k, v in GOOD.items()})
    proc = run_cli("pack", one, two, tmp_path / "dst", "--quiet", check=1)
    assert "holds no regular files" not in proc.stderr
    assert f"8 name(s) are in both {one} and {two}: sample key(s) a/0000, a/0001, a/0002 and 1 more" in (
        proc.stderr
    )
    assert "--prefix-sources" in proc.stderr
    allowed = run_cli("pack", one, two, tmp_path / "dst", "--quiet", "--allow-skip", check=1)
    assert "no samples left to pack" in allowed.stderr and "--prefix-sources" in allowed.stderr
    with pytest.raises(SkippedInputError) as info:
        fastload.pack([str(one), str(two)], tmp_path / "api", progress=False)
    assert f"{one}" in info.value.hint and f"{two}" in info.value.hint

    run_cli("pack", one, two, tmp_path / "dst", "--quiet", "--prefix-sources", check=0)
    expected = {f"one/{k}": v for k, v in GOOD.items()} | {f"two/{k}": v + b"-two" for k, v in GOOD.items()}
    assert _packed(tmp_path / "dst") == expected
    report = fastload.pack([str(one), str(two)], tmp_path / "py", prefix_sources=True, progress=False)
    assert report.index.samples == 8
    same = _write(tmp_path / "x" / "one", GOOD)
    with pytest.raises(ConfigError, match="same folder name 'one'"):
        fastload.pack([str(one), str(same)], tmp_path / "py2", prefix_sources=True, progress=False)


def test_symlinks_followed_are_counted_and_fields_no_decoder_knows_get_a_hint(tmp_path):
    outside = _write(tmp_path / "outside", {"real.wav": b"RIFF", "d/0005.jpg": b"j"})
    root = _write(tmp_path / "src", {**GOOD, "s/take.v2.wav": b"RIFF2"})
    os.symlink(outside / "real.wav", root / "a/0000.wav")
    os.symlink(outside / "d", root / "linked")
    proc = run_cli("pack", root, tmp_path / "dst", "--quiet", check=0)
    assert _packed(tmp_path / "dst")["a/0000.wav"] == b"RIFF"
    assert _packed(tmp_path / "dst")["linked/0005.jpg"] == b"j"
    assert "followed 2 symlink(s)" in proc.stdout and f"{root}/linked/" in proc.stdout
    assert "field 'v2.wav' comes from names like s/take.v2.wav" in proc.stdout
    assert "no built-in decoder for field(s) v2.wav, wav" in proc.stdout
    quiet = run_cli("pack", _write(tmp_path / "plain", GOOD), tmp_path / "dst2", "--quiet", check=0)
    assert quiet.stdout.splitlines()[1:] == ["skipped nothing"]
