"""Planning a pack of files: list the sources, group files into samples (core.keys), order and cut them
into shards (core.plan). Nothing is written here; :mod:`fastload.packing.write` writes what is planned."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from fastload import formats
from fastload.config import PackConfig, S3Config
from fastload.core.keys import KeyRuleError, Sample, group_samples, partition_value, split_key
from fastload.core.pathrules import EXCLUDED, HIDDEN, PathRules
from fastload.core.plan import ShardPlan, plan_shards, sample_order
from fastload.core.weburls import is_web
from fastload.errors import ConfigError, PackError, Skip, SkippedInputError
from fastload.packing.options import output_options
from fastload.packing.report import ListingNotes, field_hints
from fastload.storage.inputs import Input
from fastload.storage.listing import SYMLINK, FileEntry, LocalSource, Note
from fastload.storage.urls import check_url, check_writable

if TYPE_CHECKING:
    from fastload.storage.s3source import S3Source


@dataclass(frozen=True, kw_only=True)
class PackPlan:
    """A planned pack of files: the samples in write order and the shards they are cut into."""

    samples: list[Sample[Input]]
    shards: list[ShardPlan]
    fields: list[str]
    skipped: list[Skip]
    layout: str  # options, names and sizes: recorded in index.json
    fingerprint: str  # layout plus mtimes/ETags: guards --resume against changed files
    payload_bytes: int
    files: int
    empty_files: int = 0  # packed as empty values
    unreadable: list[Skip] = field(default_factory=list)  # planned inputs this process cannot read now
    notes: ListingNotes = field(default_factory=ListingNotes)  # left out by rule, symlinks, field hints
    hint: str = ""  # what to do about the skips (sources with the same names)

    def shards_holding(self, paths: Collection[str]) -> set[int]:
        """The numbers of the shards whose planned samples have an input shown as one of ``paths``."""
        return {
            shard.number
            for shard in self.shards
            for s in self.samples[shard.start : shard.stop]
            if any(it.shown in paths for _, it in s.members)
        }

    def shard_totals(self, number: int) -> tuple[int, int]:
        """The payload bytes and files of shard ``number`` written whole, as planned."""
        shard = self.shards[number]  # (numbered 0.. in order)
        members = [it for s in self.samples[shard.start : shard.stop] for _, it in s.members]
        return sum(it.entry.size for it in members), len(members)


@dataclass(frozen=True)
class Listed:
    """The files of a pack's sources as ``(relpath, input)``, the inputs left out (:class:`Skip`), the sample
    keys those leave incomplete (``(key, why)``: the grouping drops such samples whole), what was left out
    by rule or followed (``notes``), and the names found in more than one source (``collisions``: the two
    sources -> relpaths)."""

    items: list[tuple[str, Input]]
    skipped: list[Skip]
    bad_keys: list[tuple[str, str]]
    notes: ListingNotes
    collisions: dict[tuple[str, str], list[str]]


def source_names(roots: Sequence[str]) -> list[str]:
    """Each source's folder name (the last part of its path or prefix; a bucket's name): the first key part
    with ``prefix_sources``. Two sources of one name are refused (their keys would collide again)."""
    names = [r.rstrip("/").rsplit("/", 1)[-1] for r in roots]
    for i, name in enumerate(names):
        if names.index(name) != i:
            raise ConfigError(
                f"prefix_sources: the sources {roots[names.index(name)]} and {roots[i]} have the same folder "
                f"name {name!r}, so their keys would still collide; pack from folders of different names"
            )
    return names


def list_sources(sources: Sequence[str], s3_config: S3Config | None, config: PackConfig) -> Listed:
    """Every file of ``sources`` (hidden and ``exclude``d paths left out as ``config`` says; with
    ``prefix_sources`` each relpath starts with its source's folder name)."""
    rules = PathRules(include_hidden=config.include_hidden, exclude=config.exclude)
    items: list[tuple[str, Input]] = []
    skipped: list[Skip] = []
    bad_keys: list[tuple[str, str]] = []
    notes = ListingNotes()
    owner: dict[str, str] = {}  # relpath -> the source it was first found in
    collisions: dict[tuple[str, str], list[str]] = {}
    opened: list[LocalSource | S3Source] = []
    for src in sources:
        if src.startswith("s3://"):
            from fastload.storage.s3source import S3Source

            opened.append(S3Source(src, config=s3_config))
        else:
            opened.append(LocalSource(src))
    prefixes = [n + "/" for n in source_names([s.root for s in opened])] if config.prefix_sources else None
    for i, source in enumerate(opened):
        prefix = prefixes[i] if prefixes is not None else ""
        for found in source.walk(rules):
            if isinstance(found, Note):
                {HIDDEN: notes.hidden, EXCLUDED: notes.excluded, SYMLINK: notes.links}[found.why].append(
                    _join(source.root, found.shown)
                )
                continue
            if isinstance(found, FileEntry):  # an empty file is data too: an empty value, as GNU tar keeps
                relpath = prefix + found.relpath
                entry = replace(found, relpath=relpath) if prefix else found
                first = owner.setdefault(relpath, source.root)
                if first != source.root:
                    collisions.setdefault((first, source.root), []).append(relpath)
                    with contextlib.suppress(KeyRuleError):
                        bad_keys.append(
                            (
                                split_key(relpath)[0],
                                f"duplicate name {relpath}: it is in both {first} and {source.root}",
                            )
                        )
                items.append((relpath, Input(source, entry)))
                continue
            problem = Skip(_join(source.root, found.path), found.reason)
            skipped.append(problem)
            with contextlib.suppress(KeyRuleError):
                key = split_key(prefix + found.path)[0]
                bad_keys.append((key, f"{problem.path} was skipped ({problem.reason})"))
    return Listed(items, skipped, bad_keys, notes, collisions)


def _key_or_name(relpath: str) -> tuple[str, str]:
    try:
        return split_key(relpath)
    except KeyRuleError:
        return relpath, ""


def collision_hint(collisions: dict[tuple[str, str], list[str]]) -> str:
    """What to say when sources hold the same relative names: which, between which sources, and the fix."""
    lines = []
    for (a, b), names in collisions.items():
        keys = sorted({k for k, _ in map(_key_or_name, names)})
        shown = ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
        lines.append(f"{len(names)} name(s) are in both {a} and {b}: sample key(s) {shown} collide")
    return (
        "\n".join(lines) + "\nThose samples are left out. To keep both, pass "
        "--prefix-sources (prefix_sources=True): each key then starts with its source folder's name."
    )


def plan_pack(sources: Sequence[str], config: PackConfig, s3_config: S3Config | None) -> PackPlan:
    """List ``sources``, group files into samples, order them, cut them into shards; write nothing."""
    listed = list_sources(sources, s3_config, config)
    samples, rejected = group_samples(listed.items, listed.bad_keys)
    skipped = listed.skipped + [Skip(r.item.shown, r.reason) for r in rejected]
    hint = collision_hint(listed.collisions) if listed.collisions else ""
    partitions: list[str | None] | None = None
    if config.partition_level is not None:
        kept: list[Sample[Input]] = []
        partitions = []
        for s in samples:
            try:
                value = partition_value(s.key, config.partition_level)
            except KeyRuleError as exc:
                skipped += [Skip(item.shown, f"sample {s.key!r} {exc}") for _, item in s.members]
                continue
            kept.append(s)
            partitions.append(f"{config.partition_column}={value}")
        samples = kept
    if not samples:
        where = ", ".join(sources)
        if skipped and not config.allow_skip:  # every input had a problem: say which, not that there is none
            raise SkippedInputError(skipped, written=False, hint=hint or "No sample is left to pack.")
        if skipped:
            shown = "\n  ".join(str(s) for s in skipped[:20])
            more = f"\n  ... and {len(skipped) - 20} more" if len(skipped) > 20 else ""
            raise PackError(
                f"no samples left to pack in {where}: all {len(skipped)} input(s) were skipped:"
                f"\n  {shown}{more}" + (f"\n{hint}" if hint else "")
            )
        notes = listed.notes
        aside = (
            f" (left out: {len(notes.hidden)} hidden, {len(notes.excluded)} matching --exclude; "
            "--include-hidden packs hidden names)"
            if notes.hidden or notes.excluded
            else ""
        )
        raise PackError(f"no samples found in {where}: it holds no regular files with an extension{aside}")
    order = sample_order(len(samples), partitions, seed=config.shuffle_seed)
    samples = [samples[i] for i in order]
    if partitions is not None:
        partitions = [partitions[i] for i in order]
    fields_seen = {f for s in samples for f, _ in s.members}
    sizes, overhead, suffix = shard_sizes(config, samples, len(fields_seen))
    shards = plan_shards(
        sizes,
        partitions,
        shard_bytes=config.shard_size_bytes,
        max_samples=config.max_samples,
        prefix=config.prefix,
        suffix=suffix,
        overhead_bytes=overhead,
    )
    layout = hashlib.sha256(json.dumps(output_options(config), sort_keys=True).encode())
    versions = hashlib.sha256()
    fields: set[str] = set()
    payload = files = empty = 0
    for s in samples:
        layout.update(s.key.encode("utf-8", "surrogateescape") + b"\0")
        for f, it in s.members:
            fields.add(f)
            payload += it.entry.size
            files += 1
            empty += it.entry.size == 0
            layout.update(
                b"%s\0%s\0%d\n" % (f.encode(), it.relpath.encode("utf-8", "surrogateescape"), it.entry.size)
            )
            versions.update(it.entry.version.encode() + b"\n")
    return PackPlan(
        samples=samples,
        shards=shards,
        fields=sorted(fields),
        skipped=skipped,
        layout=layout.hexdigest(),
        fingerprint=layout.hexdigest() + versions.hexdigest(),
        payload_bytes=payload,
        files=files,
        empty_files=empty,
        notes=replace(listed.notes, hints=field_hints(samples)),
        hint=hint,
        unreadable=[
            Skip(it.shown, it.entry.unreadable) for s in samples for _, it in s.members if it.entry.unreadable
        ],
    )


def _join(root: str, relpath: str) -> str:
    return root + relpath if root.endswith("/") else os.path.join(root, relpath)


def source_and_target(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    dst: str | os.PathLike[str],
    *,
    missing: str,
) -> tuple[list[str], str]:
    """Sources and destination as strings; a destination inside a local source is refused (its output
    would be read as input)."""
    srcs = (
        [os.fspath(sources)] if isinstance(sources, (str, os.PathLike)) else [os.fspath(s) for s in sources]
    )
    if not srcs:
        raise ConfigError(f"no source given; {missing}")
    target = os.fspath(dst)
    for url in srcs:  # a mistyped s3:// or a gs:// URL is not a local path
        check_url(url)
        if is_web(url):
            raise ConfigError(
                f"{url}: pack reads its sources from local folders or s3://; copy web files first "
                f"(`fastload cp -r {url} local/`)"
            )
    check_writable(target)
    for src in srcs:
        if not src.startswith("s3://") and not target.startswith(("s3://", "gs://", "az://")):
            a, b = os.path.realpath(src), os.path.realpath(target)
            if b == a or b.startswith(a.rstrip(os.sep) + os.sep):
                raise ConfigError(
                    f"destination {target} is inside the source {src}; what is written there would be "
                    "read as input: choose a destination outside the source"
                )
    return srcs, target


def shard_sizes(
    config: PackConfig, samples: Sequence[Sample[Input]], n_fields: int
) -> tuple[list[int], int, str]:
    """Each sample's exact bytes in a shard of ``config.shard_format``, the per-shard overhead and the
    shard name suffix: what :func:`~fastload.core.plan.plan_shards` cuts shards by (the format says)."""
    fmt = formats.by_name(config.shard_format)
    sizes, overhead = fmt.sample_sizes(samples, n_fields=n_fields, config=config)
    return sizes, overhead, fmt.suffixes[0]
