"""The core is pure: no module in fastload/core imports I/O, threads, clocks, env, torch or cloud SDKs.

Only fastload/io talks to S3 (the only boto3/botocore imports). Checked statically with ``ast`` on every file.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "fastload"
CORE_FORBIDDEN = (
    "fastload.io",
    "torch",
    "boto3",
    "botocore",
    "pyarrow",
    "threading",
    "socket",
    "os",
    "time",
    "subprocess",
)
S3_SDKS = ("boto3", "botocore")


def imported_modules(source: str, module: str) -> set[str]:
    """Fully qualified modules a source file imports (``from a.b import c`` gives ``a.b`` and ``a.b.c``;
    relative imports are resolved against ``module``, the file's own dotted name)."""
    found: set[str] = set()
    package = module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package[: len(package) - (node.level - 1)]
                base = ".".join([*base_parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return found


def imports_any(modules: set[str], names: tuple[str, ...]) -> set[str]:
    return {m for m in modules for name in names if m == name or m.startswith(name + ".")}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _all_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


CORE_FILES = sorted((PACKAGE / "core").glob("*.py"))


def test_the_walk_finds_the_modules() -> None:
    names = {p.name for p in CORE_FILES}
    assert {"__init__.py", "keys.py", "tar.py", "plan.py", "index.py", "units.py"} <= names
    assert PACKAGE / "io" / "tarwriter.py" in _all_files()


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: p.name)
def test_core_module_is_pure(path: Path) -> None:
    modules = imported_modules(path.read_text(encoding="utf-8"), _module_name(path))
    bad = imports_any(modules, CORE_FORBIDDEN)
    assert not bad, f"{path.relative_to(PACKAGE.parent)} imports {sorted(bad)}; fastload/core must stay pure"


def test_only_io_imports_the_s3_sdk() -> None:
    offenders = []
    for path in _all_files():
        modules = imported_modules(path.read_text(encoding="utf-8"), _module_name(path))
        if imports_any(modules, S3_SDKS) and "io" not in path.relative_to(PACKAGE).parts[:1]:
            offenders.append(str(path.relative_to(PACKAGE.parent)))
    assert not offenders, f"only fastload/io may import boto3/botocore: {offenders}"


# --- the checker itself catches every import form -----------------------------------------------------


@pytest.mark.parametrize(
    ("source", "module", "expected"),
    [
        ("import os", "fastload.core.x", {"os"}),
        ("import os.path as p", "fastload.core.x", {"os"}),
        ("from os import path", "fastload.core.x", {"os"}),
        ("from fastload import io", "fastload.core.x", {"fastload.io"}),
        ("from fastload.io.localfs import atomic_write", "fastload.core.x", {"fastload.io"}),
        ("from ..io import localfs", "fastload.core.x", {"fastload.io"}),
        ("from .. import io", "fastload.core.x", {"fastload.io"}),
        ("def f():\n    import boto3\n", "fastload.core.x", {"boto3"}),
        ("try:\n    import torch\nexcept ImportError:\n    pass\n", "fastload.core.x", {"torch"}),
        ("from botocore.config import Config", "fastload.core.x", {"botocore"}),
        ("import threading, time", "fastload.core.x", {"threading", "time"}),
    ],
)
def test_checker_finds_forbidden_imports(source: str, module: str, expected: set[str]) -> None:
    found = imports_any(imported_modules(source, module), CORE_FORBIDDEN)
    assert {next(n for n in CORE_FORBIDDEN if m == n or m.startswith(n + ".")) for m in found} == expected


@pytest.mark.parametrize(
    "source",
    [
        "import ostruct",
        "import timeit_free",
        "from fastload.errors import IndexFormatError",
        "from . import keys",
        "from .tar import BLOCK",
        "import random, re, json",
        "from fastload.iostuff import x",
    ],
)
def test_checker_allows_pure_imports(source: str) -> None:
    assert not imports_any(imported_modules(source, "fastload.core.x"), CORE_FORBIDDEN)
