"""Where a pack writes: a local folder or an S3 prefix, behind one small interface.

Shards are written to a local temporary file first; ``publish`` then renames it into place (local) or
uploads it with a multipart upload (S3). Either way a shard appears under its final name only when whole.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Protocol

from fastload.config import S3Config
from fastload.errors import S3NotFoundError
from fastload.io.localfs import atomic_write, publish
from fastload.io.retrying import Retrier
from fastload.io.s3client import fail_fast_error, get_client, parse_s3_url
from fastload.io.s3list import ObjectInfo, list_objects
from fastload.io.s3source import get_whole
from fastload.io.s3upload import upload_file


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
        os.makedirs(os.path.dirname(self._path(name)), exist_ok=True)
        atomic_write(self._path(name), data)

    def publish(self, local_tmp: str, name: str) -> None:
        publish(local_tmp, self._path(name))

    def list(self, prefix: str) -> list[str]:
        folder = self._path(prefix)
        if not os.path.isdir(folder):
            return []
        return sorted(os.path.join(prefix, n) for n in os.listdir(folder))

    def remove_tree(self, prefix: str) -> None:
        shutil.rmtree(self._path(prefix), ignore_errors=True)

    def cleanup(self) -> None:
        """Nothing to do: the temporary folder is inside the state folder."""


class S3Destination:
    """An S3 prefix; temporary files live in a local temporary folder and are uploaded when complete."""

    def __init__(self, url: str, *, config: S3Config) -> None:
        self.bucket, prefix = parse_s3_url(url)
        self.prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        self.url = f"s3://{self.bucket}/{self.prefix}"
        self.config = config
        self.client = get_client(config)
        self.tmp_dir = ""

    def _key(self, name: str) -> str:
        return self.prefix + name

    def is_empty(self) -> bool:
        return next(iter(list_objects(self.bucket, self.prefix, config=self.config)), None) is None

    def exists_as_file(self) -> bool:
        return False

    def prepare(self) -> None:
        self.tmp_dir = tempfile.mkdtemp(prefix="fastload-pack-")

    def size(self, name: str) -> int | None:
        retrier = Retrier.from_config(self.config)
        key = self._key(name)
        try:
            resp = retrier.call(
                lambda: self.client.head_object(Bucket=self.bucket, Key=key),
                lambda f, t, e: fail_fast_error(f, self.bucket, key),
            )
        except S3NotFoundError:
            return None
        return int(resp["ContentLength"])

    def read_bytes(self, name: str) -> bytes | None:
        try:
            return get_whole(self.bucket, self._key(name), config=self.config)
        except S3NotFoundError:
            return None

    def write_bytes(self, name: str, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(prefix="fastload-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            upload_file(tmp, self.bucket, self._key(name), config=self.config)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def publish(self, local_tmp: str, name: str) -> None:
        try:
            upload_file(local_tmp, self.bucket, self._key(name), config=self.config)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(local_tmp)

    def list(self, prefix: str) -> list[str]:
        full = self._key(prefix.rstrip("/") + "/")
        return [
            o.key[len(self.prefix) :]
            for o in list_objects(self.bucket, full, config=self.config)
            if isinstance(o, ObjectInfo)
        ]

    def remove_tree(self, prefix: str) -> None:
        keys = [self._key(n) for n in self.list(prefix)]
        for i in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[i : i + 1000]]
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})

    def cleanup(self) -> None:
        if self.tmp_dir:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)


def destination(url: str, state_dir: str, *, config: S3Config | None = None) -> Destination:
    """The destination for a local path or ``s3://`` URL."""
    if url.startswith("s3://"):
        return S3Destination(url, config=config or S3Config.from_env())
    return LocalDestination(url, state_dir)
