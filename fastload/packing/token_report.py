"""What a ``pack_tokens`` run did: :class:`TokensReport`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastload.core.index import DatasetIndex
from fastload.errors import Skip


@dataclass
class TokensReport:
    """What a ``pack_tokens`` run did."""

    dst: str
    index: DatasetIndex
    documents: int = 0
    tokens: int = 0
    dtype: str = "int32"
    max_token_id: int = -1
    dtype_chosen: bool = False
    skipped: list[Skip] = field(default_factory=list)
    seconds: float = 0.0
    shards_written: int = 0
    shards_kept: int = 0
    already_complete: bool = False
    appended: tuple[Any, DatasetIndex] | None = None  # an append: (its Version, the dataset's index now)

    def summary(self) -> str:
        if self.already_complete:
            return (
                f"nothing to do: {self.dst} already holds this pack ({self.documents:,} documents, "
                f"{self.tokens:,} tokens in {len(self.index.shards)} parquet shard(s)); skipped "
                f"{len(self.skipped)} document(s) or file(s)"
            )
        rate = f", {self.tokens / self.seconds / 1e6:,.1f}M tokens/s" if self.seconds else ""
        lines = [
            f"packed {self.documents:,} documents ({self.tokens:,} tokens, {self.dtype}) into "
            f"{len(self.index.shards)} parquet shard(s) in {self.dst} in {self.seconds:.1f}s{rate}"
        ]
        if self.appended is not None:
            version, now = self.appended
            number = f"version {version.version}" if version is not None else "a new version"
            lines.append(
                f"appended as {number}: {self.dst} now holds {now.options.get('documents', now.samples):,} "
                f"documents in {len(now.shards)} shard(s) (`fastload inspect --versions` lists the versions)"
            )
        if self.shards_kept:
            lines.append(f"resumed: kept {self.shards_kept} finished shard(s), wrote {self.shards_written}")
        if self.dtype == "int32" and not self.dtype_chosen and 0 <= self.max_token_id < 1 << 16:
            lines.append(
                f"every token id is below 65,536 (largest {self.max_token_id:,}): --vocab-size N (or "
                "--dtype uint16) would store 2 bytes per token instead of 4"
            )
        if self.skipped:
            lines.append(f"skipped {len(self.skipped)} document(s) or file(s):")
            lines += [f"  {s}" for s in self.skipped[:50]]
            if len(self.skipped) > 50:
                lines.append(f"  ... and {len(self.skipped) - 50} more (all listed in index.json)")
        return "\n".join(lines)


__all__ = ["TokensReport"]
