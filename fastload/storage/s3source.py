"""An S3 prefix as a pack source: listed once with ListObjectsV2, objects fetched whole (small ones with one
GET, large ones with the parallel ranged reader)."""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from typing import Any, BinaryIO

from fastload.config import S3Config
from fastload.core.pathrules import PathRules
from fastload.core.retry import Fault
from fastload.errors import RangeReadError, Skip
from fastload.s3 import runtime
from fastload.s3.client import Failure, parse_s3_url
from fastload.s3.listing import ObjectInfo, list_objects
from fastload.s3.reader import RangedReader
from fastload.s3.retrying import BadResponse, Retrier, give_up_on
from fastload.storage.listing import FileEntry, Note


def unsafe_key_part(relpath: str) -> str | None:
    """Why a key (relative to its prefix) cannot become a local path or sample name, or None."""
    if not relpath:
        return "empty name"
    if "\0" in relpath:
        return "contains a NUL character"
    if relpath.startswith("/"):
        return "is an absolute path"
    parts = relpath.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "has an empty, '.' or '..' path segment"
    return None


class S3Source:
    """Objects under ``s3://bucket/prefix/``; their keys relative to the prefix are the sample paths."""

    def __init__(self, url: str, *, config: S3Config | None = None) -> None:
        self.bucket, prefix = parse_s3_url(url)
        self.prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        self.root = f"s3://{self.bucket}/{self.prefix}"
        self.config = config or S3Config.from_env()

    def __repr__(self) -> str:
        return f"S3Source({self.root!r})"

    def list(self) -> Iterator[FileEntry | Skip]:
        for found in self.walk():
            if not isinstance(found, Note):
                yield found

    def walk(self, rules: PathRules | None = None) -> Iterator[FileEntry | Skip | Note]:
        """The objects under the prefix, leaving out what ``rules`` say (each as a :class:`Note`)."""
        for obj in list_objects(self.bucket, self.prefix, config=self.config):
            assert isinstance(obj, ObjectInfo)
            relpath = obj.key[len(self.prefix) :]
            if obj.key.endswith("/") and obj.size == 0:
                continue  # a folder marker, not a file
            problem = unsafe_key_part(relpath)
            if problem:
                yield Skip(relpath, f"key {problem}; it cannot name a sample")
                continue
            why = rules.left_out_key(relpath) if rules is not None else None
            if why is not None:
                yield Note(relpath, why)
                continue
            yield FileEntry(relpath, f"s3://{self.bucket}/{obj.key}", obj.size, obj.etag)

    def open(self, entry: FileEntry) -> tuple[BinaryIO, int]:
        """Fetch an object whole (into memory if at most one part, else through the ranged reader)."""
        key = entry.path[len(f"s3://{self.bucket}/") :]
        if entry.size > self.config.part_size_bytes:
            reader = RangedReader(self.bucket, key, config=self.config)
            return reader, reader.size  # type: ignore[return-value]
        data = get_whole(self.bucket, key, config=self.config)
        return io.BytesIO(data), len(data)


def get_whole(bucket: str, key: str, *, config: S3Config, client: Any = None) -> bytes:
    """One object's bytes: through the ranged reader (a small object is one GET; retried, checked against
    its Content-Range, hedged when it stalls), or with ``client``'s ``get_object`` when one is given."""
    if client is None:
        with RangedReader(bucket, key, config=config) as reader:
            return reader.fetch_range(0, sys.maxsize)

    def attempt() -> bytes:
        resp = client.get_object(Bucket=bucket, Key=key)
        body = resp["Body"]
        try:
            data = body.read()
        finally:
            body.close()
        if len(data) != int(resp["ContentLength"]):
            raise BadResponse(
                Failure(Fault.SHORT_BODY, 200, f"body has {len(data)} of {resp['ContentLength']} bytes")
            )
        runtime.current().stats.add_bytes(len(data))
        return bytes(data)

    def spent(failure: Failure, tries: int, elapsed_s: float) -> Exception:
        return RangeReadError(
            bucket=bucket,
            key=key,
            start=0,
            end=1,
            attempts=tries,
            elapsed_s=elapsed_s,
            last_error=f"GET: {failure.message}",
            cause=failure.fault.value,
        )

    return Retrier.from_config(config).call(attempt, give_up_on(bucket, key, what="read", spent=spent))
