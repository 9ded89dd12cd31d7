"""``fastload cp`` from a local file or folder to ``gs://`` or ``az://`` (each file one upload, ``jobs`` at a
time; a folder's ``index.json`` last, so a dataset copied is readable only once every shard is there)."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from fastload.config import S3Config
from fastload.core.index import INDEX_NAMES
from fastload.core.weburls import parse_gs_url
from fastload.errors import ConfigError, NotFoundError
from fastload.s3 import gcswrite


def upload_to_gcs(
    src: str, dst: str, *, recursive: bool, config: S3Config, jobs: int
) -> list[tuple[str, int]]:
    """Copy ``src`` to ``dst`` (``gs://`` or ``az://``); ``(destination URL, bytes)`` of each file copied,
    in order."""
    scheme = dst[:5]
    if scheme == "az://":
        from fastload.s3 import azwrite
        from fastload.s3.azstore import parse_az_url

        bucket, prefix = parse_az_url(dst)
        put: Callable[[str, str, str, S3Config], object] = azwrite.upload
    else:
        bucket, prefix = parse_gs_url(dst)
        put = gcswrite.upload
    if os.path.isdir(src):
        if not recursive:
            raise ConfigError(f"{src} is a folder: copy it with -r (fastload cp -r {src} {dst})")
        root = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
        pairs: list[tuple[str, str]] = []
        for folder, dirs, files in os.walk(src):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, src).replace(os.sep, "/")
                pairs.append((path, root + rel))
        last = {root + name for name in INDEX_NAMES}  # a reader that finds the index finds its files
    elif os.path.isfile(src):
        name = prefix + os.path.basename(src) if not prefix or prefix.endswith("/") else prefix
        pairs, last = [(src, name)], set()
    else:
        raise NotFoundError(f"{src} does not exist", path=src)
    head = [p for p in pairs if p[1] not in last]
    tail = [p for p in pairs if p[1] in last]

    def send(pair: tuple[str, str]) -> tuple[str, int]:
        put(pair[0], bucket, pair[1], config)
        return f"{scheme}{bucket}/{pair[1]}", os.path.getsize(pair[0])

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        done = list(pool.map(send, head))
    return done + [send(p) for p in tail]
