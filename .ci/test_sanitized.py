"""Run by .ci/sanitize only (not collected from ``tests/``): the C reader the tests use is the sanitized
build and the ASan and UBSan runtimes are live in this process, so a clean run of the other tests means
something."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest

SANITIZED = os.environ.get("FASTLOAD_SANITIZED_NATIVE")
pytestmark = pytest.mark.skipif(not SANITIZED, reason="run by .ci/sanitize, with its sanitized build")


def _mapped_files() -> set[str]:
    return {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if "/" in line}


def test_the_readers_use_the_sanitized_build() -> None:
    from fastload import _native
    from fastload.formats import native

    assert SANITIZED is not None
    assert Path(_native.__file__).resolve() == Path(SANITIZED).resolve()
    assert native.layout_run is _native.layout_run  # the function the tar readers call
    repo_builds = list((Path(__file__).resolve().parent.parent / "fastload").glob("_native*.so"))
    assert not {str(p.resolve()) for p in repo_builds} & _mapped_files(), "the repository's build is loaded"


def test_the_sanitizer_runtimes_are_live() -> None:
    maps = _mapped_files()
    assert any("libasan" in Path(p).name for p in maps), "the ASan runtime is not loaded (LD_PRELOAD)"
    assert any("libubsan" in Path(p).name for p in maps), "the UBSan runtime is not loaded"
    assert str(Path(SANITIZED or "").resolve()) in maps
    code = Path(SANITIZED or "").read_bytes()  # the build is instrumented: it calls the runtimes' reports
    assert b"__asan_report_load" in code and b"__ubsan_handle_" in code
    assert hasattr(ctypes.CDLL(None), "__asan_init")  # ASan is in the process itself, not only dlopen'ed
