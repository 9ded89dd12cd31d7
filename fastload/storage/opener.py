"""``fastload.open``: one call for local paths and ``s3://`` URLs, returning a read-only binary file."""

from __future__ import annotations

import builtins
import os
from typing import Any, BinaryIO

from fastload.config import S3Config
from fastload.errors import ConfigError
from fastload.storage.urls import check_url


def open(
    url: str | os.PathLike[str],
    mode: str = "rb",
    *,
    config: S3Config | None = None,
    **s3_options: Any,
) -> BinaryIO:
    """Open ``url`` for reading: a local path, ``file://`` URL, or ``s3://bucket/key``.

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
        if config is not None and s3_options:
            from dataclasses import replace

            config = replace(config, **s3_options)
        elif config is None:
            config = S3Config.from_env(**s3_options)
        # the reader buffers whole parts itself; a BufferedReader on top would only add a copy
        return RangedReader(bucket, key, config=config)  # type: ignore[return-value]
    if s3_options:
        raise ConfigError(f"S3 options {sorted(s3_options)} given for the local path {text!r}")
    path = text[len("file://") :] if text.startswith("file://") else text
    return builtins.open(path, "rb")
