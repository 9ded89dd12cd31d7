"""Uniform read-side access to local paths, ``s3://`` URLs and the web stores (``http(s)://``, ``hf://``:
``storage.web``): read, size, open, list."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import BinaryIO

from fastload.config import S3Config
from fastload.core.weburls import WEB_SCHEMES, is_web
from fastload.errors import ConfigError, NotFoundError
from fastload.storage.urls import check_url


def is_remote(url: str) -> bool:
    return url.startswith(("s3://", *WEB_SCHEMES))


def normalise(url: str | os.PathLike[str]) -> str:
    text = os.fspath(url)
    check_url(text)
    if text.startswith("file://"):
        text = text[len("file://") :]
    return text.rstrip("/") if is_remote(text) else os.path.abspath(text)


def join(root: str, name: str) -> str:
    return f"{root.rstrip('/')}/{name}" if is_remote(root) else os.path.join(root, name)


def open_read(url: str, *, config: S3Config | None = None) -> BinaryIO:
    """A read-only binary file for ``url`` (the parallel ranged reader for S3)."""
    from fastload.storage.opener import open as fastload_open

    return fastload_open(url, config=config)


def read_bytes(url: str, *, config: S3Config | None = None) -> bytes:
    """All bytes of ``url``; :class:`~fastload.errors.NotFoundError` if it does not exist."""
    if is_web(url):
        from fastload.storage.web import open_web

        with open_web(url, config or S3Config.from_env()) as reader:
            return reader.fetch_range(0, sys.maxsize)
    if is_remote(url):
        from fastload.s3.client import parse_s3_url
        from fastload.storage.s3source import get_whole

        bucket, key = parse_s3_url(url)
        return get_whole(bucket, key, config=config or S3Config.from_env())
    try:
        with open(url, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise NotFoundError(f"{url} does not exist", path=url) from None


def size_of(url: str, *, config: S3Config | None = None) -> int:
    if is_web(url):
        from fastload.storage.web import open_web

        with open_web(url, config or S3Config.from_env()) as reader:
            return reader.size
    if is_remote(url):
        from fastload.s3.client import parse_s3_url
        from fastload.s3.reader import RangedReader

        bucket, key = parse_s3_url(url)
        with RangedReader(bucket, key, config=config or S3Config.from_env()) as reader:
            return reader.size
    return os.path.getsize(url)


def exists(url: str, *, config: S3Config | None = None) -> bool:
    try:
        size_of(url, config=config)
    except (FileNotFoundError, NotFoundError):
        return False
    return True


def is_folder(url: str) -> bool:
    """True for a local folder or any S3 prefix (S3 has no folders; a prefix may hold objects) or web URL."""
    return is_remote(url) or os.path.isdir(url)


def list_files(root: str, suffix: str, *, config: S3Config | None = None) -> list[str]:
    """Files (or objects) under ``root`` whose names end with ``suffix``, sorted (a web server: ConfigError,
    it cannot be listed; the Hub: its tree API)."""
    if is_web(root):
        from fastload.storage.web import list_web

        return list_web(root, suffix, config or S3Config.from_env())
    if is_remote(root):
        from fastload.s3.client import parse_s3_url
        from fastload.s3.listing import ObjectInfo, list_objects

        bucket, prefix = parse_s3_url(root + "/")
        return sorted(
            f"s3://{bucket}/{o.key}"
            for o in list_objects(bucket, prefix, config=config or S3Config.from_env())
            if isinstance(o, ObjectInfo) and o.key.endswith(suffix)
        )
    out: list[str] = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        out += [os.path.join(folder, f) for f in sorted(files) if f.endswith(suffix)]
    return sorted(out)


def split_root(urls: Sequence[str]) -> tuple[str, list[str]]:
    """A common root of ``urls`` and each URL's name relative to it."""
    remote = {is_remote(u) for u in urls}
    if len(remote) != 1:
        raise ConfigError("give shard URLs all on S3 (or all on the web) or all local, not a mix")
    if remote.pop():
        parents = [u.rsplit("/", 1)[0] for u in urls]
        root = parents[0]
        while any(not (p + "/").startswith(root + "/") for p in parents):
            root = root.rsplit("/", 1)[0]
            if root.endswith(":/") or root.endswith(":"):
                raise ConfigError("give shard URLs in one bucket (or on one web server)")
        return root, [u[len(root) + 1 :] for u in urls]
    root = os.path.commonpath([os.path.dirname(u) for u in urls])
    return root, [os.path.relpath(u, root) for u in urls]
