"""``decode="cuda"``: JPEGs decoded in batches on the GPU (torchvision's nvJPEG), after the transfer.

The CPU workers only read bytes (images are not decoded there); the collated batch keeps each image field
as a list of ``bytes``. :class:`DeviceImageDecoder` runs on the device prefetcher's side stream: every
image field of a dict batch (by extension: ``jpg``, ``png``, ...; or, for a tuple/list batch, every element
that is a list of ``bytes``) becomes a ``uint8`` RGB tensor ``[B, 3, H, W]`` on the device when the images
share a size, else a list of ``[3, H, W]`` tensors. JPEGs go to the device decoder in one call; what it
cannot decode (PNG, WebP, CMYK or progressive JPEGs nvJPEG refuses, ...) is decoded on the CPU with Pillow
one image at a time and copied over, counted in :attr:`DeviceImageDecoder.cpu_fallbacks`.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from fastload.errors import ConfigError
from fastload.train.decode import IMAGE_EXTENSIONS

JPEG_MAGIC = b"\xff\xd8\xff"
BatchDecoder = Callable[[list[torch.Tensor], torch.device], list[torch.Tensor]]


def is_jpeg(data: bytes) -> bool:
    return data[:3] == JPEG_MAGIC


def nvjpeg_decoder() -> BatchDecoder:
    """torchvision's batched ``decode_jpeg(list, device=...)`` (RGB), or :class:`ConfigError` saying what is
    missing."""
    try:
        from torchvision.io import ImageReadMode, decode_jpeg  # type: ignore[import-not-found, unused-ignore]
    except ImportError as exc:
        raise ConfigError(
            f'decode="cuda" needs torchvision (with nvJPEG, as its CUDA builds have) matching torch '
            f"{torch.__version__}: pip install torchvision ({exc}); or leave decode at its default to "
            "decode on the CPU workers"
        ) from None

    def decode(data: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        out = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
        return list(out) if isinstance(out, (list, tuple)) else [out]

    return decode


def pillow_rgb(data: bytes) -> torch.Tensor:
    """One image decoded on the CPU as a ``uint8`` RGB tensor ``[3, H, W]``."""
    try:
        from PIL import Image
    except ImportError:
        raise ConfigError("decoding images on the CPU needs Pillow: pip install pillow") from None
    with Image.open(io.BytesIO(data)) as image:
        array = np.asarray(image.convert("RGB"))
    return torch.from_numpy(array.copy()).permute(2, 0, 1)


class DeviceImageDecoder:
    """Decodes a batch's image fields on ``device``; ``decode_jpegs`` (default: :func:`nvjpeg_decoder`)
    and ``decode_cpu`` (default: :func:`pillow_rgb`) are replaceable (tests; other decoders)."""

    def __init__(
        self,
        device: str | torch.device,
        *,
        decode_jpegs: BatchDecoder | None = None,
        decode_cpu: Callable[[bytes], torch.Tensor] = pillow_rgb,
    ) -> None:
        self.device = torch.device(device)
        self.decode_jpegs = decode_jpegs if decode_jpegs is not None else nvjpeg_decoder()
        self.decode_cpu = decode_cpu
        self.cpu_fallbacks = 0
        self.device_decoded = 0

    def __call__(self, batch: Any) -> Any:
        if isinstance(batch, dict):
            return {k: self.images(v) if _image_field(k) and _byte_list(v) else v for k, v in batch.items()}
        if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
            return type(batch)(self.images(v) if _byte_list(v) else v for v in batch)
        return batch

    def images(self, blobs: Sequence[bytes]) -> torch.Tensor | list[torch.Tensor]:
        """``blobs`` decoded on the device: stacked when they share a shape, else a list."""
        out: list[torch.Tensor | None] = [None] * len(blobs)
        jpegs = [i for i, b in enumerate(blobs) if is_jpeg(b)]
        decoded: list[torch.Tensor | None]
        if jpegs:
            inputs = [torch.frombuffer(bytearray(blobs[i]), dtype=torch.uint8) for i in jpegs]
            try:
                decoded = list(self.decode_jpegs(inputs, self.device))
            except RuntimeError:  # one image nvJPEG refuses fails the call: try them one by one
                decoded = [self._one(t) for t in inputs]
            for i, tensor in zip(jpegs, decoded, strict=True):
                out[i] = tensor
        for i, tensor in enumerate(out):
            if tensor is None:
                out[i] = self.decode_cpu(bytes(blobs[i])).to(self.device, non_blocking=False)
                self.cpu_fallbacks += 1
            else:
                self.device_decoded += 1
        done = [t for t in out if t is not None]
        if done and all(t.shape == done[0].shape for t in done):
            return torch.stack(done)
        return done

    def _one(self, data: torch.Tensor) -> torch.Tensor | None:
        try:
            return self.decode_jpegs([data], self.device)[0]
        except RuntimeError:
            return None  # decoded on the CPU instead


def _image_field(name: str) -> bool:
    return name.rsplit(".", 1)[-1].lower() in IMAGE_EXTENSIONS


def _byte_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, (bytes, bytearray)) for v in value)
