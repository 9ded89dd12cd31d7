"""``fastload.to_ray`` and ``fastload.from_ray``: a packed dataset as a ``ray.data`` Dataset, and a
``ray.data`` pipeline written as fastload shards with ``index.json``.

Rows are sample dicts in the WebDataset convention: ``__key__`` (str) plus one column per field
(``bytes``; null where a sample lacks that field).
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from fastload.config import PackConfig, S3Config
from fastload.core.index import DatasetIndex, ShardEntry
from fastload.errors import ConfigError, FastloadError, PackError
from fastload.formats import DatasetEntries, index_name
from fastload.packing.dest import destination
from fastload.packing.journal import STATE_DIR
from fastload.packing.options import checked, output_options
from fastload.packing.ray_engine import require_ray
from fastload.packing.report import PackReport
from fastload.storage import access as storage

# Options that decide which samples go where in a local pack; a ray.data pipeline decides that itself.
_PIPELINE_OPTIONS = {
    "shuffle_seed": "shuffle in the pipeline instead: ds.random_shuffle(seed=...)",
    "partition_level": "filter the pipeline per partition and write each into its own destination",
    "resume": "a pipeline's rows are not guaranteed to repeat; write into an empty destination",
}


def to_ray(source: str | os.PathLike[str], *, s3_config: S3Config | None = None) -> Any:
    """A ``ray.data.Dataset`` of the samples of a packed dataset (folder or ``s3://`` prefix), in index
    order within each shard: one read task per shard, each shard read with one ranged read (tar) or by
    row group (Parquet), from any node."""
    require_ray()
    import ray.data

    dataset = DatasetEntries.open(source, s3_config=s3_config)  # (given index.json: its folder is the root)
    root, index = dataset.root, dataset.index
    items = [
        {
            "url": storage.join(root, s.name),
            "root": root,
            "format": index.shard_format,
            # (a v2 manifest entry: the task fetches the shard's sample table itself)
            "entry": json.dumps(s.manifest_dict() if s.detached else s.to_dict()),
            "detached": s.detached,
        }
        for s in index.shards
    ]
    if not items:
        raise PackError(f"{root} holds no shards; there is nothing to read")
    ds = ray.data.from_items(items, override_num_blocks=len(items))
    return ds.flat_map(functools.partial(_shard_rows, fields=index.fields, s3_config=s3_config))


def _shard_rows(
    item: dict[str, Any], *, fields: list[str], s3_config: S3Config | None
) -> list[dict[str, Any]]:
    """Every sample of one shard as a row with ``__key__`` and every field (None where missing)."""
    from fastload.train.shardread import ShardReader

    raw = json.loads(item["entry"])
    held = ShardEntry.from_manifest(raw) if item.get("detached") else ShardEntry.from_dict(raw)
    # the task's dataset is its one shard (a task carries its own entry, not the whole index)
    one = DatasetIndex(shard_format=item["format"], fields=fields, shards=[held])
    entry = DatasetEntries(item["root"], one, s3_config=s3_config).entry(0)
    reader = ShardReader(item["url"], entry, config=s3_config)
    try:
        return [
            {"__key__": s["__key__"], **{f: s.get(f) for f in fields}}
            for batch in reader.read_samples(range(entry.samples))
            for s in batch
        ]
    finally:
        reader.close()


def from_ray(
    dataset: Any,
    dst: str | os.PathLike[str],
    config: PackConfig | None = None,
    *,
    s3_config: S3Config | None = None,
    **options: Any,
) -> PackReport:
    """Write the rows of ``dataset`` (a ``ray.data.Dataset`` with a ``__key__`` column and one column per
    field: bytes, str or int) as fastload shards plus ``index.json`` in ``dst`` (an empty folder on a file
    system every node mounts, or an ``s3://`` prefix).

    Ray Data's write tasks write the shards (``{prefix}-{task:06d}-{n:06d}``, cut by ``shard_size_bytes``
    and ``max_samples``), in the pipeline's row order; the index lists them by name and is written last.
    ``options`` override fields of ``config`` (format, sizes, prefix, compression, fsync). Keys must be
    unique: a duplicate raises :class:`~fastload.errors.PackError` and no index is written.
    """
    require_ray()
    from fastload.packing.ray_sink import KEY, ShardSink

    config = checked(replace(config or PackConfig(), **options) if options else (config or PackConfig()))
    default = PackConfig()
    for name, advice in _PIPELINE_OPTIONS.items():
        if getattr(config, name) != getattr(default, name):
            raise ConfigError(f"from_ray does not take {name}; {advice}")
    target = os.fspath(dst)
    if target.startswith("s3://"):
        s3_config = s3_config or S3Config.from_env()
    began = time.monotonic()
    dest = destination(
        target if target.startswith("s3://") else os.path.abspath(target), STATE_DIR, config=s3_config
    )
    if dest.exists_as_file():
        raise PackError(f"destination {dest.url} is a file; choose a folder")
    if not dest.is_empty():
        raise PackError(f"destination {dest.url} is not empty; choose an empty or new folder")
    schema = dataset.schema()
    if schema is None:
        raise PackError(f"the dataset has no rows (no schema); nothing was written to {dest.url}")
    columns = list(schema.names)
    if KEY not in columns:
        raise ConfigError(
            f"the dataset has columns {columns} but no '__key__'; add one with the sample names, e.g. "
            "ds.map(lambda r: {'__key__': r['path'].rsplit('.', 1)[0], ...})"
        )
    fields = sorted(c for c in columns if c != KEY)
    dest.prepare()
    sink = ShardSink(dest.url, config, fields, s3_config)
    try:
        dataset.write_datasink(sink)
    except Exception as exc:
        cause = _fastload_cause(exc)
        if cause is None:
            raise
        raise cause from None  # Ray wraps it with the worker's traceback; the message is what matters
    finally:
        dest.cleanup()
    written = sorted(sink.returns, key=lambda r: r["entry"]["name"])
    shards = [ShardEntry.from_manifest(r["entry"]) for r in written]
    index = DatasetIndex(
        shard_format=config.shard_format,
        fields=sorted({f for r in written for f in r["fields"]}),
        shards=shards,
        options={**output_options(config), "source": "ray.data"},
        payload_bytes=sum(r["payload_bytes"] for r in written),
    )
    seen = _key_counts(DatasetEntries(dest.url, index, s3_config=s3_config))
    twice = [k for k, n in seen.items() if n > 1]
    if twice:
        raise PackError(
            f"{len(twice)} key(s) occur in more than one row, e.g. {twice[:3]}; samples need unique keys. "
            f"The shards are in {dest.url} but no index was written: fix the keys and write into an empty "
            "destination"
        )
    if not shards:
        raise PackError(f"the dataset has no rows; nothing was written to {dest.url}")

    dest.write_bytes(index_name(index.shard_format), index.to_json())
    dest.remove_tree(STATE_DIR)
    return PackReport(
        dest.url,
        index,
        shards_written=len(shards),
        files=sum(r["files"] for r in written),
        seconds=time.monotonic() - began,
    )


def _key_counts(dataset: DatasetEntries) -> Counter[str]:
    """How often each key occurs in ``dataset`` (manifest entries: their sample tables are read, in
    parallel, one shard's keys at a time)."""

    def keys(i: int) -> list[str]:
        return list(dataset.entry(i).keys)

    seen: Counter[str] = Counter()
    with ThreadPoolExecutor(max_workers=16) as pool:
        for found in pool.map(keys, range(len(dataset.index.shards))):
            seen.update(found)
    return seen


def _fastload_cause(exc: BaseException) -> FastloadError | None:
    """The fastload error a Ray task raised, unwrapped from Ray's exceptions, or None."""
    from ray.exceptions import RayError

    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, FastloadError) and not isinstance(e, RayError):
            return e
        cause = getattr(e, "cause", None) if isinstance(e, RayError) else None
        todo += [cause if isinstance(cause, BaseException) else None, e.__cause__, e.__context__]
    return None
