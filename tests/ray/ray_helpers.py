"""Helpers for the Ray tests: S3 settings for workers, a source tree of uneven samples, and folder snapshots.

(No ``__init__.py`` in this folder: a package named ``ray`` would shadow Ray itself.)
"""

from __future__ import annotations

import os
import random
from pathlib import Path

REGION = "us-east-1"
ACCESS_KEY, SECRET_KEY = "AKIDRAYTESTS", "ray-tests-secret"


def worker_env(scratch: Path) -> dict[str, str]:
    """Dummy S3 credentials and nothing from this machine's AWS configuration."""
    return {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": REGION,
        "AWS_CONFIG_FILE": os.fspath(scratch / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": os.fspath(scratch / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }


# A member path well over 100 bytes (the ustar name field), so that its tar header needs pax records.
LONG = "a-rather-long-folder-name-" + "x" * 50 + "/and-a-long-file-name-" + "y" * 40


def uneven_files(seed: int = 7) -> dict[str, bytes]:
    """Samples of very uneven sizes (1 byte to larger than a 64 KiB shard) in three top folders, with one to
    three fields each (some missing), multi-dot fields, non-ASCII and over-long names."""
    rng = random.Random(seed)
    files: dict[str, bytes] = {}
    sizes = [1, 511, 512, 513, 3000, 20_000, 9, 45_000, 100, 7000]
    for i in range(60):
        key = f"{['cats', 'dogs', 'birds'][i % 3]}/{i:04d}"
        size = sizes[i % len(sizes)] + rng.randrange(0, 300)
        files[f"{key}.jpg"] = rng.randbytes(size)
        if i % 2 == 0:
            files[f"{key}.cls"] = b"%d" % (i % 5)
        if i % 5 == 1:
            files[f"{key}.seg.png"] = rng.randbytes(rng.randrange(1, 4000))
    files["cats/huge.bin"] = rng.randbytes(100_000)  # larger than a shard: a shard of its own
    files["dogs/é-日本語.txt"] = "こんにちは".encode()
    files[f"birds/{LONG}.jpg"] = rng.randbytes(2100)
    return files


def write_files(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones included): relative path -> bytes."""
    out: dict[str, bytes] = {}
    for root, _dirs, files in os.walk(folder):
        for name in files:
            path = Path(root) / name
            out[path.relative_to(folder).as_posix()] = path.read_bytes()
    return out
