"""Each sample of a tar shard checked against the CRC32C its index records (index v2 ``crcs``: every byte of
the sample's range ``[offsets[i], +sizes[i])``, headers and padding included), and the error that names a
sample whose bytes are not the ones packed."""

from __future__ import annotations

from crc32c import crc32c

from fastload.core.index import ShardEntry
from fastload.errors import SampleChecksumError


def crc_mismatch(
    shard: str, key: str, offset: int, size: int, got: int, want: int, *, index: int
) -> SampleChecksumError:
    """The error for sample ``index`` of a shard, whose bytes are not the ones packed."""
    return SampleChecksumError(
        f"the sample's {size} bytes have CRC32C {got:08x}, the index says {want:08x}: the shard was damaged "
        "or changed after packing; run `fastload verify` on the dataset and re-pack or re-download the shard "
        "(with cache_dir=, a damaged cached copy is fetched again); on_error='skip' leaves such samples out "
        "(counted and named in epoch_report()), verify_samples=False reads the bytes as they are",
        shard=shard,
        key=key,
        offset=offset,
        index=index,
    )


def check_crcs(data: bytes | memoryview, entry: ShardEntry, first: int, stop: int, *, shard: str) -> None:
    """Check samples ``first..stop-1`` (their bytes ``data``, from sample ``first``'s offset) against the
    index's per-sample CRC32C, if it has them; :class:`~fastload.errors.SampleChecksumError` at the first
    that differs."""
    crcs = entry.crcs
    if not crcs:
        return
    offsets, sizes = entry.offsets, entry.sizes
    base = offsets[first]
    view = memoryview(data)
    for i in range(first, stop):
        at = offsets[i] - base
        got = crc32c(view[at : at + sizes[i]])
        if got != crcs[i]:
            raise crc_mismatch(shard, entry.keys[i], offsets[i], sizes[i], got, crcs[i], index=i)
