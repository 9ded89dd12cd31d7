"""The dataset manifest (``index.json``) read from a folder or ``s3://`` prefix."""

from __future__ import annotations

import os

from fastload.config import S3Config
from fastload.core.index import INDEX_NAME, DatasetIndex, ShardEntry, parse_index
from fastload.errors import IndexFormatError, NotFoundError
from fastload.storage import access as storage


def load_index(dataset: str | os.PathLike[str], *, s3_config: S3Config | None = None) -> DatasetIndex:
    """Read ``index.json`` from a dataset folder or ``s3://`` prefix (or the index file itself)."""
    url = storage.normalise(dataset)
    if not url.endswith(".json"):
        url = storage.join(url, INDEX_NAME)
    try:
        raw = storage.read_bytes(url, config=s3_config)
    except (NotFoundError, FileNotFoundError):
        raise NotFoundError(
            f"{url} not found: is this a dataset written by `fastload pack`?", path=url
        ) from None
    return parse_index(raw, where=url)


def is_one_file(url: str, *, s3_config: S3Config | None = None) -> bool:
    """Whether ``url`` (normalised) is one file or S3 object rather than a folder or prefix."""
    if storage.is_remote(url):
        return not url.endswith("/") and storage.exists(url, config=s3_config)
    return os.path.isfile(url)


def _parent(url: str) -> str:
    if storage.is_remote(url):
        head, _, _ = url.rstrip("/").rpartition("/")
        return url if head in ("s3:", "s3:/") else head
    return os.path.dirname(url)


def dataset_of_file(
    url: str, *, s3_config: S3Config | None = None, levels: int = 4
) -> tuple[str, DatasetIndex, ShardEntry] | None:
    """``(root, index, entry)`` of the dataset whose ``index.json`` lists the file ``url`` (normalised) as a
    shard: in its folder or one of the ``levels`` folders above (partition folders); None when none does."""
    root = url
    for _ in range(levels):
        parent = _parent(root)
        if parent == root or parent == "":
            return None
        root = parent
        try:
            index = load_index(root, s3_config=s3_config)
        except (NotFoundError, FileNotFoundError, IndexFormatError):
            continue
        name = url[len(root) :].lstrip("/").replace(os.sep, "/")
        return next(((root, index, s) for s in index.shards if s.name == name), None)
    return None
