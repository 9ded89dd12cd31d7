"""The package map of docs/DESIGN.md, enforced statically with ``ast`` on every file.

- ``fastload/core`` is pure: no I/O, threads, clocks, env, torch or cloud SDKs; it imports only itself and
  ``fastload.errors``.
- Each capability package imports only the packages below it (``ALLOWED``) and the base modules
  (``errors``, ``config``, ``gcpause``); none imports a face (``cli``, ``summary``, ``copy``, ...).
- Only ``fastload/s3`` imports boto3/botocore; only ``fastload/train`` and ``fastload/bench`` import torch.
- No import circles between modules, lazy (function-level) imports included.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Set
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "fastload"
CORE_FORBIDDEN = (
    "fastload.s3",
    "fastload.storage",
    "fastload.formats",
    "fastload.train",
    "fastload.packing",
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
BASE = {"errors", "config", "gcpause"}
ALLOWED: dict[str, set[str]] = {
    "core": {"core"},
    "s3": {"core", "s3"},
    "storage": {"core", "s3", "storage"},
    "formats": {"core", "storage", "formats", "_native"},
    "packing": {"core", "s3", "storage", "formats", "packing"},
    "train": {"core", "s3", "storage", "formats", "train"},
    "testing": {"testing"},
    "bench": {"core", "s3", "storage", "formats", "packing", "train", "testing", "bench"},
}
PACKAGES = set(ALLOWED)
MAX_LINES = 400


def imported_modules(source: str, module: str) -> set[str]:
    """Fully qualified modules a source file imports (``from a.b import c`` gives ``a.b`` and ``a.b.c``;
    relative imports are resolved against ``module``, the file's own dotted name)."""
    found: set[str] = set()
    package = module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(node, package)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return found


def _from_base(node: ast.ImportFrom, package: list[str]) -> str:
    """The module a ``from ... import`` names, relative imports resolved against ``package``."""
    if not node.level:
        return node.module or ""
    base_parts = package[: len(package) - (node.level - 1)]
    return ".".join([*base_parts, *([node.module] if node.module else [])])


def imports_any(modules: Set[str], names: tuple[str, ...]) -> set[str]:
    return {m for m in modules for name in names if m == name or m.startswith(name + ".")}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _all_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


@functools.cache  # read by several tests, unchanged during a run: parsed once (~2 s of CPU saved)
def _imports_of(path: Path) -> frozenset[str]:
    return frozenset(imported_modules(path.read_text(encoding="utf-8"), _module_name(path)))


def _top(module: str) -> str | None:
    """The first name under ``fastload`` (a package, a base module or a face), or None outside fastload."""
    parts = module.split(".")
    return parts[1] if parts[0] == "fastload" and len(parts) > 1 else None


CORE_FILES = sorted((PACKAGE / "core").glob("*.py"))
PACKAGE_FILES = [p for p in _all_files() if p.relative_to(PACKAGE).parts[0] in PACKAGES]


def test_the_walk_finds_the_modules() -> None:
    names = {p.name for p in CORE_FILES}
    assert {"__init__.py", "keys.py", "plan.py", "index.py", "units.py"} <= names
    assert PACKAGE / "formats" / "tar" / "writer.py" in _all_files()
    assert {p.relative_to(PACKAGE).parts[0] for p in PACKAGE_FILES} == PACKAGES


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: p.name)
def test_core_module_is_pure(path: Path) -> None:
    bad = imports_any(_imports_of(path), CORE_FORBIDDEN)
    assert not bad, f"{path.relative_to(PACKAGE.parent)} imports {sorted(bad)}; fastload/core must stay pure"


@pytest.mark.parametrize("path", PACKAGE_FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_package_imports_only_what_is_below_it(path: Path) -> None:
    own = path.relative_to(PACKAGE).parts[0]
    allowed = ALLOWED[own] | (BASE if own != "core" else {"errors"})
    bad = sorted(m for m in _imports_of(path) if _top(m) is not None and _top(m) not in allowed)
    assert not bad, f"fastload/{own} may import {sorted(allowed)}; {path.relative_to(PACKAGE)} imports {bad}"


def test_only_s3_imports_the_s3_sdk() -> None:
    offenders = [
        str(p.relative_to(PACKAGE))
        for p in _all_files()
        if imports_any(_imports_of(p), S3_SDKS) and p.relative_to(PACKAGE).parts[0] != "s3"
    ]
    assert not offenders, f"only fastload/s3 may import boto3/botocore: {offenders}"


def test_only_train_and_bench_import_torch() -> None:
    offenders = [
        str(p.relative_to(PACKAGE))
        for p in _all_files()
        if imports_any(_imports_of(p), ("torch",))
        and p.relative_to(PACKAGE).parts[0] not in ("train", "bench")
    ]
    assert not offenders, f"only fastload/train and fastload/bench may import torch: {offenders}"


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_each_package_says_what_it_owns_and_may_import(package: str) -> None:
    doc = ast.get_docstring(ast.parse((PACKAGE / package / "__init__.py").read_text(encoding="utf-8"))) or ""
    where = f"fastload/{package}/__init__.py"
    assert "May import" in doc or "Imports nothing" in doc, f"{where}: say what the package may import"
    assert len(doc.split()) >= 15, f"{where}: say what the package owns"


@pytest.mark.parametrize("path", _all_files(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_long_module_says_why(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    if source.count("\n") <= MAX_LINES:
        return
    doc = ast.get_docstring(ast.parse(source)) or ""
    assert f"Over {MAX_LINES} lines" in doc, (
        f"{path.relative_to(PACKAGE)} has {source.count(chr(10))} lines: split it by concept, or say at its "
        f"top why not ('(Over {MAX_LINES} lines on purpose: ...)')"
    )


EXTENSIONS = {"fastload._native"}  # modules built from C: they import nothing of fastload


def module_edges(source: str, module: str, known: set[str], *, is_package: bool = False) -> set[str]:
    """The modules of ``known`` that a file imports by name, package ``__init__`` files included: ``from P
    import m`` is an edge to ``P.m`` when that is a module (else to ``P``, whose ``__init__`` runs and
    gives the name), ``import a.b`` an edge to ``a.b``. The parents a submodule import runs implicitly are
    not edges (every module would be in a circle with a package ``__init__`` that imports it)."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(node, package)
            names = [f"{base}.{alias.name}" for alias in node.names]
            modules = [n for n in names if n in known]
            if len(modules) < len(names):
                found.add(base)
            found.update(modules)
    return {m for m in found if m in known and m != module}


def _module_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in _all_files()}
    known = set(files) | EXTENSIONS
    graph: dict[str, set[str]] = {name: set() for name in EXTENSIONS}
    for name, path in files.items():
        source = path.read_text(encoding="utf-8")
        graph[name] = module_edges(source, name, known, is_package=path.name == "__init__.py")
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles() -> None:
    """No circle among fastload's modules, lazy imports and package ``__init__`` files counted."""
    assert _cycles(_module_graph()) == []


def test_edges_into_a_package_init_are_seen() -> None:
    known = {"fastload", "fastload.formats", "fastload.formats.registry", "fastload.config", "fastload.x"}
    lazy = "def f():\n    from fastload import formats\n"
    assert module_edges(lazy, "fastload.config", known) == {"fastload.formats"}
    assert module_edges("from fastload.formats import registry", "fastload.x", known) == {
        "fastload.formats.registry"
    }
    assert module_edges("from fastload.formats import by_name", "fastload.x", known) == {"fastload.formats"}
    assert module_edges("from . import registry", "fastload.formats", known, is_package=True) == {
        "fastload.formats.registry"
    }
    imported = module_edges("import fastload.formats.registry", "fastload.x", known)
    assert imported == {"fastload.formats.registry"}
    circle = {"fastload.config": {"fastload.formats"}, "fastload.formats": {"fastload.config"}}
    assert _cycles(circle) == [["fastload.config", "fastload.formats"]]


def test_cycle_finder_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


# --- the checker itself catches every import form -----------------------------------------------------


@pytest.mark.parametrize(
    ("source", "module", "expected"),
    [
        ("import os", "fastload.core.x", {"os"}),
        ("import os.path as p", "fastload.core.x", {"os"}),
        ("from os import path", "fastload.core.x", {"os"}),
        ("from fastload import s3", "fastload.core.x", {"fastload.s3"}),
        ("from fastload.storage.localfs import atomic_write", "fastload.core.x", {"fastload.storage"}),
        ("from ..s3 import client", "fastload.core.x", {"fastload.s3"}),
        ("from .. import train", "fastload.core.x", {"fastload.train"}),
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
        "from .index import ShardEntry",
        "import random, re, json",
        "from fastload.s3stuff import x",
    ],
)
def test_checker_allows_pure_imports(source: str) -> None:
    assert not imports_any(imported_modules(source, "fastload.core.x"), CORE_FORBIDDEN)


@pytest.mark.parametrize(
    "package", sorted(p.parent for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE), ids=str
)
def test_each_package_docstring_names_its_modules(package: Path) -> None:
    """A package's docstring is its map: every module and subpackage in it is named there (``name``)."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8"))) or ""
    members = [p.stem for p in package.glob("*.py") if p.stem != "__init__"]
    members += [p.name for p in package.iterdir() if (p / "__init__.py").is_file()]
    missing = sorted(m for m in members if f"``{m}``" not in doc)
    assert not missing, f"{package.relative_to(PACKAGE.parent)}/__init__.py does not name {missing}"


FORMAT_PACKAGES = sorted(p.parent.name for p in (PACKAGE / "formats").glob("*/__init__.py"))


@pytest.mark.parametrize(
    "path", sorted((PACKAGE / "formats").glob("*/*.py")), ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_no_format_package_imports_another(path: Path) -> None:
    """What formats share lives in ``fastload/formats`` itself (``shard``, ``checks``, ``registry``)."""
    own = path.parent.name
    others = {f"fastload.formats.{name}" for name in FORMAT_PACKAGES if name != own}
    bad = sorted(m for m in _imports_of(path) if any(m == o or m.startswith(o + ".") for o in others))
    assert not bad, f"{path.relative_to(PACKAGE)} imports another format's package: {bad}"
