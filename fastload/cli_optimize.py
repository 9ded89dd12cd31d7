"""The ``fastload optimize FN --inputs FILE DST`` command: its arguments (:func:`add_parser`, added by
:mod:`fastload.cli_args`) and its handler (:func:`run`, called by :mod:`fastload.cli`)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

from fastload import formats
from fastload.config import PARQUET_COMPRESSIONS
from fastload.core.units import parse_size
from fastload.errors import InputFailedError


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_parser(sub: Any, s3_options: argparse.ArgumentParser) -> None:
    """The ``optimize`` command's parser, under ``sub`` (``fastload.cli_args`` calls it)."""
    o = sub.add_parser(
        "optimize",
        parents=[s3_options],
        help="run a Python function on every input (a line of --inputs) in worker processes and write the "
        "samples it returns as a dataset",
    )
    o.add_argument(
        "fn",
        metavar="FN",
        help="the function: module:function (from the working directory) or path/to/file.py:function; it "
        "takes one input (a line of text) and returns a sample dict, a list of them, or None",
    )
    o.add_argument(
        "--inputs",
        required=True,
        metavar="FILE",
        help="a text file of inputs, one per line (paths, URLs, ids; empty lines left out); - reads stdin",
    )
    o.add_argument(
        "dst",
        metavar="DST",
        help="destination folder or s3:// prefix (new or empty, or an interrupted run with --resume)",
    )
    o.add_argument("--workers", type=int, default=None, help="worker processes (default: one per CPU)")
    o.add_argument("--format", choices=formats.names(), default="tar", help="shard format (default tar)")
    o.add_argument(
        "--shard-size", type=_size, default=256 << 20, metavar="SIZE", help="bytes per shard (256MiB)"
    )
    o.add_argument("--max-samples", type=int, default=None, metavar="N", help="samples per shard at most")
    o.add_argument("--prefix", default="shard", help="shard name prefix (default: shard)")
    o.add_argument("--compression", choices=PARQUET_COMPRESSIONS, default="none", help="Parquet compression")
    o.add_argument(
        "--on-error",
        choices=("raise", "skip"),
        default="raise",
        help="an exception in the function: stop, naming the input (raise, the default), or leave the input "
        "out and list it (skip)",
    )
    o.add_argument(
        "--engine",
        choices=("process", "ray"),
        default="process",
        help="run the function in worker processes of this machine (default) or as Ray tasks",
    )
    o.add_argument("--ray-address", default=None, metavar="ADDRESS", help="Ray cluster for --engine ray")
    o.add_argument(
        "--chunk-size", type=int, default=None, metavar="N", help="inputs per task (default: auto)"
    )
    o.add_argument("--resume", action="store_true", help="continue an interrupted optimize into DST")
    o.add_argument(
        "--append",
        action="store_true",
        help="add the samples to the dataset in DST as a new version (its format and options; existing "
        "files kept as they are); with --resume, finish an interrupted append",
    )
    o.add_argument(
        "--quiet", action="store_true", help="no progress bar (none either when not on a terminal)"
    )


def run(args: argparse.Namespace) -> int:
    """Run ``fastload optimize`` (``fastload.cli`` calls it); the exit status."""
    from fastload.packing.input_lines import InputLines
    from fastload.packing.optimize import optimize
    from fastload.packing.tokenizer_hook import load_callable

    fn = load_callable(args.fn, what="function")
    module = sys.modules.get(getattr(fn, "__module__", ""))
    if module is not None and module.__name__.startswith("_fastload_"):  # loaded from path/to/file.py
        with contextlib.suppress(ImportError):  # (spawned workers and Ray tasks get it by value)
            import cloudpickle

            cloudpickle.register_pickle_by_value(module)
    try:
        report = optimize(
            fn,
            InputLines(args.inputs),
            args.dst,
            workers=args.workers,
            format=args.format,
            shard_size_bytes=args.shard_size,
            max_samples=args.max_samples,
            prefix=args.prefix,
            compression=args.compression,
            resume=args.resume,
            mode="append" if args.append else "create",
            on_error=args.on_error,
            engine=args.engine,
            chunk_size=args.chunk_size,
            ray_address=args.ray_address,
            progress=False if args.quiet else None,
        )
    except InputFailedError as exc:
        print(exc.traceback.rstrip(), file=sys.stderr)
        print(f"fastload optimize: {exc}", file=sys.stderr)
        return 1
    print(report.summary())
    return 0
