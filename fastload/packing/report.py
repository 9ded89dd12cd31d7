"""What a pack did: :class:`PackReport` and its one-paragraph summary."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastload.core.index import DatasetIndex
from fastload.errors import Skip


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
        if self.empty_files:
            lines.append(f"{self.empty_files:,} empty file(s) packed as empty values")
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
