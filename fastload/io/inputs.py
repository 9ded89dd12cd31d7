"""What shard writers read: one input file of a sample, openable wherever it lives."""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO, Protocol

from fastload.io.listing import FileEntry, display


class Opener(Protocol):
    def open(self, entry: FileEntry) -> BinaryIO: ...


@dataclass(frozen=True)
class Input:
    """A listed file together with the source that can open it."""

    source: Opener
    entry: FileEntry

    @property
    def relpath(self) -> str:
        return self.entry.relpath

    @property
    def shown(self) -> str:
        """The path as printed in messages."""
        return display(self.entry.path)

    def open(self) -> BinaryIO:
        return self.source.open(self.entry)


class ShrunkError(OSError):
    """A file gave fewer bytes than its size said (it shrank while being read)."""


def read_exactly(f: BinaryIO, view: memoryview) -> None:  # f: any raw binary file with readinto
    """Fill ``view`` from ``f`` or raise :class:`ShrunkError`; never leaves a short read unnoticed."""
    got = 0
    total = len(view)
    while got < total:
        n = f.readinto(view[got:])  # type: ignore[attr-defined]
        if not n:
            raise ShrunkError(f"file ended after {got} of {total} bytes (it shrank while being packed)")
        got += n
