"""Checks shard formats share: the whole file's CRC32C against its index entry (verify), and an index entry
that must give each sample's byte range (formats read by offsets: tar, TFRecord)."""

from __future__ import annotations

from fastload.core.index import ShardEntry
from fastload.errors import VerifyError
from fastload.formats.shard import ChecksumReader


def crc_problem(reader: ChecksumReader, shard: ShardEntry) -> list[VerifyError]:
    """The problem when the CRC32C of everything read through ``reader`` (drained) is not the index's."""
    if reader.crc == int(shard.checksum, 16):
        return []
    return [
        VerifyError(
            f"CRC32C is {reader.crc:08x}, index says {shard.checksum}: the shard's bytes "
            "changed; re-download or re-pack it",
            shard=shard.name,
        )
    ]


def offsets_problem(entry: ShardEntry) -> str | None:
    """Why ``entry`` cannot describe a shard read by per-sample byte ranges, or None when it can."""
    if len(entry.offsets) != entry.samples:
        return "lacks per-sample offsets; re-run `fastload pack` (`fastload index` for other tools' files)"
    return None
