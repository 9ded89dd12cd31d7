"""``fastload cp`` from one store to another of a different kind: ``s3://``, ``gs://``, ``az://`` (and from
``http(s)://`` or ``hf://``) to ``s3://``, ``gs://`` or ``az://``. Each object is streamed: read by its
store's ranged reader (parallel ranges, exact lengths, every 206 checked, pinned to one version) straight
into the destination's upload, never staged on local disk.

- to ``s3://``: a multipart upload whose parts are ranged reads of the source (``s3.upload.upload_from``),
  each part sent with its Content-MD5 and CRC32C, which S3 checks;
- to ``gs://`` / ``az://``: one upload request whose body is the source read in order
  (``s3.httpcall.Stream``, opened again from the start if the request is retried), hashed (MD5) as it is
  sent; the MD5 the store reports of what it stored must be that one, else the object is deleted and the
  copy fails naming both URLs (a store that reports none: its size must be the source's).

A folder copy (``-r``) lists the source (a web server, which cannot be listed: the dataset its index.json
names) and sends every ``index.json`` last, so a copy that fails leaves no index at the destination.
Objects already at the destination are copied again (no skip of unchanged ones: that is S3 <-> local's).
S3 to S3 is server-side (:mod:`fastload.copy`), gs to gs too (GCS's ``rewriteTo``); az to az is
streamed as here.
"""

from __future__ import annotations

import base64
import hashlib
import io
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastload.config import S3Config
from fastload.core.index import INDEX_NAME
from fastload.core.weburls import expand_braces, has_braces, lists_folders
from fastload.errors import ConfigError, NotFoundError, S3Error
from fastload.storage import access as storage

STORES = ("s3://", "gs://", "az://")


def is_store_copy(src: str, dst: str) -> bool:
    """Whether ``fastload cp SRC DST`` is a copy between two stores that is not S3 to S3."""
    both_s3 = src.startswith("s3://") and dst.startswith("s3://")
    return storage.is_remote(src) and dst.startswith(STORES) and not both_s3


class _Hashed(io.RawIOBase):
    """The source object read in order, MD5-hashed and counted as it is read (an upload's body)."""

    def __init__(self, reader: Any) -> None:
        self._reader, self.md5, self.sent = reader, hashlib.md5(usedforsecurity=False), 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n: int = self._reader.readinto(buffer)
        self.md5.update(memoryview(buffer)[:n])
        self.sent += n
        return n

    def close(self) -> None:
        self._reader.close()
        super().close()


def _copy_one(src: str, dst: str, config: S3Config) -> int:
    """Stream the object ``src`` to ``dst``; its size."""
    from fastload.storage.opener import open as open_url

    if src.startswith("gs://") and dst.startswith("gs://"):  # inside GCS: its own copy
        from fastload.core.weburls import parse_gs_url
        from fastload.s3 import gcswrite

        return gcswrite.rewrite(parse_gs_url(src), parse_gs_url(dst), config)
    reader: Any = open_url(src, config=config)
    try:
        size: int = reader.size  # (one HEAD, which pins the version the reads then ask for)
    except BaseException:
        reader.close()
        raise
    if not dst.startswith("s3://"):
        _stream_to_store(src, dst, reader, size, config)
        return size
    from fastload.s3.client import parse_s3_url
    from fastload.s3.upload import upload_from

    bucket, key = parse_s3_url(dst)
    with reader:
        upload_from(
            lambda at, n: reader.fetch_range(at, at + n), size, bucket, key, source=src, config=config
        )
    return size


def _stream_to_store(src: str, dst: str, reader: Any, size: int, config: S3Config) -> None:
    """One upload of ``reader``'s bytes to ``dst`` (``gs://``, ``az://``); a retry reads ``src`` again."""
    from fastload.packing.storedest import azure_ops, gcs_ops
    from fastload.s3.httpcall import Stream
    from fastload.storage.opener import open as open_url

    ops = gcs_ops() if dst.startswith("gs://") else azure_ops()
    bucket, name = ops.parse(dst)
    spare, bodies = [reader], []

    def open_body() -> Any:
        bodies.append(_Hashed(spare.pop() if spare else open_url(src, config=config)))
        return io.BufferedReader(bodies[-1], buffer_size=1 << 20)

    try:
        reported = ops.upload(Stream(open_body, size), bucket, name, config)
    finally:
        for unused in spare:
            unused.close()
    sent = bodies[-1]
    ours = base64.b64encode(sent.md5.digest()).decode()
    stored = ops.size(bucket, name, config) if reported is None else None
    if sent.sent != size or (reported is not None and reported != ours) or stored not in (None, size):
        ops.delete(bucket, name, config)
        seen = f"MD5 {reported}" if reported is not None else f"{stored} bytes"
        raise S3Error(
            f"copying {src} to {dst}: the store holds {seen} where {sent.sent} bytes with MD5 {ours} were "
            f"sent of {size}; the copy was deleted: run the command again",
            bucket=bucket,
            key=name,
            url=dst,
        )


def web_names(root: str, config: S3Config) -> list[str]:
    """The files of the web folder ``root``, relative to it: listed (the Hub), else a dataset's own
    (``index.json``, its shards and their sample tables: a web server cannot be listed)."""
    from fastload.core.index import parse_index
    from fastload.storage.manifest import read_manifest

    if lists_folders(root):
        return [u[len(root) + 1 :] for u in storage.list_files(root, "", config=config)]
    found = read_manifest(root, s3_config=config)
    if found is None:
        raise NotFoundError(
            f"{root} has no index.json; a web server's folders cannot be listed, so fastload cp copies a "
            "dataset folder (its index.json names the files) or one file by its URL",
            path=root,
        )
    url, data = found
    index = parse_index(data, where=url)
    names = [url[len(root) + 1 :]]
    for shard in index.shards:
        names.append(shard.name)
        if shard.table is not None:
            names.append(shard.table.name)
    return names


def _pairs(src: str, dst: str, recursive: bool, config: S3Config) -> list[tuple[str, str]]:
    """(source URL, destination URL) of every object to copy (a brace pattern's: laid out as under their
    common folder)."""
    if storage.is_remote(src) and has_braces(src):
        root, names = storage.split_root(expand_braces(src))
        return [(f"{root}/{n}", f"{dst.rstrip('/')}/{n}") for n in names]
    if not (recursive or src.endswith("/")):
        base = src.rstrip("/").rsplit("/", 1)[-1]
        return [(src, dst + base if dst.endswith("/") else dst)]
    root, to = src.rstrip("/"), dst.rstrip("/")
    if storage.is_remote(root) and not root.startswith(("http://", "https://")):
        names = [u[len(root) + 1 :] for u in storage.list_files(root, "", config=config)]
    else:
        names = web_names(root, config)
    if not names:
        raise ConfigError(f"{src} holds no objects to copy (check the URL)")
    return [(f"{root}/{n}", f"{to}/{n}") for n in names]


def copy_between(
    src: str,
    dst: str,
    *,
    recursive: bool,
    config: S3Config,
    jobs: int,
    on_file: Callable[[], None] | None = None,
) -> list[tuple[str, int]]:
    """Copy ``src`` to ``dst`` (see the module docstring), ``jobs`` objects at a time, every ``index.json``
    after the rest; ``(destination URL, bytes)`` of each object copied, in order."""
    pairs = _pairs(src, dst, recursive, config)
    waves = [
        [p for p in pairs if p[1].rsplit("/", 1)[-1] != INDEX_NAME],
        [p for p in pairs if p[1].rsplit("/", 1)[-1] == INDEX_NAME],
    ]
    done: list[tuple[str, int]] = []

    def one(pair: tuple[str, str]) -> tuple[str, int]:
        size = _copy_one(pair[0], pair[1], config)
        if on_file is not None:
            on_file()
        return pair[1], size

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        for wave in waves:
            done += pool.map(one, wave)
    return done
