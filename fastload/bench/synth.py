"""The embedded default dataset: small synthetic JPEGs with labels, as files and packed, cached between runs.

Layout under ``CACHE/synthetic-v{VERSION}-{images}-s{seed}/``, the way image datasets usually sit on disk
(ImageFolder: the label is the class folder, one file per sample)::

    files/class_03/000123.jpg      96-192 px on a side, JPEG quality 85, about 6 KiB each
    packed/shard-000000.tar ...    the same files packed by fastload.pack (16 shards), plus index.json
    complete.json                  written last: a folder without it is rebuilt

Every image is drawn from ``numpy.random.default_rng((seed, index))``: the same arguments give the same
bytes on every machine with the same Pillow/libjpeg.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

VERSION = 1
CLASSES = 10
SHARDS = 16
MIN_PX, MAX_PX = 96, 192


@dataclass(frozen=True)
class SyntheticData:
    """Where a generated dataset lives, and its size."""

    root: str
    images: int
    file_bytes: int

    @property
    def files(self) -> str:
        return os.path.join(self.root, "files")

    @property
    def packed(self) -> str:
        return os.path.join(self.root, "packed")


def relpath(index: int) -> str:
    return f"class_{index % CLASSES:02d}/{index:06d}.jpg"


def image_bytes(index: int, seed: int) -> bytes:
    """One JPEG: a random smooth colour field with a little noise (compresses like a photo thumbnail)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng((seed, index))
    w, h = (int(v) for v in rng.integers(MIN_PX, MAX_PX + 1, size=2))
    x = np.linspace(0, 1, w, dtype=np.float32)[None, :, None]
    y = np.linspace(0, 1, h, dtype=np.float32)[:, None, None]
    a, b, c = (rng.uniform(0, 255, size=(1, 1, 3)).astype(np.float32) for _ in range(3))
    field = a + b * x + c * y * x + 40 * np.sin(rng.uniform(2, 12) * (x + y))
    field += rng.integers(0, 24, size=(h, w, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(np.mod(field, 256).astype(np.uint8), "RGB").save(out, "JPEG", quality=85)
    return out.getvalue()


def _write_range(args: tuple[str, int, int, int]) -> int:
    folder, start, stop, seed = args
    total = 0
    for i in range(start, stop):
        path = os.path.join(folder, relpath(i))
        data = image_bytes(i, seed)
        with open(path, "wb") as f:
            f.write(data)
        total += len(data)
    return total


def ensure_synthetic(
    cache_dir: str,
    images: int,
    *,
    seed: int = 0,
    workers: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> SyntheticData:
    """The cached dataset for (images, seed), generated and packed first if missing or incomplete."""
    root = os.path.join(cache_dir, f"synthetic-v{VERSION}-{images}-s{seed}")
    marker = os.path.join(root, "complete.json")
    try:
        with open(marker) as f:
            done = json.load(f)
        return SyntheticData(root, int(done["images"]), int(done["file_bytes"]))
    except (OSError, ValueError, KeyError):
        pass
    if os.path.exists(root):
        shutil.rmtree(root)
    files = os.path.join(root, "files")
    for c in range(CLASSES):
        os.makedirs(os.path.join(files, f"class_{c:02d}"), exist_ok=True)
    if progress:
        progress(f"generating {images:,} synthetic JPEGs under {root} (once; cached)")
    jobs = max(1, min(workers or os.cpu_count() or 1, 8))
    step = -(-images // (jobs * 4))
    ranges = [(files, a, min(a + step, images), seed) for a in range(0, images, step)]
    if jobs == 1:
        file_bytes = sum(map(_write_range, ranges))
    else:
        with ProcessPoolExecutor(jobs) as pool:
            file_bytes = sum(pool.map(_write_range, ranges))
    from fastload.packing.pack import pack

    pack(files, os.path.join(root, "packed"), max_samples=-(-images // SHARDS), progress=False)
    with open(marker, "w") as f:
        json.dump({"images": images, "file_bytes": file_bytes, "seed": seed, "version": VERSION}, f)
    return SyntheticData(root, images, file_bytes)
