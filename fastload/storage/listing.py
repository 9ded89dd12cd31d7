"""Listing a local source tree into file entries, with every unusable path reported, never dropped.

The lister only lists; :class:`LocalSource` also opens entries for reading. An S3 source will offer the
same two methods (``list`` and ``open``), so the packer does not care where bytes come from.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from fastload.core.pathrules import PathRules
from fastload.errors import NotFoundError, Skip, SourceError


def display(path: str) -> str:
    """A printable form of a path that may hold undecodable bytes (shown as ``\\xNN``)."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


@dataclass(frozen=True)
class FileEntry:
    """One file of a source: its ``/``-separated path relative to the root, its full path or URL, its size
    and a version tag that changes when the content may have (mtime for files, ETag for objects).
    ``unreadable`` says why this process cannot read it (empty when it can, or when nobody checked): such
    an entry is still planned, so shards are cut the same once it is fixed, but the pack reports it."""

    relpath: str
    path: str
    size: int
    version: str
    unreadable: str = ""


SYMLINK = "symlink"


@dataclass(frozen=True)
class Note:
    """A path a listing left out by its rules (``why``: ``"hidden"`` or ``"excluded"``, see
    :mod:`fastload.core.pathrules`), or a symlink it followed (``why``: ``"symlink"``)."""

    relpath: str
    why: str
    folder: bool = False

    @property
    def shown(self) -> str:
        return self.relpath + "/" if self.folder else self.relpath


def _unreadable(path: str) -> str:
    """Why this process may not read ``path`` (its permissions as they are now), or ``""``."""
    if os.access(path, os.R_OK, effective_ids=os.access in os.supports_effective_ids):
        return ""
    return "unreadable: permission denied; fix its permissions"


class LocalSource:
    """A folder tree on a local (or mounted) file system. Symlinks are followed; loops are reported."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.abspath(os.fspath(root))
        if not os.path.exists(self.root):
            raise NotFoundError(f"source {self.root} does not exist", path=self.root)
        if not os.path.isdir(self.root):
            raise SourceError(
                f"source {self.root} is not a folder; pass the folder holding the files", path=self.root
            )

    def __repr__(self) -> str:
        return f"LocalSource({self.root!r})"

    def list(self) -> Iterator[FileEntry | Skip]:
        """Every regular file under the root (depth-first, each folder's entries sorted), or a :class:`Skip`
        for a path that cannot be used."""
        for found in self.walk():
            if not isinstance(found, Note):
                yield found

    def walk(self, rules: PathRules | None = None) -> Iterator[FileEntry | Skip | Note]:
        """:meth:`list`, leaving out what ``rules`` say (each path left out, a folder once, as a
        :class:`Note`), with a :class:`Note` for each symlink followed (before what it leads to)."""
        root_stat = os.stat(self.root)
        yield from self._walk(self.root, "", ((root_stat.st_dev, root_stat.st_ino),), rules)

    def _walk(
        self,
        folder: str,
        prefix: str,
        ancestors: tuple[tuple[int, int], ...],
        rules: PathRules | None,
    ) -> Iterator[FileEntry | Skip | Note]:
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            yield Skip(display(prefix.rstrip("/") or "."), f"cannot list folder: {exc.strerror}")
            return
        for entry in entries:
            relpath = prefix + entry.name
            if rules is not None:
                try:
                    is_folder = entry.is_dir(follow_symlinks=True)
                except OSError:  # a symlink loop, say: reported below when it is stat'ed
                    is_folder = False
                why = rules.left_out(relpath, folder=is_folder)
                if why is not None:
                    yield Note(display(relpath), why, folder=is_folder)
                    continue
            try:
                st = entry.stat(follow_symlinks=True)
            except OSError as exc:
                yield Skip(display(relpath), self._stat_problem(entry, exc))
                continue
            if entry.is_symlink() and (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                yield Note(display(relpath), SYMLINK, folder=stat.S_ISDIR(st.st_mode))
            if stat.S_ISDIR(st.st_mode):
                ident = (st.st_dev, st.st_ino)
                if ident in ancestors:
                    yield Skip(
                        display(relpath),
                        "symlink loop: this folder links back to one of its parents; remove the link",
                    )
                    continue
                yield from self._walk(entry.path, relpath + "/", (*ancestors, ident), rules)
            elif stat.S_ISREG(st.st_mode):
                yield FileEntry(relpath, entry.path, st.st_size, str(st.st_mtime_ns), _unreadable(entry.path))
            else:
                yield Skip(display(relpath), "not a regular file (a FIFO, socket or device)")

    @staticmethod
    def _stat_problem(entry: os.DirEntry[str], exc: OSError) -> str:
        if exc.errno == errno.ELOOP:
            return "symlink loop: the link resolves to itself; remove it"
        if entry.is_symlink():
            try:
                target = os.readlink(entry.path)
            except OSError:
                target = "?"
            if exc.errno == errno.ENOENT:
                return f"broken symlink (points to {display(target)!r}, which does not exist)"
            return f"symlink to {display(target)!r} cannot be followed: {exc.strerror}"
        if exc.errno == errno.ENOENT:
            return "vanished while the tree was being listed"
        return f"cannot stat: {exc.strerror}"

    def open(self, entry: FileEntry) -> tuple[BinaryIO, int]:
        """Open an entry for reading (unbuffered; ``readinto`` goes straight to the OS), with its size now."""
        f = open(entry.path, "rb", buffering=0)  # noqa: SIM115 - the caller closes it
        try:
            return f, os.fstat(f.fileno()).st_size
        except OSError:
            f.close()
            raise
