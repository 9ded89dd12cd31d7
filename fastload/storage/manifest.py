"""The dataset manifest (``index.json``) read from a folder or ``s3://`` prefix."""

from __future__ import annotations

import os

from fastload.config import S3Config
from fastload.core.index import INDEX_NAME, DatasetIndex, parse_index
from fastload.errors import NotFoundError
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
