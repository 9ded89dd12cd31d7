"""``fastload.pack_tokens``: documents of token ids (JSONL or Parquet) into Parquet token shards.

A token dataset is an ordinary fastload Parquet dataset: one row per document with ``__key__`` and one binary
column, ``tokens.u16`` or ``tokens.i32``, holding the document's little-endian token ids (Arrow's binary
column is a flat token buffer plus document offsets), and an ``index.json`` with row groups and CRC32C, so
``ShardDataset`` (splitting, shuffling, resume, S3), ``fastload verify`` and ``fastload inspect`` work on it
unchanged. ``index.json``'s ``options`` record ``"kind": "tokens"``, the field, the dtype and the totals.

It runs on the pack pipeline: list inputs (``token_inputs``, through the pack's listers) -> fingerprint
inputs and options, prepare the destination, keep an interrupted run's shards (``journal``) -> read
documents in order and check their ids (``token_docs``) -> cut row groups and shards and write each shard
through ``formats.parquet.writer`` as its groups arrive (``token_shards``) -> an engine
(``engine.LocalEngine``) checksums, publishes and journals the finished shards -> ``index.json`` last.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastload.config import PackConfig, S3Config
from fastload.core.index import DatasetIndex
from fastload.core.seqpack import TOKEN_DTYPES
from fastload.errors import ConfigError, PackError, Skip
from fastload.formats.shard import ShardResult
from fastload.packing.append import run_append
from fastload.packing.dest import Destination
from fastload.packing.driver import Plan, Target, run
from fastload.packing.engine import Engine, LocalEngine, ShardJob
from fastload.packing.journal import PackJournal
from fastload.packing.plan import source_and_target
from fastload.packing.token_docs import Chunk, Reader, check_range
from fastload.packing.token_inputs import (
    PARQUET_SUFFIX,
    check_input,
    fingerprint,
    list_inputs,
)
from fastload.packing.token_report import TokensReport
from fastload.packing.token_shards import ShardCutter, TokenGroup, shard_jobs
from fastload.packing.tokenizer_hook import Tokenizer, load_tokenizer

DTYPES = {"uint16": "u16", "int32": "i32"}  # --dtype name -> field extension
DEFAULT_WORKERS = 4  # publishers when not given; reading, in one thread, is the usual limit


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
    bos_id: int | None = None,
    eos_id: int | None = None,
    vocab_size: int | None = None,
    dtype: str = "auto",
    field_name: str = "tokens",
    shard_size_bytes: int = 256 << 20,
    row_group_bytes: int = 1 << 20,
    prefix: str = "shard",
    compression: str = "none",
    allow_skip: bool = False,
    workers: int | None = None,
    resume: bool = False,
    s3_config: S3Config | None = None,
    progress: bool | None = None,
    append: bool = False,
) -> TokensReport:
    """Write the token-id documents of ``sources`` (JSONL / Parquet files, or folders or ``s3://`` prefixes
    holding ``.jsonl``, ``.jsonl.gz``, ``.ndjson`` and ``.parquet`` files, read in sorted order) as Parquet
    token shards plus ``index.json`` in ``dst`` (a new or empty folder, or an ``s3://`` prefix).

    ``column`` holds each document's token ids (a JSON list of ints; a Parquet ``list<int>``); or pass
    ``tokenizer`` taking the text in ``text_column`` and returning ids: a callable, or a spec string
    (``"module:function"``, ``"path/to/file.py:function"``, a ``tokenizer.json`` file of Hugging Face's
    ``tokenizers``, or ``"hf:NAME"`` from the Hub; the last two tokenise 4,096 documents at a time on
    every core). ``bos_id`` / ``eos_id``: an id put before / after every document's ids.
    Keys are ``FILE/ROW`` (``FILE`` relative to its source without extension, ``ROW`` from 0: a JSONL
    line number minus one), or the value of ``key_column``. Ids are stored as ``uint16`` when
    ``vocab_size <= 65536`` (else ``int32``; ``dtype`` forces one); an id below 0 or not below
    ``vocab_size`` (or the dtype's range) is an error. Documents that are not token ids are left out and
    listed; unless ``allow_skip``, :class:`~fastload.errors.SkippedInputError` is raised after writing.

    One reader cuts documents into row groups and shards and writes each shard to a temporary file as its
    row groups arrive (one row group in memory, plus one input chunk of 4,096 documents); up to ``workers``
    threads (default: up to 4) checksum, publish (rename, or upload to S3) and journal finished shards, so
    that overlaps with reading the next ones. The output does not depend on ``workers``. A missing
    column fails before anything is written; if the run is interrupted later (killed, disk full), the shards
    published so far are journaled: ``resume=True`` with the same inputs and options keeps them and writes
    the rest, giving the bytes of an uninterrupted run (it refuses if the inputs or options changed).
    A progress bar (token bytes, documents/s) shows on a terminal unless ``progress=False``.
    ``append``: the shards join the token dataset in ``dst`` as a new version, as ``fastload pack --append``
    does (same dtype, field and options; the totals in ``index.json`` grown).
    """
    chosen, explicit = _dtype_for(dtype, vocab_size)
    ext = DTYPES[chosen]
    np_dtype = TOKEN_DTYPES[ext]
    limit = vocab_size if vocab_size is not None else int(np.iinfo(np_dtype).max) + 1
    if not field_name or "/" in field_name or "." in field_name or field_name.startswith("_"):
        raise ConfigError(
            f"field_name={field_name!r} must be a plain name such as 'tokens' (no '.', '/', '_' first)"
        )
    for name, special in (("bos_id", bos_id), ("eos_id", eos_id)):
        if special is not None and (
            isinstance(special, bool) or not isinstance(special, int) or not 0 <= special < limit
        ):
            raise ConfigError(f"{name}={special!r} must be a token id in 0..{limit - 1:,}")
    if workers is not None and (isinstance(workers, bool) or workers < 1):
        raise ConfigError(f"workers={workers!r} must be >= 1")
    config = PackConfig(  # (its checks, and messages, are those of every pack's options)
        shard_format="parquet",
        shard_size_bytes=shard_size_bytes,
        row_group_bytes=row_group_bytes,
        prefix=prefix,
        compression=compression,
        workers=workers or min(DEFAULT_WORKERS, os.cpu_count() or 1),
        resume=resume,
        allow_skip=allow_skip,
        progress=progress,
    )
    srcs, target = source_and_target(
        sources, dst, missing="pass the JSONL/Parquet files (or folders) to pack"
    )
    if any(u.startswith("s3://") for u in [*srcs, target]):
        s3_config = s3_config or S3Config.from_env()
    hook: Tokenizer | None = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    read_column = text_column if hook is not None else column
    inputs, skipped = list_inputs(srcs, s3_config)
    for inp in inputs:
        check_input(
            inp, column=read_column, key_column=key_column, text=hook is not None, s3_config=s3_config
        )
    field_full = f"{field_name}.{ext}"
    options: dict[str, Any] = {
        "kind": "tokens",
        "field": field_full,
        "dtype": chosen,
        "vocab_size": vocab_size,
        "column": read_column,
        "key_column": key_column,
        "tokenizer": tokenizer if isinstance(tokenizer, str) else None,
        **({"bos_id": bos_id} if bos_id is not None else {}),
        **({"eos_id": eos_id} if eos_id is not None else {}),
        "shard_size_bytes": shard_size_bytes,
        "row_group_bytes": row_group_bytes,
        "compression": compression,
        "prefix": prefix,
    }
    hook_name = (
        None if hook is None else f"{getattr(hook, '__module__', '')}:{getattr(hook, '__qualname__', '')}"
    )
    layout, print_ = fingerprint(inputs, {**options, "hook": hook_name})

    return (run_append if append else run)(
        TokensPlan(
            target=Target(
                url=target,
                fingerprint=print_,
                layout=layout,
                shards=None,
                resume=resume,
                allow_skip=allow_skip,
                progress=progress,
                s3_config=s3_config,
            ),
            config=config,
            srcs=srcs,
            inputs=inputs,
            skipped=skipped,
            options=options,
            reader=dict(
                column=read_column,
                key_column=key_column,
                tokenizer=hook,
                s3_config=s3_config,
                skipped=skipped,
                bos_id=bos_id,
                eos_id=eos_id,
            ),
            limit=limit,
            vocab_size=vocab_size,
            dtype=chosen,
            dtype_chosen=explicit,
            field_name=field_full,
        )
    )


@dataclass(kw_only=True)
class TokensPlan(Plan[TokensReport]):
    """The driver's plan of a pack of token documents: shards cut while the documents stream in (so their
    number is known only at the end), each written by the reader and published by the local engine's
    threads (:func:`~fastload.packing.token_shards.shard_jobs`); the bar counts token bytes and documents."""

    target: Target
    config: PackConfig
    srcs: list[str]
    inputs: list[Any]
    skipped: list[Skip]
    options: dict[str, Any]
    reader: dict[str, Any]  # Reader's keywords
    limit: int
    vocab_size: int | None
    dtype: str
    dtype_chosen: bool
    field_name: str
    totals: _Totals = field(default_factory=lambda: _Totals())
    cutter: ShardCutter | None = None
    _kept: frozenset[int] = frozenset()

    progress_items = "documents"

    def name_of(self, number: int) -> str:
        return _shard_name(self.config.prefix, number)

    def engine(self, dest: Destination, journal: PackJournal, todo: int | None) -> Engine:
        return LocalEngine(dest, journal, workers=self.config.worker_count)

    def progress_desc(self) -> str:
        return f"packing {len(self.inputs)} file(s) of tokens"

    def jobs(self, dest: Destination, kept: Mapping[int, ShardResult]) -> Iterable[ShardJob]:
        np_dtype = TOKEN_DTYPES[DTYPES[self.dtype]]
        self._kept = frozenset(kept)
        cfg = self.config
        self.cutter = cutter = ShardCutter(
            dtype=np_dtype, row_group_bytes=cfg.row_group_bytes, shard_size_bytes=cfg.shard_size_bytes
        )

        def documents() -> Iterator[tuple[int, TokenGroup]]:
            for inp in self.inputs:
                reader = Reader(inp, **self.reader)
                for chunk in reader.chunks():
                    chunk = check_range(
                        chunk, reader, limit=self.limit, vocab_size=self.vocab_size, dtype=self.dtype
                    )
                    if chunk.keys:
                        self.totals.add(chunk)
                        yield from cutter.add(chunk)
            yield from cutter.finish()

        return shard_jobs(
            documents(),
            tmp_dir=dest.tmp_dir,
            name_of=self.name_of,
            field=self.field_name,
            compression=self.config.compression,
            skip=kept,
        )

    def output_options(self) -> dict[str, Any]:
        return {**self.options, "shard_format": "parquet"}

    def joined_options(self, current: dict[str, Any], added: dict[str, Any]) -> dict[str, Any]:
        """The dataset's totals (documents, tokens, the largest id) grown by the append's."""
        out = dict(current)
        for name in ("documents", "tokens"):
            out[name] = int(current.get(name, 0)) + int(added.get(name, 0))
        out["max_token_id"] = max(int(current.get("max_token_id", -1)), int(added.get("max_token_id", -1)))
        return out

    def _shards(self) -> int:
        return self.cutter.shards if self.cutter is not None else 0

    def index(self, results: Mapping[int, ShardResult]) -> DatasetIndex:
        if not self._shards():
            first = f": {len(self.skipped)} skipped, first: {self.skipped[0]}" if self.skipped else ""
            raise PackError(f"no documents found in {', '.join(self.srcs)}{first}")
        t = self.totals
        return DatasetIndex(
            shard_format="parquet",
            fields=[self.field_name],
            shards=[results[n].entry for n in range(self._shards())],
            options={
                **self.options,
                "documents": t.documents,
                "tokens": t.tokens,
                "max_token_id": t.max_id,
                "layout": self.target.layout,
            },
            skipped=[{"path": s.path, "reason": s.reason} for s in self.skipped],
            payload_bytes=t.tokens * TOKEN_DTYPES[DTYPES[self.dtype]].itemsize,
        )

    def report(
        self, url: str, index: DatasetIndex, results: Mapping[int, ShardResult], *, kept: int, seconds: float
    ) -> TokensReport:
        shards = self._shards()
        kept = len([n for n in self._kept if n < shards])
        return TokensReport(
            url,
            index,
            documents=self.totals.documents,
            tokens=self.totals.tokens,
            dtype=self.dtype,
            max_token_id=self.totals.max_id,
            dtype_chosen=self.dtype_chosen,
            skipped=self.skipped,
            seconds=seconds,
            shards_written=shards - kept,
            shards_kept=kept,
        )

    def complete(self, url: str, index: DatasetIndex, *, skipped: list[Skip], seconds: float) -> TokensReport:
        opts = index.options
        return TokensReport(
            url,
            index,
            documents=int(opts.get("documents", index.samples)),
            tokens=int(opts.get("tokens", 0)),
            dtype=str(opts.get("dtype", "int32")),
            max_token_id=int(opts.get("max_token_id", -1)),
            dtype_chosen=True,
            skipped=skipped,
            seconds=seconds,
            shards_kept=len(index.shards),
            already_complete=True,
        )

    def late_skips(self, results: Mapping[int, ShardResult]) -> list[Skip]:
        return self.skipped  # (documents and files: found while reading, which is while writing)


def _shard_name(prefix: str, number: int) -> str:
    return f"{prefix}-{number:06d}{PARQUET_SUFFIX}"


@dataclass
class _Totals:
    """Documents, tokens and the largest id seen, over the documents kept."""

    documents: int = 0
    tokens: int = 0
    max_id: int = -1

    def add(self, chunk: Chunk) -> None:
        if chunk.ids.size:
            self.max_id = max(self.max_id, int(chunk.ids.max()))
        self.documents += len(chunk.keys)
        self.tokens += int(chunk.ids.size)


__all__ = ["TokensReport", "load_tokenizer", "pack_tokens"]
