"""Every error fastload raises on purpose.

::

    FastloadError
    ├── ConfigError(ValueError)          bad option or argument; the message names the value and the fix
    ├── SourceError                      a source tree/prefix cannot be listed or read
    │   └── NotFoundError(FileNotFoundError)
    ├── PackError                        a pack run cannot proceed (destination state, changed source)
    │   └── SkippedInputError            the pack finished but skipped inputs (see ``.skipped``)
    ├── IndexFormatError                 an ``index.json`` that is missing, malformed or of another version
    ├── VerifyError                      a shard does not match its index (names shard, sample, offset)
    │   └── SampleChecksumError          one sample's bytes fail their CRC32C (on_error="skip" skips it)
    └── S3Error                          an S3 request failed for good (names bucket and key)
        ├── RangeReadError(OSError)      retries spent on one byte range (range, attempts, last error)
        ├── ObjectChangedError           the object was overwritten while being read (ETag changed)
        ├── AccessDeniedError(PermissionError)  401/403
        └── S3NotFoundError(NotFoundError)      404: no such bucket or key

Errors carry the data a user needs (path, shard, key, byte offset) as attributes and say what to do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


class FastloadError(Exception):
    """Root of fastload's errors. Instances pickle with their attributes (so an error raised in a DataLoader
    worker reaches the training process with its type and data intact)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, self.__dict__.copy()))


def _rebuild(cls: type[FastloadError], args: tuple[Any, ...], state: dict[str, Any]) -> FastloadError:
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class ConfigError(FastloadError, ValueError):
    """An option or argument has an invalid value."""


class SourceError(FastloadError):
    """A source cannot be listed or read."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class NotFoundError(SourceError, FileNotFoundError):
    """A source path, object or dataset does not exist."""


class PackError(FastloadError):
    """A pack run cannot proceed."""


@dataclass(frozen=True)
class Skip:
    """One input left out of a pack, with the reason in plain words."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


class SkippedInputError(PackError):
    """A pack finished but left inputs out; re-run with ``allow_skip=True`` to accept that."""

    def __init__(self, skipped: Sequence[Skip], *, written: bool) -> None:
        self.skipped = list(skipped)
        self.written = written
        head = "\n  ".join(str(s) for s in self.skipped[:20])
        more = f"\n  ... and {len(self.skipped) - 20} more" if len(self.skipped) > 20 else ""
        what = "the shards and index were written without them" if written else "nothing was written"
        super().__init__(
            f"{len(self.skipped)} input(s) skipped ({what}):\n  {head}{more}\n"
            "Fix or remove these files, or pass --allow-skip (allow_skip=True) to pack without them."
        )


class IndexFormatError(FastloadError, ValueError):
    """An ``index.json`` is missing, malformed or of an unsupported version."""


class VerifyError(FastloadError):
    """A shard does not match its index or is not a well-formed shard."""

    def __init__(
        self,
        message: str,
        *,
        shard: str,
        key: str | None = None,
        offset: int | None = None,
    ) -> None:
        where = f"{shard}"
        if key is not None:
            where += f", sample {key!r}"
        if offset is not None:
            where += f", byte offset {offset}"
        super().__init__(f"{where}: {message}")
        self.shard = shard
        self.key = key
        self.offset = offset


class S3Error(FastloadError):
    """An S3 request failed for good. Never carries credentials."""

    def __init__(self, message: str, *, bucket: str, key: str) -> None:
        super().__init__(message)
        self.bucket = bucket
        self.key = key

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


class RangeReadError(S3Error, OSError):
    """Every retry of one byte range failed; the reader returns no bytes for it (never short data)."""

    def __init__(
        self,
        *,
        bucket: str,
        key: str,
        start: int,
        end: int,
        attempts: int,
        elapsed_s: float,
        last_error: str,
        cause: str,
    ) -> None:
        self.start, self.end = start, end
        self.attempts = attempts
        self.elapsed_s = elapsed_s
        self.last_error = last_error
        self.cause = cause
        advice = {
            "throttle": "the store kept throttling (503 SlowDown): lower max_concurrency or DataLoader "
            "workers, spread keys over more prefixes, or raise the retry deadline",
            "timeout": "responses stalled or never came: check the endpoint and network, or raise "
            "read_timeout_s",
            "connection": "connections kept failing: check the endpoint URL and that the server is up",
        }.get(
            cause, "the store kept failing: retry later or raise the retry budget (max_attempts, deadline_s)"
        )
        super().__init__(
            f"s3://{bucket}/{key} bytes {start}-{end - 1}: gave up after {attempts} attempt(s) in "
            f"{elapsed_s:.1f}s; last error: {last_error}. {advice}",
            bucket=bucket,
            key=key,
        )


class ObjectChangedError(S3Error):
    """The object was overwritten between two range reads; its bytes would mix two versions."""


class AccessDeniedError(S3Error, PermissionError):
    """The store refused the request (401/403)."""


class S3NotFoundError(S3Error, NotFoundError):
    """No such bucket or key (404)."""

    def __init__(self, message: str, *, bucket: str, key: str) -> None:
        S3Error.__init__(self, message, bucket=bucket, key=key)
        self.path = f"s3://{bucket}/{key}"


class WorkerDiedError(FastloadError, RuntimeError):
    """A DataLoader worker process ended without finishing (killed: out of memory, a signal, a crash)."""


class SampleChecksumError(VerifyError):
    """One sample's bytes, as read, are not the bytes packed: they fail their CRC32C (a tar sample's in the
    index, a TFRecord record's own). ``index`` is the sample's position in its shard (``key`` None where the
    record does not say it: the reader fills it in from the index). Reading with ``on_error="skip"`` leaves
    such a sample out (counted and named) instead of raising."""

    def __init__(self, message: str, *, shard: str, key: str | None, offset: int, index: int) -> None:
        super().__init__(message, shard=shard, key=key, offset=offset)
        self.index = index
