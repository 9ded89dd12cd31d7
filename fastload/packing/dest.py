"""Where a pack writes: a local folder or a store prefix (s3://, gs://, az://), behind one small interface.

Shards are written to a local temporary file first; ``publish`` then renames it into place (local) or
uploads it with a multipart upload (S3). Either way a shard appears under its final name only when whole.
A failed local write (to the folder, or to an S3 destination's staging folder) raises
:class:`~fastload.errors.DestinationWriteError` naming both (:func:`write_failed`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from typing import Protocol

from fastload.config import S3Config
from fastload.core.index import INDEX_NAMES
from fastload.errors import DestinationWriteError, write_error
from fastload.storage.localfs import atomic_write, publish

STORES = ("s3://", "gs://", "az://")  # the stores a pack writes to (anything else is a local path)


def dest_url(url: str) -> str:
    """A destination's URL: a store's as given, a local path made absolute."""
    return url if url.startswith(STORES) else os.path.abspath(url)


class Destination(Protocol):
    url: str
    tmp_dir: str

    def is_empty(self) -> bool: ...
    def exists_as_file(self) -> bool: ...
    def prepare(self) -> None: ...
    def size(self, name: str) -> int | None: ...
    def read_bytes(self, name: str) -> bytes | None: ...
    def write_bytes(self, name: str, data: bytes) -> None: ...
    def publish(self, local_tmp: str, name: str) -> None: ...
    def list(self, prefix: str) -> list[str]: ...
    def remove(self, name: str) -> None: ...
    def remove_tree(self, prefix: str) -> None: ...
    def cleanup(self) -> None: ...


class LocalDestination:
    """A local folder; temporary files live in ``STATE_DIR/tmp`` inside it (same file system: rename)."""

    def __init__(self, root: str, state_dir: str) -> None:
        self.root = os.path.abspath(root)
        self.url = self.root
        self.tmp_dir = os.path.join(self.root, state_dir, "tmp")

    def is_empty(self) -> bool:
        return not os.path.isdir(self.root) or not os.listdir(self.root)

    def exists_as_file(self) -> bool:
        return os.path.exists(self.root) and not os.path.isdir(self.root)

    def prepare(self) -> None:
        shutil.rmtree(self.tmp_dir, ignore_errors=True)
        os.makedirs(self.tmp_dir, exist_ok=True)

    def _path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def size(self, name: str) -> int | None:
        try:
            return os.path.getsize(self._path(name))
        except OSError:
            return None

    def read_bytes(self, name: str) -> bytes | None:
        try:
            with open(self._path(name), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def write_bytes(self, name: str, data: bytes) -> None:
        try:
            os.makedirs(os.path.dirname(self._path(name)), exist_ok=True)
            atomic_write(self._path(name), data)
        except OSError as exc:
            raise write_failed(self, exc, self._path(name)) from exc

    def publish(self, local_tmp: str, name: str) -> None:
        try:
            publish(local_tmp, self._path(name))
        except OSError as exc:
            raise write_failed(self, exc, self._path(name)) from exc

    def list(self, prefix: str) -> list[str]:
        folder = self._path(prefix)
        if not os.path.isdir(folder):
            return []
        # leaves out atomic_write's hidden temporary files (a kill can leave one behind)
        return sorted(os.path.join(prefix, n) for n in os.listdir(folder) if not n.startswith("."))

    def remove(self, name: str) -> None:
        """Delete one file, if it is there."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(name))

    def remove_tree(self, prefix: str) -> None:
        shutil.rmtree(self._path(prefix), ignore_errors=True)

    def cleanup(self) -> None:
        """Nothing to do: the temporary folder is inside the state folder."""


def write_failed(dest: Destination, exc: OSError, path: str) -> DestinationWriteError:
    """``exc``, met writing ``path`` for ``dest``, as an error naming the destination and, for S3, the local
    staging folder (where the file being written was)."""
    staging = dest.tmp_dir if dest.url.startswith(("s3://", "gs://", "az://")) and dest.tmp_dir else None
    return write_error(exc, path).at(destination=dest.url, staging=staging)


def destination(url: str, state_dir: str, *, config: S3Config | None = None) -> Destination:
    """The destination for a local path, an ``s3://``, ``gs://`` or ``az://`` URL."""
    if url.startswith(("az://", "gs://")):
        from fastload.packing.storedest import StoreDestination, azure_ops, gcs_ops

        ops = azure_ops() if url.startswith("az://") else gcs_ops()
        return StoreDestination(url, config=config or S3Config.from_env(), ops=ops)
    if url.startswith("s3://"):
        from fastload.packing.s3dest import S3Destination

        return S3Destination(url, config=config or S3Config.from_env())
    return LocalDestination(url, state_dir)


def read_index_bytes(dest: Destination) -> tuple[str, bytes] | None:
    """``(url, bytes)`` of the manifest a finished pack left in ``dest`` (``index.json``, or
    ``_fastload/index.json`` for Parquet), or None."""
    for name in INDEX_NAMES:
        raw = dest.read_bytes(name)
        if raw is not None:
            return f"{dest.url}/{name}", raw
    return None
