"""Feeding a GPU: does ``fastload.loader(..., device="cuda")`` hide the host-to-device copy, and are the
batches that reach the model exactly the bytes that were packed?

A prepared check for a machine with a CUDA device (it also runs on CPU, as a smoke test of the same
code): packs N synthetic uint8 images (3x224x224) with labels, then runs a small convolutional model's
training step over them in four interleaved variants, medians of --reps:

- ``plain``: ``fastload.DataLoader`` without pinned memory, batches moved with ``.to(device)`` in the loop;
- ``pinned``: the same with ``pin_memory=True`` and ``non_blocking=True`` copies in the loop;
- ``prefetch``: ``fastload.loader(..., device=device)``: pinned memory and the next batch copied on a side
  CUDA stream while the current step runs;
- ``data-only``: the prefetch variant with no model step (the loader's own ceiling).

It reports samples/s, the share of each step spent waiting for data (``loader.stats``), and checks that
the sum of every batch computed on the device equals the sum computed from the packed bytes (a stream
synchronisation bug would show up as a mismatch). Usage::

    python benchmarks/gpu_feed.py                 # on the GPU if there is one
    python benchmarks/gpu_feed.py --device cpu --count 512 --reps 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import fastload


def make_dataset(root: Path, count: int, seed: int) -> tuple[Path, int]:
    """``count`` samples of a 3x224x224 uint8 image (.npy) and a label (.cls), packed; and their byte sum."""
    rng = np.random.default_rng(seed)
    src = root / "src"
    total = 0
    for i in range(count):
        image = rng.integers(0, 256, size=(3, 224, 224), dtype=np.uint8)
        total += int(image.sum(dtype=np.int64))
        folder = src / f"{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / f"{i:06d}.npy", image)
        (folder / f"{i:06d}.cls").write_text(str(i % 10))
    fastload.pack(src, root / "packed", shard_size_bytes=64 << 20, progress=False)
    return root / "packed", total


def to_pair(sample: dict[str, Any]) -> tuple[torch.Tensor, int]:
    return torch.as_tensor(sample["npy"]), int(sample["cls"])


def model_for(device: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 5, stride=2),
        torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, stride=2),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(64, 10),
    ).to(device)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def run(variant: str, packed: Path, device: torch.device, args: argparse.Namespace) -> dict[str, Any]:
    cuda = device.type == "cuda"
    prefetch = variant in ("prefetch", "data-only")
    loader = fastload.loader(
        str(packed),
        batch_size=args.batch_size,
        num_workers=args.workers,
        device=device if prefetch else None,
        pin_memory=cuda and variant != "plain",
        map=to_pair,
    )
    model, optimizer = model_for(device)
    checksum = torch.zeros((), dtype=torch.int64, device=device)
    samples = 0
    if cuda:
        torch.cuda.synchronize()
    started = time.perf_counter()
    for images, labels in loader:
        if not prefetch:
            images = images.to(device, non_blocking=variant == "pinned")
            labels = labels.to(device, non_blocking=variant == "pinned")
        checksum += images.sum(dtype=torch.int64)
        samples += len(labels)
        if variant != "data-only":
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(images.float() / 255), labels)
            loss.backward()
            optimizer.step()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    return {
        "variant": variant,
        "seconds": seconds,
        "samples": samples,
        "samples_per_s": samples / seconds,
        "wait_share": loader.stats.wait_share,
        "checksum": int(checksum.item()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--count", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=min(8, max(2, (os.cpu_count() or 2) - 1)))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    device = torch.device(args.device)
    variants = ["plain", "pinned", "prefetch", "data-only"]
    with tempfile.TemporaryDirectory(prefix="fastload-gpu-") as tmp:
        packed, expected = make_dataset(Path(tmp), args.count, args.seed)
        results: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        for rep in range(args.reps):
            for k in range(len(variants)):
                variant = variants[(k + rep) % len(variants)]
                result = run(variant, packed, device, args)
                results[variant].append(result)
                ok = "ok" if result["checksum"] == expected else "MISMATCH"
                print(
                    f"rep {rep + 1} {variant:<10} {result['samples_per_s']:>9,.0f} samples/s  "
                    f"waiting {100 * result['wait_share']:>3.0f}%  bytes {ok}",
                    flush=True,
                )
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"\ndevice: {name}; {args.count} samples of 3x224x224 uint8, batch {args.batch_size}, "
        f"num_workers {args.workers}, medians of {args.reps}"
    )
    medians = {v: statistics.median(r["samples_per_s"] for r in rs) for v, rs in results.items()}
    for v in variants:
        wait = statistics.median(r["wait_share"] for r in results[v])
        print(
            f"  {v:<10} {medians[v]:>9,.0f} samples/s  waiting {100 * wait:.0f}%  "
            f"x plain {medians[v] / medians['plain']:.2f}"
        )
    bad = [r for rs in results.values() for r in rs if r["checksum"] != expected]
    print("every batch's bytes matched the packed data" if not bad else f"{len(bad)} run(s) MISMATCHED")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"device": name, "args": vars(args) | {"json": str(args.json)}, "results": results}, indent=1
            )
        )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
