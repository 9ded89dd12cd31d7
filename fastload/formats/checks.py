"""Checks every shard format's verify shares: the whole file's CRC32C against its index entry."""

from __future__ import annotations

from fastload.core.index import ShardEntry
from fastload.errors import VerifyError
from fastload.formats.tar.scan import ChecksumReader


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
