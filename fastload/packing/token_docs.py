"""Reading the documents of one ``pack-tokens`` input (JSONL or Parquet) as chunks of token ids: a flat id
array plus per-document lengths, checked in bulk; documents that are not token ids become :class:`Skip`
entries naming the file and line or row."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from fastload.config import S3Config
from fastload.errors import ConfigError, PackError, Skip, shown
from fastload.packing.token_inputs import TokenInput, open_input
from fastload.packing.tokenizer_hook import Tokenizer
from fastload.storage.inputs import stamp

CHUNK_DOCS = 4096


@dataclass
class Chunk:
    """Documents of one input, in order: ``ids[offsets[i]:offsets[i + 1]]`` is document ``i``."""

    keys: list[str]
    rows: list[int]
    ids: np.ndarray
    lengths: np.ndarray


class Reader:
    """Reads documents from one input as chunks; bad documents become :class:`Skip` entries."""

    def __init__(
        self,
        inp: TokenInput,
        *,
        column: str,
        key_column: str | None,
        tokenizer: Tokenizer | None,
        s3_config: S3Config | None,
        skipped: list[Skip],
        bos_id: int | None = None,
        eos_id: int | None = None,
    ) -> None:
        self.inp, self.column, self.key_column = inp, column, key_column
        self.tokenizer, self.s3_config, self.skipped = tokenizer, s3_config, skipped
        self.bos = np.asarray([] if bos_id is None else [bos_id], dtype=np.int64)
        self.eos = np.asarray([] if eos_id is None else [eos_id], dtype=np.int64)

    def where(self, row: int) -> str:
        return f"{self.inp.url} row {row}" if self.inp.is_parquet else f"{self.inp.url}:{row + 1}"

    def _key(self, row: int, record_key: Any) -> str:
        return str(record_key) if self.key_column is not None else f"{self.inp.key_prefix}/{row}"

    def _ids(self, value: Any, row: int, tokenized: Any = None) -> np.ndarray | None:
        """A document's ids as a 1-D int64 array (``bos``/``eos`` added), or None (and a skip) when they
        are not token ids. ``tokenized``: the tokenizer's output for ``value``, made in a batch."""
        try:
            if self.tokenizer is not None:
                if not isinstance(value, str):
                    raise ValueError(f"{self.column!r} is {type(value).__name__}, not text")
                value = self.tokenizer(value) if tokenized is None else tokenized
                if isinstance(value, dict) or hasattr(value, "keys"):
                    value = value["input_ids"]
                if hasattr(value, "detach"):
                    value = value.detach().cpu().numpy()
            arr = np.asarray(value)
            if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
                raise ValueError(f"{self.column!r} is not a list of integers")
            arr = arr.astype(np.int64, copy=False)
            if self.bos.size or self.eos.size:
                arr = np.concatenate((self.bos, arr, self.eos))
            return arr
        except Exception as exc:
            self.skipped.append(Skip(self.where(row), f"{exc}; document left out"))
            return None

    def _with_ends(self, ids: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Documents ``ids`` (of ``lengths``) with ``bos`` before and ``eos`` after each."""
        b, e = self.bos.size, self.eos.size
        if not (b or e):
            return ids, lengths
        new_lengths = lengths + b + e
        starts = np.concatenate(([0], np.cumsum(new_lengths)[:-1])).astype(np.int64)
        old_starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
        out = np.empty(int(new_lengths.sum()), dtype=np.int64)
        body = np.repeat(starts + b - old_starts, lengths) + np.arange(ids.size, dtype=np.int64)
        out[body] = ids
        if b:
            out[starts] = self.bos[0]
        if e:
            out[starts + b + lengths] = self.eos[0]
        return out, new_lengths

    def _batch(self, values: list[Any]) -> list[Any]:
        """The tokenizer's outputs for ``values`` made at once where it has a batch form (None each
        where it has none, or the batch failed: then each is tokenised alone and its error reported)."""
        batch = getattr(self.tokenizer, "batch", None)
        if batch is None or not values or not all(isinstance(v, str) for v in values):
            return [None] * len(values)
        try:
            out = list(batch(values))
        except Exception:
            return [None] * len(values)
        return out if len(out) == len(values) else [None] * len(values)

    def chunks(self) -> Iterator[Chunk]:
        """The file's documents in chunks. A local file that changed while it was read (:func:`stamp`
        before and after, as GNU tar checks) stops the pack: its documents went into shards as they were
        read, so they may mix two versions, and cannot be read again."""
        try:
            with open_input(self.inp.url, self.s3_config) as f:
                before = stamp(f)
                yield from (self._parquet(f) if self.inp.is_parquet else self._jsonl(f))
                if before is not None and stamp(f) != before:
                    raise PackError(
                        f"{shown(self.inp.url)}: file changed as we read it (written to while being "
                        "packed: its size, mtime or ctime moved), so documents read from it may mix two "
                        "versions; delete the destination and pack again once the files stop changing"
                    )
        except (OSError, ValueError) as exc:  # an unreadable or corrupt file: left out whole
            if isinstance(exc, ConfigError):
                raise
            self.skipped.append(
                Skip(self.inp.url, f"cannot read the file ({exc}); the rest of it is left out")
            )

    def _jsonl(self, f: IO[bytes]) -> Iterator[Chunk]:
        batched = getattr(self.tokenizer, "batch", None) is not None
        rows: list[int] = []
        record_keys: list[Any] = []
        values: list[Any] = []
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
            value = record[self.column]
            # (np.asarray takes JSON true as 1: look for booleans only in lines that spell one)
            if (b"true" in line or b"false" in line) and _holds_bool(value):
                why = f"{self.column!r} holds true/false, not token ids; document left out"
                self.skipped.append(Skip(self.where(row), why))
                continue
            rows.append(row)
            record_keys.append(record.get(self.key_column) if self.key_column else None)
            # ids are made an array at once (a chunk of Python ints is ~36 bytes an id); text is kept
            # for a batch only when the tokenizer has one
            values.append(value if batched else self._ids(value, row))
            if len(values) >= CHUNK_DOCS:
                yield from self._made(rows, record_keys, values, batched=batched)
                rows, record_keys, values = [], [], []
        yield from self._made(rows, record_keys, values, batched=batched)

    def _made(
        self, rows: list[int], record_keys: list[Any], values: list[Any], *, batched: bool = True
    ) -> Iterator[Chunk]:
        """The chunk of these documents (rows, their key column's values, their ids or text; with
        ``batched=False`` their arrays made already, or None where left out)."""
        keys: list[str] = []
        kept: list[int] = []
        docs: list[np.ndarray] = []
        made = self._batch(values) if batched else values
        for row, record_key, value, tokenized in zip(rows, record_keys, values, made, strict=True):
            arr = self._ids(value, row, tokenized) if batched else tokenized
            if arr is not None:
                keys.append(self._key(row, record_key))
                kept.append(row)
                docs.append(arr)
        if docs:
            yield _chunk(keys, kept, docs)

    def _parquet(self, f: IO[bytes]) -> Iterator[Chunk]:
        import pyarrow as pa
        import pyarrow.compute as pc

        from fastload.formats.parquet.arrowfile import open_parquet

        parquet = open_parquet(f)
        columns = [self.column] + ([self.key_column] if self.key_column else [])
        row = 0
        for batch in parquet.iter_batches(batch_size=CHUNK_DOCS, columns=columns):
            col = batch.column(0)
            record_keys = batch.column(1).to_pylist() if self.key_column else [None] * len(batch)
            n = len(batch)
            if self.tokenizer is None and (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)):
                lengths = pc.list_value_length(col).fill_null(0).to_numpy(zero_copy_only=False)
                flat = col.flatten()
                if pa.types.is_integer(flat.type) and flat.null_count == 0 and col.null_count == 0:
                    ids = flat.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
                    keys = [self._key(row + i, record_keys[i]) for i in range(n)]
                    ids, lengths = self._with_ends(ids, lengths.astype(np.int64))
                    yield Chunk(keys, list(range(row, row + n)), ids, lengths)
                    row += n
                    continue
            values = col.to_pylist()  # slow path: text to tokenise, or lists with nulls to report
            for i, value in enumerate(values):
                if value is None:
                    self.skipped.append(
                        Skip(self.where(row + i), f"{self.column!r} is null; document left out")
                    )
            present = [i for i, value in enumerate(values) if value is not None]
            yield from self._made(
                [row + i for i in present], [record_keys[i] for i in present], [values[i] for i in present]
            )
            row += n


def _holds_bool(value: Any) -> bool:
    return isinstance(value, list) and any(v is True or v is False for v in value)


def _chunk(keys: list[str], rows: list[int], docs: list[np.ndarray]) -> Chunk:
    lengths = np.fromiter((d.size for d in docs), dtype=np.int64, count=len(docs))
    ids = np.concatenate(docs) if docs else np.zeros(0, dtype=np.int64)
    return Chunk(keys, rows, ids.astype(np.int64, copy=False), lengths)


def check_range(chunk: Chunk, reader: Reader, *, limit: int, vocab_size: int | None, dtype: str) -> Chunk:
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
    return Chunk(
        [k for k, ok in zip(chunk.keys, keep_list, strict=True) if ok],
        [r for r, ok in zip(chunk.rows, keep_list, strict=True) if ok],
        chunk.ids[np.repeat(keep, chunk.lengths)],
        chunk.lengths[keep],
    )
