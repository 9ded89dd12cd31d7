"""The dataset manifest (``index.json``) read from a folder or ``s3://`` prefix, and the refusal of a
folder that holds an unfinished pack (its journal, no ``index.json``): part of a dataset is not one."""

from __future__ import annotations

import os

from fastload.config import S3Config
from fastload.core.index import INDEX_NAME, DatasetIndex, parse_index
from fastload.errors import NotFoundError, UnfinishedPackError
from fastload.storage import access as storage

JOURNAL_DIR = ".fastload-pack"  # a pack's resume journal, in its destination while it runs
JOURNAL_STATE = f"{JOURNAL_DIR}/state.json"


def refuse_unfinished(root: str, *, s3_config: S3Config | None = None, what: str = "read") -> None:
    """Raise :class:`UnfinishedPackError` if the folder or prefix ``root`` holds a pack's journal (a pack
    was killed or is still running there: the shards present are part of the dataset, and index.json is
    not written yet). One stat (a HEAD on S3); callers ask only when there is no ``index.json``."""
    mark = storage.join(root, JOURNAL_STATE)
    if os.path.isfile(mark) if not storage.is_remote(root) else storage.exists(mark, config=s3_config):
        raise UnfinishedPackError(root, what=what)


def load_index(dataset: str | os.PathLike[str], *, s3_config: S3Config | None = None) -> DatasetIndex:
    """Read ``index.json`` from a dataset folder or ``s3://`` prefix (or the index file itself)."""
    url = storage.normalise(dataset)
    if not url.endswith(".json"):
        url = storage.join(url, INDEX_NAME)
    try:
        raw = storage.read_bytes(url, config=s3_config)
    except (NotFoundError, FileNotFoundError):
        if not storage.normalise(dataset).endswith(".json"):
            refuse_unfinished(storage.normalise(dataset), s3_config=s3_config)
        raise NotFoundError(
            f"{url} not found: is this a dataset written by `fastload pack`?", path=url
        ) from None
    return parse_index(raw, where=url)
