"""Versions of a dataset that grows by appends (``index.json``'s ``versions``), and the names of appended
shards.

Existing shards are never rewritten and appended ones go after them, so version ``n`` is exactly the first
``versions[n-1].shards`` shards of the manifest: reading a version is reading a prefix of the shard list. An
index without ``versions`` is version 1 of all its shards. ``docs/INDEX-FORMAT.md`` has the schema.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from fastload.errors import ConfigError

IndexT = TypeVar("IndexT")


@dataclass(frozen=True, kw_only=True)
class Version:
    """One version: its number (1, 2, ...), when it was published (UTC ISO time; None for a version 1 that
    a pack wrote before versions were recorded), the totals of the dataset at that version (cumulative),
    the shards it ``added``, and the fingerprint and layout of its inputs (None where not recorded)."""

    version: int
    created: str | None
    shards: int
    samples: int
    bytes: int
    added: int
    fingerprint: str | None = None
    layout: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "created": self.created,
            "shards": self.shards,
            "samples": self.samples,
            "bytes": self.bytes,
            "added": self.added,
            "fingerprint": self.fingerprint,
            "layout": self.layout,
        }


def first_version(shards: Sequence[Any], *, layout: str | None) -> Version:
    """Version 1 of an index that records no versions: every one of its ``shards`` (entries with
    ``samples`` and ``bytes``)."""
    n = len(shards)
    samples, size = sum(s.samples for s in shards), sum(s.bytes for s in shards)
    return Version(version=1, created=None, shards=n, samples=samples, bytes=size, added=n, layout=layout)


def versions_of(index: Any) -> list[Version]:
    """The versions of a :class:`~fastload.core.index.DatasetIndex`; one without recorded versions is
    version 1 of every shard."""
    return list(index.versions) or [first_version(index.shards, layout=index.options.get("layout"))]


def at_version(index: IndexT, version: int | None, *, where: str) -> IndexT:
    """The :class:`~fastload.core.index.DatasetIndex` ``index`` as it was at ``version`` (None: the
    newest): its first shards, as many as that version lists (``where`` names it in errors)."""
    v = pick_version(versions_of(index), version, where=where)
    shards = index.shards  # type: ignore[attr-defined]
    if v.shards == len(shards):
        return index
    kept = index.versions[: v.version]  # type: ignore[attr-defined]
    return dataclasses.replace(index, shards=shards[: v.shards], versions=kept, payload_bytes=0)  # type: ignore[type-var]


def joined(current: IndexT | None, added: IndexT, *, created: str, fingerprint: str, layout: str) -> IndexT:
    """The :class:`~fastload.core.index.DatasetIndex` ``added`` (an append's new shards) as the next version
    of ``current`` (None: the first version of a new dataset): its shards after ``current``'s, fields and
    skips joined, payload summed, ``current``'s options kept, and a version recording ``created`` (UTC
    time), the inputs' ``fingerprint`` digest and ``layout``."""
    old: Any = current
    new: Any = added
    before = versions_of(old) if old is not None else []
    shards = [*(old.shards if old is not None else []), *new.shards]
    version = Version(
        version=len(before) + 1,
        created=created,
        shards=len(shards),
        samples=sum(s.samples for s in shards),
        bytes=sum(s.bytes for s in shards),
        added=len(new.shards),
        fingerprint=fingerprint,
        layout=layout,
    )
    if old is None:
        return dataclasses.replace(new, versions=[version])  # type: ignore[no-any-return]
    return dataclasses.replace(  # type: ignore[no-any-return]
        old,
        fields=sorted(set(old.fields) | set(new.fields)),
        shards=shards,
        skipped=[*old.skipped, *new.skipped],
        payload_bytes=old.payload_bytes + new.payload_bytes,
        versions=[*before, version],
    )


def parse_versions(raw: Any, *, shards: int) -> list[Version]:
    """The ``versions`` list of an ``index.json`` holding ``shards`` shards, checked (numbered 1.. in order,
    shard counts growing by what each added, the last covering every shard); raises ``ValueError`` saying
    what is wrong."""
    if not isinstance(raw, list):
        raise ValueError("'versions' must be a list")
    out: list[Version] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise ValueError(f"versions[{i}] must be an object")
        for name in ("version", "shards", "samples", "bytes", "added"):
            if type(item.get(name)) is not int or item[name] < 0:
                raise ValueError(f"versions[{i}].{name} must be an integer >= 0")
        v = Version(
            version=item["version"],
            created=None if item.get("created") is None else str(item["created"]),
            shards=item["shards"],
            samples=item["samples"],
            bytes=item["bytes"],
            added=item["added"],
            fingerprint=None if item.get("fingerprint") is None else str(item["fingerprint"]),
            layout=None if item.get("layout") is None else str(item["layout"]),
        )
        before = out[-1].shards if out else 0
        if v.version != i + 1:
            raise ValueError(
                f"versions[{i}] is numbered {v.version}; versions are numbered 1, 2, ... in order"
            )
        if v.shards != before + v.added:
            raise ValueError(f"version {v.version}: {before} shards before + {v.added} added != {v.shards}")
        out.append(v)
    if out and out[-1].shards != shards:
        raise ValueError(f"the last version has {out[-1].shards} shards, the manifest lists {shards}")
    return out


def pick_version(versions: list[Version], wanted: int | None, *, where: str) -> Version:
    """The version ``wanted`` (None: the newest) of ``versions`` (never empty); a :class:`ConfigError`
    naming the versions there are otherwise."""
    if wanted is None:
        return versions[-1]
    if type(wanted) is not int or not 1 <= wanted <= len(versions):
        raise ConfigError(
            f"version={wanted!r}: {where} has version(s) 1..{len(versions)} (`fastload inspect --versions` "
            "lists them); pick one of those, or leave version out to read the newest"
        )
    return versions[wanted - 1]


def input_tag(fingerprint: str) -> str:
    """8 hex digits naming an append's shards (from its inputs' fingerprint): two appends of different
    inputs never write the same names, even at the same time, and a resumed append finds its own again."""
    return hashlib.sha256(fingerprint.encode()).hexdigest()[:8]


def fingerprint_digest(fingerprint: str) -> str:
    """What a version records of its inputs' fingerprint (32 hex digits)."""
    return hashlib.sha256(fingerprint.encode()).hexdigest()[:32]


_NUMBERED = re.compile(r"(?P<stem>.*)-(?P<number>\d+)(?P<suffix>\.[^/]*)")


def appended_name(name: str, number: int, tag: str) -> str:
    """The name of an appended shard planned as ``name`` (``[folder/]prefix-000003.tar``): numbered
    ``number`` (after the existing shards) and tagged with its append's ``tag``
    (``[folder/]prefix-000013-1a2b3c4d.tar``)."""
    folder, _, base = name.rpartition("/")
    m = _NUMBERED.fullmatch(base)
    if m is None:
        stem, dot, suffix = base.partition(".")
        renamed = f"{stem}-{number:06d}-{tag}{dot}{suffix}"
    else:
        renamed = f"{m['stem']}-{number:06d}-{tag}{m['suffix']}"
    return f"{folder}/{renamed}" if folder else renamed


__all__ = [
    "Version",
    "appended_name",
    "at_version",
    "fingerprint_digest",
    "first_version",
    "input_tag",
    "joined",
    "parse_versions",
    "pick_version",
    "versions_of",
]
