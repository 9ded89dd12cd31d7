"""WebDataset's sample-key rule and grouping of files into samples.

A file's key is its relative directory plus its basename up to the *first* dot; the rest of the basename
is the field (extension): ``a/b/0001.seg.png`` -> key ``a/b/0001``, field ``seg.png``. Files that share a
key form one sample. This matches ``webdataset.tariterators.base_plus_ext`` for every name this module
accepts; names it would split differently or drop are rejected with a reason.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


# The last extensions of the fields fastload's decoders turn into values (fastload.train.decode; a test keeps
# the two equal): images, text, labels, JSON, NumPy, token ids, pickles. Any other field is read as bytes.
DECODED_EXTENSIONS = frozenset(
    {"jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "txt", "text", "cls", "cls2", "index"}
    | {"json", "npy", "pickle", "pkl", "pyd", "pth", "pt"}
    | {"u16", "i32"}
)


class KeyRuleError(ValueError):
    """A name cannot be turned into a (key, field) pair; the message says why."""


def split_key(relpath: str) -> tuple[str, str]:
    """Split a ``/``-separated relative path into ``(key, field)`` or raise :class:`KeyRuleError`."""
    try:
        relpath.encode("utf-8")
    except UnicodeEncodeError:
        raise KeyRuleError(
            "name is not valid UTF-8; tar and Parquet shards store UTF-8 names: rename the file"
        ) from None
    if any(c in relpath for c in "\n\r\0"):
        raise KeyRuleError("name contains a newline, carriage return or NUL; WebDataset cannot key it")
    if not relpath or relpath.startswith("/") or "//" in relpath:
        raise KeyRuleError("not a normalised relative path")
    slash = relpath.rfind("/")
    base = relpath[slash + 1 :]
    if base.startswith("."):
        raise KeyRuleError("hidden file (name starts with '.'): WebDataset cannot key it")
    dot = base.find(".")
    if dot < 0:
        raise KeyRuleError("no extension: a sample's field is the part of the name after the first dot")
    field = base[dot + 1 :]
    if not field:
        raise KeyRuleError("empty extension (name ends with '.')")
    return relpath[: slash + 1] + base[:dot], field


def partition_value(key: str, level: int) -> str:
    """The directory component of ``key`` at ``level`` (0 = top), used for hive-style partitions."""
    parts = key.split("/")[:-1]
    if level >= len(parts):
        raise KeyRuleError(f"has no directory component {level} to partition by")
    return parts[level]


@dataclass(frozen=True)
class Sample(Generic[T]):
    """Files sharing one key; ``members`` are ``(field, item)`` sorted by field."""

    key: str
    members: tuple[tuple[str, T], ...]


@dataclass(frozen=True)
class Rejected(Generic[T]):
    """An item (or a whole sample) left out, with the reason."""

    item: T
    reason: str


def group_samples(
    items: Iterable[tuple[str, T]],
    bad_keys: Iterable[tuple[str, str]] = (),
) -> tuple[list[Sample[T]], list[Rejected[T]]]:
    """Group ``(relpath, item)`` pairs into samples sorted by key.

    ``bad_keys`` are ``(key, reason)`` pairs for keys with a member that could not even be listed (a broken
    symlink, say): such samples are rejected whole, so a sample never silently loses a field. Two items
    with the same key and field reject their sample too.
    """
    by_key: dict[str, dict[str, T]] = {}
    rejected: list[Rejected[T]] = []
    sample_problems: dict[str, str] = dict(bad_keys)
    duplicates: dict[str, list[T]] = {}
    for relpath, item in items:
        try:
            key, field = split_key(relpath)
        except KeyRuleError as exc:
            rejected.append(Rejected(item, str(exc)))
            continue
        fields = by_key.setdefault(key, {})
        if field in fields:
            sample_problems.setdefault(
                key, f"duplicate key+extension {key!r}.{field!r}: two inputs map to the same member name"
            )
            duplicates.setdefault(key, []).append(item)
            continue
        fields[field] = item
    samples: list[Sample[T]] = []
    for key in sorted(by_key):
        members = tuple(sorted(by_key[key].items()))
        problem = sample_problems.get(key)
        if problem is not None:
            rejected.extend(
                Rejected(item, f"sample {key!r} left out whole: {problem}")
                for item in [*(item for _, item in members), *duplicates.get(key, [])]
            )
            continue
        samples.append(Sample(key, members))
    return samples, rejected


def webdataset_would_split(name: str) -> tuple[str, str] | None:
    """How WebDataset splits a tar member name (its ``base_plus_ext`` rule), or None if it drops it."""
    match = re.match(r"^((?:.*/|)[^.]+)[.]([^/]*)$", name)
    return (match.group(1), match.group(2)) if match else None


def lint_member_name(name: str) -> str | None:
    """Why a foreign tar member name is a problem for WebDataset readers, or None when it is fine."""
    wds = webdataset_would_split(name)
    try:
        ours = split_key(name)
    except KeyRuleError as exc:
        if wds is None:
            return f"WebDataset ignores this member ({exc})"
        return f"WebDataset keys it as {wds[0]!r} field {wds[1]!r}, which is surely not meant ({exc})"
    if wds != ours:
        return f"WebDataset would split it as {wds!r}, not key {ours[0]!r} field {ours[1]!r}"
    return None
