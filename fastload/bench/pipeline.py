"""The per-sample work every variant shares, so variants differ only in how bytes arrive: decode each image
field to a fixed-size ``uint8`` CHW tensor, take the label, count the encoded bytes; collate a batch.

Both are top-level classes/functions so DataLoader workers can pickle them under any start method.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.utils.data

from fastload.train.decode import IMAGE_EXTENSIONS, decode_field


def label_of(key: str, classes: Mapping[str, int]) -> int:
    """The class index of a key's folder (ImageFolder's rule), or -1."""
    folder = key.rpartition("/")[0]
    return classes.get(folder, -1)


class Decode:
    """Raw sample (``{"__key__": ..., field: bytes}``) -> ``{"image", "label", "__key__", "nbytes"}``.

    Every image field is decoded with Pillow (the same call fastload's decoder makes), converted to RGB and
    resized to ``px x px``; the first one is kept. ``cls`` gives the label, else the key's folder via
    ``classes``. ``nbytes`` counts the encoded bytes of all fields. A sample whose image or label does not
    decode is marked ``bad`` (``"key field: why"``) with a blank image: collate leaves it out of the counts,
    so it is named and counted but not measured.
    """

    def __init__(self, px: int, classes: Mapping[str, int]) -> None:
        self.px, self.classes = px, dict(classes)

    def __call__(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        from PIL import Image

        key = str(raw["__key__"])
        nbytes = 0
        image: torch.Tensor | None = None
        label = -1
        bad: str | None = None
        for name, value in raw.items():
            if name.startswith("__") or not isinstance(value, bytes):
                continue
            nbytes += len(value)
            ext = name.rsplit(".", 1)[-1].lower()
            try:
                if ext in IMAGE_EXTENSIONS:
                    img = (
                        decode_field(name, value)
                        .convert("RGB")
                        .resize((self.px, self.px), Image.Resampling.BILINEAR)
                    )
                    if image is None:
                        image = torch.from_numpy(np.array(img)).permute(2, 0, 1)
                elif ext in ("cls", "cls2"):
                    label = int(decode_field(name, value))
            except Exception as exc:  # one bad file must not end the measurement: named and counted
                bad = bad or f"{key}.{name}: {type(exc).__name__}: {exc}"
        if label < 0:
            label = label_of(key, self.classes)
        if image is None:
            image = torch.zeros((3, self.px, self.px), dtype=torch.uint8)
        return {"image": image, "label": label, "__key__": key, "nbytes": nbytes, "bad": bad}


def collate(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Stack images and labels; keys as a list; ``nbytes`` summed; ``size`` the sample count; ``made`` the
    ``time.monotonic()`` at which the batch was complete (system-wide on Linux, so comparable across the
    DataLoader's worker processes) and ``worker`` the DataLoader worker that made it (-1: main process).
    ``bad``: the samples that did not decode (``"key field: why"``), left out of ``size`` and ``nbytes``."""
    info = torch.utils.data.get_worker_info()
    bad = [str(s["bad"]) for s in samples if s.get("bad")]
    return {
        "image": torch.stack([s["image"] for s in samples]),
        "label": torch.tensor([s["label"] for s in samples], dtype=torch.int64),
        "__key__": [s["__key__"] for s in samples],
        "nbytes": sum(int(s["nbytes"]) for s in samples if not s.get("bad")),
        "size": len(samples) - len(bad),
        "bad": bad,
        "made": time.monotonic(),
        "worker": -1 if info is None else info.id,
    }
