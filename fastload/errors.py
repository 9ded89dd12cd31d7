"""Every error fastload raises on purpose.

::

    FastloadError
    ├── ConfigError(ValueError)          bad option or argument; the message names the value and the fix
    ├── SourceError                      a source tree/prefix cannot be listed or read
    │   └── NotFoundError(FileNotFoundError)
    ├── PackError                        a pack run cannot proceed (destination state, changed source)
    │   └── SkippedInputError            the pack finished but skipped inputs (see ``.skipped``)
    ├── IndexFormatError                 an ``index.json`` that is missing, malformed or of another version
    └── VerifyError                      a shard does not match its index (names shard, sample, offset)

Errors carry the data a user needs (path, shard, key, byte offset) as attributes and say what to do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class FastloadError(Exception):
    """Root of fastload's errors."""


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
