"""Configuration dataclasses (frozen, keyword-only, units in names), validated on construction."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from fastload.errors import ConfigError

SHARD_FORMATS = ("tar", "parquet")
PARQUET_COMPRESSIONS = ("none", "snappy", "zstd", "gzip", "lz4", "brotli")


@dataclass(frozen=True, kw_only=True)
class PackConfig:
    """Options of ``fastload pack``.

    Memory bound while packing: about ``workers x 8 MiB`` (tar: one copy buffer per writer) or
    ``workers x row_group_bytes`` (Parquet: one row group per writer), plus the listing's metadata
    (about 300 bytes per file). Neither depends on the dataset's total size.
    """

    shard_format: str = "tar"
    shard_size_bytes: int = 256 << 20
    max_samples: int | None = None
    prefix: str = "shard"
    shuffle_seed: int | None = None
    workers: int | None = None
    row_group_bytes: int = 64 << 20
    compression: str = "none"
    partition_level: int | None = None
    partition_name: str | None = None
    resume: bool = False
    allow_skip: bool = False
    fsync: bool = False
    progress: bool | None = None

    def __post_init__(self) -> None:
        if self.shard_format not in SHARD_FORMATS:
            raise ConfigError(f"shard_format={self.shard_format!r}; choose one of {', '.join(SHARD_FORMATS)}")
        if self.shard_size_bytes < 4096:
            raise ConfigError(
                f"shard_size_bytes={self.shard_size_bytes} is too small; use at least 4 KiB "
                "(a few hundred MiB is typical)"
            )
        if self.max_samples is not None and self.max_samples < 1:
            raise ConfigError(f"max_samples={self.max_samples} must be >= 1")
        if not self.prefix or "/" in self.prefix or self.prefix.startswith("."):
            raise ConfigError(
                f"prefix={self.prefix!r} must be a non-empty file name part without '/' "
                "that does not start with '.'"
            )
        if self.workers is not None and self.workers < 1:
            raise ConfigError(f"workers={self.workers} must be >= 1")
        if not 1 <= self.row_group_bytes <= 1 << 30:
            raise ConfigError(f"row_group_bytes={self.row_group_bytes} must be between 1 byte and 1 GiB")
        if self.compression not in PARQUET_COMPRESSIONS:
            raise ConfigError(
                f"compression={self.compression!r}; choose one of {', '.join(PARQUET_COMPRESSIONS)}"
            )
        if self.partition_level is not None and self.partition_level < 0:
            raise ConfigError(f"partition_level={self.partition_level} must be >= 0 (0 = top folder)")
        if self.partition_name is not None and (
            not self.partition_name or "/" in self.partition_name or "=" in self.partition_name
        ):
            raise ConfigError(f"partition_name={self.partition_name!r} must be non-empty, without '/' or '='")

    @property
    def worker_count(self) -> int:
        return self.workers or os.cpu_count() or 1

    @property
    def partition_column(self) -> str | None:
        if self.partition_level is None:
            return None
        return self.partition_name or f"level{self.partition_level}"

    def output_options(self) -> dict[str, Any]:
        """The options that decide the output bytes (not workers, progress or resume)."""
        out = asdict(self)
        for name in ("workers", "resume", "allow_skip", "fsync", "progress"):
            out.pop(name)
        if self.shard_format == "tar":
            out.pop("row_group_bytes")
            out.pop("compression")
        return out
