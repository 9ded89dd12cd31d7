"""An ``az://`` folder as a pack destination (see :mod:`fastload.packing.dest`): shards are written to a
local staging folder, then uploaded whole (``s3.azwrite``); the pack writes ``index.json`` last, so a
reader sees a dataset only once every shard is in place."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

from fastload.config import S3Config
from fastload.errors import S3NotFoundError, write_error
from fastload.packing.staging import StagingFolder, sweep_stale
from fastload.s3 import azwrite
from fastload.s3.azstore import list_azure, open_azure, parse_az_url


class AzureDestination:
    """A folder in an Azure container; temporary files live in a local staging folder until uploaded."""

    def __init__(self, url: str, *, config: S3Config) -> None:
        self.bucket, prefix = parse_az_url(url)
        self.prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        self.url = f"az://{self.bucket}/{self.prefix}".rstrip("/")
        self.config = config
        self.tmp_dir = ""
        self._staging: StagingFolder | None = None

    def _name(self, name: str) -> str:
        return self.prefix + name

    def is_empty(self) -> bool:
        return not list_azure(f"az://{self.bucket}/{self.prefix}", self.config)

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
        return azwrite.blob_size(self.bucket, self._name(name), self.config)

    def read_bytes(self, name: str) -> bytes | None:
        try:
            with open_azure(f"az://{self.bucket}/{self._name(name)}", self.config) as reader:
                return reader.read()
        except S3NotFoundError:
            return None

    def write_bytes(self, name: str, data: bytes) -> None:
        azwrite.upload(data, self.bucket, self._name(name), self.config)

    def publish(self, local_tmp: str, name: str) -> None:
        try:
            azwrite.upload(local_tmp, self.bucket, self._name(name), self.config)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(local_tmp)

    def list(self, prefix: str) -> list[str]:
        root = f"az://{self.bucket}/{self._name(prefix.rstrip('/'))}"
        start = len(f"az://{self.bucket}/{self.prefix}")
        return [url[start:] for url, _size in list_azure(root, self.config)]

    def remove(self, name: str) -> None:
        azwrite.delete(self.bucket, self._name(name), self.config)

    def remove_tree(self, prefix: str) -> None:
        for name in self.list(prefix):
            self.remove(name)

    def cleanup(self) -> None:
        if self._staging is not None:
            self._staging.close()
            self._staging = None
        elif self.tmp_dir:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
