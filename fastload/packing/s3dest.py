"""An S3 prefix as a pack destination (see :mod:`fastload.packing.dest`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

from fastload.config import S3Config
from fastload.errors import S3NotFoundError, write_error
from fastload.packing.staging import StagingFolder, sweep_stale
from fastload.s3.client import fail_fast_error, get_client, parse_s3_url
from fastload.s3.delete import delete_keys
from fastload.s3.listing import ObjectInfo, list_objects
from fastload.s3.retrying import Retrier
from fastload.s3.upload import abort_stale_uploads, upload_file
from fastload.storage.s3source import get_whole


class S3Destination:
    """An S3 prefix; temporary files live in a local temporary folder and are uploaded when complete."""

    def __init__(self, url: str, *, config: S3Config) -> None:
        self.bucket, prefix = parse_s3_url(url)
        self.prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        self.url = f"s3://{self.bucket}/{self.prefix}"
        self.config = config
        self.client = get_client(config)
        self.tmp_dir = ""
        self._staging: StagingFolder | None = None
        # the names whose open multipart uploads prepare() aborts: every key under the prefix, or those of
        # one of several writers into it (ShardWriter(part=...): the others' uploads are live)
        self.uploads_prefix = self.prefix

    def _key(self, name: str) -> str:
        return self.prefix + name

    def is_empty(self) -> bool:
        return next(iter(list_objects(self.bucket, self.prefix, config=self.config)), None) is None

    def exists_as_file(self) -> bool:
        return False

    def prepare(self) -> None:
        """Make the local staging folder (:mod:`fastload.packing.staging`; those of killed packs are
        removed), and abort multipart uploads left under the prefix by a pack that was killed mid-upload
        (they would otherwise keep their parts, and their cost, forever): those under ``uploads_prefix``."""
        sweep_stale()
        try:
            self._staging = StagingFolder("fastload-pack-")
        except OSError as exc:
            staging = tempfile.gettempdir()
            raise write_error(exc, staging).at(destination=self.url, staging=staging) from exc
        self.tmp_dir = self._staging.path
        abort_stale_uploads(self.client, self.bucket, self.uploads_prefix, config=self.config)

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
        """Upload ``data`` as one object, through a file in the staging folder."""
        staging = self.tmp_dir or tempfile.gettempdir()
        tmp = ""
        try:
            fd, tmp = tempfile.mkstemp(prefix="fastload-", dir=staging)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        except OSError as exc:
            if tmp:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            raise write_error(exc, tmp or staging).at(destination=self.url, staging=staging) from exc
        try:
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

    def remove(self, name: str) -> None:
        """Delete one object (nothing happens if it is not there); retried as every request."""
        delete_keys(self.bucket, [self._key(name)], config=self.config, client=self.client)

    def remove_tree(self, prefix: str) -> None:
        """Delete every object under ``prefix`` (DeleteObjects batches, retried as every request)."""
        keys = [self._key(n) for n in self.list(prefix)]
        delete_keys(self.bucket, keys, config=self.config, client=self.client)

    def cleanup(self) -> None:
        if self._staging is not None:
            self._staging.close()
            self._staging = None
        elif self.tmp_dir:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
