"""A ``gs://`` or ``az://`` folder as a pack destination (see :mod:`fastload.packing.dest`): shards are
written to a local staging folder, then uploaded whole (``s3.gcswrite``, ``s3.azwrite``); the pack writes
``index.json`` last, so a reader sees a dataset only once every shard is in place. One class for both
stores: what differs is a :class:`StoreOps` (how a URL splits, lists, opens, sizes, uploads, deletes)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastload.config import S3Config
from fastload.errors import S3NotFoundError, write_error
from fastload.packing.staging import StagingFolder, sweep_stale


@dataclass(frozen=True)
class StoreOps:
    """One store's object operations, each taking the store's URLs or (bucket, key) and an S3Config."""

    scheme: str
    parse: Callable[[str], tuple[str, str]]
    list_urls: Callable[[str, S3Config], list[tuple[str, int]]]
    open_object: Callable[[str, S3Config], Any]
    size: Callable[[str, str, S3Config], int | None]
    upload: Callable[[Any, str, str, S3Config], Any]
    delete: Callable[[str, str, S3Config], Any]


def gcs_ops() -> StoreOps:
    from fastload.core.weburls import parse_gs_url
    from fastload.s3 import gcswrite
    from fastload.s3.gcsstore import list_gcs, open_gcs

    return StoreOps(
        "gs", parse_gs_url, list_gcs, open_gcs, gcswrite.object_size, gcswrite.upload, gcswrite.delete
    )


def azure_ops() -> StoreOps:
    from fastload.s3 import azwrite
    from fastload.s3.azstore import list_azure, open_azure, parse_az_url

    return StoreOps(
        "az", parse_az_url, list_azure, open_azure, azwrite.blob_size, azwrite.upload, azwrite.delete
    )


class StoreDestination:
    """A folder in a GCS bucket or an Azure container; temporary files live in a local staging folder until
    uploaded."""

    def __init__(self, url: str, *, config: S3Config, ops: StoreOps) -> None:
        self.ops = ops
        self.bucket, prefix = ops.parse(url)
        self.prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        self.url = f"{ops.scheme}://{self.bucket}/{self.prefix}".rstrip("/")
        self.config = config
        self.tmp_dir = ""
        self._staging: StagingFolder | None = None

    def _name(self, name: str) -> str:
        return self.prefix + name

    def _url(self, key: str) -> str:
        return f"{self.ops.scheme}://{self.bucket}/{key}"

    def is_empty(self) -> bool:
        return not self.ops.list_urls(self._url(self.prefix), self.config)

    def exists_as_file(self) -> bool:
        return False

    def prepare(self) -> None:
        """Make the local staging folder (those of killed packs are removed)."""
        sweep_stale()
        try:
            self._staging = StagingFolder("fastload-pack-")
        except OSError as exc:
            staging = tempfile.gettempdir()
            raise write_error(exc, staging).at(destination=self.url, staging=staging) from exc
        self.tmp_dir = self._staging.path

    def size(self, name: str) -> int | None:
        return self.ops.size(self.bucket, self._name(name), self.config)

    def read_bytes(self, name: str) -> bytes | None:
        try:
            with self.ops.open_object(self._url(self._name(name)), self.config) as reader:
                data: bytes = reader.read()
                return data
        except S3NotFoundError:
            return None

    def write_bytes(self, name: str, data: bytes) -> None:
        self.ops.upload(data, self.bucket, self._name(name), self.config)

    def publish(self, local_tmp: str, name: str) -> None:
        try:
            self.ops.upload(local_tmp, self.bucket, self._name(name), self.config)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(local_tmp)

    def list(self, prefix: str) -> list[str]:
        root = self._url(self._name(prefix.rstrip("/")))
        start = len(self._url(self.prefix))
        return [url[start:] for url, _size in self.ops.list_urls(root, self.config)]

    def remove(self, name: str) -> None:
        self.ops.delete(self.bucket, self._name(name), self.config)

    def remove_tree(self, prefix: str) -> None:
        for name in self.list(prefix):
            self.remove(name)

    def cleanup(self) -> None:
        if self._staging is not None:
            self._staging.close()
            self._staging = None
        elif self.tmp_dir:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
