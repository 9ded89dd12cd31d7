"""What of a :class:`~fastload.config.PackConfig` a pack depends on, checked against the format registry
(``config`` is a base module every package imports, so it cannot consult ``formats`` itself)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastload import formats
from fastload.config import PackConfig

RUNTIME_FIELDS = ("workers", "resume", "allow_skip", "fsync", "progress", "append")  # never change the bytes
# which files are listed (include_hidden, exclude) and their keys (prefix_sources) are in the layout
# already, through the names packed
LISTING_FIELDS = ("include_hidden", "exclude", "prefix_sources")


# how an append's shards are cut: they may differ from the dataset's (each shard is a whole shard of its
# format either way); every other output option must be the dataset's
APPEND_FREE = ("shard_size_bytes", "max_samples", "shuffle_seed", "row_group_bytes", "prefix")


def append_problems(
    dataset: dict[str, Any], shard_format: str, appended: dict[str, Any], fmt: str
) -> list[str]:
    """What keeps shards written with ``appended`` output options in format ``fmt`` from joining a dataset
    of ``shard_format`` written with ``dataset`` (its ``index.json`` options), in words naming each option;
    empty when they may. Options one side does not record are not compared (older indexes record fewer)."""
    if fmt != shard_format:
        return [
            f"shard_format: the dataset is {shard_format}, this append writes {fmt} "
            f"(pass --format {shard_format}; from Python, format={shard_format!r})"
        ]
    out = []
    kinds = (dataset.get("kind"), appended.get("kind"))
    if "tokens" in kinds and kinds[0] != kinds[1]:  # (token documents join only token documents)
        out.append(f"kind: {kinds[0]!r} in the dataset, {kinds[1]!r} in this append")
    for name in sorted(set(dataset) & set(appended)):
        if name in APPEND_FREE or name == "layout" or dataset[name] == appended[name]:
            continue
        out.append(f"{name}: {dataset[name]!r} in the dataset, {appended[name]!r} in this append")
    return out


def checked(config: PackConfig) -> PackConfig:
    """``config``, once its ``shard_format`` is a registered format (a :class:`ConfigError` naming the
    registered ones otherwise); what every pack entry point calls before anything is listed or written."""
    formats.by_name(config.shard_format)
    return config


def output_options(config: PackConfig) -> dict[str, Any]:
    """The options that decide the output bytes: not workers, progress or resume, and not the options of
    other formats (a Parquet row group size does not change a tar shard)."""
    out = asdict(config)
    for name in (*RUNTIME_FIELDS, *LISTING_FIELDS):
        out.pop(name)
    own = formats.by_name(config.shard_format).pack_options
    for fmt in formats.all_formats():
        for name in fmt.pack_options:
            if name not in own:
                out.pop(name, None)
    return out


__all__ = ["APPEND_FREE", "append_problems", "checked", "output_options"]
