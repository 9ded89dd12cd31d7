"""Shard formats: the only place that knows a format's bytes (tar, Parquet, TFRecord), each one module
implementing :class:`ShardFormat`, chosen through the registry (:func:`by_name`, :func:`for_path`).

May import ``core``, ``storage``, the base modules and the C module ``fastload._native``.

Modules: the protocol and registry (``registry``), a dataset's index and full entries checked by their format
(``entries``; ``DatasetEntries``: a dataset held to complete its shards' entries the one way), the shard kit
every format shares (``shard``: the write loop, its output, results, a checksumming reader), checks every
format shares (``checks``), the optional C readers (``native``), and one package per format: ``tar``,
``parquet``, ``tfrecord``; no format package imports another's."""

from fastload.formats.entries import (
    DatasetEntries,
    EntryMemo,
    attach_tables,
    check_index,
    dataset_root,
    full_entry,
    load_index,
    read_payload,
)
from fastload.formats.parquet.format import PARQUET
from fastload.formats.registry import (
    Problem,
    SampleSource,
    ShardFormat,
    all_formats,
    by_name,
    for_path,
    foreign_format,
    index_files,
    index_name,
    names,
    register,
    sidecar_prefix,
    table_path,
    unregister,
)
from fastload.formats.tar.format import TAR
from fastload.formats.tfrecord.format import TFRECORD

for _fmt in (TAR, PARQUET, TFRECORD):
    register(_fmt, replace=True)

__all__ = [
    "DatasetEntries",
    "EntryMemo",
    "Problem",
    "SampleSource",
    "ShardFormat",
    "all_formats",
    "attach_tables",
    "by_name",
    "check_index",
    "dataset_root",
    "for_path",
    "foreign_format",
    "full_entry",
    "index_files",
    "index_name",
    "load_index",
    "names",
    "read_payload",
    "register",
    "sidecar_prefix",
    "table_path",
    "unregister",
]
