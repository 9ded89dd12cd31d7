"""The inputs of ``fastload pack-tokens``: listing JSONL/Parquet files (through the pack's listers), opening
them, checking their columns before anything is written."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

from fastload.config import S3Config
from fastload.errors import ConfigError, Skip
from fastload.storage import access as storage
from fastload.storage.listing import FileEntry, LocalSource

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".ndjson")
PARQUET_SUFFIX = ".parquet"
SUFFIXES = (*JSONL_SUFFIXES, PARQUET_SUFFIX)


@dataclass(frozen=True)
class TokenInput:
    """One input file: its path or URL, the key prefix of its documents (``PREFIX/ROW``), and its size and
    version (mtime or ETag) as listed, for the resume fingerprint."""

    url: str
    key_prefix: str
    size: int = 0
    version: str = ""

    @property
    def is_parquet(self) -> bool:
        return self.url.endswith(PARQUET_SUFFIX)


def _strip_suffix(name: str) -> str:
    for suffix in (*JSONL_SUFFIXES, PARQUET_SUFFIX, ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def list_inputs(sources: Sequence[str], s3_config: S3Config | None) -> tuple[list[TokenInput], list[Skip]]:
    """The input files of ``sources`` (files, folders or ``s3://`` prefixes; folders walked in sorted path
    order, hidden names left out), and the paths with an input's name that cannot be read (broken links)."""
    inputs: list[TokenInput] = []
    skipped: list[Skip] = []
    for src in sources:
        root = storage.normalise(src)
        if storage.is_remote(root):
            from fastload.storage.s3source import S3Source

            entries = _entries(S3Source(root, config=s3_config).list(), skipped, hidden=False)
            if not entries and "." in root.rsplit("/", 1)[-1]:
                inputs.append(_s3_object(root, s3_config))
                continue
        elif os.path.isfile(root):
            st = os.stat(root)
            name = os.path.basename(root)
            inputs.append(TokenInput(root, _strip_suffix(name), st.st_size, str(st.st_mtime_ns)))
            continue
        elif os.path.isdir(root):
            entries = _entries(LocalSource(root).list(), skipped, hidden=True)
        else:
            raise ConfigError(
                f"source {src} does not exist; give JSONL/Parquet files or folders holding them"
            )
        inputs += [TokenInput(e.path, _strip_suffix(e.relpath), e.size, e.version) for e in entries]
    seen: dict[str, str] = {}
    for inp in inputs:
        if inp.key_prefix in seen:
            raise ConfigError(
                f"{seen[inp.key_prefix]} and {inp.url} would give their documents the same keys "
                f"({inp.key_prefix}/ROW); pack them from one folder, or pass key_column= (--key-column)"
            )
        seen[inp.key_prefix] = inp.url
    if not inputs:
        raise ConfigError(f"no input files in {', '.join(sources)}: expected {', '.join(SUFFIXES)}")
    return inputs, skipped


def _entries(found: Iterator[FileEntry | Skip], skipped: list[Skip], *, hidden: bool) -> list[FileEntry]:
    out: list[FileEntry] = []
    for item in found:
        if isinstance(item, Skip):
            if item.path.endswith(SUFFIXES):
                skipped.append(item)
        elif item.relpath.endswith(SUFFIXES) and not (
            hidden and any(part.startswith(".") for part in item.relpath.split("/"))
        ):
            out.append(item)
    return out


def _s3_object(url: str, s3_config: S3Config | None) -> TokenInput:
    """A single object named by its URL (listed, for its size and ETag)."""
    from fastload.s3.client import parse_s3_url
    from fastload.s3.listing import ObjectInfo, list_objects

    bucket, key = parse_s3_url(url)
    for obj in list_objects(bucket, key, config=s3_config or S3Config.from_env()):
        if isinstance(obj, ObjectInfo) and obj.key == key:
            return TokenInput(url, _strip_suffix(url.rsplit("/", 1)[-1]), obj.size, obj.etag)
    raise ConfigError(f"source {url} does not exist; give JSONL/Parquet objects or prefixes holding them")


def fingerprint(inputs: Sequence[TokenInput], options: dict[str, Any]) -> tuple[str, str]:
    """``(layout, fingerprint)``: a digest of the options and the inputs' names and sizes (recorded in
    ``index.json``), and that plus their versions (guards ``resume`` against changed inputs)."""
    layout = hashlib.sha256(json.dumps(options, sort_keys=True).encode())
    versions = hashlib.sha256()
    for inp in inputs:
        layout.update(b"%s\0%d\n" % (inp.key_prefix.encode("utf-8", "surrogateescape"), inp.size))
        versions.update(inp.version.encode() + b"\n")
    return layout.hexdigest(), layout.hexdigest() + versions.hexdigest()


@contextlib.contextmanager
def open_input(url: str, s3_config: S3Config | None) -> Iterator[IO[bytes]]:
    """A buffered binary stream of ``url`` (gunzipped for ``.gz``); everything opened is closed after."""
    with contextlib.ExitStack() as stack:
        raw: IO[bytes]
        if storage.is_remote(url):
            reader: Any = stack.enter_context(storage.open_read(url, config=s3_config))
            raw = io.BufferedReader(reader, 1 << 20)
        else:
            raw = stack.enter_context(open(url, "rb", buffering=1 << 20))
        if url.endswith(".gz"):
            raw = stack.enter_context(gzip.GzipFile(fileobj=raw, mode="rb"))  # type: ignore[arg-type]
        yield raw


def check_input(
    inp: TokenInput, *, column: str, key_column: str | None, text: bool, s3_config: S3Config | None
) -> None:
    """Fail before writing anything when an input lacks the column (its first record, for JSONL)."""
    wanted = [column] + ([key_column] if key_column else [])
    with open_input(inp.url, s3_config) as f:
        if inp.is_parquet:
            import pyarrow as pa

            from fastload.formats.parquet.arrowfile import open_parquet

            try:
                schema = open_parquet(f).schema_arrow
            except (OSError, ValueError) as exc:
                raise ConfigError(f"{inp.url} is not a readable Parquet file ({exc})") from None
            missing = [c for c in wanted if c not in schema.names]
            if missing:
                raise ConfigError(
                    f"{inp.url} has no column {missing[0]!r} (columns: {', '.join(schema.names)})"
                )
            kind = schema.field(column).type
            ok = (
                pa.types.is_string(kind) or pa.types.is_large_string(kind)
                if text
                else (
                    (pa.types.is_list(kind) or pa.types.is_large_list(kind))
                    and pa.types.is_integer(kind.value_type)
                )
            )
            if not ok:
                want = "text (string)" if text else "token ids (a list of integers)"
                raise ConfigError(f"{inp.url}: column {column!r} is {kind}, expected {want}")
            return
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                raise ConfigError(
                    f"{inp.url}:{line_no} is not valid JSON; is this a JSON Lines file?"
                ) from None
            if not isinstance(record, dict):
                raise ConfigError(f"{inp.url}:{line_no} is not a JSON object; JSON Lines of objects expected")
            missing = [c for c in wanted if c not in record]
            if missing:
                raise ConfigError(
                    f"{inp.url}:{line_no} has no field {missing[0]!r} (fields: {', '.join(record)}); "
                    "pass the right column" + ("" if text else ", or --tokenizer for text")
                )
            return
