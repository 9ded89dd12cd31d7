"""``fastload ls``: the objects under an S3 prefix (one level, or all with ``recursive``), the files of a
local folder, or a listable web store's (the Hub's) files."""

from __future__ import annotations

from fastload.config import S3Config
from fastload.core.weburls import is_web
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
