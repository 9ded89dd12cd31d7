"""The dataset manifest (``index.json``) read from a folder or ``s3://`` prefix, and the refusal of a
folder that holds an unfinished pack (its journal, no ``index.json``): part of a dataset is not one."""

from __future__ import annotations

import os

from fastload.config import S3Config
from fastload.core.index import INDEX_NAME, INDEX_NAMES, DatasetIndex, ShardEntry, parse_index
from fastload.errors import IndexFormatError, NotFoundError, UnfinishedPackError
from fastload.storage import access as storage

JOURNAL_DIR = ".fastload-pack"  # a pack's resume journal, in its destination while it runs
JOURNAL_STATE = f"{JOURNAL_DIR}/state.json"
OPTIMIZE_STATE = f"{JOURNAL_DIR}/optimize/state.json"  # (fastload.optimize's journal, beside the writer's)
OPTIMIZE_HOW = (
    "fastload.optimize left it (its journal .fastload-pack/optimize/ is there): finish it with "
    "fastload.optimize(..., resume=True) (or `fastload optimize ... --resume`) with the same function, "
    "inputs and options, or delete the folder and run optimize again"
)


def refuse_unfinished(root: str, *, s3_config: S3Config | None = None, what: str = "read") -> None:
    """Raise :class:`UnfinishedPackError` if the folder or prefix ``root`` holds a pack's journal (a pack
    was killed or is still running there: the shards present are part of the dataset, and index.json is
    not written yet). One stat (a HEAD on S3); callers ask only when there is no ``index.json``."""
    mark = storage.join(root, JOURNAL_STATE)
    if os.path.isfile(mark) if not storage.is_remote(root) else storage.exists(mark, config=s3_config):
        by = unfinished_by(root, s3_config=s3_config)
        raise UnfinishedPackError(root, what=what, how=OPTIMIZE_HOW if by == "optimize" else None)


def unfinished_by(root: str, *, s3_config: S3Config | None = None) -> str:
    """What left the unfinished pack in ``root``: "optimize" where its journal is there, else "pack"."""
    mark = storage.join(root, OPTIMIZE_STATE)
    found = os.path.isfile(mark) if not storage.is_remote(root) else storage.exists(mark, config=s3_config)
    return "optimize" if found else "pack"


def read_manifest(root: str, *, s3_config: S3Config | None = None) -> tuple[str, bytes] | None:
    """``(url, bytes)`` of the dataset manifest under ``root`` (normalised): ``index.json`` at the root, else
    ``_fastload/index.json`` (where Parquet datasets keep it: :data:`fastload.core.index.INDEX_NAMES`);
    None when there is neither."""
    for name in INDEX_NAMES:
        url = storage.join(root, name)
        try:
            return url, storage.read_bytes(url, config=s3_config)
        except (NotFoundError, FileNotFoundError, NotADirectoryError):
            continue
    return None


def has_index(root: str, *, s3_config: S3Config | None = None) -> bool:
    """Whether ``root`` (normalised) holds a dataset manifest, in either place."""
    return any(storage.exists(storage.join(root, name), config=s3_config) for name in INDEX_NAMES)


def load_index(dataset: str | os.PathLike[str], *, s3_config: S3Config | None = None) -> DatasetIndex:
    """Read the manifest of a dataset folder or ``s3://`` prefix (``index.json``, or ``_fastload/index.json``
    in a Parquet dataset), or the index file itself."""
    url = storage.normalise(dataset)
    if url.endswith(".json"):
        try:
            return parse_index(storage.read_bytes(url, config=s3_config), where=url)
        except (NotFoundError, FileNotFoundError):
            raise NotFoundError(
                f"{url} not found: is this a dataset written by `fastload pack`?", path=url
            ) from None
    found = read_manifest(url, s3_config=s3_config)
    if found is None:
        where = storage.join(url, INDEX_NAME)
        refuse_unfinished(url, s3_config=s3_config)
        raise NotFoundError(
            f"{where} not found (nor {storage.join(url, INDEX_NAMES[1])}): is this a dataset written by "
            "`fastload pack`?",
            path=where,
        )
    return parse_index(found[1], where=found[0])


def is_one_file(url: str, *, s3_config: S3Config | None = None) -> bool:
    """Whether ``url`` (normalised) is one file or S3 object rather than a folder or prefix."""
    if storage.is_remote(url):
        return not url.endswith("/") and storage.exists(url, config=s3_config)
    return os.path.isfile(url)


def _parent(url: str) -> str:
    if storage.is_remote(url):
        head, _, _ = url.rstrip("/").rpartition("/")
        return url if head.endswith((":", ":/")) else head
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
