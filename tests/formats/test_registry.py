"""The format registry: lookups by name and by file name, registration, the index check, and a static rule
(like ``tests/test_layering.py``) that no module outside ``fastload/formats`` checks a file suffix or a
``shard_format`` itself."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import fastload
from fastload import formats
from fastload.core.index import DatasetIndex, ShardEntry, parse_index
from fastload.errors import ConfigError, IndexFormatError

PACKAGE = Path(__file__).resolve().parent.parent.parent / "fastload"

# --- lookups ------------------------------------------------------------------------------------------


def test_builtin_formats_are_registered_in_order() -> None:
    assert formats.names()[:3] == ("tar", "parquet", "tfrecord")
    for name in ("tar", "parquet", "tfrecord"):
        fmt = formats.by_name(name)
        assert fmt.name == name and isinstance(fmt, formats.ShardFormat)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("shard-000000.tar", "tar"),
        ("s3://bucket/a/b/shard-000001.tar", "tar"),
        ("x.parquet", "parquet"),
        ("train.tfrecord", "tfrecord"),
        ("a/b.tfrecords", "tfrecord"),
        ("x.tfrec", "tfrecord"),
        ("x.tfrecord.gz", "tfrecord"),
        ("s3://b/p/x.tfrecords.gz", "tfrecord"),
        ("x.gz", None),
        ("x.tar.gz", None),
        ("x.tfrecord.zst", None),
        ("index.json", None),
        ("tar", None),
    ],
)
def test_for_path(path: str, expected: str | None) -> None:
    fmt = formats.for_path(path)
    assert (fmt.name if fmt is not None else None) == expected


def test_foreign_formats_are_those_readable_without_an_index() -> None:
    assert formats.foreign_format("a.tar") is formats.by_name("tar")
    assert formats.foreign_format("a.tfrecord.gz") is formats.by_name("tfrecord")
    assert formats.foreign_format("a.parquet") is formats.by_name("parquet")  # indexed from its footer
    assert formats.foreign_format("a.csv") is None


def test_by_name_unknown_names_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"shard_format='zip'; choose one of tar, parquet, tfrecord"):
        formats.by_name("zip")


def test_register_refuses_duplicates_and_non_formats() -> None:
    with pytest.raises(ConfigError, match="registered already"):
        formats.register(formats.by_name("tar"))
    with pytest.raises(ConfigError, match="does not implement"):
        formats.register(object())  # type: ignore[arg-type]


def test_pack_config_validates_through_the_registry(tmp_path: Path) -> None:
    """Where a pack starts (the config module cannot import the formats that import it): nothing written."""
    from fastload.config import PackConfig
    from fastload.packing.options import output_options

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("a")
    for call in (
        lambda: fastload.pack(tmp_path / "src", tmp_path / "dst", shard_format="zip"),
        lambda: fastload.pack(tmp_path / "src", tmp_path / "dst", config=PackConfig(shard_format="zip")),
    ):
        with pytest.raises(ConfigError, match=r"shard_format='zip'; choose one of tar, parquet, tfrecord"):
            call()
        assert not (tmp_path / "dst").exists()
    with pytest.raises(ConfigError, match="must name a shard format"):
        PackConfig(shard_format="")
    tar = output_options(PackConfig(shard_format="tar"))
    parquet = output_options(PackConfig(shard_format="parquet"))
    assert "row_group_bytes" not in tar and "compression" not in tar
    assert parquet["row_group_bytes"] == 64 << 20 and parquet["compression"] == "none"


# --- the index check ------------------------------------------------------------------------------------


def _index(shard_format: str, **shard: object) -> bytes:
    entry = ShardEntry("shard-000000.tar", 2048, "00000000", ["a", "b"], [0, 1024], [1024, 1024])
    raw = DatasetIndex(shard_format, ["jpg"], [entry]).to_dict()
    raw["shards"][0].update(shard)
    return json.dumps(raw).encode()


def test_unknown_shard_format() -> None:
    """(Was tests/unit/test_index.py's: the list of formats is the registry's, so the check is here.)"""
    where = "s3://bucket/ds/index.json"
    index = parse_index(_index("zip"), where=where)
    with pytest.raises(IndexFormatError) as info:
        formats.check_index(index, where=where)
    assert "'zip'" in str(info.value) and where in str(info.value)


def test_parquet_shard_without_row_groups_is_rejected() -> None:
    where = "ds/index.json"
    index = parse_index(_index("parquet"), where=where)  # offsets, but no row groups
    with pytest.raises(IndexFormatError, match=r"ds/index\.json: parquet shard shard-000000\.tar lacks row"):
        formats.check_index(index, where=where)


def test_load_index_checks_the_format(tmp_path: Path) -> None:
    (tmp_path / "index.json").write_bytes(_index("zip"))
    with pytest.raises(IndexFormatError, match="unknown shard_format 'zip'"):
        formats.load_index(tmp_path)
    (tmp_path / "index.json").write_bytes(_index("tar"))
    assert formats.load_index(tmp_path).shards[0].keys == ["a", "b"]


# --- no format checks outside fastload/formats ------------------------------------------------------------

# modules that may still decide by format themselves, and why (keep this list short)
ALLOWED_CHECKS: dict[str, str] = {
    "bench/stages.py": "the stage breakdown times the tar parser itself; other formats have no such stages",
    "bench/variants.py": "webdataset, a peer measured by the bench, reads tar shards only",
    "packing/token_inputs.py": "pack-tokens' inputs are JSONL and Parquet documents, not shards",
    "packing/tabular.py": "a tabular pack's inputs are Parquet/CSV/JSONL tables, not shards",
    "packing/tablenames.py": "which pack sources are tables (Parquet/CSV/JSONL), not shards",
}
_SUFFIXES = (".tar", ".parquet", ".tfrecord", ".tfrecords", ".tfrec", ".gz")
_HELPERS = {"is_tfrecord_name", "is_gzip_name", "shard_stem"}


def _constants(tree: ast.Module) -> dict[str, set[str]]:
    """Module-level names bound to a string or a tuple of strings (``PARQUET_SUFFIX = ".parquet"``)."""
    out: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = _strings(node.value, {})
    return out


def _strings(node: ast.AST, names: dict[str, set[str]]) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Name):
        return names.get(node.id, set())
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_strings(e, names) for e in node.elts)) if node.elts else set()
    if isinstance(node, ast.Starred):
        return _strings(node.value, names)
    return set()


def _is_shard_format(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "shard_format") or (
        isinstance(node, ast.Name) and node.id == "shard_format"
    )


def format_checks(source: str) -> list[str]:
    """Where ``source`` decides by format itself: a comparison of a ``shard_format``, ``endswith``/
    ``removesuffix`` with a shard suffix, or a name test helper of a format imported."""
    tree = ast.parse(source)
    names = _constants(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        sides = [node.left, *node.comparators] if isinstance(node, ast.Compare) else []
        if any(_is_shard_format(n) for n in sides) and any(
            _strings(n, names) for n in sides if not _is_shard_format(n)
        ):  # (one format name against another, e.g. an append's against its dataset's, decides nothing)
            found.append(f"line {node.lineno}: compares shard_format")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("endswith", "removesuffix")
            and any(s.endswith(_SUFFIXES) for a in node.args for s in _strings(a, names))
        ):
            found.append(f"line {node.lineno}: checks a shard file suffix")
        elif isinstance(node, ast.ImportFrom) and any(a.name in _HELPERS for a in node.names):
            found.append(f"line {node.lineno}: imports a format's name test")
    return found


def _outside_formats() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] != "formats")


@pytest.mark.parametrize("path", _outside_formats(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_format_checks_outside_formats(path: Path) -> None:
    rel = str(path.relative_to(PACKAGE))
    found = format_checks(path.read_text(encoding="utf-8"))
    if rel in ALLOWED_CHECKS:
        assert found, f"{rel} no longer checks formats: remove it from ALLOWED_CHECKS"
        return
    assert not found, f"fastload/{rel} decides by format itself ({found}); ask fastload.formats instead"


@pytest.mark.parametrize(
    "source",
    [
        'if index.shard_format == "tar":\n    pass',
        'ok = config.shard_format != "parquet"',
        'ok = shard_format in ("tar", "tfrecord")',
        'TAR = "tar"\nok = index.shard_format == TAR',
        'ok = url.endswith(".tar")',
        'ok = name.endswith((".tfrecord", ".tfrec"))',
        'SUFFIX = ".parquet"\nok = name.endswith(SUFFIX)',
        'ok = name.endswith(".gz")',
        "from fastload.formats.tfrecord.codec import is_tfrecord_name",
    ],
)
def test_the_checker_finds_format_checks(source: str) -> None:
    assert format_checks(source)


@pytest.mark.parametrize(
    "source",
    [
        'ok = url.endswith("/")',
        'ok = url.endswith(".json")',
        "fmt = formats.by_name(index.shard_format)",
        "fmt = formats.for_path(url)",
        'PackConfig(shard_format="parquet")',
        "same = fmt != shard_format",
        "same = index.shard_format == config.shard_format",
    ],
)
def test_the_checker_allows_registry_lookups(source: str) -> None:
    assert not format_checks(source)


# --- shards without an index ------------------------------------------------------------------------------


def _tar(path: Path, keys: list[str]) -> None:
    import io
    import tarfile

    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key in keys:
            data = key.encode()
            info = tarfile.TarInfo(f"{key}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _tfrecord(path: Path, keys: list[str]) -> None:
    from fastload.formats.tfrecord.codec import encode_example, frame

    path.write_bytes(b"".join(frame(encode_example([("__key__", k.encode()), ("txt", b"x")])) for k in keys))


def test_index_files_by_format(tmp_path: Path) -> None:
    _tar(tmp_path / "a.tar", ["s0", "s1"])
    _tar(tmp_path / "b.tar", ["s2"])
    root, index = formats.index_files([str(tmp_path / "a.tar"), str(tmp_path / "b.tar")])
    assert root == str(tmp_path) and index.shard_format == "tar"
    assert [s.name for s in index.shards] == ["a.tar", "b.tar"] and index.samples == 3
    _tfrecord(tmp_path / "c.tfrecord", ["r0", "r1"])
    root, index = formats.index_files([str(tmp_path / "c.tfrecord")])
    assert index.shard_format == "tfrecord" and index.shards[0].keys == ["r0", "r1"]


def test_index_files_refuses_mixes_and_other_files(tmp_path: Path) -> None:
    _tar(tmp_path / "a.tar", ["s0"])
    _tfrecord(tmp_path / "c.tfrecord", ["r0"])
    with pytest.raises(ConfigError, match="tar and TFRecord files; one dataset reads one format"):
        formats.index_files([str(tmp_path / "a.tar"), str(tmp_path / "c.tfrecord")])
    with pytest.raises(ConfigError, match="Parquet and tar files; one dataset reads one format"):
        formats.index_files([str(tmp_path / "x.parquet"), str(tmp_path / "a.tar")])
    with pytest.raises(ConfigError, match=r"x\.csv: only shards named \*\.tar, .*\*\.parquet"):
        formats.index_files([str(tmp_path / "x.csv")])
    with pytest.raises(ConfigError, match="no shards given"):
        formats.index_files([])
