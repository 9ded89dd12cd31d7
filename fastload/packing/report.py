"""What a pack did: :class:`PackReport` and its one-paragraph summary."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fastload.core.index import DatasetIndex
from fastload.core.keys import DECODED_EXTENSIONS, Sample
from fastload.core.versions import versions_of
from fastload.errors import Skip


@dataclass(frozen=True)
class ListingNotes:
    """What a pack's listing left out by rule (hidden paths, ``exclude`` globs: folders end with ``/``) and
    the symlinks it followed (full paths), and hints about the fields found."""

    hidden: list[str] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """The summary's lines about them (none when there is nothing to say)."""
        out = []
        if self.hidden:
            out.append(
                f"left out {len(self.hidden):,} hidden file(s)/folder(s) ({_some(self.hidden)}); "
                "--include-hidden (include_hidden=True) packs them"
            )
        if self.excluded:
            out.append(f"left out {len(self.excluded):,} path(s) matching --exclude ({_some(self.excluded)})")
        if self.links:
            out.append(
                f"followed {len(self.links):,} symlink(s) and packed what they point to ({_some(self.links)})"
            )
        return out + [f"hint: {h}" for h in self.hints]


def _some(paths: Sequence[str], n: int = 3) -> str:
    return ", ".join(paths[:n]) + (f" and {len(paths) - n:,} more" if len(paths) > n else "")


def field_hints(samples: Sequence[Sample[Any]]) -> list[str]:
    """Hints about the fields of ``samples``: one for each field with a dot in it (the key ends at the first
    dot: ``take.v2.wav`` is key ``take``, field ``v2.wav``, which may not be meant), and one for the fields
    whose last extension no built-in decoder knows (their values are read as bytes)."""
    example: dict[str, str] = {}
    for s in samples:
        for f, _ in s.members:
            example.setdefault(f, s.key)
    hints = []
    for f, key in sorted(example.items()):
        if "." in f:
            head, last = f.rsplit(".", 1)
            hints.append(
                f"field {f!r} comes from names like {key}.{f}: a key ends at the first dot, so the key is "
                f"{key!r}; if {head!r} belongs to the key, rename such files (e.g. {key}_{head}.{last})"
            )
    unknown = sorted(f for f in example if f.rsplit(".", 1)[-1].lower() not in DECODED_EXTENSIONS)
    if unknown:
        hints.append(
            f"no built-in decoder for field(s) {', '.join(unknown)} (decoders go by the last extension): "
            "ShardDataset returns their bytes; decode them in map="
        )
    return hints


@dataclass
class PackReport:
    """What a pack did."""

    dst: str
    index: DatasetIndex
    skipped: list[Skip] = field(default_factory=list)
    shards_written: int = 0
    shards_kept: int = 0
    files: int = 0
    empty_files: int = 0
    seconds: float = 0.0
    already_complete: bool = False
    notes: ListingNotes = field(default_factory=ListingNotes)
    appended: tuple[Any, DatasetIndex] | None = None  # an append: (its Version, the dataset's index now)

    def summary(self) -> str:
        idx = self.index
        if self.already_complete:
            return (
                f"nothing to do: {self.dst} already holds this pack ({idx.samples:,} samples in "
                f"{len(idx.shards)} {idx.shard_format} shard(s)); skipped {len(self.skipped)} input(s)"
            )
        mb = idx.payload_bytes / 1e6
        rate = (
            f", {self.files / self.seconds:,.0f} files/s, {mb / self.seconds:,.1f} MB/s"
            if self.seconds
            else ""
        )
        lines = [
            f"packed {idx.samples:,} samples ({self.files:,} files, {mb:,.1f} MB) into {len(idx.shards)} "
            f"{idx.shard_format} shard(s) in {self.dst} in {self.seconds:.1f}s{rate}",
        ]
        if self.appended is not None:
            version, now = self.appended
            number = f"version {version.version}" if version is not None else "a new version"
            lines.append(
                f"appended as {number}: {self.dst} now holds {now.samples:,} samples in {len(now.shards)} "
                f"shard(s) ({len(versions_of(now))} versions; `fastload inspect --versions` lists them)"
            )
        if self.empty_files:
            lines.append(f"{self.empty_files:,} empty file(s) packed as empty values")
        lines += self.notes.lines()
        if self.shards_kept:
            lines.append(f"resumed: kept {self.shards_kept} finished shard(s), wrote {self.shards_written}")
        if self.skipped:
            lines.append(f"skipped {len(self.skipped)} input(s):")
            lines += [f"  {s}" for s in self.skipped[:50]]
            if len(self.skipped) > 50:
                lines.append(f"  ... and {len(self.skipped) - 50} more (all listed in index.json)")
        else:
            lines.append("skipped nothing")
        return "\n".join(lines)
