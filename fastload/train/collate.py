"""Batching token sequences: :func:`pad` (dynamic padding) and :func:`blocks` (packed blocks).

``pad`` pads a batch of variable-length sequences to the longest one in the batch (optionally rounded up),
so a batch carries as little padding as its longest member allows. ``blocks`` stacks the fixed-length
blocks of :class:`fastload.PackedSequences` and joins their ``cu_seqlens`` for a varlen attention kernel.
torch is imported on first use, so ``import fastload`` stays light.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fastload.core.seqpack import TOKEN_DTYPES
from fastload.errors import ConfigError


def _ids(item: Any, field: str | None, what: str) -> np.ndarray:
    """One sequence's token ids as a 1-D integer array."""
    if isinstance(item, dict):
        name = field or _field_of(item)
        where = f"{what} (key {item.get('__key__')!r})"
        if name not in item:
            raise ConfigError(f"{where} has no field {name!r} (it has {sorted(item)}); pass field=NAME")
        value = item[name]
        if isinstance(value, (bytes, bytearray, memoryview)):
            dtype = TOKEN_DTYPES.get(name.rsplit(".", 1)[-1])
            if dtype is None or len(value) % dtype.itemsize:
                raise ConfigError(
                    f"{where}: field {name!r} holds bytes that are not token ids (a field ending in "
                    f"{' or '.join('.' + e for e in TOKEN_DTYPES)}); decode it first"
                )
            return np.frombuffer(value, dtype=dtype)
        item, what = value, where
    if hasattr(item, "detach"):
        item = item.detach().cpu().numpy()
    arr = np.asarray(item)
    if arr.ndim != 1 or (arr.dtype.kind not in "iu" and arr.size):
        raise ConfigError(
            f"{what} is not a 1-D sequence of integer token ids (got {arr.dtype} with shape {arr.shape})"
        )
    return arr


def _field_of(sample: dict[str, Any]) -> str:
    if "input_ids" in sample:
        return "input_ids"
    found = [k for k in sample if k.rsplit(".", 1)[-1] in TOKEN_DTYPES]
    if len(found) != 1:
        raise ConfigError(
            f"sample {sample.get('__key__')!r} has fields {sorted(sample)}: cannot tell which holds the "
            "token ids; pass field=NAME"
        )
    return found[0]


def pad(
    batch: Sequence[Any],
    *,
    pad_id: int = 0,
    pad_to_multiple_of: int | None = None,
    label_ignore_index: int = -100,
    padding_side: str = "right",
    field: str | None = None,
) -> dict[str, Any]:
    """Pad a batch of token sequences to the longest in the batch (rounded up to ``pad_to_multiple_of``).

    Items are 1-D integer tensors/arrays, lists of ints, or dicts holding the ids in ``field`` (default
    ``input_ids``, else the one field ending in ``.u16``/``.i32``, decoded or raw bytes); a dict's own
    ``labels`` sequence (e.g. with a prompt masked) is padded alongside. Returns ``input_ids`` (``int64``,
    ``[batch, length]``), ``attention_mask`` (``int64``, 1 for real tokens), ``labels`` (the ids, or the
    given labels, with ``label_ignore_index`` at padding); other dict entries are passed on as lists.
    """
    import torch

    if not isinstance(batch, Sequence) or isinstance(batch, (str, bytes)) or not batch:
        raise ConfigError("pad() needs a non-empty list of sequences (or of samples holding them)")
    if pad_to_multiple_of is not None and (isinstance(pad_to_multiple_of, bool) or pad_to_multiple_of < 1):
        raise ConfigError(f"pad_to_multiple_of={pad_to_multiple_of!r} must be >= 1 (e.g. 8 or 64)")
    if padding_side not in ("right", "left"):
        raise ConfigError(f"padding_side={padding_side!r}; choose 'right' or 'left'")
    seqs = [_ids(item, field, f"batch item {i}") for i, item in enumerate(batch)]
    given = [item.get("labels") if isinstance(item, dict) else None for item in batch]
    lengths = np.fromiter((s.size for s in seqs), dtype=np.int64, count=len(seqs))
    width = int(lengths.max())
    if pad_to_multiple_of:
        width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    cols = np.arange(width)
    real = cols < lengths[:, None] if padding_side == "right" else cols >= (width - lengths)[:, None]
    input_ids = np.full((len(seqs), width), pad_id, dtype=np.int64)
    input_ids[real] = np.concatenate(seqs) if seqs else []
    labels = np.full((len(seqs), width), label_ignore_index, dtype=np.int64)
    if any(g is not None for g in given):
        for i, (g, s) in enumerate(zip(given, seqs, strict=True)):
            lab = s if g is None else _ids(g, None, f"labels of batch item {i}")
            if lab.size != s.size:
                raise ConfigError(f"batch item {i}: {lab.size} labels for {s.size} token ids")
            labels[i, real[i]] = lab
    else:
        labels[real] = input_ids[real]
    out: dict[str, Any] = {
        "input_ids": torch.from_numpy(input_ids),
        "attention_mask": torch.from_numpy(real.astype(np.int64)),
        "labels": torch.from_numpy(labels),
    }
    if isinstance(batch[0], dict):
        taken = {"labels", field or _field_of(batch[0])}
        for key in batch[0]:
            if key not in taken and key not in out:
                out[key] = [item.get(key) for item in batch]
    return out


def blocks(batch: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Collate :class:`fastload.PackedSequences` blocks: tensors of equal shape are stacked
    (``input_ids``, ``position_ids``, ``labels``: ``[batch, seq_len]``; ``attention_mask``:
    ``[batch, seq_len, seq_len]``).

    ``cu_seqlens`` varies in length per block, so the blocks' are joined with offsets into one ``int32``
    vector for the flattened batch of ``batch x seq_len`` tokens: ``[0, ..., seq_len, ..., 2 x seq_len,
    ..., batch x seq_len]``, which is what FlashAttention's varlen kernels take with ``q.view(-1, heads,
    dim)``; no segment crosses a block boundary. ``max_seqlen`` is the largest over the batch;
    ``num_tokens`` becomes an ``int64`` tensor ``[batch]``.
    """
    import torch

    if not batch:
        raise ConfigError("blocks() needs a non-empty list of PackedSequences blocks")
    first = batch[0]
    if not isinstance(first, dict) or "cu_seqlens" not in first or "input_ids" not in first:
        raise ConfigError("blocks() collates the dicts PackedSequences yields (with input_ids, cu_seqlens)")
    seq_len = int(first["input_ids"].shape[-1])
    out: dict[str, Any] = {}
    for key in first:
        if key == "cu_seqlens":
            tails = [b[key][1:] for b in batch]  # each block's offsets moved by its place: one add for all
            moved = np.repeat(np.arange(len(batch), dtype=np.int32) * seq_len, [len(t) for t in tails])
            joined = torch.cat(tails).to(torch.int32) + torch.from_numpy(moved)
            out[key] = torch.cat([first[key][:1].to(torch.int32), joined])
        elif key == "max_seqlen":
            out[key] = max(int(b[key]) for b in batch)
        elif key == "num_tokens":
            out[key] = torch.tensor([int(b[key]) for b in batch], dtype=torch.int64)
        else:
            values = [b[key] for b in batch]
            out[key] = torch.stack(values) if isinstance(values[0], torch.Tensor) else values
    return out


__all__ = ["blocks", "pad"]
