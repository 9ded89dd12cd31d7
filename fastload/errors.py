"""Every error fastload raises on purpose.

::

    FastloadError
    ├── ConfigError(ValueError)          bad option or argument; the message names the value and the fix
    ├── SourceError                      a source tree/prefix cannot be listed or read
    │   └── NotFoundError(FileNotFoundError)
    ├── PackError                        a pack run cannot proceed (destination state, changed source)
    │   ├── SkippedInputError            the pack finished but skipped inputs (see ``.skipped``)
    │   ├── DestinationWriteError(OSError)  writing a pack's destination (or staging folder), or cp's, failed
    │   ├── UnfinishedPackError          a folder holds an interrupted pack (its journal): --resume it
    │   ├── AppendConflictError          another run appends the same inputs, or already appended them
    │   ├── InputFailedError             optimize: the function raised on an input (its number, repr)
    │   └── ResumeMismatchError          optimize: resume refused, the function, inputs or options changed
    ├── SampleError(ValueError)          a sample given to ShardWriter cannot be written (names key, field)
    ├── IndexFormatError                 an ``index.json`` that is missing, malformed or of another version
    ├── VerifyError                      a shard does not match its index (names shard, sample, offset)
    │   └── SampleChecksumError          one sample's bytes fail their CRC32C (on_error="skip" skips it)
    └── S3Error                          a store request failed for good (names bucket and key, or URL)
        ├── RangeReadError(OSError)      retries spent on one byte range (range, attempts, last error)
        ├── ObjectChangedError           the object was overwritten while being read (ETag changed)
        ├── AccessDeniedError(PermissionError)  401/403
        ├── S3NotFoundError(NotFoundError)      404: no such bucket or key
        └── PreconditionFailedError      412: a conditional PUT lost to another writer (If-Match)

Errors carry the data a user needs (path, shard, key, byte offset) as attributes and say what to do.
"""

from __future__ import annotations

import errno as errno_codes
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
        return f"{shown(self.path)}: {self.reason}"


class SkippedInputError(PackError):
    """A pack finished but left inputs out; re-run with ``allow_skip=True`` to accept that."""

    def __init__(self, skipped: Sequence[Skip], *, written: bool, hint: str = "") -> None:
        self.skipped = list(skipped)
        self.written = written
        self.hint = hint  # what to do besides fixing the files (e.g. sources with the same names)
        head = "\n  ".join(str(s) for s in self.skipped[:20])
        more = f"\n  ... and {len(self.skipped) - 20} more" if len(self.skipped) > 20 else ""
        what = "the shards and index were written without them" if written else "nothing was written"
        super().__init__(
            f"{len(self.skipped)} input(s) skipped ({what}):\n  {head}{more}\n"
            + (f"{hint}\n" if hint else "")
            + "Fix or remove these files, or pass --allow-skip (allow_skip=True) to pack without them."
        )


class DestinationWriteError(PackError, OSError):
    """A write to a pack's output failed (no space, quota, I/O error...): the destination's fault, never a
    source's. Carries ``path`` (the file being written), ``errno``, ``strerror``, and where known the
    ``destination`` (URL) and ``staging`` folder (the local folder an S3 destination's shards are written
    to before upload). Nothing inconsistent is published: the shard being written is removed and
    ``index.json`` is not written; ``--resume`` keeps the shards finished before."""

    def __init__(
        self,
        path: str,
        *,
        errno: int | None,
        strerror: str,
        destination: str | None = None,
        staging: str | None = None,
        command: str = "pack",
    ) -> None:
        self.path = path
        self.destination = destination
        self.staging = staging
        self.command = command
        why = _WRITE_PROBLEMS.get(errno or 0, strerror)
        elsewhere = "choose another destination" if command == "pack" else "copy elsewhere"
        if staging is not None and destination is not None:
            where = (
                f"cannot write to the local staging folder {shown(staging)} of the pack to "
                f"{shown(destination)}: {why} ({shown(path)}); pack writes each shard there before "
                "uploading it"
            )
        elif destination is not None:
            detail = f" ({shown(path)})" if path != destination else ""
            where = f"cannot write to {shown(destination)}: {why}{detail}"
        else:
            where = f"cannot write {shown(path)}: {why}"
        if errno in (errno_codes.ENOSPC, errno_codes.EDQUOT):
            room = (
                f"free space in {shown(staging)} or point TMPDIR at a larger disk"
                if staging is not None
                else f"free some space (or {elsewhere})"
            )
        else:
            room = f"fix the destination's disk or file system (or {elsewhere})"
        if command == "pack":
            tail = (
                f"no partial shard and no index.json were published; {room}, then run the same command "
                "with --resume: the shards finished so far are kept"
            )
        else:
            tail = f"nothing was left under that name; {room}"
        PackError.__init__(self, f"{where}; {tail}")
        self.errno = errno
        self.strerror = strerror
        self.filename = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_destination_error,
            (self.path, self.errno, self.strerror, self.destination, self.staging, self.command),
        )

    def at(self, *, destination: str, staging: str | None, command: str = "pack") -> DestinationWriteError:
        """The same failure, naming the pack's destination (and S3 staging folder)."""
        return DestinationWriteError(
            self.path,
            errno=self.errno,
            strerror=self.strerror or "",
            destination=destination,
            staging=staging,
            command=command,
        )

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _rebuild_destination_error(
    path: str, code: int | None, strerror: str, destination: str | None, staging: str | None, command: str
) -> DestinationWriteError:
    return DestinationWriteError(
        path, errno=code, strerror=strerror, destination=destination, staging=staging, command=command
    )


def write_error(exc: OSError, path: str, *, command: str = "pack") -> DestinationWriteError:
    """``exc``, met writing ``path`` (an output file of ``command``), as a :class:`DestinationWriteError`."""
    if isinstance(exc, DestinationWriteError):
        return exc
    return DestinationWriteError(
        path, errno=exc.errno, strerror=exc.strerror or str(exc) or type(exc).__name__, command=command
    )


class UnfinishedPackError(PackError):
    """A folder or prefix holds the journal of a pack that has not finished (killed, or still running):
    what is there is part of a dataset. Finish it with ``fastload pack ... --resume`` (same command)."""

    def __init__(self, url: str, *, what: str = "read", how: str | None = None) -> None:
        self.url = url  # (how: what left it and how to finish it, where known: fastload.optimize does)
        super().__init__(
            f"{shown(url)} holds an unfinished pack (its journal .fastload-pack/ is there: the pack was "
            f"interrupted, or is still running), so it cannot be {what} as a dataset; "
            + (
                how
                or "finish it by running the same command (`fastload pack` or `pack-tokens`, same sources "
                "and options) again with --resume (or delete the folder and pack again); a dataset written "
                "in parts by fastload.ShardWriter(part=i, parts=n) is published by "
                "fastload.ShardWriter.merge once all are closed"
            )
        )


class AppendConflictError(PackError):
    """An append cannot go on: another run is appending the same inputs to the dataset now (``holder``
    says which), or they are already its version ``version``."""

    def __init__(
        self, message: str, *, url: str, holder: str | None = None, version: int | None = None
    ) -> None:
        super().__init__(message)
        self.url = url
        self.holder = holder
        self.version = version


_WRITE_PROBLEMS = {
    errno_codes.ENOSPC: "no space left on the device",
    errno_codes.EDQUOT: "the disk quota is used up",
    errno_codes.EROFS: "it is on a read-only file system",
    errno_codes.EIO: "input/output error (the disk or file system failed)",
}


def shown(name: str) -> str:
    """A path, URL or key as printed in a message: as is when plain, else quoted with escapes (a newline
    or other control character, or a space at an end, cannot pass unnoticed)."""
    if name.isprintable() and name == name.strip():
        return name
    return repr(name)


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
    """A store request failed for good (S3, or another store read through the same reader: ``url`` then
    names the object, ``bucket`` is empty). Never carries credentials."""

    def __init__(self, message: str, *, bucket: str, key: str, url: str | None = None) -> None:
        super().__init__(message)
        self.bucket = bucket
        self.key = key
        self.object_url = url

    @property
    def url(self) -> str:
        return self.object_url or f"s3://{self.bucket}/{self.key}"


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
        url: str | None = None,
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
            "unreachable": "no connection could be made to an endpoint that never answered here",
        }.get(
            cause, "the store kept failing: retry later or raise the retry budget (max_attempts, deadline_s)"
        )
        where = url or f"s3://{bucket}/{key}"
        super().__init__(
            f"{where} bytes {start}-{end - 1}: gave up after {attempts} attempt(s) in "
            f"{elapsed_s:.1f}s; last error: {last_error}. {advice}",
            bucket=bucket,
            key=key,
            url=url,
        )


class ObjectChangedError(S3Error):
    """The object was overwritten between two range reads; its bytes would mix two versions."""


class AccessDeniedError(S3Error, PermissionError):
    """The store refused the request (401/403)."""


class S3NotFoundError(S3Error, NotFoundError):
    """No such bucket or key (404)."""

    def __init__(self, message: str, *, bucket: str, key: str, url: str | None = None) -> None:
        S3Error.__init__(self, message, bucket=bucket, key=key, url=url)
        self.path = self.url


class PreconditionFailedError(S3Error):
    """A conditional PUT was refused (412): the object is no longer the one read (``If-Match``), or exists
    already (``If-None-Match: *``); read it again and retry."""


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


class InputFailedError(PackError):
    """``fastload.optimize``: the user's function raised on one input, so the run stopped (no ``index.json``;
    shards finished before it are journaled for ``resume=True``). Carries the input's ``number`` (from 0 in
    input order), ``input`` (a short repr), ``error`` (``"TypeName: message"``) and ``traceback`` (the
    function's traceback as text: it may have run in another process)."""

    def __init__(self, *, number: int, input: str, error: str, traceback: str = "") -> None:
        self.number = number
        self.input = input
        self.error = error
        self.traceback = traceback
        super().__init__(
            f"the function raised on input #{number} ({input}): {error}; nothing was published as a dataset "
            "(no index.json). Fix the function or the input and run again with resume=True (--resume) to "
            "keep the shards finished so far, or pass on_error='skip' (--on-error skip) to leave failing "
            "inputs out and list them in the report"
        )


class ResumeMismatchError(PackError):
    """``fastload.optimize(..., resume=True)`` refused: ``what`` (``"function"``, ``"inputs"`` or
    ``"options"``) differs from the interrupted run's, so its shards cannot be continued to the bytes of
    one uninterrupted run."""

    def __init__(self, message: str, *, what: str, url: str) -> None:
        super().__init__(message)
        self.what = what
        self.url = url


class SampleError(FastloadError, ValueError):
    """A sample given to :class:`fastload.ShardWriter` cannot be written: its key is missing, repeated or one
    WebDataset would split, a field name is not an extension, or a value cannot be encoded. Raised by
    ``write`` before any of the sample is written; ``key`` and ``field`` name it (None where unknown)."""

    def __init__(self, message: str, *, key: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.field = field
