"""Tar shards of every dialect (ustar, pax, GNU, oldgnu, v7), written by Python's tarfile and GNU tar: what
``fastload index``, ``fastload verify`` and ShardDataset (C and Python readers) see is what tarfile and
webdataset see; directory entries are skipped alike; members a sample cannot be are refused by name."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastload
from fastload.errors import VerifyError
from fastload.packing.indexing import build_index

from .tarbuild import (
    DIALECTS,
    HAVE_GNU_TAR,
    Members,
    check_every_path,
    dataset_sees,
    fits,
    samples_of,
    tarfile_sees,
    webdataset_sees,
    write_tar,
)

LONG = "folder-" + "x" * 90 + "/" + "sample-" + "y" * 40  # a key of 139 bytes: names past 100 bytes


def long_name_members() -> Members:
    return [
        (f"{LONG}-{i:02d}.{field}", bytes([i]) * size)
        for i in range(4)
        for field, size in (("cls", 1), ("jpg", 700 + i), ("json", 0))
    ]


@pytest.mark.parametrize(
    "dialect", ["tarfile-gnu", "gnutar-gnu", "gnutar-oldgnu", "tarfile-pax", "gnutar-pax"]
)
def test_long_names_read_index_and_verify_in_every_dialect_that_stores_them(
    tmp_path: Path, dialect: str
) -> None:
    """GNU tar's default format stores names past 100 bytes in 'L' headers: index and verify read them, and
    so must ShardDataset (it used to raise "cut at 100 chars", with the C reader and without)."""
    members = long_name_members()
    (tmp_path / "ds").mkdir()
    write_tar(tmp_path / "ds" / "a.tar", members, dialect)
    expected = samples_of(members)
    assert tarfile_sees(tmp_path / "ds" / "a.tar") == expected == webdataset_sees(tmp_path / "ds" / "a.tar")
    check_every_path(tmp_path / "ds" / "a.tar", expected)


def directory_members() -> Members:
    return [
        ("dir/", None),
        ("dir/001.cls", b"1"),
        ("dir/001.jpg", b"j" * 600),
        ("dir/sub/", None),
        ("dir/sub/002.cls", b"2"),
        ("dir/sub/002.jpg", b""),
        ("dir/sub/deeper/", None),
        ("dir/003.cls", b"3"),
    ]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_directory_entries_are_skipped_by_index_verify_and_read(tmp_path: Path, dialect: str) -> None:
    """``tar -cf x.tar dir`` writes directory entries: verify used to reject the index that index wrote."""
    members = directory_members()
    (tmp_path / "ds").mkdir()
    write_tar(tmp_path / "ds" / "a.tar", members, dialect)
    expected = samples_of(members)
    assert tarfile_sees(tmp_path / "ds" / "a.tar") == expected == webdataset_sees(tmp_path / "ds" / "a.tar")
    check_every_path(tmp_path / "ds" / "a.tar", expected)


def test_a_folder_tarred_whole_by_gnu_tar(tmp_path: Path) -> None:
    """The case as users make it: ``tar -cf x.tar dir`` (recursive, GNU tar's order and default format)."""
    if not HAVE_GNU_TAR:
        pytest.skip("GNU tar is not installed")
    src = tmp_path / "src"
    files = {f"dir/{i:03d}.{f}": b"%d" % i * (i * 100) for i in range(5) for f in ("cls", "txt")}
    for name, data in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    (tmp_path / "ds").mkdir()
    subprocess.run(
        ["tar", "--sort=name", "-C", str(src), "-cf", str(tmp_path / "ds" / "x.tar"), "dir"], check=True
    )
    check_every_path(tmp_path / "ds" / "x.tar", samples_of(sorted(files.items())))


def _gnu_base256_size(path: Path) -> None:
    """Rewrite every regular member's size field in GNU base-256 (as GNU tar writes sizes >= 8 GiB)."""
    data = bytearray(path.read_bytes())
    pos = 0
    while pos + 512 <= len(data) and any(data[pos : pos + 512]):
        size = int(data[pos + 124 : pos + 135], 8)
        if data[pos + 156 : pos + 157] in (b"0", b"\0"):
            data[pos + 124 : pos + 136] = b"\x80" + size.to_bytes(11, "big")
            data[pos + 148 : pos + 156] = b"        "
            data[pos + 148 : pos + 156] = b"%06o\0 " % sum(data[pos : pos + 512])
        pos += 512 + (size + 511) // 512 * 512
    path.write_bytes(bytes(data))


def test_base256_sizes(tmp_path: Path) -> None:
    members = [(f"s/{i}.bin", bytes([i]) * (i * 300)) for i in range(5)]
    (tmp_path / "ds").mkdir()
    write_tar(tmp_path / "ds" / "a.tar", members, "tarfile-gnu")
    _gnu_base256_size(tmp_path / "ds" / "a.tar")
    assert tarfile_sees(tmp_path / "ds" / "a.tar") == samples_of(members)
    check_every_path(tmp_path / "ds" / "a.tar", samples_of(members))


def test_pax_global_headers_without_names_are_skipped(tmp_path: Path) -> None:
    members = [(f"s/{i}.txt", b"t" * i) for i in range(3)]
    (tmp_path / "ds").mkdir()
    path = tmp_path / "ds" / "a.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "git archive"}) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    assert path.read_bytes()[156:157] == b"g"
    check_every_path(path, samples_of(members))


# --- what a sample cannot be ---------------------------------------------------------------------------


def _special(kind: str, path: Path) -> str:
    """A tar holding one good sample and then a member of ``kind``; returns what the error must name."""
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        info = tarfile.TarInfo("s/0.txt")
        info.size = 3
        tf.addfile(info, io.BytesIO(b"abc"))
        info = tarfile.TarInfo("s/1.txt")
        if kind == "hardlink":
            info.type, info.linkname = tarfile.LNKTYPE, "s/0.txt"
        elif kind == "long-hardlink":
            info.type, info.linkname = tarfile.LNKTYPE, "l" * 150 + "/0.txt"
        elif kind == "symlink":
            info.type, info.linkname = tarfile.SYMTYPE, "0.txt"
        elif kind == "fifo":
            info.type = tarfile.FIFOTYPE
        elif kind == "device":
            info.type = tarfile.CHRTYPE
        elif kind == "global-path":
            pass
        tf.addfile(info)
    if kind == "global-path":
        with tarfile.open(path, "w", format=tarfile.PAX_FORMAT, pax_headers={"path": "x.txt"}) as tf:
            info = tarfile.TarInfo("s/0.txt")
            tf.addfile(info, io.BytesIO(b""))
        return "global pax header"
    return {
        "hardlink": "hard link",
        "long-hardlink": "hard link",
        "symlink": "symbolic link",
        "fifo": "FIFO",
        "device": "character device",
    }[kind]


def _sparse(path: Path, fmt: str) -> str:
    if not HAVE_GNU_TAR:
        pytest.skip("GNU tar is not installed")
    src = path.parent / "src"
    src.mkdir()
    with open(src / "0.bin", "wb") as f:
        f.truncate(1 << 20)
        f.seek(500_000)
        f.write(b"data")
    subprocess.run(
        ["tar", f"--format={fmt}", "--sparse", "-C", str(src), "-cf", str(path), "0.bin"], check=True
    )
    return "sparse"


@pytest.mark.parametrize(
    "kind",
    ["hardlink", "long-hardlink", "symlink", "fifo", "device", "global-path", "sparse-gnu", "sparse-pax"],
)
def test_members_a_sample_cannot_be_are_refused_by_name(tmp_path: Path, kind: str) -> None:
    (tmp_path / "ds").mkdir()
    path = tmp_path / "ds" / "a.tar"
    says = _sparse(path, kind[7:]) if kind.startswith("sparse") else _special(kind, path)
    report = build_index(str(tmp_path / "ds"), workers=1)
    assert not report.ok and report.problems[0].shard == "a.tar"
    assert says in str(report.problems[0]) and "fastload pack" in str(report.problems[0])
    linted = fastload.verify(path, workers=1)
    assert not linted.ok and says in str(linted.problems[0]), linted.summary()
    with pytest.raises(VerifyError, match=says) as info:
        dataset_sees([str(path)], "Python")
    assert info.value.shard == "a.tar"


# --- property: every dialect, random samples, every reader agrees ------------------------------------------

_COMPONENT = st.text(alphabet="abcxyz019-é日", min_size=1, max_size=70)
_FIELDS = st.lists(
    st.sampled_from(["cls", "jpg", "json", "txt.gz", "a.b"]), min_size=1, max_size=3, unique=True
)
_SIZES = st.one_of(st.sampled_from([0, 1, 511, 512, 513, 1023, 1024, 1025]), st.integers(0, 3000))


@st.composite
def sample_sets(draw: st.DrawFn, dialect: str) -> tuple[str, Members]:
    folders = draw(st.lists(st.lists(_COMPONENT, max_size=3).map("/".join), min_size=1, max_size=3))
    with_dirs = draw(st.booleans())
    members: list[tuple[str, bytes | None]] = []
    seen_dirs: set[str] = set()
    for n in range(draw(st.integers(1, 6))):
        folder = draw(st.sampled_from(folders))
        stem = draw(st.text(alphabet="kqé0-", max_size=30)) + f"{n:03d}"
        key = f"{folder}/{stem}" if folder else stem
        if with_dirs and folder:
            parts = folder.split("/")
            for depth in range(1, len(parts) + 1):
                d = "/".join(parts[:depth]) + "/"
                if d not in seen_dirs:
                    seen_dirs.add(d)
                    members.append((d, None))
        for field in draw(_FIELDS):
            size = draw(_SIZES)
            members.append((f"{key}.{field}", bytes([n + 1]) * size))
    names = [n for n, _ in members]
    if not fits(dialect, names):
        dialect = "tarfile-pax"
    return dialect, members


@pytest.mark.parametrize("dialect", DIALECTS)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_dialect_reads_as_tarfile_and_webdataset_read_it(dialect: str, data: st.DataObject) -> None:
    """Random sample sets (keys in folders, names past 100 bytes, non-ASCII names, empty members, sizes
    around 512-byte blocks, directory entries) in ``dialect`` (pax where a name does not fit it)."""
    dialect, members = data.draw(sample_sets(dialect))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ds" / "a.tar"
        os.mkdir(path.parent)
        write_tar(path, members, dialect)
        expected = samples_of(members)
        assert tarfile_sees(path) == expected
        assert webdataset_sees(path) == expected
        check_every_path(path, expected)


def test_the_cli_indexes_and_verifies_a_gnu_tar_with_long_names_and_directories(tmp_path: Path) -> None:
    """The report's case as users run it: ``fastload index DIR`` then ``fastload verify DIR``."""
    members = [("d/", None), *long_name_members()]
    (tmp_path / "ds").mkdir()
    write_tar(tmp_path / "ds" / "a.tar", members, "tarfile-gnu")
    for command in ("index", "verify"):
        proc = subprocess.run(
            [sys.executable, "-m", "fastload", command, str(tmp_path / "ds")], capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK: 1 shards checked against index.json: 4 samples" in proc.stdout
    assert dataset_sees(tmp_path / "ds", "C") == list(samples_of(members).items())
