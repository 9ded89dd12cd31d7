"""The tar writer's C loop (``fastload._native.tar_fill``) against its Python loop: the same shard bytes,
index entry and member layout, and the same skips for real faults of the sources (a file gone, resized or
turned into a folder after it was listed, one that gives fewer bytes than its size), with the C loop shown
to be the one that ran. An out-of-descriptors open stops the pack (PackError) in both."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import fastload
from fastload.core.keys import Sample
from fastload.formats import native
from fastload.formats.tar import writer
from fastload.formats.tar.layout import layout_of
from fastload.formats.tar.writer import write_tar_shard
from fastload.storage.inputs import Input
from fastload.storage.listing import FileEntry, LocalSource

pytestmark = pytest.mark.skipif(native.tar_fill is None, reason="fastload._native.tar_fill not built here")

ROOT = Path(__file__).resolve().parents[2]
LONG = "k" * 120  # a key over 100 bytes: a pax header (the Python writer's)


class Spy:
    """Counts the calls of the C loop and the samples it wrote."""

    def __init__(self) -> None:
        self.calls = 0
        self.real = native.tar_fill

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        return self.real(*args)  # type: ignore[misc]


def _tree(root: Path) -> list[Sample[Input]]:
    """Samples of two members of assorted sizes (0, 1, 511, 512, 513 bytes, ~100 KB, 300 KB: more than
    the 256 KiB buffer the tests write with), a long key, a non-ASCII key."""
    root.mkdir()
    sizes = [0, 1, 511, 512, 513, 100_000, 300_000, 7, 4096, 3]
    keys = [f"{i:03d}" for i in range(len(sizes))] + [LONG, "clé"]
    sizes += [10, 20]
    for i, (key, size) in enumerate(zip(keys, sizes, strict=True)):
        (root / f"{key}.jpg").write_bytes(os.urandom(size))
        (root / f"{key}.txt").write_bytes(f"caption {i}".encode())
    return _samples(root, keys)


def _samples(root: Path, keys: list[str]) -> list[Sample[Input]]:
    source = LocalSource(root)
    out = []
    for key in keys:
        members = []
        for field in ("jpg", "txt"):
            path = root / f"{key}.{field}"
            size = path.stat().st_size if path.exists() else 0
            members.append((field, Input(source, FileEntry(f"{key}.{field}", str(path), size, ""))))
        out.append(Sample(key, tuple(members)))
    return out


def _write(samples: list[Sample[Input]], path: Path, monkeypatch: pytest.MonkeyPatch, *, c: bool) -> Any:
    spy = Spy()
    with monkeypatch.context() as m:
        m.setattr(native, "tar_fill", spy if c else None)
        result = write_tar_shard("shard.tar", samples, str(path), buffer_bytes=256 << 10, mtime=1234)
    assert (spy.calls > 0) is c
    return result


def _same(a: Any, b: Any, a_path: Path, b_path: Path) -> None:
    assert a_path.read_bytes() == b_path.read_bytes()
    assert a.entry == b.entry and a.skipped == b.skipped
    assert (a.payload_bytes, a.files) == (b.payload_bytes, b.files)


def test_the_c_loop_writes_the_python_loops_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    samples = _tree(tmp_path / "src")
    c = _write(samples, tmp_path / "c.tar", monkeypatch, c=True)
    py = _write(samples, tmp_path / "py.tar", monkeypatch, c=False)
    _same(c, py, tmp_path / "c.tar", tmp_path / "py.tar")
    assert c.entry.keys == [s.key for s in samples] and not c.skipped
    assert len(c.entry.crcs) == len(samples)
    assert layout_of(c.entry) is None  # (the pax-headed samples: no layout, in both)
    plain = [s for s in samples if s.key.isascii() and len(s.key) < 90]
    c = _write(plain, tmp_path / "c2.tar", monkeypatch, c=True)
    py = _write(plain, tmp_path / "py2.tar", monkeypatch, c=False)
    _same(c, py, tmp_path / "c2.tar", tmp_path / "py2.tar")
    layout = layout_of(c.entry)
    assert layout is not None and layout.fields == ["jpg", "txt"] and len(layout.sizes) == len(plain)


def test_real_faults_of_sources_are_the_same_skips(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    samples = _tree(tmp_path / "src")
    src = tmp_path / "src"
    (src / "001.jpg").unlink()  # gone
    (src / "003.jpg").write_bytes(b"x" * 600)  # grew: 512 -> 600 bytes
    (src / "005.txt").unlink()
    (src / "005.txt").mkdir()  # a folder now
    results = []
    for c in (True, False):
        results.append(_write(samples, tmp_path / f"{c}.tar", monkeypatch, c=c))
    _same(*results, tmp_path / "True.tar", tmp_path / "False.tar")
    reasons = {Path(s.path).name: s.reason for s in results[0].skipped}
    assert sorted(reasons) == ["001.jpg", "003.jpg", "005.txt"], reasons
    assert reasons["001.jpg"].startswith("vanished after it was listed"), reasons
    assert reasons["003.jpg"].startswith("changed after it was listed (grew: 512 -> 600 bytes)"), reasons
    assert reasons["005.txt"].startswith("became a folder after it was listed"), reasons
    assert "sample '005' left out of shard.tar" in reasons["005.txt"], reasons
    assert results[0].entry.keys == [s.key for s in samples if s.key not in ("001", "003", "005")]


SHORT = "/sys/kernel/mm/transparent_hugepage/enabled"  # fstat says 4096 bytes; a read gives a few dozen


@pytest.mark.skipif(
    not os.path.exists(SHORT) or os.stat(SHORT).st_size <= len(Path(SHORT).read_bytes()),
    reason=f"needs {SHORT}: a file that gives fewer bytes than its size",
)
def test_a_file_shorter_than_its_size_is_the_same_skip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    samples = _tree(tmp_path / "src")
    short = Input(LocalSource("/sys"), FileEntry("enabled", SHORT, os.stat(SHORT).st_size, ""))
    samples[2] = Sample(samples[2].key, (("jpg", short), samples[2].members[1]))
    results = [_write(samples, tmp_path / f"{c}.tar", monkeypatch, c=c) for c in (True, False)]
    _same(*results, tmp_path / "True.tar", tmp_path / "False.tar")
    (skip,) = results[0].skipped
    assert skip.path == SHORT and f"of {os.stat(SHORT).st_size} bytes (it shrank" in skip.reason, skip


def test_a_pack_is_the_same_with_and_without_the_c_loop(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _tree(src)
    outputs = []
    for flag in ("1", "0"):
        dst = tmp_path / f"ds{flag}"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "FASTLOAD_NATIVE": flag}
        subprocess.run(
            [sys.executable, "-m", "fastload", "pack", str(src), str(dst), "--quiet", "--shard-size=64KiB"],
            check=True,
            env=env,
            timeout=120,
        )
        outputs.append({p.relative_to(dst): p.read_bytes() for p in dst.rglob("*") if p.is_file()})
    assert outputs[0] == outputs[1] and len(outputs[0]) > 3
    assert fastload.verify(tmp_path / "ds1").ok


OUT_OF_FDS = """
import os, resource, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from fastload.errors import PackError
from fastload.formats import native
from fastload.formats.tar.writer import write_tar_shard
from fastload.storage.inputs import Input
from fastload.storage.listing import FileEntry, LocalSource
from fastload.core.keys import Sample
if sys.argv[3] == "0":
    native.tar_fill = None
src = Path(sys.argv[2])
sample = Sample("a", (("bin", Input(LocalSource(src), FileEntry("a.bin", str(src / "a.bin"), 5, ""))),))
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = []
try:
    while True:
        held.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    os.close(held.pop())  # one descriptor left: the shard's
try:
    write_tar_shard("s.tar", [sample], str(src / "s.tar"))
except PackError as exc:
    print("PackError:", exc)
"""


@pytest.mark.parametrize("c", ["1", "0"])
def test_out_of_descriptors_stops_the_pack(tmp_path: Path, c: str) -> None:
    (tmp_path / "a.bin").write_bytes(b"hello")
    proc = subprocess.run(
        [sys.executable, "-c", OUT_OF_FDS, str(ROOT), str(tmp_path), c],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "PackError: too many open files while opening" in proc.stdout, proc.stdout + proc.stderr
    assert "ulimit -n" in proc.stdout and not (tmp_path / "s.tar").exists()


def test_the_c_loop_is_left_out_for_a_source_opened_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A source whose ``open`` is not LocalSource's own (a subclass's, a patched one) is read through it."""
    samples = _tree(tmp_path / "src")
    opened = []

    class Counting(LocalSource):
        def open(self, entry: FileEntry) -> Any:
            opened.append(entry.path)
            return super().open(entry)

    other = [
        Sample(s.key, tuple((f, Input(Counting(str(tmp_path / "src")), it.entry)) for f, it in s.members))
        for s in samples
    ]
    spy = Spy()
    monkeypatch.setattr(native, "tar_fill", spy)
    write_tar_shard("shard.tar", other, str(tmp_path / "o.tar"))
    assert spy.calls == 0 and len(opened) == 2 * len(samples)
    assert writer.plain_local(samples) and not writer.plain_local(other)


def test_a_tar_pack_of_files_does_not_import_pyarrow(tmp_path: Path) -> None:
    """Asking whether a source is a table is a suffix check (packing.tablenames), not an import of
    packing.tabular and with it pyarrow and numpy (a tenth of a small tar pack's time)."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.bin").write_bytes(b"x")
    code = (
        "import sys, fastload; fastload.pack(sys.argv[1], sys.argv[2], progress=False); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyarrow', 'numpy')))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "src"), str(tmp_path / "ds")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "pyarrow" not in proc.stdout, proc.stdout
