"""``fastload.serve`` against the trainer-local ``fastload.DataLoader`` on a decode-heavy ``map=`` (issue 34).

The data: ``--samples`` JPEGs (480 x 360, fixed seed) packed with fastload; ``map=`` decodes one with PIL,
resizes it to 224 x 224, flips it and returns a uint8 CHW tensor (``images=False``: the bytes reach
``map=`` undecoded). Batches of ``--batch``.

Cases (``--case``), each in its own run of this script (Ray starts once per run):

- ``pinned`` (the issue's "trainer CPU-bound" case on one 2-core machine): this process, the trainer, is
  pinned to core 0 and Ray (its head and the feeder) to core 1 (``sched_setaffinity`` before and after
  ``ray.init``: Ray's processes inherit the affinity of the process that starts them). Each batch the
  trainer spends a busy **step** of CPU time (``--step-ms``; default: what decoding a batch costs here,
  measured at the start), so that the local loader must decode and step on one core while serve decodes
  on the other. ``local``: ``fastload.DataLoader(num_workers=0)`` in the trainer; ``serve``:
  ``fastload.serve(feeders=1, feeder_cpus=1)``. Target (issue 34): serve >= 1.6x local.
- ``equal``: nothing pinned, no step: ``local`` is ``fastload.DataLoader(num_workers=1,
  persistent_workers=True)`` (decoding in one worker process), ``serve`` one feeder of 1 CPU; both have
  the same CPUs. Target: serve's cost (1 - serve/local) <= 10%.

Each tool reads one warm-up epoch, then ``--reps`` epochs interleaved with the other tool (order rotated
each repetition); an epoch is timed from asking for its first batch to its last. Prints each tool's
samples/s (median and range), the ratio serve/local per repetition, and the load average before and after
(quote it: on a shared machine the ratios move).

On a loaded machine the wall-clock rates mostly measure the scheduler's share, so each epoch's CPU time
is measured too: of the trainer process, and of every process it started (DataLoader workers; Ray's head
processes and the feeder), in ms per sample. From them, the rate each tool reaches on idle cores:
``pinned``: local ``1 / trainer``; serve ``1 / max(trainer, others)`` (core 0 runs the trainer, core 1
the rest); ``equal``: ``1 / max(trainer, others)`` for both (printed as "idle-core projection").

    python benchmarks/serve.py --case pinned
    python benchmarks/serve.py --case equal --samples 240 --reps 3
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Iterable
from typing import Any

SEED = 20261203
SIDE = 224


def make_dataset(folder: str, count: int) -> str:
    """``count`` 480 x 360 JPEGs (gradients plus noise, as photos compress), packed; returns the root."""
    import numpy as np
    from PIL import Image

    import fastload

    rng = np.random.default_rng(SEED)
    y, x = np.mgrid[0:360, 0:480]
    src = os.path.join(folder, "src", "img")
    os.makedirs(src)
    for i in range(count):
        base = (x * rng.uniform(0.1, 0.4) + y * rng.uniform(0.1, 0.4) + rng.uniform(0, 255)) % 256
        rgb = np.stack([base, base[::-1], base[:, ::-1]], axis=-1) + rng.normal(0, 12, (360, 480, 3))
        Image.fromarray(rgb.clip(0, 255).astype(np.uint8)).save(os.path.join(src, f"{i:06d}.jpg"), quality=90)
        with open(os.path.join(src, f"{i:06d}.cls"), "w") as f:
            f.write(str(i % 10))
    fastload.pack(os.path.join(folder, "src"), os.path.join(folder, "ds"), progress=False)
    return os.path.join(folder, "ds")


def decode(sample: dict[str, Any]) -> dict[str, Any]:
    """The decode-heavy ``map=``: JPEG -> RGB -> 224 x 224 -> flipped -> uint8 CHW tensor."""
    import numpy as np
    import torch
    from PIL import Image

    with Image.open(io.BytesIO(sample["jpg"])) as image:
        small = image.convert("RGB").resize((SIDE, SIDE), Image.BILINEAR)
    array = np.ascontiguousarray(np.asarray(small)[:, ::-1].transpose(2, 0, 1))
    return {"__key__": sample["__key__"], "image": torch.from_numpy(array), "cls": int(sample["cls"])}


def busy(seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU time (a step that needs the core, not just the clock)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def cpu_seconds() -> tuple[float, dict[int, float]]:
    """CPU seconds (user + system) of this process, and of each process it started, by pid (DataLoader
    workers, Ray's head processes and its workers: the feeders)."""
    import psutil

    me = psutil.Process()
    others: dict[int, float] = {}
    for child in me.children(recursive=True):
        try:
            t = child.cpu_times()
        except psutil.Error:  # gone meanwhile
            continue
        others[child.pid] = t.user + t.system
    t = me.cpu_times()
    return t.user + t.system, others


def epoch(loader: Any, step_s: float, epoch_number: int) -> tuple[int, float, float, float]:
    """One epoch: samples, seconds (from asking for the first batch to the last), CPU seconds of this
    process and of the processes it started."""
    loader.set_epoch(epoch_number)
    samples = 0
    mine, others = cpu_seconds()
    started = time.perf_counter()
    for batch in loader:
        samples += len(batch["__key__"])
        if step_s:
            busy(step_s)
    seconds = time.perf_counter() - started
    mine_after, others_after = cpu_seconds()
    spent = sum(v - others.get(pid, 0.0) for pid, v in others_after.items())
    return samples, seconds, mine_after - mine, spent


def decode_cost_s(root: str, count: int = 24) -> float:
    """CPU seconds ``decode`` takes per sample here (this thread's time: what the load does not inflate
    as much as the wall clock)."""
    import fastload

    samples = list(fastload.ShardDataset(root, images=False))[:count]
    started = time.thread_time()
    for sample in samples:
        decode(sample)
    return (time.thread_time() - started) / len(samples)


def summary(name: str, rates: Iterable[float]) -> str:
    r = sorted(rates)
    return f"{name:>6}: {statistics.median(r):7.1f} samples/s (range {r[0]:.1f}-{r[-1]:.1f}, {len(r)} runs)"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--case", choices=("pinned", "equal"), default="pinned")
    parser.add_argument("--samples", type=int, default=240)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--step-ms", type=float, default=None, help="pinned: CPU ms per step (default: decode's)"
    )
    args = parser.parse_args()

    import ray
    import torch

    import fastload

    torch.set_num_threads(1)
    print(f"load average before: {os.getloadavg()}")
    pinned = args.case == "pinned"
    cores = sorted(os.sched_getaffinity(0))
    if pinned and len(cores) < 2:
        raise SystemExit(f"--case pinned needs 2 cores, this process may use {cores}")
    with tempfile.TemporaryDirectory() as tmp:
        root = make_dataset(tmp, args.samples)
        per_sample = decode_cost_s(root)
        step_s = 0.0
        if pinned:
            step_s = args.batch * per_sample if args.step_ms is None else args.step_ms / 1e3
            os.sched_setaffinity(0, {cores[1]})  # Ray's head and workers inherit this
        ray.init(num_cpus=1, include_dashboard=False, logging_level=logging.WARNING)
        if pinned:
            os.sched_setaffinity(0, {cores[0]})  # the trainer
        print(
            f"case {args.case}: {args.samples} samples, batches of {args.batch}, decode "
            f"{per_sample * 1e3:.1f} ms CPU per sample, step {step_s * 1e3:.1f} ms CPU per batch"
        )
        options: dict[str, Any] = {"images": False, "map": decode, "seed": 0}
        workers = 0 if pinned else 1
        local = fastload.DataLoader(
            fastload.ShardDataset(root, **options),
            batch_size=args.batch,
            num_workers=workers,
            persistent_workers=workers > 0,
        )
        served = fastload.serve(root, args.batch, feeders=1, feeder_cpus=1, **options)
        tools = {"local": local, "serve": served}
        rates: dict[str, list[float]] = {name: [] for name in tools}
        cpu: dict[str, list[tuple[float, float]]] = {name: [] for name in tools}
        ratios: list[float] = []
        try:
            for loader in tools.values():  # warm-up: workers and feeders started, files cached
                epoch(loader, 0.0, 0)
            for rep in range(args.reps):
                names = list(tools)[rep % 2 :] + list(tools)[: rep % 2]
                got: dict[str, float] = {}
                for name in names:
                    samples, seconds, mine, others = epoch(tools[name], step_s, rep + 1)
                    got[name] = samples / seconds
                    rates[name].append(got[name])
                    cpu[name].append((1e3 * mine / samples, 1e3 * others / samples))
                ratios.append(got["serve"] / got["local"])
                (lt, lo), (st, so) = cpu["local"][-1], cpu["serve"][-1]
                print(
                    f"rep {rep}: local {got['local']:.1f}, serve {got['serve']:.1f} samples/s; CPU ms per "
                    f"sample (trainer, others): local {lt:.2f}, {lo:.2f}; serve {st:.2f}, {so:.2f}",
                    flush=True,
                )
        finally:
            served.close()
    for name in tools:
        print(summary(name, rates[name]))
    print(
        f"serve/local: median {statistics.median(ratios):.2f}x (range {min(ratios):.2f}-{max(ratios):.2f}x)"
    )
    idle: dict[str, float] = {}
    for name in tools:
        trainer = statistics.median(c[0] for c in cpu[name])
        others = statistics.median(c[1] for c in cpu[name])
        bound = trainer if pinned and name == "local" else max(trainer, others)
        idle[name] = 1e3 / bound
        print(f"{name:>6}: CPU ms/sample: trainer {trainer:.2f}, others {others:.2f} -> {idle[name]:.1f}/s")
    print(f"idle-core projection serve/local: {idle['serve'] / idle['local']:.2f}x")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
