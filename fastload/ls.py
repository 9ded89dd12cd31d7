"""``fastload ls``: the objects under an S3 prefix (one level, or all with ``recursive``), the files of a
local folder, a listable web store's (the Hub's) files, or the shards a brace pattern names
(``https://host/shard-{000000..000009}.tar``, each with its size)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from fastload.config import S3Config
from fastload.core.weburls import expand_braces, has_braces, is_web
from fastload.storage import access as storage


def listing(url: str, *, recursive: bool = False, config: S3Config | None = None) -> list[str]:
    """Lines for ``fastload ls``: ``size  name`` for objects, ``PRE name/`` for common prefixes."""
    if not storage.is_remote(url):
        from fastload.storage.listing import FileEntry, LocalSource

        source = LocalSource(storage.normalise(url))
        return [
            f"{found.size:>12}  {found.relpath}" if isinstance(found, FileEntry) else f"{'SKIP':>12}  {found}"
            for found in source.list()
        ]
    if is_web(url) and has_braces(url):  # the shards a pattern names, each HEADed for its size
        config = config or S3Config.from_env()
        root, names = storage.split_root(expand_braces(url))
        with ThreadPoolExecutor(max_workers=min(16, len(names))) as pool:
            sizes = list(pool.map(lambda name: storage.size_of(f"{root}/{name}", config=config), names))
        return [f"{size:>12}  {name}" for name, size in zip(names, sizes, strict=True)]
    if is_web(url):  # the Hub lists (recursively); a web server cannot (list_files says so)
        root = url.rstrip("/")
        return [
            u[len(root) + 1 :] for u in storage.list_files(root, "", config=config or S3Config.from_env())
        ]
    from fastload.s3.client import parse_s3_url
    from fastload.s3.listing import list_objects

    bucket, prefix = parse_s3_url(url)
    lines = []
    for item in list_objects(
        bucket, prefix, config=config or S3Config.from_env(), delimiter=None if recursive else "/"
    ):
        if isinstance(item, str):
            lines.append(f"{'PRE':>12}  {item}")
        else:
            lines.append(f"{item.size:>12}  {item.key}")
    return lines
