"""Samples for the ShardWriter tests, importable cheaply by the processes the parts tests start."""

from __future__ import annotations

import random
from typing import Any


def samples(n: int, seed: int = 0, size: int = 3000) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {
            "__key__": f"s/{i:05d}",
            "bin": rng.randbytes(rng.randrange(0, size)),
            "json": {"label": i % 7, "name": f"n{i}"},
            "txt": f"a caption {i} é",
            "cls": i % 10,
        }
        for i in range(n)
    ]
