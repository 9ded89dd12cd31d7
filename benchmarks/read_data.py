"""The read benchmark's data: small JPEG files, their tar shards (``fastload.pack``) and litdata's format.

Made once per (count, seed, shard size, chunk size) under ``--data-dir`` (default
``/tmp/fastload-readbench``) and reused; ``manifest.json`` is written last, so a folder without it is
incomplete and is made again. Every JPEG is a real Pillow encode of a random-ish picture (a smooth random
field plus grain, random size 256-512 x 256-448, quality 80-95), about 75 KiB on average; each sample
also has a ``.cls`` label. The manifest lists every sample's key, sizes, label and CRC32C, from which the
benchmark computes the digest each reader must reproduce.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from crc32c import crc32c

FORMAT_VERSION = 1
GRAIN_TILE = 1024
GRAIN_AMPLITUDE = 30.0
LITDATA_CHUNK = "64MB"  # litdata's documented recommendation
MASK64 = (1 << 64) - 1


def key_of(i: int) -> str:
    """Key of sample ``i``: 1,000 samples per folder, as a big image dataset on disk is laid out."""
    return f"{i // 1000:03d}/{i:07d}"


def sample_digest(key: str, jpg: bytes | memoryview, cls: bytes | memoryview) -> int:
    """CRC32C of one sample (key, jpg bytes, cls bytes), the term a reader adds to its digest."""
    return crc32c(cls, crc32c(jpg, crc32c(key.encode())))


def combine(digests: Iterable[int]) -> int:
    """Order-independent digest of a set of samples: the sum of their CRCs modulo 2**64."""
    return sum(digests) & MASK64


def _jpeg(i: int, seed: int, grain: Any) -> bytes:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng((seed, i))
    w, h = int(rng.integers(256, 513)), int(rng.integers(256, 449))
    field = rng.integers(0, 256, size=(6, 6, 3), dtype=np.uint8)
    base = np.asarray(Image.fromarray(field).resize((w, h), Image.Resampling.BICUBIC), dtype=np.float32)
    y, x = int(rng.integers(0, GRAIN_TILE - h)), int(rng.integers(0, GRAIN_TILE - w))
    pixels = np.clip(base + GRAIN_AMPLITUDE * grain[y : y + h, x : x + w], 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=int(rng.integers(80, 96)))
    return out.getvalue()


def _make_files(files: Path, count: int, seed: int) -> list[list[Any]]:
    import numpy as np

    grain = (
        np.random.default_rng((seed, 1 << 40))
        .normal(0, 1, size=(GRAIN_TILE, GRAIN_TILE, 3))
        .astype(np.float32)
    )
    samples = []
    began = time.perf_counter()
    for i in range(count):
        key = key_of(i)
        jpg, cls = _jpeg(i, seed, grain), b"%d" % (i % 1000)
        path = files / key
        path.parent.mkdir(parents=True, exist_ok=True)
        (files / f"{key}.jpg").write_bytes(jpg)
        (files / f"{key}.cls").write_bytes(cls)
        samples.append([key, len(jpg), len(cls), i % 1000, sample_digest(key, jpg, cls)])
        if (i + 1) % 5000 == 0:
            print(f"  {i + 1:,} JPEGs in {time.perf_counter() - began:.0f} s", flush=True)
    return samples


def _litdata_item(arg: tuple[str, str]) -> dict[str, Any]:
    root, key = arg
    return {
        "key": key,
        "jpg": Path(root, f"{key}.jpg").read_bytes(),
        "cls": Path(root, f"{key}.cls").read_bytes(),
    }


def _make_litdata(files: Path, out: Path, keys: Sequence[str], workers: int) -> None:
    import litdata

    litdata.optimize(
        fn=_litdata_item,
        inputs=[(str(files), k) for k in keys],
        output_dir=str(out),
        chunk_bytes=LITDATA_CHUNK,
        num_workers=workers,
        reorder_files=False,
        keep_data_ordered=True,
        verbose=False,
    )


def _repack_if_stale(manifest: dict[str, Any], shard_bytes: int, workers: int) -> None:
    """Re-pack cached shards whose index lacks what the current fastload writes (the member layout,
    which lets readers skip header parsing), so the benchmark measures today's packer output."""
    shards = Path(manifest["shards"])
    index = json.loads((shards / "index.json").read_text())
    import fastload

    if index.get("version", 1) >= 2:
        return
    if all("member_fields" in s for s in index["shards"]):
        # index v2 (each sample's CRC32C in a sidecar table, checked on read): what pack writes now
        from fastload.packing.upgrade import upgrade_index

        print(f"upgrading {shards} to index v2 ...", flush=True)
        upgrade_index(str(shards))
        return

    print(f"re-packing {shards} (its index predates the member layout) ...", flush=True)
    fresh = shards.with_name(shards.name + ".new")
    if fresh.exists():
        shutil.rmtree(fresh)
    fastload.pack(
        manifest["files"], str(fresh), shard_size_bytes=shard_bytes, workers=workers, progress=False
    )
    shutil.rmtree(shards)
    os.replace(fresh, shards)


def ensure(data_dir: Path, *, count: int, seed: int, shard_bytes: int, workers: int = 2) -> dict[str, Any]:
    """The dataset for these settings (made if missing): paths plus the per-sample manifest."""
    tag = f"v{FORMAT_VERSION}-n{count}-s{seed}-shard{shard_bytes >> 20}m-lit{LITDATA_CHUNK}"
    root = data_dir / tag
    manifest_path = root / "manifest.json"
    if manifest_path.exists():
        manifest: dict[str, Any] = json.loads(manifest_path.read_text())
        if all(Path(manifest[p]).exists() for p in ("files", "shards", "litdata")):
            _repack_if_stale(manifest, shard_bytes, workers)
            return manifest
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    files, shards, lit = root / "files", root / "shards", root / "litdata"
    print(f"making {count:,} JPEGs under {files} (once; cached) ...", flush=True)
    began = time.perf_counter()
    samples = _make_files(files, count, seed)
    made_s = time.perf_counter() - began
    import fastload

    began = time.perf_counter()
    fastload.pack(str(files), str(shards), shard_size_bytes=shard_bytes, workers=workers, progress=False)
    pack_s = time.perf_counter() - began
    began = time.perf_counter()
    _make_litdata(files, lit, [s[0] for s in samples], workers)
    lit_s = time.perf_counter() - began
    tars = sorted(p.name for p in shards.iterdir() if p.suffix == ".tar")
    manifest = {
        "tag": tag,
        "count": count,
        "seed": seed,
        "files": str(files),
        "shards": str(shards),
        "litdata": str(lit),
        "tars": tars,
        "shard_bytes": sum((shards / n).stat().st_size for n in tars),
        "litdata_bytes": sum(p.stat().st_size for p in lit.iterdir()),
        "payload_bytes": sum(s[1] + s[2] for s in samples),
        "samples": samples,  # [key, jpg bytes, cls bytes, label, crc]
        "seconds": {"jpegs": made_s, "pack": pack_s, "litdata": lit_s},
    }
    tmp = manifest_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest))
    os.replace(tmp, manifest_path)
    print(
        f"  made in {made_s:.0f} s, packed into {len(tars)} shards in {pack_s:.0f} s, "
        f"litdata in {lit_s:.0f} s",
        flush=True,
    )
    return manifest
