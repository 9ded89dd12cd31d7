"""decode="cuda" (fastload.train.gpudecode): batching, CPU fallback and the errors, with an injected device
decoder on the CPU (torchvision and CUDA are not needed)."""

from __future__ import annotations

import io
import sys
from typing import Any

import numpy as np
import pytest
import torch

import fastload
from fastload.errors import ConfigError
from fastload.train.feed import Loader
from fastload.train.gpudecode import DeviceImageDecoder, nvjpeg_decoder, pillow_rgb

Image = pytest.importorskip("PIL.Image")


def encoded(fmt: str, size: tuple[int, int] = (8, 6), mode: str = "RGB", seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(size[1], size[0], len(mode)), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels if mode != "L" else pixels[..., 0], mode).save(out, fmt, quality=95)
    return out.getvalue()


class FakeNvjpeg:
    """Decodes on the CPU like nvJPEG would on the device (Pillow), recording each call; refuses CMYK as
    nvJPEG does in some builds (raising for the whole call)."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, data: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        self.calls.append(len(data))
        out = []
        for t in data:
            raw = t.numpy().tobytes()
            if Image.open(io.BytesIO(raw)).mode == "CMYK":
                raise RuntimeError("nvjpeg: unsupported JPEG (CMYK)")
            out.append(pillow_rgb(raw).to(device))
        return out


def test_jpegs_in_one_call_others_on_the_cpu() -> None:
    fake = FakeNvjpeg()
    decoder = DeviceImageDecoder("cpu", decode_jpegs=fake)
    blobs = [encoded("JPEG", seed=0), encoded("PNG", seed=1), encoded("JPEG", seed=2)]
    batch = decoder({"jpg": blobs, "cls": torch.tensor([1, 2, 3]), "__key__": ["a", "b", "c"]})
    assert fake.calls == [2]  # both JPEGs in one batched call; the PNG never reaches the device decoder
    assert decoder.cpu_fallbacks == 1 and decoder.device_decoded == 2
    images = batch["jpg"]
    assert images.shape == (3, 3, 6, 8) and images.dtype == torch.uint8
    for got, blob in zip(images, blobs, strict=True):
        assert torch.equal(got, pillow_rgb(blob))  # same tensors (here the same decoder)
    assert batch["cls"].tolist() == [1, 2, 3] and batch["__key__"] == ["a", "b", "c"]


def test_an_image_the_device_refuses_falls_back_alone() -> None:
    fake = FakeNvjpeg()
    decoder = DeviceImageDecoder("cpu", decode_jpegs=fake)
    cmyk = encoded("JPEG", mode="CMYK", seed=3)
    blobs = [encoded("JPEG", seed=4), cmyk, encoded("JPEG", seed=5)]
    images = decoder({"image.jpeg": blobs})["image.jpeg"]
    assert fake.calls == [3, 1, 1, 1]  # the batch failed: each tried alone, the CMYK one on the CPU
    assert decoder.cpu_fallbacks == 1 and images.shape == (3, 3, 6, 8)
    assert torch.equal(images[1], pillow_rgb(cmyk))


def test_sizes_that_differ_give_a_list_and_tuples_are_decoded() -> None:
    decoder = DeviceImageDecoder("cpu", decode_jpegs=FakeNvjpeg())
    blobs = [encoded("JPEG", (8, 6)), encoded("JPEG", (4, 4))]
    images, labels = decoder((blobs, torch.tensor([0, 1])))
    assert [tuple(t.shape) for t in images] == [(3, 6, 8), (3, 4, 4)] and labels.tolist() == [0, 1]
    assert decoder({"txt": [b"not", b"images"]}) == {"txt": [b"not", b"images"]}


def test_loader_decodes_after_the_transfer() -> None:
    blobs = [encoded("JPEG", seed=i) for i in range(4)]
    batches = [
        {"jpg": blobs[:2], "cls": torch.tensor([0, 1])},
        {"jpg": blobs[2:], "cls": torch.tensor([2, 3])},
    ]
    decoder = DeviceImageDecoder("cpu", decode_jpegs=FakeNvjpeg())
    loader = Loader(batches, device="cpu", on_device=decoder)
    out = list(loader)
    assert [b["jpg"].shape for b in out] == [(2, 3, 6, 8)] * 2 and loader.stats.batches == 2
    assert torch.equal(out[1]["jpg"][0], pillow_rgb(blobs[2]))


def test_decode_cuda_needs_a_cuda_device(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match=r'decode="cuda" .* needs device="cuda"'):
        fastload.loader([b"x"], num_workers=0, decode="cuda")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA GPU"):
            fastload.loader([b"x"], num_workers=0, device="cuda", decode="cuda")


def test_no_torchvision_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.setitem(sys.modules, "torchvision.io", None)
    with pytest.raises(ConfigError, match="needs torchvision"):
        nvjpeg_decoder()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a GPU machine without torchvision
    with pytest.raises(ConfigError, match="needs torchvision"):
        fastload.loader([b"x"], num_workers=0, device="cuda", decode="cuda")
