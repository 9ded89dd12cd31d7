"""``fastload.open``: one call for local paths, ``s3://`` and web URLs, returning a read-only binary file."""

from __future__ import annotations

import builtins
import os
from typing import Any, BinaryIO

from fastload.config import S3Config
from fastload.core.weburls import is_web
from fastload.errors import ConfigError
from fastload.storage.urls import check_url


def open(
    url: str | os.PathLike[str],
    mode: str = "rb",
    *,
    config: S3Config | None = None,
    **s3_options: Any,
) -> BinaryIO:
    """Open ``url`` for reading: a local path, ``file://`` URL, ``s3://bucket/key``, or a web URL
    (``https://host/path``, ``http://...``, ``hf://datasets/ORG/NAME/PATH``: ``docs/stores.md``).

    S3 objects are read with parallel ranged GETs (see :class:`~fastload.config.S3Config`; keyword
    options such as ``part_size_bytes=`` or ``max_concurrency=`` override the config). The result supports
    ``read``, ``readinto``, ``seek``, ``tell`` and works with ``tarfile``, ``zipfile`` and ``pyarrow``.
    """
    if mode not in ("rb", "br"):
        raise ConfigError(f"mode={mode!r}: fastload.open only reads binary; use 'rb'")
    text = os.fspath(url)
    check_url(text)
    if text.startswith("s3://"):
        from fastload.s3.client import parse_s3_url
        from fastload.s3.reader import RangedReader

        bucket, key = parse_s3_url(text)
        if not key or key.endswith("/"):
            raise ConfigError(f"{text!r} names a prefix, not an object; give the full key")
        # the reader buffers whole parts itself; a BufferedReader on top would only add a copy
        return RangedReader(bucket, key, config=_config(config, s3_options))  # type: ignore[return-value]
    if is_web(text):
        from fastload.storage.web import open_web

        if text.endswith("/"):
            raise ConfigError(f"{text!r} names a folder, not a file; give the file's URL")
        return open_web(text, _config(config, s3_options))  # type: ignore[return-value]
    if s3_options:
        raise ConfigError(f"S3 options {sorted(s3_options)} given for the local path {text!r}")
    path = text[len("file://") :] if text.startswith("file://") else text
    return builtins.open(path, "rb")


def _config(config: S3Config | None, options: dict[str, Any]) -> S3Config:
    """``config`` (or the environment's) with ``options`` (``headers=``, ``part_size_bytes=``) over it."""
    if config is not None and options:
        from dataclasses import replace

        return replace(config, **options)
    return config if config is not None else S3Config.from_env(**options)
