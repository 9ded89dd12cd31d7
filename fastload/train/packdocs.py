"""One document's token ids from what a :class:`fastload.PackedSequences` upstream gives: a token field's
little-endian bytes (``tokens.u16`` / ``tokens.i32``, as ``decode=False`` reads them), a 1-D tensor, array or
list of ints; anything else (a collated batch, 2-D data, negative ids) refused naming what to do."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fastload.core.seqpack import TOKEN_DTYPES
from fastload.errors import ConfigError


def refuse_collated(sample: dict[str, Any]) -> None:
    """A dict whose ``__key__`` is a list is a batch a DataLoader collated, not a sample."""
    if isinstance(sample.get("__key__"), (list, tuple)):
        raise ConfigError(
            f"got a collated batch of {len(sample['__key__'])} samples (each field a list), "
            "not samples: pass collate_fn=list to the DataLoader that feeds PackedSequences"
        )


def token_ids(doc: Any, name: str | None, where: str) -> np.ndarray:
    """The ids of ``doc`` (the value of field ``name`` of the sample ``where`` names, or a document)."""
    if isinstance(doc, (bytes, bytearray, memoryview)):
        ext = (name or "").rsplit(".", 1)[-1]
        if ext not in TOKEN_DTYPES:
            raise ConfigError(
                f"{where}: field {name!r} holds bytes; token bytes need a field ending in "
                f"{' or '.join('.' + e for e in TOKEN_DTYPES)}"
            )
        if len(doc) % TOKEN_DTYPES[ext].itemsize:
            raise ConfigError(f"{where}: {len(doc)} bytes in {name!r} is not a whole number of token ids")
        return np.frombuffer(doc, dtype=TOKEN_DTYPES[ext])
    arr = doc.detach().cpu().numpy() if isinstance(doc, torch.Tensor) else np.asarray(doc)
    if arr.ndim != 1 or (arr.dtype.kind not in "iu" and arr.size):
        raise ConfigError(
            f"{where} is not a 1-D sequence of integer token ids (got {arr.dtype} with shape "
            f"{arr.shape}); give token ids, e.g. from a `fastload pack-tokens` dataset"
        )
    if arr.size and arr.dtype.kind == "i" and int(arr.min()) < 0:
        at = int(arr.argmin())
        raise ConfigError(
            f"{where} holds a negative token id ({int(arr[at])} at position {at}); ids are >= 0"
        )
    return arr


__all__ = ["refuse_collated", "token_ids"]
