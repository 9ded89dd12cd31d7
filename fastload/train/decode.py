"""Decoding sample fields by extension. Nothing is unpickled unless the user opts in.

Built in: ``cls``/``cls2``/``index`` -> int, ``txt``/``text`` -> str, ``json`` -> object, ``npy`` -> numpy
array (``allow_pickle=False``), ``pt``/``pth``/``pickle``/``pyd`` -> refused unless ``allow_pickle=True``,
images (``jpg``, ``jpeg``, ``png``, ``webp``) -> ``PIL.Image`` (needs Pillow; ``images=False`` keeps bytes),
token ids (``u16``, ``i32``: little-endian, as ``fastload pack-tokens`` writes them) -> 1-D ``torch.int64``
tensor, everything else -> bytes.
The last dotted part of a field decides (``seg.png`` is an image).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import numpy as np

from fastload.core.seqpack import TOKEN_DTYPES
from fastload.errors import ConfigError

IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff"})
PICKLE_EXTENSIONS = frozenset({"pickle", "pkl", "pyd", "pth", "pt"})
# token id fields: extension -> numpy dtype of the stored little-endian ids (see fastload.packing.tokens)


class UnsafeFieldError(ValueError):
    """A field that would be unpickled, which was not allowed."""


def _int(data: bytes) -> int:
    return int(data.decode("utf-8").strip())


def _text(data: bytes) -> str:
    return data.decode("utf-8")


def _npy(data: bytes) -> Any:
    import numpy as np

    return np.load(io.BytesIO(data), allow_pickle=False)


def _image(data: bytes) -> Any:
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise ConfigError(
            "decoding images needs Pillow: pip install pillow (or decode=False for bytes)"
        ) from None
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except UnidentifiedImageError:
        raise ValueError(
            f"not an image Pillow can read ({len(data):,} bytes starting {data[:8]!r})"
        ) from None
    return image


def _tokens(dtype: np.dtype[Any]) -> Callable[[bytes], Any]:
    def decode(data: bytes) -> Any:
        import torch

        if len(data) % dtype.itemsize:
            raise ValueError(f"{len(data)} bytes is not a whole number of {dtype.itemsize}-byte token ids")
        return torch.from_numpy(np.frombuffer(data, dtype=dtype).astype(np.int64))

    return decode


_DECODERS: dict[str, Callable[[bytes], Any]] = {
    "cls": _int,
    "cls2": _int,
    "index": _int,
    "txt": _text,
    "text": _text,
    "json": lambda d: json.loads(d),
    "npy": _npy,
    **{ext: _tokens(dtype) for ext, dtype in TOKEN_DTYPES.items()},
}


def decode_field(field: str, data: bytes, *, images: bool = True, allow_pickle: bool = False) -> Any:
    """Decode one field's bytes by its (last) extension. An empty value (an empty file packed) has nothing
    to decode: it stays ``b""`` (text fields give ``""``, token fields an empty tensor)."""
    ext = field.rsplit(".", 1)[-1].lower()
    if not data and ext not in ("txt", "text") and ext not in TOKEN_DTYPES:
        return data
    if ext in PICKLE_EXTENSIONS:
        if not allow_pickle:
            raise UnsafeFieldError(
                f"field {field!r} would be unpickled; a downloaded dataset is untrusted input: pass "
                "allow_pickle=True only for data you trust, or decode=False to get the bytes"
            )
        if ext in ("pt", "pth"):
            import torch

            return torch.load(io.BytesIO(data), weights_only=False)
        import pickle

        return pickle.loads(data)  # the user opted in
    if ext in IMAGE_EXTENSIONS:
        return _image(data) if images else data
    decoder = _DECODERS.get(ext)
    return decoder(data) if decoder is not None else data


def decode_sample(
    sample: dict[str, Any], *, images: bool = True, allow_pickle: bool = False
) -> dict[str, Any]:
    """A new dict with every non-``__`` field decoded."""
    return {
        k: (
            v
            if k.startswith("__") or not isinstance(v, bytes)
            else decode_field(k, v, images=images, allow_pickle=allow_pickle)
        )
        for k, v in sample.items()
    }
