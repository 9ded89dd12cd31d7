"""Feeding a GPU, measured on one: utilisation, copies, overlap, and decoding on the device.

The one script to run on a CUDA machine (issue 20); it also runs on CPU as a smoke test of the same code
(``--device cpu --smoke``). Sections, each printed and written as a RESULTS.md section (``--markdown``):

1. **copy**: host-to-device GB/s of one batch out of a fastload shared-memory slot, pageable (a view of the
   slot) against pinned (copied out pinned, as ``pin_memory=True`` does), against the measured peak
   (a 256 MiB pinned ``cudaMemcpy``, best of 5). Target: pinned >= 80% of peak.
2. **bytes and overlap** (packed uint8 ``.npy`` images): ``plain`` (no pinning, ``.to()`` in the loop),
   ``pinned``, ``prefetch`` (``fastload.loader(device=...)``: side-stream copy), ``data-only``; the sum of
   every batch on the device must equal the packed bytes' sum (a stream bug shows as a mismatch). CUDA events
   around each side-stream copy and each step show how much copy time overlaps compute.
3. **training** (JPEGs, 224 px): a conv net's step (bf16 autocast, channels_last; ResNet-50 with
   torchvision, else a small CNN) fed by a per-file torch Dataset (PIL), by ``fastload.loader`` decoding on
   the CPU workers, and with ``decode="cuda"`` (nvJPEG after the transfer): samples/s, share of the loop
   waiting, NVML utilisation (mean, and the pattern :mod:`fastload.core.gpuutil` reads). Target: fastload
   >= 90% utilisation where the per-file loader is below 50%. Also nvJPEG against Pillow on the same files.

(Over 400 lines on purpose: one self-contained script for a briefly lent machine.) Usage::

    python benchmarks/gpu_feed.py --markdown OUT.md --json OUT.json    # on the GPU (about 3-4 minutes)
    python benchmarks/gpu_feed.py --device cpu --smoke                  # CPU smoke test (seconds)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Generator, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import fastload
from fastload.core.gpuutil import GpuTimeline, read_pattern
from fastload.train.feed import DevicePrefetcher, to_device
from fastload.train.gpudecode import DeviceImageDecoder, pillow_rgb
from fastload.train.gpumon import GpuMonitor
from fastload.train.shmbatch import MainSlots, WorkerSlots

# -- data ------------------------------------------------------------------------------------------------


def make_npy(root: Path, count: int, seed: int, px: int) -> tuple[Path, int]:
    """``count`` samples of a 3 x px x px uint8 image (.npy) and a label (.cls), packed; and the byte sum."""
    rng = np.random.default_rng(seed)
    src, total = root / "npy", 0
    for i in range(count):
        image = rng.integers(0, 256, size=(3, px, px), dtype=np.uint8)
        total += int(image.sum(dtype=np.int64))
        folder = src / f"{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / f"{i:06d}.npy", image)
        (folder / f"{i:06d}.cls").write_text(str(i % 10))
    fastload.pack(src, root / "npy-packed", shard_size_bytes=64 << 20, progress=False)
    return root / "npy-packed", total


def make_jpegs(root: Path, count: int, seed: int, px: int) -> tuple[Path, Path]:
    """``count`` RGB JPEGs (smooth colour fields with noise, ~15-25 KB, like photos) with labels, as
    files and packed."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    src = root / "jpg"
    for i in range(count):
        low = rng.integers(0, 256, size=(14, 14, 3), dtype=np.uint8)
        image = np.asarray(Image.fromarray(low).resize((px, px), Image.Resampling.BICUBIC), dtype=np.int16)
        image = np.clip(image + rng.integers(-12, 13, size=image.shape), 0, 255).astype(np.uint8)
        folder = src / f"{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / f"{i:06d}.jpg", quality=90)
        (folder / f"{i:06d}.cls").write_text(str(i % 10))
    fastload.pack(src, root / "jpg-packed", shard_size_bytes=64 << 20, progress=False)
    return src, root / "jpg-packed"


class FilesDataset(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """The per-file baseline: one JPEG file opened and decoded (Pillow) per sample."""

    def __init__(self, root: Path) -> None:
        self.items = sorted((p, int(p.with_suffix(".cls").read_text())) for p in root.rglob("*.jpg"))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, label = self.items[i]
        return pillow_rgb(path.read_bytes()), label


def npy_pair(sample: dict[str, Any]) -> tuple[torch.Tensor, int]:
    return torch.as_tensor(sample["npy"]), int(sample["cls"])


def jpg_pair(sample: dict[str, Any]) -> dict[str, Any]:
    """fastload with CPU decode: the worker turns the PIL image into a uint8 CHW tensor."""
    array = np.asarray(sample["jpg"].convert("RGB"))
    return {"jpg": torch.from_numpy(array.copy()).permute(2, 0, 1), "cls": int(sample["cls"])}


# -- 1. copies -------------------------------------------------------------------------------------------


def _timed_copy(src: torch.Tensor, dst: torch.Tensor, cuda: bool) -> float:
    """Seconds for ``dst.copy_(src)`` (CUDA events on a GPU)."""
    if not cuda:
        t = time.perf_counter()
        dst.copy_(src)
        return time.perf_counter() - t
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    dst.copy_(src, non_blocking=True)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000


def copy_bandwidth(device: torch.device, batch: int, reps: int, px: int) -> dict[str, Any]:
    """Peak pinned H2D GB/s, and one batch out of a shared-memory slot, pageable and pinned."""
    cuda = device.type == "cuda"
    big = torch.empty((256 if cuda else 16) << 20, dtype=torch.uint8, pin_memory=cuda)
    dst = torch.empty_like(big, device=device)
    peak = max(big.numel() / _timed_copy(big, dst, cuda) for _ in range(5)) / 1e9
    shape = (batch, 3, px, px)
    nbytes = int(np.prod(shape))
    worker = WorkerSlots(slots=2)
    out: dict[str, Any] = {"peak_gb_s": peak, "peak_bytes": big.numel(), "batch_bytes": nbytes}
    target = torch.empty(shape, dtype=torch.uint8, device=device)
    main = MainSlots()  # maps each slot once (and unlinks its name): one for both kinds
    try:
        for pinned in (False, True):
            main.pin_memory = pinned and cuda
            copies, totals, slotted = [], [], 0
            for rep in range(reps + 1):  # the first is a warm-up (slot creation, pinned allocation)
                rest, description = worker.pack({"x": torch.full(shape, rep, dtype=torch.uint8)})
                slotted += description is not None
                t = time.perf_counter()
                host = main.unpack(rest, description)["x"] if description else rest["x"]
                unpacked = time.perf_counter() - t
                copy_s = _timed_copy(host, target, cuda)
                if rep:
                    copies.append(nbytes / copy_s / 1e9)
                    totals.append(nbytes / (unpacked + copy_s) / 1e9)
                del host
            out["pinned" if pinned else "pageable"] = {
                "copy_gb_s": statistics.median(copies),
                "slot_to_device_gb_s": statistics.median(totals),
                "via_slot": f"{slotted}/{reps + 1}",
            }
    finally:
        main.close()
    return out


# -- 2. bytes and overlap --------------------------------------------------------------------------------


def feed_variant(
    variant: str, packed: Path, device: torch.device, args: argparse.Namespace
) -> dict[str, Any]:
    cuda = device.type == "cuda"
    prefetch = variant in ("prefetch", "data-only")
    loader = fastload.loader(
        str(packed),
        batch_size=args.batch_size,
        num_workers=args.workers,
        device=device if prefetch else None,
        pin_memory=cuda and variant != "plain",
        map=npy_pair,
    )
    model, optimizer = small_cnn(device)
    checksum = torch.zeros((), dtype=torch.int64, device=device)
    samples = 0
    sync(device)
    started = time.perf_counter()
    for images, labels in loader:
        if not prefetch:
            images = images.to(device, non_blocking=variant == "pinned")
            labels = labels.to(device, non_blocking=variant == "pinned")
        checksum += images.sum(dtype=torch.int64)
        samples += len(labels)
        if variant != "data-only":
            train_step(model, optimizer, images, labels, device)
    sync(device)
    seconds = time.perf_counter() - started
    return {
        "variant": variant,
        "samples_per_s": samples / seconds,
        "wait_share": loader.stats.wait_share,
        "checksum": int(checksum.item()),
    }


def overlap(packed: Path, device: torch.device, args: argparse.Namespace) -> dict[str, Any]:
    """CUDA events around each side-stream copy (DevicePrefetcher, as fastload.loader uses it) and each
    step: the share of copy time that ran while a step was running."""
    if device.type != "cuda":
        return {"not_measured": f"CUDA events need a CUDA device (ran on {device})"}
    host = fastload.loader(
        str(packed), batch_size=args.batch_size, num_workers=args.workers, pin_memory=True, map=npy_pair
    )
    copies: list[tuple[Any, Any]] = []
    steps: list[tuple[Any, Any]] = []

    def copy(item: Any, dev: torch.device, non_blocking: bool) -> Any:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()  # on the side stream: DevicePrefetcher calls copy inside torch.cuda.stream(side)
        moved = to_device(item, dev, non_blocking=non_blocking)
        end.record()
        copies.append((start, end))
        return moved

    model, optimizer = small_cnn(device)
    origin = torch.cuda.Event(enable_timing=True)
    origin.record()
    for images, labels in DevicePrefetcher(host, device, copy=copy):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        train_step(model, optimizer, images, labels, device)
        end.record()
        steps.append((start, end))
    torch.cuda.synchronize()

    def span(pair: tuple[Any, Any]) -> tuple[float, float]:
        return origin.elapsed_time(pair[0]), origin.elapsed_time(pair[1])

    step_spans = [span(p) for p in steps]
    copy_ms = overlapped_ms = 0.0
    for a, b in (span(p) for p in copies[1:]):  # the first copy has no step to overlap
        copy_ms += b - a
        overlapped_ms += sum(max(0.0, min(b, d) - max(a, c)) for c, d in step_spans)
    return {
        "copies": len(copies),
        "copy_ms_mean": copy_ms / max(1, len(copies) - 1),
        "step_ms_mean": statistics.fmean(d - c for c, d in step_spans) if step_spans else 0.0,
        "overlap_share": overlapped_ms / copy_ms if copy_ms else 0.0,
    }


# -- 3. training on JPEGs --------------------------------------------------------------------------------


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def small_cnn(device: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 5, stride=2),
        torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, stride=2),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(64, 10),
    ).to(device, memory_format=torch.channels_last)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def training_model(name: str, device: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer, str]:
    if name == "resnet50":
        try:
            import torchvision

            model = torchvision.models.resnet50(num_classes=10).to(device, memory_format=torch.channels_last)
            return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), "ResNet-50"
        except ImportError:
            pass
    model, optimizer = small_cnn(device)
    return model, optimizer, "small CNN"


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    images: torch.Tensor,
    labels: torch.Tensor,
    device: torch.device,
) -> None:
    """bf16 autocast, channels_last; no host synchronisation (as real training)."""
    x = images.to(device, non_blocking=True).float().div_(255).contiguous(memory_format=torch.channels_last)
    y = labels.to(device, non_blocking=True)
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()


def batches(make: Callable[[], Iterable[Any]]) -> Generator[tuple[torch.Tensor, torch.Tensor], None, None]:
    """Epoch after epoch of (images, labels) from any of the three feeds."""
    while True:
        for batch in make():
            if isinstance(batch, dict):
                yield batch["jpg"], batch["cls"]
            else:
                yield batch[0], batch[1]


def train_variant(
    variant: str, make: Callable[[], Iterable[Any]], device: torch.device, args: argparse.Namespace
) -> dict[str, Any]:
    model, optimizer, model_name = training_model(args.model, device)
    source = batches(make)
    for _ in range(args.warmup):  # workers started, cuDNN tuned, pinned pool filled
        images, labels = next(source)
        train_step(model, optimizer, images, labels, device)
    sync(device)
    monitor = GpuMonitor(hz=args.hz, index=device.index or 0) if device.type == "cuda" else None
    if monitor is not None:
        monitor.start()
    started = time.perf_counter()
    waited, samples, steps = 0.0, 0, 0
    while time.perf_counter() - started < args.seconds:
        t = time.perf_counter()
        images, labels = next(source)
        waited += time.perf_counter() - t
        train_step(model, optimizer, images, labels, device)
        samples += len(labels)
        steps += 1
    sync(device)
    seconds = time.perf_counter() - started
    source.close()  # ends the feed's iteration (and so its workers, once the feed is dropped)
    timeline = monitor.stop() if monitor is not None else GpuTimeline(not_measured=f"ran on {device}")
    pattern = read_pattern(timeline.utils, waited / seconds, not_measured=timeline.not_measured)
    return {
        "variant": variant,
        "model": model_name,
        "steps": steps,
        "samples_per_s": samples / seconds,
        "wait_share": waited / seconds,
        "gpu_util_mean_pct": timeline.mean_util_pct,
        "gpu_pattern": pattern.kind,
        "gpu_line": pattern.line,
        "gpu": timeline.as_dict(),
    }


def training(
    files: Path, packed: Path, device: torch.device, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """The three feeds in turn, each built just before its run and dropped after (its workers with it)."""
    cuda = device.type == "cuda"
    common: dict[str, Any] = {"batch_size": args.batch_size, "num_workers": args.workers, "drop_last": True}

    def per_file() -> Iterable[Any]:
        return torch.utils.data.DataLoader(
            FilesDataset(files),
            shuffle=True,
            pin_memory=cuda,
            persistent_workers=args.workers > 0,
            prefetch_factor=4 if args.workers else None,
            **common,
        )

    def cpu_decode() -> Iterable[Any]:
        return fastload.loader(str(packed), device=device if cuda else None, map=jpg_pair, **common)

    def device_decode() -> Iterable[Any]:
        if cuda:
            return fastload.loader(str(packed), device=device, decode="cuda", **common)
        loader = fastload.loader(str(packed), images=False, **common)  # Pillow standing in for nvJPEG
        loader.on_device = DeviceImageDecoder(
            device, decode_jpegs=lambda blobs, dev: [pillow_rgb(t.numpy().tobytes()) for t in blobs]
        )
        return loader

    feeds = {"per-file": per_file, "fastload cpu-decode": cpu_decode, 'fastload decode="cuda"': device_decode}
    results = []
    for name, build in feeds.items():
        try:
            feed = build()
            result = train_variant(name, lambda feed=feed: feed, device, args)  # type: ignore[misc]
            del feed
        except Exception as exc:  # e.g. decode="cuda" without nvJPEG: keep the other feeds' figures
            import traceback

            traceback.print_exc()
            results.append({"variant": name, "error": f"{type(exc).__name__}: {exc}"})
            continue
        results.append(result)
        print(
            f"  {name:<24} {result['samples_per_s']:>8,.0f} samples/s  "
            f"waiting {100 * result['wait_share']:>3.0f}%  "
            f"GPU {_pct(result['gpu_util_mean_pct'])} ({result['gpu_pattern']})",
            flush=True,
        )
    return results


def decode_agreement(files: Path, device: torch.device, count: int = 64) -> dict[str, Any]:
    """nvJPEG against Pillow on the same files: mean and max absolute difference per pixel value."""
    if device.type != "cuda":
        return {"not_measured": f"nvJPEG needs a CUDA device (ran on {device})"}
    blobs = [p.read_bytes() for p in sorted(files.rglob("*.jpg"))[:count]]
    decoder = DeviceImageDecoder(device)
    gpu = decoder.images(blobs)
    diffs = [(g.cpu().int() - pillow_rgb(b).int()).abs() for g, b in zip(gpu, blobs, strict=True)]
    return {
        "images": len(blobs),
        "mean_abs_diff": float(statistics.fmean(float(d.float().mean()) for d in diffs)),
        "max_abs_diff": int(max(int(d.max()) for d in diffs)),
        "cpu_fallbacks": decoder.cpu_fallbacks,
    }


# -- report ----------------------------------------------------------------------------------------------


def _version(dist: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0f}%"


def markdown(report: dict[str, Any]) -> str:
    """The report as a RESULTS.md section; a section that failed says so (with the error)."""
    a = report["args"]
    lines = [
        f"## Feeding a GPU: {report['device']} (`benchmarks/gpu_feed.py`, issue 20)",
        "",
        f"{report['when']}; torch {report['torch']}, torchvision {report['torchvision']}, "
        f"{report['cores']} cores, load {report['load']}; "
        f"batch {a['batch_size']}, num_workers {a['workers']}.",
        "",
    ]
    for name in SECTIONS:
        part = report.get(name, {"error": "not run"})
        if isinstance(part, dict) and "error" in part:
            lines += [f"{name}: FAILED: {part['error']}", ""]
        elif isinstance(part, dict) and "not_measured" in part:
            lines += [f"{name}: not measured: {part['not_measured']}", ""]
        else:
            lines += [*SECTION_TEXT[name](part, a), ""]
    return "\n".join(lines)


def _copy_md(c: dict[str, Any], a: dict[str, Any]) -> list[str]:
    lines = [
        f"Host-to-device, one {c['batch_bytes'] / 2**20:.1f} MiB batch out of a shared-memory slot; "
        f"peak ({c['peak_bytes'] >> 20} MiB pinned cudaMemcpy) {c['peak_gb_s']:.1f} GB/s:",
        "",
        "| source | copy GB/s | of peak | slot to device GB/s | via a slot |",
        "|---|---|---|---|---|",
    ]
    for k in ("pageable", "pinned"):
        lines.append(
            f"| {k} | {c[k]['copy_gb_s']:.1f} | {100 * c[k]['copy_gb_s'] / c['peak_gb_s']:.0f}% | "
            f"{c[k]['slot_to_device_gb_s']:.1f} | {c[k]['via_slot']} |"
        )
    return lines


def _feed_md(feed: list[dict[str, Any]], a: dict[str, Any]) -> list[str]:
    lines = [
        f"Packed uint8 images of {a['px']} px, small CNN, medians of {a['reps']} interleaved runs:",
        "",
        "| variant | samples/s | waiting | bytes on the device |",
        "|---|---|---|---|",
    ]
    for r in feed:
        lines.append(
            f"| {r['variant']} | {r['samples_per_s']:,.0f} | {100 * r['wait_share']:.0f}% | "
            f"{'match' if r['bytes_ok'] else 'MISMATCH'} |"
        )
    return lines


def _overlap_md(o: dict[str, Any], a: dict[str, Any]) -> list[str]:
    return [
        f"Side-stream prefetch overlap (CUDA events): {100 * o['overlap_share']:.0f}% of copy time ran "
        f"during a step ({o['copies']} copies of {o['copy_ms_mean']:.2f} ms, "
        f"steps {o['step_ms_mean']:.2f} ms)."
    ]


def _training_md(runs: list[dict[str, Any]], a: dict[str, Any]) -> list[str]:
    model = next((r["model"] for r in runs if "model" in r), "?")
    lines = [
        f"Training on {a['count']} JPEGs of {a['px']} px ({model}, bf16 autocast, channels_last), "
        f"{a['seconds']:g} s each after {a['warmup']} warm-up steps:",
        "",
        "| feed | samples/s | waiting | GPU util (NVML mean) | pattern |",
        "|---|---|---|---|---|",
    ]
    for r in runs:
        if "error" in r:
            lines.append(f"| {r['variant']} | FAILED: {r['error']} | | | |")
            continue
        lines.append(
            f"| {r['variant']} | {r['samples_per_s']:,.0f} | {100 * r['wait_share']:.0f}% | "
            f"{_pct(r['gpu_util_mean_pct'])} | {r['gpu_pattern']} |"
        )
    return lines


def _agreement_md(d: dict[str, Any], a: dict[str, Any]) -> list[str]:
    return [
        f"nvJPEG against Pillow on {d['images']} of these JPEGs: mean abs difference "
        f"{d['mean_abs_diff']:.2f}, max {d['max_abs_diff']} (of 255); {d['cpu_fallbacks']} CPU fallbacks."
    ]


SECTION_TEXT: dict[str, Callable[[Any, dict[str, Any]], list[str]]] = {
    "copy": _copy_md,
    "feed": _feed_md,
    "overlap": _overlap_md,
    "training": _training_md,
    "decode_agreement": _agreement_md,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--count", type=int, default=2048, help="images in each data set")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=min(12, max(2, (os.cpu_count() or 2) - 2)))
    parser.add_argument("--reps", type=int, default=2, help="repetitions of the interleaved feed variants")
    parser.add_argument("--seconds", type=float, default=15.0, help="timed training per feed")
    parser.add_argument("--warmup", type=int, default=10, help="untimed training steps per feed")
    parser.add_argument("--model", choices=["resnet50", "small"], default="resnet50")
    parser.add_argument("--hz", type=float, default=25.0, help="NVML samples per second")
    parser.add_argument("--px", type=int, default=224, help="image side in pixels")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: a test of the script itself")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path, help="append a RESULTS.md section here")
    args = parser.parse_args(argv)
    if args.smoke:
        args.count, args.batch_size, args.workers, args.reps, args.px = 8, 4, 0, 1, 16
        args.seconds, args.warmup, args.model = 0.05, 1, "small"
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    report: dict[str, Any] = {
        "device": name,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "torch": torch.__version__,
        "torchvision": _version("torchvision"),
        "nvidia-ml-py": _version("nvidia-ml-py"),
        "cores": os.cpu_count(),
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    with tempfile.TemporaryDirectory(prefix="fastload-gpu-") as tmp:
        root = Path(tmp)
        print(
            f"device: {name}; torch {torch.__version__} (CUDA {torch.version.cuda}), torchvision "
            f"{report['torchvision']}, nvidia-ml-py {report['nvidia-ml-py']}; "
            f"preparing {args.count} images twice",
            flush=True,
        )
        npy, expected = make_npy(root, args.count, args.seed, args.px)
        files, jpg = make_jpegs(root, args.count, args.seed, args.px)
        reps = 3 if args.smoke else 10
        # each section on its own: one that fails (a driver or library surprise) must not lose the others
        guarded(report, "copy", lambda: copy_bandwidth(device, args.batch_size, reps=reps, px=args.px))
        guarded(report, "feed", lambda: feed_section(npy, expected, device, args))
        guarded(report, "overlap", lambda: overlap(npy, device, args))
        guarded(report, "training", lambda: training(files, jpg, device, args))
        guarded(report, "decode_agreement", lambda: decode_agreement(files, device))
    text = markdown(report)
    print("\n" + text)
    if args.markdown:
        with args.markdown.open("a") as f:
            f.write("\n" + text)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    failed = [k for k in SECTIONS if isinstance(report.get(k), dict) and "error" in report[k]]
    feed_ok = isinstance(report.get("feed"), list) and all(r["bytes_ok"] for r in report["feed"])
    return 0 if feed_ok and not failed else 1


SECTIONS = ("copy", "feed", "overlap", "training", "decode_agreement")


def guarded(report: dict[str, Any], name: str, run: Callable[[], Any]) -> None:
    """``report[name] = run()``, or ``{"error": ...}`` with the traceback printed."""
    import traceback

    try:
        report[name] = run()
    except Exception as exc:
        traceback.print_exc()
        report[name] = {"error": f"{type(exc).__name__}: {exc}"}
    print(f"{name}: {json.dumps(report[name], default=str)[:600]}", flush=True)


def feed_section(
    npy: Path, expected: int, device: torch.device, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """The four feed variants interleaved (the order rotated each repetition); medians."""
    variants = ["plain", "pinned", "prefetch", "data-only"]
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for rep in range(args.reps):
        for k in range(len(variants)):
            v = variants[(k + rep) % len(variants)]
            runs[v].append(feed_variant(v, npy, device, args))
    return [
        {
            "variant": v,
            "samples_per_s": statistics.median(r["samples_per_s"] for r in rs),
            "wait_share": statistics.median(r["wait_share"] for r in rs),
            "bytes_ok": all(r["checksum"] == expected for r in rs),
        }
        for v, rs in runs.items()
    ]


if __name__ == "__main__":
    raise SystemExit(main())
