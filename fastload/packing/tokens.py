"""``fastload.pack_tokens``: documents of token ids (JSONL or Parquet) into Parquet token shards.

A token dataset is an ordinary fastload Parquet dataset: one row per document with ``__key__`` and one binary
column, ``tokens.u16`` or ``tokens.i32``, holding the document's little-endian token ids (Arrow's binary
column is a flat token buffer plus document offsets), and an ``index.json`` with row groups and CRC32C, so
``ShardDataset`` (splitting, shuffling, resume, S3), ``fastload verify`` and ``fastload inspect`` work on it
unchanged. ``index.json``'s ``options`` record ``"kind": "tokens"``, the field, the dtype and the totals.

read inputs in order -> check ids (vectorised, per chunk of documents) -> row groups of ``row_group_bytes``
of token data -> shards of at most ``shard_size_bytes`` (a document never spans two) written to a temporary
name and published whole -> ``index.json`` last.
"""

from __future__ import annotations

import contextlib
import gzip
import importlib
import io
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

from fastload.config import PARQUET_COMPRESSIONS, S3Config
from fastload.core.index import INDEX_NAME, DatasetIndex, ShardEntry
from fastload.core.seqpack import TOKEN_DTYPES
from fastload.errors import ConfigError, PackError, Skip, SkippedInputError
from fastload.packing.dest import Destination, destination
from fastload.packing.journal import STATE_DIR
from fastload.storage import access as storage

DTYPES = {"uint16": "u16", "int32": "i32"}  # --dtype name -> field extension
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".ndjson")
PARQUET_SUFFIX = ".parquet"
_CHUNK_DOCS = 4096

Tokenizer = Callable[[str], Any]


@dataclass
class TokensReport:
    """What a ``pack_tokens`` run did."""

    dst: str
    index: DatasetIndex
    documents: int = 0
    tokens: int = 0
    dtype: str = "int32"
    max_token_id: int = -1
    dtype_chosen: bool = False
    skipped: list[Skip] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> str:
        rate = f", {self.tokens / self.seconds / 1e6:,.1f}M tokens/s" if self.seconds else ""
        lines = [
            f"packed {self.documents:,} documents ({self.tokens:,} tokens, {self.dtype}) into "
            f"{len(self.index.shards)} parquet shard(s) in {self.dst} in {self.seconds:.1f}s{rate}"
        ]
        if self.dtype == "int32" and not self.dtype_chosen and 0 <= self.max_token_id < 1 << 16:
            lines.append(
                f"every token id is below 65,536 (largest {self.max_token_id:,}): --vocab-size N (or "
                "--dtype uint16) would store 2 bytes per token instead of 4"
            )
        if self.skipped:
            lines.append(f"skipped {len(self.skipped)} document(s) or file(s):")
            lines += [f"  {s}" for s in self.skipped[:50]]
            if len(self.skipped) > 50:
                lines.append(f"  ... and {len(self.skipped) - 50} more (all listed in index.json)")
        return "\n".join(lines)


# -- inputs -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Input:
    url: str
    key_prefix: str  # documents get keys PREFIX/ROW

    @property
    def is_parquet(self) -> bool:
        return self.url.endswith(PARQUET_SUFFIX)


def _strip_suffix(name: str) -> str:
    for suffix in (*JSONL_SUFFIXES, PARQUET_SUFFIX, ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _list_inputs(sources: Sequence[str], s3_config: S3Config | None) -> list[_Input]:
    inputs: list[_Input] = []
    for src in sources:
        root = storage.normalise(src)
        if storage.is_remote(root):
            found = [
                u
                for s in (*JSONL_SUFFIXES, PARQUET_SUFFIX)
                for u in storage.list_files(root, s, config=s3_config)
            ]
            if not found and "." in root.rsplit("/", 1)[-1]:
                inputs.append(_Input(root, _strip_suffix(root.rsplit("/", 1)[-1])))
                continue
            base = root.rstrip("/") + "/"
            inputs += [_Input(u, _strip_suffix(u[len(base) :])) for u in sorted(found)]
        elif os.path.isfile(root):
            inputs.append(_Input(root, _strip_suffix(os.path.basename(root))))
        elif os.path.isdir(root):
            for folder, dirs, files in os.walk(root):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(files):
                    if not name.startswith(".") and name.endswith((*JSONL_SUFFIXES, PARQUET_SUFFIX)):
                        path = os.path.join(folder, name)
                        rel = os.path.relpath(path, root).replace(os.sep, "/")
                        inputs.append(_Input(path, _strip_suffix(rel)))
        else:
            raise ConfigError(
                f"source {src} does not exist; give JSONL/Parquet files or folders holding them"
            )
    seen: dict[str, str] = {}
    for inp in inputs:
        if inp.key_prefix in seen:
            raise ConfigError(
                f"{seen[inp.key_prefix]} and {inp.url} would give their documents the same keys "
                f"({inp.key_prefix}/ROW); pack them from one folder, or pass key_column"
            )
        seen[inp.key_prefix] = inp.url
    if not inputs:
        raise ConfigError(
            f"no input files in {', '.join(sources)}: expected {', '.join((*JSONL_SUFFIXES, PARQUET_SUFFIX))}"
        )
    return inputs


@contextlib.contextmanager
def _open(url: str, s3_config: S3Config | None) -> Iterator[IO[bytes]]:
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


def load_tokenizer(spec: str) -> Tokenizer:
    """``"module:function"`` (the function may be dotted, ``pkg.mod:tok.encode``) as a callable."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"tokenizer {spec!r}: write module:function, e.g. mytok:encode")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"tokenizer {spec!r}: cannot import {module_name!r} ({exc})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"tokenizer {spec!r}: {module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"tokenizer {spec!r} is not callable")
    return obj  # type: ignore[no-any-return]


@dataclass
class _Chunk:
    """Documents of one input, in order: ``ids[offsets[i]:offsets[i + 1]]`` is document ``i``."""

    keys: list[str]
    rows: list[int]
    ids: np.ndarray
    lengths: np.ndarray


class _Reader:
    """Reads documents from one input as chunks; bad documents become :class:`Skip` entries."""

    def __init__(
        self,
        inp: _Input,
        *,
        column: str,
        key_column: str | None,
        tokenizer: Tokenizer | None,
        s3_config: S3Config | None,
        skipped: list[Skip],
    ) -> None:
        self.inp, self.column, self.key_column = inp, column, key_column
        self.tokenizer, self.s3_config, self.skipped = tokenizer, s3_config, skipped

    def where(self, row: int) -> str:
        return f"{self.inp.url} row {row}" if self.inp.is_parquet else f"{self.inp.url}:{row + 1}"

    def _key(self, row: int, record_key: Any) -> str:
        return str(record_key) if self.key_column is not None else f"{self.inp.key_prefix}/{row}"

    def _ids(self, value: Any, row: int) -> np.ndarray | None:
        """A document's ids as a 1-D int64 array, or None (and a skip) when they are not token ids."""
        try:
            if self.tokenizer is not None:
                if not isinstance(value, str):
                    raise ValueError(f"{self.column!r} is {type(value).__name__}, not text")
                value = self.tokenizer(value)
                if isinstance(value, dict) or hasattr(value, "keys"):
                    value = value["input_ids"]
                if hasattr(value, "detach"):
                    value = value.detach().cpu().numpy()
            arr = np.asarray(value)
            if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
                raise ValueError(f"{self.column!r} is not a list of integers")
            return arr.astype(np.int64, copy=False)
        except Exception as exc:
            self.skipped.append(Skip(self.where(row), f"{exc}; document left out"))
            return None

    def chunks(self) -> Iterator[_Chunk]:
        try:
            with _open(self.inp.url, self.s3_config) as f:
                yield from (self._parquet(f) if self.inp.is_parquet else self._jsonl(f))
        except (OSError, ValueError) as exc:  # an unreadable or corrupt file: left out whole
            if isinstance(exc, ConfigError):
                raise
            self.skipped.append(
                Skip(self.inp.url, f"cannot read the file ({exc}); the rest of it is left out")
            )

    def _jsonl(self, f: IO[bytes]) -> Iterator[_Chunk]:
        keys: list[str] = []
        rows: list[int] = []
        docs: list[np.ndarray] = []
        for row, line in enumerate(f):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                self.skipped.append(Skip(self.where(row), f"not valid JSON ({exc}); document left out"))
                continue
            if not isinstance(record, dict) or self.column not in record:
                self.skipped.append(Skip(self.where(row), f"no {self.column!r} field; document left out"))
                continue
            if self.key_column is not None and self.key_column not in record:
                self.skipped.append(Skip(self.where(row), f"no {self.key_column!r} field; document left out"))
                continue
            arr = self._ids(record[self.column], row)
            if arr is None:
                continue
            keys.append(self._key(row, record.get(self.key_column) if self.key_column else None))
            rows.append(row)
            docs.append(arr)
            if len(docs) >= _CHUNK_DOCS:
                yield _chunk(keys, rows, docs)
                keys, rows, docs = [], [], []
        if docs:
            yield _chunk(keys, rows, docs)

    def _parquet(self, f: IO[bytes]) -> Iterator[_Chunk]:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(f)
        columns = [self.column] + ([self.key_column] if self.key_column else [])
        row = 0
        for batch in parquet.iter_batches(batch_size=_CHUNK_DOCS, columns=columns):
            col = batch.column(0)
            record_keys = batch.column(1).to_pylist() if self.key_column else [None] * len(batch)
            n = len(batch)
            if self.tokenizer is None and (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)):
                lengths = pc.list_value_length(col).fill_null(0).to_numpy(zero_copy_only=False)
                flat = col.flatten()
                if pa.types.is_integer(flat.type) and flat.null_count == 0 and col.null_count == 0:
                    ids = flat.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
                    keys = [self._key(row + i, record_keys[i]) for i in range(n)]
                    yield _Chunk(keys, list(range(row, row + n)), ids, lengths.astype(np.int64))
                    row += n
                    continue
            values = col.to_pylist()  # slow path: text to tokenise, or lists with nulls to report
            keys, rows, docs = [], [], []
            for i, value in enumerate(values):
                arr = None
                if value is None:
                    self.skipped.append(
                        Skip(self.where(row + i), f"{self.column!r} is null; document left out")
                    )
                else:
                    arr = self._ids(value, row + i)
                if arr is not None:
                    keys.append(self._key(row + i, record_keys[i]))
                    rows.append(row + i)
                    docs.append(arr)
            if docs:
                yield _chunk(keys, rows, docs)
            row += n


def _chunk(keys: list[str], rows: list[int], docs: list[np.ndarray]) -> _Chunk:
    lengths = np.fromiter((d.size for d in docs), dtype=np.int64, count=len(docs))
    ids = np.concatenate(docs) if docs else np.zeros(0, dtype=np.int64)
    return _Chunk(keys, rows, ids.astype(np.int64, copy=False), lengths)


def _check_input(
    inp: _Input, *, column: str, key_column: str | None, text: bool, s3_config: S3Config | None
) -> None:
    """Fail before writing anything when an input lacks the column (its first record, for JSONL)."""
    wanted = [column] + ([key_column] if key_column else [])
    with _open(inp.url, s3_config) as f:
        if inp.is_parquet:
            import pyarrow as pa
            import pyarrow.parquet as pq

            try:
                schema = pq.read_schema(f)
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


# -- writing ----------------------------------------------------------------------------------------------


class _ShardWriter:
    """Cuts documents into row groups and shards, writes each shard to a temporary file, publishes it."""

    def __init__(
        self,
        dest: Destination,
        *,
        field_name: str,
        dtype: np.dtype[Any],
        shard_size_bytes: int,
        row_group_bytes: int,
        prefix: str,
        compression: str,
    ) -> None:
        from fastload.formats.parquet.writer import parquet_schema

        self.dest, self.field_name, self.dtype = dest, field_name, dtype
        self.shard_size_bytes = shard_size_bytes
        self.row_group_bytes = min(row_group_bytes, shard_size_bytes)
        self.prefix, self.compression = prefix, compression
        self.schema = parquet_schema([field_name])
        self.shards: list[ShardEntry] = []
        self._group: list[_Chunk] = []
        self._group_bytes = 0
        self._writer: Any = None
        self._tmp = ""
        self._entry: ShardEntry | None = None
        self._shard_bytes = 0
        self._rows: list[int] = []

    def add(self, chunk: _Chunk) -> None:
        nbytes = chunk.lengths * self.dtype.itemsize
        offsets = np.concatenate(([0], np.cumsum(chunk.lengths)))
        pos, n = 0, len(chunk.keys)
        while pos < n:
            cum = np.cumsum(nbytes[pos:])
            take = int(np.searchsorted(cum, self.row_group_bytes - self._group_bytes, side="right"))
            if take == 0 and not self._group:
                take = 1  # a document larger than a row group gets one of its own
            if take:
                stop = pos + take
                self._group.append(
                    _Chunk(
                        chunk.keys[pos:stop],
                        chunk.rows[pos:stop],
                        chunk.ids[offsets[pos] : offsets[stop]],
                        chunk.lengths[pos:stop],
                    )
                )
                self._group_bytes += int(cum[take - 1])
                pos = stop
            if take == 0 or self._group_bytes >= self.row_group_bytes:
                self._write_group()

    def _write_group(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self._group:
            return
        keys = [k for c in self._group for k in c.keys]
        lengths = np.concatenate([c.lengths for c in self._group])
        values = np.concatenate([c.ids for c in self._group]).astype(self.dtype)
        group_bytes = self._group_bytes
        self._group, self._group_bytes = [], 0
        if self._writer is not None and self._shard_bytes + group_bytes > self.shard_size_bytes:
            self._close_shard()
        if self._writer is None:
            name = f"{self.prefix}-{len(self.shards):06d}{PARQUET_SUFFIX}"
            self._tmp = os.path.join(self.dest.tmp_dir, f"{len(self.shards):06d}.part")
            self._entry = ShardEntry(name=name, bytes=0, checksum="", keys=[])
            self._writer = pq.ParquetWriter(
                self._tmp,
                self.schema,
                compression=self.compression,
                use_dictionary=False,
                write_statistics=False,
            )
        assert self._entry is not None
        offsets = np.concatenate(([0], np.cumsum(lengths) * self.dtype.itemsize)).astype(np.int32)
        column = pa.Array.from_buffers(
            pa.binary(), len(keys), [None, pa.py_buffer(offsets), pa.py_buffer(values)]
        )
        table = pa.Table.from_arrays([pa.array(keys, type=pa.string()), column], schema=self.schema)
        self._writer.write_table(table, row_group_size=len(keys))
        self._entry.keys.extend(keys)
        self._rows.append(len(keys))
        self._shard_bytes += group_bytes

    def _close_shard(self) -> None:
        import pyarrow.parquet as pq

        from fastload.formats.parquet.writer import file_crc32c

        entry = self._entry
        assert entry is not None and self._writer is not None
        self._writer.close()
        self._writer = None
        crc, entry.bytes = file_crc32c(self._tmp)
        entry.checksum = f"{crc:08x}"
        meta = pq.read_metadata(self._tmp)
        for i, rows in enumerate(self._rows):
            rg = meta.row_group(i)
            first = min(_column_start(rg.column(c)) for c in range(rg.num_columns))
            size = sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))
            entry.row_groups.append((first, size, rows))
        self.dest.publish(self._tmp, entry.name)
        self.shards.append(entry)
        self._entry, self._rows, self._shard_bytes = None, [], 0

    def finish(self) -> None:
        self._write_group()
        if self._writer is not None:
            self._close_shard()

    def abort(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
            with contextlib.suppress(OSError):
                os.unlink(self._tmp)


def _column_start(col: Any) -> int:
    first = int(col.data_page_offset)
    if col.has_dictionary_page and col.dictionary_page_offset is not None:
        first = min(first, int(col.dictionary_page_offset))
    return first


# -- the job ----------------------------------------------------------------------------------------------


def _dtype_for(dtype: str, vocab_size: int | None) -> tuple[str, bool]:
    """``(dtype name, chosen by the user)`` from the ``dtype`` option and the vocabulary size."""
    if dtype not in ("auto", *DTYPES):
        raise ConfigError(f"dtype={dtype!r}; choose auto, {', '.join(DTYPES)}")
    if vocab_size is not None and (isinstance(vocab_size, bool) or vocab_size < 1 or vocab_size > 1 << 31):
        raise ConfigError(f"vocab_size={vocab_size!r} must be between 1 and 2**31")
    if dtype == "uint16" and vocab_size is not None and vocab_size > 1 << 16:
        raise ConfigError(f"vocab_size={vocab_size} does not fit uint16 (at most 65,536 ids); use int32")
    if dtype != "auto":
        return dtype, True
    if vocab_size is None:
        return "int32", False
    return ("uint16" if vocab_size <= 1 << 16 else "int32"), True


def pack_tokens(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    dst: str | os.PathLike[str],
    *,
    column: str = "input_ids",
    key_column: str | None = None,
    tokenizer: str | Tokenizer | None = None,
    text_column: str = "text",
    vocab_size: int | None = None,
    dtype: str = "auto",
    field_name: str = "tokens",
    shard_size_bytes: int = 256 << 20,
    row_group_bytes: int = 1 << 20,
    prefix: str = "shard",
    compression: str = "none",
    allow_skip: bool = False,
    s3_config: S3Config | None = None,
) -> TokensReport:
    """Write the token-id documents of ``sources`` (JSONL / Parquet files, or folders or ``s3://`` prefixes
    holding ``.jsonl``, ``.jsonl.gz``, ``.ndjson`` and ``.parquet`` files, read in sorted order) as Parquet
    token shards plus ``index.json`` in ``dst`` (a new or empty folder, or an ``s3://`` prefix).

    ``column`` holds each document's token ids (a JSON list of ints; a Parquet ``list<int>``); or pass
    ``tokenizer`` (a callable, or ``"module:function"``) taking the text in ``text_column`` and returning ids.
    Keys are ``FILE/ROW`` (``FILE`` relative to its source without extension, ``ROW`` from 0: a JSONL
    line number minus one), or the value of ``key_column``. Ids are stored as ``uint16`` when
    ``vocab_size <= 65536`` (else ``int32``; ``dtype`` forces one); an id below 0 or not below
    ``vocab_size`` (or the dtype's range) is an error. Documents that are not token ids are left out and
    listed; unless ``allow_skip``, :class:`~fastload.errors.SkippedInputError` is raised after writing.
    A missing column fails before anything is written; if the run fails later (e.g. the disk fills up),
    shards already published stay without an ``index.json``: delete ``dst`` and run again.
    """
    began = time.monotonic()
    chosen, explicit = _dtype_for(dtype, vocab_size)
    ext = DTYPES[chosen]
    np_dtype = TOKEN_DTYPES[ext]
    limit = vocab_size if vocab_size is not None else int(np.iinfo(np_dtype).max) + 1
    if not field_name or "/" in field_name or "." in field_name or field_name.startswith("_"):
        raise ConfigError(
            f"field_name={field_name!r} must be a plain name such as 'tokens' (no '.', '/', '_' first)"
        )
    if row_group_bytes < 1 or row_group_bytes > 1 << 30:
        raise ConfigError(f"row_group_bytes={row_group_bytes} must be between 1 byte and 1 GiB")
    if shard_size_bytes < 4096:
        raise ConfigError(f"shard_size_bytes={shard_size_bytes} is too small; use at least 4 KiB")
    if compression not in PARQUET_COMPRESSIONS:
        raise ConfigError(f"compression={compression!r}; choose one of {', '.join(PARQUET_COMPRESSIONS)}")
    if not prefix or "/" in prefix or prefix.startswith("."):
        raise ConfigError(
            f"prefix={prefix!r} must be a non-empty file name part without '/', not starting with '.'"
        )
    from fastload.packing.pack import source_and_target

    srcs, target = source_and_target(
        sources, dst, missing="pass the JSONL/Parquet files (or folders) to pack"
    )
    if any(u.startswith("s3://") for u in [*srcs, target]):
        s3_config = s3_config or S3Config.from_env()
    hook: Tokenizer | None = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    read_column = text_column if hook is not None else column
    inputs = _list_inputs(srcs, s3_config)
    for inp in inputs:
        _check_input(
            inp, column=read_column, key_column=key_column, text=hook is not None, s3_config=s3_config
        )

    dest = destination(
        target if target.startswith("s3://") else os.path.abspath(target), STATE_DIR, config=s3_config
    )
    if dest.exists_as_file():
        raise PackError(f"destination {dest.url} is a file; choose a folder")
    if not dest.is_empty():
        raise PackError(f"destination {dest.url} is not empty; choose an empty or new folder")
    dest.prepare()
    field_full = f"{field_name}.{ext}"
    writer = _ShardWriter(
        dest,
        field_name=field_full,
        dtype=np_dtype,
        shard_size_bytes=shard_size_bytes,
        row_group_bytes=row_group_bytes,
        prefix=prefix,
        compression=compression,
    )
    skipped: list[Skip] = []
    documents = tokens = 0
    max_id = -1
    try:
        for inp in inputs:
            reader = _Reader(
                inp,
                column=read_column,
                key_column=key_column,
                tokenizer=hook,
                s3_config=s3_config,
                skipped=skipped,
            )
            for chunk in reader.chunks():
                chunk = _check_range(chunk, reader, limit=limit, vocab_size=vocab_size, dtype=chosen)
                if not chunk.keys:
                    continue
                if chunk.ids.size:
                    max_id = max(max_id, int(chunk.ids.max()))
                documents += len(chunk.keys)
                tokens += int(chunk.ids.size)
                writer.add(chunk)
        writer.finish()
    except BaseException:
        writer.abort()
        dest.remove_tree(STATE_DIR)
        dest.cleanup()
        raise
    if not writer.shards:
        dest.remove_tree(STATE_DIR)
        dest.cleanup()
        detail = f": {len(skipped)} skipped, first: {skipped[0]}" if skipped else ""
        raise PackError(f"no documents found in {', '.join(srcs)}{detail}")
    index = DatasetIndex(
        shard_format="parquet",
        fields=[field_full],
        shards=writer.shards,
        options={
            "kind": "tokens",
            "field": field_full,
            "dtype": chosen,
            "vocab_size": vocab_size,
            "column": read_column,
            "key_column": key_column,
            "tokenizer": tokenizer if isinstance(tokenizer, str) else None,
            "shard_size_bytes": shard_size_bytes,
            "row_group_bytes": row_group_bytes,
            "compression": compression,
            "prefix": prefix,
            "documents": documents,
            "tokens": tokens,
            "max_token_id": max_id,
        },
        skipped=[{"path": s.path, "reason": s.reason} for s in skipped],
        payload_bytes=tokens * np_dtype.itemsize,
    )
    dest.write_bytes(INDEX_NAME, index.to_json())
    dest.remove_tree(STATE_DIR)
    dest.cleanup()
    report = TokensReport(
        dest.url,
        index,
        documents=documents,
        tokens=tokens,
        dtype=chosen,
        max_token_id=max_id,
        dtype_chosen=explicit,
        skipped=skipped,
        seconds=time.monotonic() - began,
    )
    if skipped and not allow_skip:
        raise SkippedInputError(skipped, written=True)
    return report


def _check_range(chunk: _Chunk, reader: _Reader, *, limit: int, vocab_size: int | None, dtype: str) -> _Chunk:
    """The chunk without documents holding an id below 0 or not below ``limit`` (those are skipped)."""
    if not chunk.ids.size:
        return chunk
    bad_token = (chunk.ids < 0) | (chunk.ids >= limit)
    if not bad_token.any():
        return chunk
    doc_of = np.repeat(np.arange(len(chunk.keys)), chunk.lengths)
    bad_docs = np.unique(doc_of[bad_token])
    starts = np.concatenate(([0], np.cumsum(chunk.lengths)))
    what = f"vocab_size {vocab_size:,}" if vocab_size is not None else f"{dtype} (0..{limit - 1:,})"
    for d in bad_docs.tolist():
        doc = chunk.ids[starts[d] : starts[d + 1]]
        pos = int(np.flatnonzero((doc < 0) | (doc >= limit))[0])
        reader.skipped.append(
            Skip(
                reader.where(chunk.rows[d]),
                f"token id {int(doc[pos])} at position {pos} is out of range for {what}; document left out",
            )
        )
    keep = np.ones(len(chunk.keys), dtype=bool)
    keep[bad_docs] = False
    keep_list = keep.tolist()
    return _Chunk(
        [k for k, ok in zip(chunk.keys, keep_list, strict=True) if ok],
        [r for r, ok in zip(chunk.rows, keep_list, strict=True) if ok],
        chunk.ids[np.repeat(keep, chunk.lengths)],
        chunk.lengths[keep],
    )


__all__ = ["TokensReport", "load_tokenizer", "pack_tokens"]
