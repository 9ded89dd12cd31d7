"""The command line's arguments: one parser per command, with help text for every argument (the handlers are
:mod:`fastload.cli`)."""

from __future__ import annotations

import argparse
from typing import Any

from fastload import formats
from fastload.config import PARQUET_COMPRESSIONS
from fastload.core.units import parse_size


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _partition(text: str) -> tuple[int, str | None]:
    level, _, name = text.partition(":")
    if not level.isdigit():
        raise argparse.ArgumentTypeError(
            f"{text!r}: write LEVEL or LEVEL:NAME, e.g. 0:split (the key's top folder becomes split=VALUE/)"
        )
    return int(level), name or None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastload", description="Keep GPUs fed: pack, verify and inspect sharded datasets."
    )
    from fastload import __version__

    parser.add_argument("--version", action="version", version=f"fastload {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # every command that may talk to S3 takes --endpoint-url, as the aws CLI spells it
    s3_options = argparse.ArgumentParser(add_help=False)
    s3_options.add_argument(
        "--endpoint-url",
        default=None,
        metavar="URL",
        help="S3 endpoint for s3:// URLs (default: AWS_ENDPOINT_URL or the AWS settings), e.g. "
        "http://127.0.0.1:9000 for MinIO or Ceph",
    )
    s3_options.add_argument(
        "--no-sign-request",
        action="store_true",
        help="send S3 requests unsigned, as the aws CLI's flag does: public buckets, no credentials "
        "needed (FASTLOAD_S3_UNSIGNED=1; S3Config(unsigned=True) in Python)",
    )

    header_help = "a header for every http(s)/hf request to the URL's host (repeatable, as curl's -H)"
    s3_options.add_argument("--header", action="append", metavar="'NAME: VALUE'", help=header_help)

    _pack(sub, s3_options)
    _verify(sub, s3_options)
    _merge(sub, s3_options)
    _inspect(sub, s3_options)
    _index(sub, s3_options)
    _cp(sub, s3_options)
    _ls(sub, s3_options)
    _mb(sub, s3_options)
    _demo_data(sub)
    _pack_tokens(sub, s3_options)
    from fastload.cli_optimize import add_parser as add_optimize_parser

    add_optimize_parser(sub, s3_options)
    from fastload.top import add_parser as add_top_parser

    add_top_parser(sub, s3_options)

    from fastload.bench.args import add_parser as add_bench_parser

    add_bench_parser(sub)
    return parser


def _pack(sub: Any, s3_options: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "pack",
        parents=[s3_options],
        help="pack a tree of small files into tar, Parquet or TFRecord shards plus index.json",
    )
    p.add_argument(
        "src", nargs="+", metavar="SRC", help="source folder(s); files are grouped into samples by key"
    )
    p.add_argument(
        "dst", metavar="DST", help="destination folder (new or empty, or an interrupted pack with --resume)"
    )
    p.add_argument(
        "--format",
        dest="shard_format",
        choices=formats.names(),
        default="tar",
        help="shard format (default tar: WebDataset-style; parquet: a row per sample; tfrecord)",
    )
    p.add_argument(
        "--shard-size",
        type=_size,
        default=256 << 20,
        metavar="SIZE",
        help="target shard size, e.g. 256MiB (default), 1GB",
    )
    p.add_argument("--max-samples", type=int, default=None, metavar="N", help="at most N samples per shard")
    p.add_argument("--prefix", default="shard", help="shard name prefix (default: shard -> shard-000000.tar)")
    p.add_argument("--shuffle", action="store_true", help="shuffle sample order (needs --seed)")
    p.add_argument("--seed", type=int, default=None, help="seed for --shuffle (same seed, same shards)")
    p.add_argument("--workers", type=int, default=None, help="parallel shard writers (default: all cores)")
    p.add_argument(
        "--row-group-size",
        type=_size,
        default=64 << 20,
        metavar="SIZE",
        help="Parquet row group size in bytes of sample data (default 64MiB)",
    )
    p.add_argument(
        "--compression",
        choices=PARQUET_COMPRESSIONS,
        default="none",
        help="Parquet compression (default none: samples are usually compressed already)",
    )
    p.add_argument(
        "--partition-by",
        type=_partition,
        default=None,
        metavar="LEVEL[:NAME]",
        help="put shards in hive-style folders NAME=VALUE by the key's folder at LEVEL (0 = top)",
    )
    p.add_argument(
        "--rows",
        action="store_true",
        help="the sources are tables (Parquet/CSV/JSONL files, or folders of them): each row is a sample "
        "(implied by a source named *.parquet, *.csv, *.jsonl)",
    )
    p.add_argument(
        "--file-column",
        action="append",
        default=[],
        metavar="COLUMN[=FIELD]",
        help="tables: a column of file paths (relative to the table's folder) whose bytes are packed in the "
        "row, in COLUMN or in a new column FIELD (e.g. image=jpg); repeatable",
    )
    p.add_argument(
        "--sort-by",
        default=None,
        metavar="COLUMN",
        help="tables: write rows sorted by COLUMN, so shards and row groups hold tight ranges of it (filters "
        "on it then skip most of the data)",
    )
    p.add_argument(
        "--key-column",
        default=None,
        metavar="COLUMN",
        help="tables: the column whose values are the sample keys (default <table name>/<row>)",
    )
    p.add_argument(
        "--include-hidden",
        action="store_true",
        help="pack hidden files and folders too (names starting with '.': .DS_Store, .git/); by default "
        "they are left out and counted in the summary",
    )
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="leave out paths matching GLOB: without '/' it matches a name at any depth (*.tmp), with '/' "
        "the path under the source (raw/*.wav), ending in '/' folders only (cache/); repeatable",
    )
    p.add_argument(
        "--prefix-sources",
        action="store_true",
        help="start each key with its source folder's name (a/x.jpg from SRC1/ and SRC2/ become SRC1/a/x "
        "and SRC2/a/x), for sources holding the same relative names",
    )
    p.add_argument("--resume", action="store_true", help="continue an interrupted pack into DST")
    p.add_argument(
        "--append",
        action="store_true",
        help="add SRC to the dataset in DST as a new version (same format and options; existing shards are "
        "kept as they are); with --resume, finish an interrupted append",
    )
    p.add_argument(
        "--allow-skip",
        action="store_true",
        help="finish with exit 0 even when some inputs had to be skipped (they are listed)",
    )
    p.add_argument("--fsync", action="store_true", help="fsync each shard before publishing it (slower)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="who writes the shards: threads here (local, default) or Ray tasks on a cluster (same output)",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="Ray cluster for --engine ray (default: RAY_ADDRESS, a running local cluster, else a new one)",
    )


def _verify(sub: Any, s3_options: argparse.ArgumentParser) -> None:
    v = sub.add_parser(
        "verify",
        parents=[s3_options],
        help="re-read shards and check them against index.json (or lint foreign tars)",
    )
    v.add_argument(
        "target",
        metavar="DST",
        help="dataset folder or s3:// prefix, one shard (checked against the index.json that lists it), or "
        "a .tar file / folder of tars without index",
    )
    v.add_argument("--workers", type=int, default=None, help="shards checked at once (default: all cores)")
    v.add_argument(
        "--quiet", action="store_true", help="no progress bar (none either when not on a terminal)"
    )


def _merge(sub: Any, s3_options: argparse.ArgumentParser) -> None:
    m = sub.add_parser(
        "merge",
        parents=[s3_options],
        help="publish a dataset written in parts by fastload.ShardWriter(part=i, parts=n): one index.json",
    )
    m.add_argument("target", metavar="DST", help="the folder or s3:// prefix the parts were written into")
    m.add_argument(
        "--no-key-check",
        dest="check_keys",
        action="store_false",
        help="do not read the parts' sample tables to refuse a key written by two parts",
    )


def _inspect(sub: Any, s3_options: argparse.ArgumentParser) -> None:
    x = sub.add_parser(
        "index",
        parents=[s3_options],
        help="write index.json for a folder or s3:// prefix of existing TFRecord, Parquet (or tar) files, "
        "or upgrade a dataset's index to v2",
    )
    x.add_argument(
        "target",
        metavar="DST",
        help="folder or s3:// prefix holding *.tfrecord[.gz], *.parquet or .tar files (with --upgrade: a "
        "dataset)",
    )
    x.add_argument("--workers", type=int, default=None, help="files read at once (default: up to 8)")
    x.add_argument(
        "--key-column",
        default=None,
        metavar="COLUMN",
        help="Parquet: the column whose values name samples (default: a __key__ column, else <file>/<row>)",
    )
    mode = x.add_mutually_exclusive_group()
    mode.add_argument("--force", action="store_true", help="replace an existing index.json")
    mode.add_argument(
        "--upgrade",
        action="store_true",
        help="turn the dataset's index.json v1 into v2 in place (per-shard sample tables; tar shards are "
        "read once for each sample's CRC32C); on a v2 dataset, rebuild from their shards the sample tables "
        "that are missing, damaged, stale or without a content checksum",
    )


def _index(sub: Any, s3_options: argparse.ArgumentParser) -> None:
    i = sub.add_parser(
        "inspect", parents=[s3_options], help="summarise index.json, or list the samples of one shard"
    )
    i.add_argument(
        "target",
        metavar="DST",
        help="dataset folder or s3:// prefix (holding index.json), or one shard file or object",
    )
    i.add_argument("--shard", default=None, help="list the samples of this shard (name or number)")
    i.add_argument("--limit", type=int, default=20, help="samples to list with --shard (0 = all)")
    i.add_argument(
        "--versions",
        action="store_true",
        help="list the dataset's versions (one per pack or append: time, shards added, totals)",
    )


def _cp(sub: Any, s3_options: argparse.ArgumentParser) -> None:
    c = sub.add_parser(
        "cp",
        parents=[s3_options],
        help="copy an object or prefix between S3 and local disk, or S3 to S3 (server-side); objects already "
        "at DST with the same bytes are skipped; from any store to s3://, gs:// or az:// (streamed)",
    )
    c.add_argument("src", metavar="SRC", help="s3://bucket/key (or prefix/ with -r), or a local file/folder")
    c.add_argument("dst", metavar="DST", help="a local path, or s3://bucket/key (or prefix/ with -r)")
    c.add_argument("--recursive", "-r", action="store_true", help="copy a whole prefix or folder")
    c.add_argument("--jobs", type=int, default=8, help="objects copied at once with --recursive")
    c.add_argument(
        "--quiet", action="store_true", help="no progress bar (none either when not on a terminal)"
    )
    c.add_argument(
        "--dry-run",
        action="store_true",
        help="list what would be copied and what skipped (already at DST with the same bytes), and why",
    )


def _ls(sub: Any, s3_options: argparse.ArgumentParser) -> None:
    ls = sub.add_parser(
        "ls", parents=[s3_options], help="list objects under an s3:// prefix (or files under a folder)"
    )
    ls.add_argument("url", metavar="URL", help="s3://bucket/prefix/ (or a local folder)")
    ls.add_argument("--recursive", "-r", action="store_true", help="list every key, not one level")


def _mb(sub: Any, s3_options: argparse.ArgumentParser) -> None:
    mb = sub.add_parser(
        "mb",
        parents=[s3_options],
        help="make a bucket (s3://bucket), e.g. on a local endpoint to try fastload on",
    )
    mb.add_argument(
        "url", metavar="URL", help="s3://bucket (in AWS_REGION; nothing done if it is yours already)"
    )


def _demo_data(sub: Any) -> None:
    d = sub.add_parser("demo-data", help="write a small generated tree of sample files to try fastload on")
    d.add_argument("dir", metavar="DIR", help="folder to write the sample files into")
    d.add_argument("--samples", type=int, default=2000, help="samples to write (default 2000)")
    d.add_argument("--seed", type=int, default=0, help="seed of the generated data (default 0)")


def _pack_tokens(sub: Any, s3_options: argparse.ArgumentParser) -> None:
    t = sub.add_parser(
        "pack-tokens",
        parents=[s3_options],
        help="write documents of token ids (JSONL/Parquet) as Parquet token shards plus index.json",
    )
    t.add_argument("src", nargs="+", metavar="SRC", help="JSONL/Parquet file(s), or folders/prefixes of them")
    t.add_argument(
        "dst",
        metavar="DST",
        help="destination folder or s3:// prefix (new or empty, or an interrupted run with --resume)",
    )
    t.add_argument(
        "--column", default="input_ids", help="field holding a list of token ids (default input_ids)"
    )
    t.add_argument(
        "--tokenizer",
        default=None,
        metavar="SPEC",
        help="tokenise the text of --text-column: module:function (from the working directory), "
        "path/to/file.py:function, a tokenizers tokenizer.json file, or hf:NAME (Hugging Face Hub)",
    )
    t.add_argument("--bos-id", type=int, default=None, metavar="ID", help="an id put before every document")
    t.add_argument("--eos-id", type=int, default=None, metavar="ID", help="an id put after every document")
    t.add_argument("--text-column", default="text", help="text field for --tokenizer (default text)")
    t.add_argument("--key-column", default=None, help="field holding document ids (default FILE/ROW)")
    t.add_argument(
        "--vocab-size", type=int, default=None, help="ids must be below N; N <= 65536 stores uint16"
    )
    t.add_argument("--dtype", choices=("auto", "uint16", "int32"), default="auto", help="stored id type")
    t.add_argument(
        "--shard-size", type=_size, default=256 << 20, metavar="SIZE", help="token bytes per shard (256MiB)"
    )
    t.add_argument(
        "--row-group-size",
        type=_size,
        default=1 << 20,
        metavar="SIZE",
        help="token bytes per row group (1MiB)",
    )
    t.add_argument("--prefix", default="shard", help="shard name prefix (default: shard)")
    t.add_argument("--compression", choices=PARQUET_COMPRESSIONS, default="none", help="Parquet compression")
    t.add_argument("--allow-skip", action="store_true", help="exit 0 even if some documents were left out")
    t.add_argument(
        "--workers",
        type=int,
        default=None,
        help="shards checksummed/published at once (default: up to 4; same output)",
    )
    t.add_argument("--resume", action="store_true", help="continue an interrupted pack-tokens into DST")
    t.add_argument("--append", action="store_true", help="add to the token dataset in DST as a new version")
    t.add_argument(
        "--quiet", action="store_true", help="no progress bar (none either when not on a terminal)"
    )
