"""The ``fastload bench`` command line: arguments -> :class:`BenchOptions` -> run -> table, JSON, plot.

Imports nothing heavy at module level, so ``fastload --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from fastload.errors import ConfigError


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write num_workers values like 0,2,4") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: write one or more values >= 0, like 0,2,4")
    return tuple(sorted(set(values)))


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip() and x.strip() != "none")


def add_parser(sub: Any) -> None:
    """Add the ``bench`` subcommand to ``fastload``'s subparsers."""
    b = sub.add_parser(
        "bench",
        help="measure the input pipeline: is the training loop waiting for data, and what would fix it",
        description="Measure data loading the way a training loop sees it. Without SOURCE: a generated "
        "JPEG dataset (cached), as files and packed, locally and behind an embedded S3 endpoint.",
    )
    b.add_argument(
        "source",
        nargs="?",
        metavar="SOURCE",
        help="a folder of small files, a fastload dataset folder, or an s3:// prefix (read-only)",
    )
    size = b.add_mutually_exclusive_group()
    size.add_argument("--quick", dest="profile", action="store_const", const="quick", help="smaller, ~20 s")
    size.add_argument("--full", dest="profile", action="store_const", const="full", help="bigger, minutes")
    b.add_argument(
        "--endpoint",
        "--endpoint-url",
        dest="endpoint",
        metavar="URL",
        help="S3 endpoint for an s3:// SOURCE (default: AWS settings)",
    )
    b.add_argument(
        "--no-sign-request", action="store_true", help="read an s3:// SOURCE unsigned (a public bucket)"
    )
    b.add_argument("--latency-ms", type=float, default=20.0, help="embedded endpoint first-byte latency (20)")
    b.add_argument(
        "--conn-mbps", type=float, default=50.0, help="embedded endpoint MB/s per connection (50; 0 = none)"
    )
    b.add_argument("--step-ms", type=float, default=25.0, help="simulated compute per batch in ms (25)")
    b.add_argument(
        "--busy", action="store_true", help="busy-wait the step (CPU training) instead of sleeping"
    )
    b.add_argument(
        "--model", action="store_true", help="train a small real CNN per step instead of --step-ms"
    )
    b.add_argument("--device", default=None, help="device for --model and the copy stage: cpu or cuda (auto)")
    b.add_argument("--batch-size", type=int, default=32, help="samples per batch (32)")
    b.add_argument("--image-px", type=int, default=64, help="images are decoded and resized to PX x PX (64)")
    b.add_argument(
        "--workers", type=_int_list, default=None, metavar="LIST", help="num_workers sweep, e.g. 0,2,4"
    )
    b.add_argument(
        "--num-workers", type=int, default=None, help="num_workers of the training loop (all cores)"
    )
    b.add_argument("--reps", type=int, default=None, help="interleaved repetitions (medians are reported)")
    b.add_argument("--images", type=int, default=None, help="generated images, or samples taken from SOURCE")
    b.add_argument("--budget-s", type=float, default=None, help="seconds of steady state per measurement")
    b.add_argument("--train-s", type=float, default=None, help="seconds of the training loop per variant")
    b.add_argument(
        "--compare",
        type=_names,
        default=("naive",),
        metavar="LIST",
        help="peers to run too: naive (a per-file Dataset; default), webdataset; 'none' for neither",
    )
    b.add_argument(
        "--json",
        dest="json_path",
        metavar="FILE",
        help="write every figure and the machine (and the plot next to it, FILE with .png)",
    )
    b.add_argument(
        "--plot",
        dest="plot_path",
        metavar="FILE.png",
        help="throughput and wait/compute timeline, with the run's conclusion (needs matplotlib)",
    )
    b.add_argument(
        "--cache-dir", default=None, help="where the generated dataset is kept (~/.cache/fastload/bench)"
    )
    b.add_argument("--seed", type=int, default=0, help="seed of the generated dataset")
    b.add_argument("--quiet", action="store_true", help="no progress bar")


def options_from_args(args: argparse.Namespace) -> Any:
    from fastload.bench.options import BenchOptions

    return BenchOptions(
        source=args.source,
        endpoint_url=args.endpoint,
        profile=args.profile or "default",
        images=args.images,
        workers=args.workers,
        reps=args.reps,
        budget_s=args.budget_s,
        train_s=args.train_s,
        num_workers=args.num_workers,
        batch_size=args.batch_size,
        image_px=args.image_px,
        step_ms=args.step_ms,
        step_mode="busy" if args.busy else "sleep",
        model=args.model,
        device=args.device,
        latency_ms=args.latency_ms,
        conn_mbps=args.conn_mbps,
        compare=args.compare,
        cache_dir=args.cache_dir,
        seed=args.seed,
        json_path=args.json_path,
        plot_path=args.plot_path,
        progress=False if args.quiet else None,
    )


NO_PLOT = "for a plot: --plot FILE.png (or --json FILE.json: the plot is written next to it)"


def plot_path_for(plot_path: str | None, json_path: str | None) -> str | None:
    """Where the plot goes: ``--plot``, else next to ``--json`` (``run.json`` -> ``run.png``), else none."""
    if plot_path:
        return plot_path
    if json_path:  # the picture goes with the figures
        return os.path.splitext(json_path)[0] + ".png"
    return None


def run(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    """Run the bench for parsed ``args``; exit status 1 when a measurement failed (named in the table)."""
    options = options_from_args(args)
    if options.plot_path and not options.plot_path.lower().endswith(".png"):
        raise ConfigError(f"--plot {options.plot_path}: the plot is a PNG; give a file name ending in .png")
    from fastload.bench.report import table, to_json
    from fastload.bench.runner import run_bench

    report = run_bench(options)
    print(table(report))
    if options.json_path:
        with open(options.json_path, "w") as f:
            json.dump(to_json(report, argv if argv is not None else sys.argv[1:]), f, indent=1, default=str)
        print(f"figures written to {options.json_path}")
    plot_path = plot_path_for(options.plot_path, options.json_path)
    if plot_path:
        from fastload.bench.plot import write_png

        try:
            write_png(report, plot_path)
            print(f"plot written to {plot_path}")
        except ConfigError as exc:  # matplotlib missing: the run's figures are still good
            if options.plot_path:
                raise
            print(f"no plot: {exc}")
    else:
        print(NO_PLOT)
    failed = [r for r in [*report.runs, *report.training] if r.error]
    bad_checks = [name for name, check in report.checks.items() if not check.get("ok")]
    if bad_checks:
        print(f"fastload bench: the delivery check failed for {', '.join(bad_checks)}", file=sys.stderr)
        return 1
    if failed:
        print(
            f"fastload bench: {len(failed)} measurement(s) failed; "
            f"the first: {failed[0].variant}: {failed[0].error}",
            file=sys.stderr,
        )
        return 1
    return 0
