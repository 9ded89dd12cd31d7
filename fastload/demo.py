"""``fastload demo-data DIR``: a small, deterministic tree of sample files to try fastload on."""

from __future__ import annotations

import io
import json
import os
import random

import numpy as np


def make_demo_tree(
    root: str | os.PathLike[str],
    *,
    samples: int = 2000,
    seed: int = 0,
    min_bytes: int = 2048,
    max_bytes: int = 65536,
) -> int:
    """Write ``samples`` samples under ``root`` (``train/`` and ``val/`` folders, class subfolders),
    each an ``.npy`` array, a ``.cls`` label and a ``.json`` record. Returns the number of files written."""
    rng = random.Random(seed)
    root = os.fspath(root)
    files = 0
    for i in range(samples):
        split = "val" if i % 10 == 9 else "train"
        label = rng.randrange(10)
        folder = os.path.join(root, split, f"class{label}")
        os.makedirs(folder, exist_ok=True)
        stem = os.path.join(folder, f"{i:06d}")
        n = rng.randrange(min_bytes, max_bytes) // 4
        array = np.frombuffer(rng.randbytes(4 * n), dtype=np.float32)
        buf = io.BytesIO()
        np.save(buf, array)
        with open(stem + ".npy", "wb") as f:
            f.write(buf.getvalue())
        with open(stem + ".cls", "w") as f:
            f.write(str(label))
        with open(stem + ".json", "w") as f:
            json.dump({"id": i, "label": label, "split": split}, f)
        files += 3
    return files
