"""``fastload.optimize`` with a CPU-bound function: how it scales with ``workers``, against litdata's
``optimize`` on the same function.

The function (``--fn``):

- ``jpeg`` (default): decode a JPEG (640 x 480, generated with a fixed seed), resize it to 224 x 224 with
  PIL, encode it again (quality 90); one sample ``{"__key__", "jpg": bytes, "cls": int}``;
- ``loop``: a pure-Python loop (300,000 iterations) and one small sample, so that only the function's CPU
  counts.

Tools, run interleaved (each repetition runs each once, in an order rotated by one per repetition), each
into a fresh folder, timed from the call to its return (worker start-up included: it is part of a run):

- ``fastload-wN``: ``fastload.optimize(fn, paths, dst, workers=N, progress=False)`` (tar, 256 MiB shards);
- ``litdata-wN``: ``litdata.optimize(fn=fn, inputs=paths, output_dir=dst, num_workers=N,
  chunk_bytes="256MB")``, if ``litdata`` imports (``pip install --no-deps --target DIR litdata`` and
  ``PYTHONPATH=DIR``: it never touches torch). litdata spawns its workers (it must: this script guards
  ``main``), and its function returns the same values.

    python benchmarks/optimize.py                          # 300 JPEGs, workers 1 and 2, 3 repetitions
    python benchmarks/optimize.py --fn loop --inputs 200 --reps 5 --tools fastload-w1,fastload-w2

Prints each tool's median samples/s and range, the CPU time per sample of this process (for fastload: the
writer; with workers=1 the function too) and of the worker processes, and the ratios fastload-w2 /
fastload-w1 and fastload / litdata at equal workers. The CPU split says what workers=N can reach on N idle
cores whatever the load here: the function's CPU divides among the workers, the writer's does not. The
machine's load average is printed before and after (quote it: on a shared machine the ratios move).
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

SEED = 20261203
SIDE = 224


def make_jpegs(folder: str, count: int) -> list[str]:
    """``count`` 640 x 480 JPEGs (smooth gradients plus noise, as photos compress) in ``folder``."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(SEED)
    y, x = np.mgrid[0:480, 0:640]
    paths = []
    for i in range(count):
        base = (x * rng.uniform(0.1, 0.4) + y * rng.uniform(0.1, 0.4) + rng.uniform(0, 255)) % 256
        rgb = np.stack([base, base[::-1], base[:, ::-1]], axis=-1) + rng.normal(0, 12, (480, 640, 3))
        path = os.path.join(folder, f"{i:06d}.jpg")
        Image.fromarray(rgb.clip(0, 255).astype(np.uint8)).save(path, quality=90)
        paths.append(path)
    return paths


def jpeg_sample(path: str) -> dict[str, Any]:
    from PIL import Image

    with Image.open(path) as image:
        small = image.convert("RGB").resize((SIDE, SIDE), Image.BILINEAR)
    out = io.BytesIO()
    small.save(out, format="JPEG", quality=90)
    name = os.path.splitext(os.path.basename(path))[0]
    return {"__key__": name, "jpg": out.getvalue(), "cls": int(name) % 10}


LOOP = 300_000


def loop_sample(path: str) -> dict[str, Any]:
    acc = 0
    for i in range(LOOP):
        acc = (acc * 31 + i) % 1_000_003
    return {"__key__": os.path.splitext(os.path.basename(path))[0], "txt": str(acc)}


def litdata_jpeg(path: str) -> dict[str, Any]:
    sample = jpeg_sample(path)
    return {"key": sample["__key__"], "jpg": sample["jpg"], "cls": sample["cls"]}


def litdata_loop(path: str) -> dict[str, Any]:
    sample = loop_sample(path)
    return {"key": sample["__key__"], "txt": sample["txt"]}


FNS: dict[str, tuple[Callable[[str], Any], Callable[[str], Any]]] = {
    "jpeg": (jpeg_sample, litdata_jpeg),
    "loop": (loop_sample, litdata_loop),
}


def run_fastload(fn: Callable[[str], Any], paths: list[str], dst: str, workers: int) -> int:
    import fastload

    report = fastload.optimize(fn, paths, dst, workers=workers, progress=False)
    return report.samples


def run_litdata(fn: Callable[[str], Any], paths: list[str], dst: str, workers: int) -> int:
    import contextlib

    from litdata import optimize

    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        optimize(fn=fn, inputs=paths, output_dir=dst, num_workers=workers, chunk_bytes="256MB")
    return len(paths)


def children_cpu() -> float:
    """CPU seconds of this process's ended child processes (the pools' workers, once shut down)."""
    import resource

    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fn", choices=sorted(FNS), default="jpeg")
    parser.add_argument("--inputs", type=int, default=300)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--tools", default="fastload-w1,fastload-w2,litdata-w1,litdata-w2", help="comma-separated tools"
    )
    args = parser.parse_args()
    tools = args.tools.split(",")
    if any(t.startswith("litdata") for t in tools):
        try:
            import litdata

            print(f"litdata {litdata.__version__}")
        except ImportError as exc:
            print(f"litdata: not measured ({exc})")
            tools = [t for t in tools if not t.startswith("litdata")]
    ours, theirs = FNS[args.fn]
    root = tempfile.mkdtemp(prefix="fastload-optimize-bench-")
    try:
        src = os.path.join(root, "src")
        os.makedirs(src)
        paths = (
            make_jpegs(src, args.inputs) if args.fn == "jpeg" else [f"{i:06d}.x" for i in range(args.inputs)]
        )
        print(
            f"fn={args.fn} inputs={args.inputs} reps={args.reps} cpus={os.cpu_count()} load average {load()}"
        )
        times: dict[str, list[float]] = {t: [] for t in tools}
        cpus: dict[str, list[tuple[float, float]]] = {t: [] for t in tools}  # (this process, workers)
        for rep in range(args.reps):
            order = tools[rep % len(tools) :] + tools[: rep % len(tools)]
            for tool in order:
                name, _, w = tool.partition("-w")
                dst = os.path.join(root, f"out-{tool}-{rep}")
                began, cpu, kids = time.perf_counter(), time.process_time(), children_cpu()
                if name == "fastload":
                    n = run_fastload(ours, paths, dst, int(w))
                else:
                    n = run_litdata(theirs, paths, dst, int(w))
                times[tool].append(time.perf_counter() - began)
                cpus[tool].append((time.process_time() - cpu, children_cpu() - kids))
                assert n == args.inputs, (tool, n)
                shutil.rmtree(dst, ignore_errors=True)
                print(f"  rep {rep} {tool}: {args.inputs / times[tool][-1]:,.1f} samples/s", flush=True)
        print(f"load average after: {load()}")
        rate = {t: [args.inputs / s for s in times[t]] for t in tools}  # in repetition order
        for t in tools:
            r = sorted(rate[t])
            parent = statistics.median(c[0] for c in cpus[t]) / args.inputs * 1e3
            workers = statistics.median(c[1] for c in cpus[t]) / args.inputs * 1e3
            print(
                f"{t:14s} median {statistics.median(r):8,.1f} samples/s  range {r[0]:,.1f}-{r[-1]:,.1f}; "
                f"CPU ms per sample: this process {parent:.2f}, worker processes {workers:.2f}"
            )

        def ratio(a: str, b: str) -> None:
            """Per repetition (the two ran back to back), then the median and range of those."""
            if a in rate and b in rate:
                pairs = sorted(x / y for x, y in zip(rate[a], rate[b], strict=True))
                mid = statistics.median(pairs)
                print(f"{a} / {b}: median {mid:.2f}x (range {pairs[0]:.2f}-{pairs[-1]:.2f})")

        ratio("fastload-w2", "fastload-w1")
        ratio("litdata-w2", "litdata-w1")
        ratio("fastload-w1", "litdata-w1")
        ratio("fastload-w2", "litdata-w2")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
