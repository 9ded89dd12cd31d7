"""The ``fastload`` command line: parse arguments, build a config, call the library, print results.

Exit codes: 0 success; 1 a problem with the data (skipped inputs, a shard that fails verification);
2 bad usage or options.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from fastload import formats
from fastload.cli_args import build_parser
from fastload.config import PackConfig
from fastload.core.weburls import has_braces
from fastload.errors import ConfigError, FastloadError, SkippedInputError
from fastload.storage.urls import check_url

# string options that are not paths or dataset URLs (an http:// endpoint is right there): --endpoint-url,
# bench's --endpoint
_NOT_PATHS = frozenset({"endpoint_url", "endpoint"})


def _pack(args: argparse.Namespace) -> int:
    from fastload.packing.pack import pack

    if args.shuffle and args.seed is None:
        raise ConfigError("--shuffle needs --seed N so that the same input always gives the same shards")
    if args.seed is not None and not args.shuffle:
        raise ConfigError("--seed only applies with --shuffle")
    level, name = args.partition_by or (None, None)
    config = PackConfig(
        shard_format=args.shard_format,
        shard_size_bytes=args.shard_size,
        max_samples=args.max_samples,
        prefix=args.prefix,
        shuffle_seed=args.seed,
        workers=args.workers,
        row_group_bytes=args.row_group_size,
        compression=args.compression,
        partition_level=level,
        partition_name=name,
        resume=args.resume,
        allow_skip=args.allow_skip,
        fsync=args.fsync,
        append=args.append,
        progress=False if args.quiet else None,
        include_hidden=args.include_hidden,
        exclude=tuple(args.exclude),
        prefix_sources=args.prefix_sources,
    )
    try:
        report = pack(
            args.src,
            args.dst,
            config,
            engine=args.engine,
            ray_address=args.ray_address,
            rows=args.rows,
            file_columns=args.file_column,
            sort_by=args.sort_by,
            key_column=args.key_column,
        )
    except SkippedInputError as exc:
        print(f"fastload pack: {exc}", file=sys.stderr)
        return 1
    print(report.summary())
    return 0


def _verify(args: argparse.Namespace) -> int:
    from fastload.packing.verify import verify
    from fastload.storage import access as storage

    if storage.is_remote(args.target) and has_braces(args.target):
        from fastload.train.source import open_index

        _, index = open_index(args.target)  # every byte read, every tar header's checksum checked
        print(
            f"read {len(index.shards)} shard(s) whole ({index.bytes:,} bytes, {index.samples:,} samples): "
            "each parsed end to end (tar headers' checksums, TFRecord record CRCs); without an index.json "
            "there are no checksums of the bytes to compare with (copy the shards with `fastload cp` and "
            "run `fastload index` there for that)"
        )
        return 0
    report = verify(args.target, workers=args.workers, progress=None if not args.quiet else False)
    print(report.summary())
    return 0 if report.ok else 1


def _merge(args: argparse.Namespace) -> int:
    from fastload.packing.shardwriter import ShardWriter

    print(ShardWriter.merge(args.target, check_keys=args.check_keys).summary())
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from fastload.storage import access as storage
    from fastload.storage.manifest import is_one_file
    from fastload.summary import describe, describe_file, describe_versions, list_shard

    url = storage.normalise(args.target)
    if storage.is_remote(url) and has_braces(url):  # index-less shards, indexed in memory as readers do
        from fastload.train.source import open_index

        root, index = open_index(url)
        if args.versions:
            raise ConfigError(f"{args.target} names shards without an index.json: they have no versions")
        shown = (
            describe(index)
            if args.shard is None
            else list_shard(index, args.shard, limit=args.limit or None, root=root)
        )
        print(shown)
        return 0
    named_like_a_shard = formats.for_path(url) is not None or not storage.is_remote(url)
    if not url.endswith(".json") and named_like_a_shard and is_one_file(url):
        if args.shard is not None:
            raise ConfigError(f"{args.target} is one shard: drop --shard, or give the dataset's folder")
        print(describe_file(url, limit=args.limit or None))
        return 0
    index = formats.load_index(args.target)
    if args.versions:
        if args.shard is not None:
            raise ConfigError("--versions lists the dataset's versions; drop --shard (or --versions)")
        print(describe_versions(index))
    elif args.shard is None:
        print(describe(index))
    else:
        root = formats.dataset_root(args.target)
        print(list_shard(index, args.shard, limit=args.limit or None, root=root))
    return 0


def _index(args: argparse.Namespace) -> int:
    from fastload.packing.indexing import build_index

    if args.upgrade:
        from fastload.packing.upgrade import upgrade_index

        print(upgrade_index(args.target, threads=args.workers or 8).summary())
        return 0
    report = build_index(args.target, workers=args.workers, force=args.force, key_column=args.key_column)
    print(report.summary())
    return 0 if report.ok else 1


def _cp(args: argparse.Namespace) -> int:
    from fastload.copy import copy

    report = copy(
        args.src,
        args.dst,
        recursive=args.recursive,
        jobs=args.jobs,
        progress=False if args.quiet else None,
        dry_run=args.dry_run,
    )
    if args.dry_run:
        for line in report.plan_lines():
            print(line)
    print(report.summary())
    return 0


def _ls(args: argparse.Namespace) -> int:
    from fastload.ls import listing

    lines = listing(args.url, recursive=args.recursive)
    for line in lines:
        print(line)
    if not lines:  # as `aws s3 ls` and `ls` of a missing path: say so, and fail
        print(f"fastload ls: nothing under {args.url}", file=sys.stderr)
        return 1
    return 0


def _mb(args: argparse.Namespace) -> int:
    from fastload.s3.buckets import bucket_of, make_bucket

    bucket = bucket_of(args.url)
    if make_bucket(args.url):
        print(f"make_bucket: s3://{bucket}")
    else:
        print(f"s3://{bucket} already exists (yours): nothing to do")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from fastload.demo import make_demo_tree

    files = make_demo_tree(args.dir, samples=args.samples, seed=args.seed)
    print(f"wrote {files} files ({args.samples} samples) under {args.dir}")
    return 0


def _pack_tokens(args: argparse.Namespace) -> int:
    from fastload.packing.tokens import pack_tokens

    try:
        report = pack_tokens(
            args.src,
            args.dst,
            column=args.column,
            key_column=args.key_column,
            tokenizer=args.tokenizer,
            text_column=args.text_column,
            bos_id=args.bos_id,
            eos_id=args.eos_id,
            vocab_size=args.vocab_size,
            dtype=args.dtype,
            shard_size_bytes=args.shard_size,
            row_group_bytes=args.row_group_size,
            prefix=args.prefix,
            compression=args.compression,
            allow_skip=args.allow_skip,
            workers=args.workers,
            resume=args.resume,
            progress=False if args.quiet else None,
            append=args.append,
        )
    except SkippedInputError as exc:
        print(f"fastload pack-tokens: {exc}", file=sys.stderr)
        return 1
    print(report.summary())
    return 0


def _optimize(args: argparse.Namespace) -> int:
    from fastload.cli_optimize import run

    return run(args)


def _bench(args: argparse.Namespace) -> int:
    from fastload.bench.args import run

    return run(args)


def _top(args: argparse.Namespace) -> int:
    from fastload.top import run

    return run(args.folder, once=args.once, interval_s=args.interval, plot_path=args.plot)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = {
        "pack": _pack,
        "verify": _verify,
        "merge": _merge,
        "inspect": _inspect,
        "demo-data": _demo,
        "pack-tokens": _pack_tokens,
        "optimize": _optimize,
        "cp": _cp,
        "ls": _ls,
        "mb": _mb,
        "bench": _bench,
        "index": _index,
        "top": _top,
    }[args.command]
    endpoint = getattr(args, "endpoint_url", None)
    if endpoint:  # this process's S3 clients (S3Config.from_env) use it
        import os

        os.environ["AWS_ENDPOINT_URL"] = endpoint
    if getattr(args, "no_sign_request", False):  # read by S3Config.from_env, as the endpoint is
        import os

        os.environ["FASTLOAD_S3_UNSIGNED"] = "1"
    if getattr(args, "header", None):  # (so are these)
        import os

        os.environ["FASTLOAD_HTTP_HEADERS"] = "\n".join(args.header)
    try:
        for name, value in vars(args).items():  # a mistyped or unknown URL would be taken as a local path
            if name in _NOT_PATHS:
                continue
            for text in value if isinstance(value, list) else [value]:
                if isinstance(text, str):
                    check_url(text)
        return handler(args)
    except ConfigError as exc:
        print(f"fastload {args.command}: {exc}", file=sys.stderr)
        return 2
    except FastloadError as exc:
        print(f"fastload {args.command}: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly, as Unix tools do
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # e.g. a destination that cannot be created or written
        import os

        from fastload.errors import shown

        filename = getattr(exc, "filename", None)
        where = f": {shown(os.fsdecode(filename))}" if filename else ""  # (no dangling ":" without a name)
        print(f"fastload {args.command}: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"fastload {args.command}: interrupted", file=sys.stderr)
        return 130
