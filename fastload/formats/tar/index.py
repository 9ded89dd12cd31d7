"""Building a fastload index for WebDataset-style tar shards that have none (written by other tools).

One sequential read of each shard: member headers give each sample's byte range (its members' headers and
padded data, which must be adjacent, as WebDataset requires), and the CRC32C of the whole file and of each
sample's byte range are computed on the way (:class:`SampleCrcReader`). The result is an ordinary
:class:`~fastload.core.index.DatasetIndex`, so every sample-level feature (even splits, exact resume, ranged
reads, the checked cache, each sample's CRC checked on read) works on foreign shards too.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

from crc32c import crc32c

from fastload.config import S3Config
from fastload.core.index import DatasetIndex, ShardEntry
from fastload.core.keys import KeyRuleError, split_key
from fastload.errors import ConfigError, VerifyError
from fastload.formats.shard import ChecksumReader
from fastload.formats.tar.header import Member, TarFormatError, UnsupportedMember
from fastload.formats.tar.layout import set_layout
from fastload.formats.tar.scan import iter_members
from fastload.storage import access as storage

_ZEROS = bytes(1 << 20)


def _advance(crc: int, n: int) -> int:
    """The linear part of CRC32C over ``n`` more bytes: ``crc32c(M, v) == crc32c(M) ^ _advance(v, len(M))``
    (two passes over zeros: only for a sample preceded by entries that belong to no sample)."""
    a, b = crc, 0
    while n > 0:
        chunk = memoryview(_ZEROS)[: min(n, len(_ZEROS))]
        a, b = crc32c(chunk, a), crc32c(chunk, b)
        n -= len(chunk)
    return a ^ b


class SampleCrcReader(ChecksumReader):
    """A :class:`~fastload.formats.tar.scan.ChecksumReader` (the whole file's ``crc`` and ``pos``) that also
    tracks the CRC32C of each sample's byte range: :meth:`member` is called for each member walked.

    The bytes since the last member's end are checksummed twice, on their own and continuing the open
    sample, because whether they start a new sample is known only once the next member's name is read.
    """

    def __init__(self, f: BinaryIO, chunk_bytes: int = 4 << 20) -> None:
        super().__init__(f, chunk_bytes)
        self.sample_crc = 0  # of the open sample, up to the last member's end
        self._fresh = self._cont = 0  # since the last member's end: alone, continuing the open sample
        self._cut = 0  # the last member's end
        self._marks: dict[int, int] = {}  # position of each read since the cut -> _fresh there

    def _take(self, data: bytes | memoryview) -> None:
        super()._take(data)
        self._fresh = crc32c(data, self._fresh)
        self._cont = crc32c(data, self._cont)

    def read(self, n: int) -> bytes:
        self._marks[self.pos] = self._fresh  # a header may start here
        return super().read(n)

    def member(self, m: Member, *, new_sample: bool) -> None:
        """Account for ``m`` (just walked: the position is its end): it continues the open sample, or
        starts a new one at ``m.header_offset``; ``sample_crc`` is then the open sample's CRC32C."""
        if not new_sample:
            self.sample_crc = self._cont
        elif m.header_offset == self._cut:
            self.sample_crc = self._fresh
        else:  # entries of no sample (directories, ...) before it: take their CRC back out
            self.sample_crc = self._fresh ^ _advance(self._marks[m.header_offset], m.end - m.header_offset)
        self._cut, self._fresh, self._cont, self._marks = m.end, 0, self.sample_crc, {}


def index_tar_shard(url: str, name: str, *, config: S3Config | None = None) -> tuple[ShardEntry, set[str]]:
    """The index entry of one tar shard (and the fields it holds), from one sequential read."""
    keys: list[str] = []
    offsets: list[int] = []
    sizes: list[int] = []
    crcs: list[int] = []
    fields: set[str] = set()
    seen: set[str] = set()
    layouts: list[tuple[list[str], list[int]] | None] = []  # see .layout.set_layout
    with storage.open_read(url, config=config) as f:
        reader = SampleCrcReader(f)
        try:
            for member in iter_members(reader):
                try:
                    key, field_name = split_key(member.name)
                except KeyRuleError as exc:
                    raise VerifyError(
                        f"member {member.name!r}: {exc}; WebDataset could not use it either (run "
                        "`fastload verify` on the shard for a full lint)",
                        shard=name,
                        offset=member.header_offset,
                    ) from None
                fields.add(field_name)
                plain = member.plain
                if keys and keys[-1] == key:
                    reader.member(member, new_sample=False)
                    crcs[-1] = reader.sample_crc
                    sizes[-1] = member.end - offsets[-1]
                    last = layouts[-1]
                    if last is not None and plain:
                        last[0].append(field_name)
                        last[1].append(member.size)
                    else:
                        layouts[-1] = None
                    continue
                if key in seen:
                    raise VerifyError(
                        "the members of this sample are not adjacent (the key appears again after another "
                        "key); WebDataset would split it into two samples: re-pack with `fastload pack`",
                        shard=name,
                        key=key,
                        offset=member.header_offset,
                    )
                seen.add(key)
                reader.member(member, new_sample=True)
                crcs.append(reader.sample_crc)
                keys.append(key)
                offsets.append(member.header_offset)
                sizes.append(member.end - member.header_offset)
                layouts.append(([field_name], [member.size]) if plain else None)
            reader.drain()
        except UnsupportedMember as exc:
            raise VerifyError(str(exc), shard=name) from None
        except TarFormatError as exc:
            raise VerifyError(
                f"not a readable tar archive ({exc}); re-download or re-create the shard", shard=name
            ) from None
    entry = ShardEntry(
        name=name,
        bytes=reader.pos,
        checksum=f"{reader.crc:08x}",
        keys=keys,
        offsets=offsets,
        sizes=sizes,
        crcs=crcs,
    )
    set_layout(entry, layouts)
    return entry, fields


def index_tar_shards(
    urls: Sequence[str], *, config: S3Config | None = None, threads: int = 8
) -> tuple[str, DatasetIndex]:
    """``(root, index)`` for tar shards without an index: shard names are relative to ``root``."""
    if not urls:
        raise ConfigError("no shards given")
    urls = [storage.normalise(u) for u in urls]
    missing = [u for u in urls if not u.endswith(".tar")]
    if missing:
        raise ConfigError(
            f"{missing[0]}: only .tar shards can be read without an index.json (for TFRecord files run "
            "`fastload index`; Parquet needs an index written by `fastload pack`)"
        )
    root, names = storage.split_root(urls)
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(urls)))) as pool:
        results = list(pool.map(lambda u, n: index_tar_shard(u, n, config=config), urls, names))
    fields = sorted(set().union(*(f for _, f in results)))
    index = DatasetIndex(
        shard_format="tar",
        fields=fields,
        shards=[entry for entry, _ in results],
        options={"built_from": "tar scan"},
        payload_bytes=0,
    )
    return root, index
