"""``fastload verify`` for tar shards: a shard against its index entry (keys in order, each sample's byte
range and, where the index has them, the CRC32C of its bytes; members adjacent and well named, the member
layout; the whole file's CRC32C), and the lint of foreign WebDataset tars without an index (duplicate
members, keys whose members are not adjacent, names WebDataset would split differently or ignore, archive
structure)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import BinaryIO

from fastload.config import S3Config
from fastload.core.index import ShardEntry
from fastload.core.keys import KeyRuleError, lint_member_name, split_key
from fastload.errors import VerifyError
from fastload.formats.checks import crc_problem
from fastload.formats.shard import ChecksumReader
from fastload.formats.tar.header import Member, TarFormatError
from fastload.formats.tar.index import SampleCrcReader
from fastload.formats.tar.layout import layout_of
from fastload.formats.tar.scan import iter_members
from fastload.storage import access as storage


def _key_of(m: Member) -> str:
    """A member's sample key (``""`` for a name that breaks the key rule)."""
    try:
        return split_key(m.name)[0]
    except KeyRuleError:
        return ""


def samples_of(members: Iterator[Member]) -> Iterator[tuple[str, list[Member]]]:
    """Group consecutive members by key (members that break the key rule come as key ``""``)."""
    key: str | None = None
    group: list[Member] = []
    for m in members:
        k = _key_of(m)
        if k != key and group:
            yield key or "", group
            group = []
        key = k
        group.append(m)
    if group:
        yield key or "", group


def verify_tar(file: BinaryIO, shard: ShardEntry) -> list[VerifyError]:
    """Check a whole tar shard, read once from its start, against its (attached) index entry."""
    reader = SampleCrcReader(file) if shard.crcs else ChecksumReader(file)  # v1: no sample CRCs to check
    problems = check_tar_samples(reader, shard)
    reader.drain()
    return problems + crc_problem(reader, shard)


def _tracked(reader: SampleCrcReader, members: Iterator[Member], crcs: list[int]) -> Iterator[Member]:
    """``members``, telling ``reader`` where samples start (as :func:`samples_of` groups them); appends
    each finished sample's CRC32C to ``crcs``, the last one when the members run out."""
    key: str | None = None
    for m in members:
        k = _key_of(m)
        if k != key and key is not None:
            crcs.append(reader.sample_crc)
        reader.member(m, new_sample=k != key)
        key = k
        yield m
    if key is not None:
        crcs.append(reader.sample_crc)


def check_tar_samples(reader: ChecksumReader, shard: ShardEntry) -> list[VerifyError]:
    """The problems of a tar shard's samples against its entry (``reader`` at the start of the shard);
    with a :class:`SampleCrcReader` and an entry with ``crcs``, each sample's bytes are checked too."""
    problems: list[VerifyError] = []
    i = 0
    got_crcs: list[int] = []  # each sample's CRC32C, when the reader computes them
    layout = layout_of(shard)
    walk = iter_members(reader)
    if isinstance(reader, SampleCrcReader) and shard.crcs:
        walk = _tracked(reader, walk, got_crcs)
    try:
        for key, members in samples_of(walk):
            first = members[0]

            def problem(message: str, key: str = key, offset: int = first.header_offset) -> VerifyError:
                return VerifyError(message, shard=shard.name, key=key, offset=offset)

            if i >= shard.samples:
                problems.append(problem("sample not in the index (extra data in the shard)"))
                break
            expected = shard.keys[i]
            if key != expected:
                problems.append(
                    problem(
                        f"expected sample {expected!r} here (index position {i}); members "
                        "reordered, renamed or missing"
                    )
                )
                break
            names = [m.name for m in members]
            if len(set(names)) != len(names):
                problems.append(problem("duplicate member names in the sample"))
            span = (first.header_offset, members[-1].end - first.header_offset)
            if span != (shard.offsets[i], shard.sizes[i]):
                problems.append(
                    problem(
                        f"sample spans bytes {span[0]}+{span[1]}, index says "
                        f"{shard.offsets[i]}+{shard.sizes[i]}"
                    )
                )
            elif got_crcs and got_crcs[i] != shard.crcs[i]:
                problems.append(
                    problem(
                        f"the sample's bytes {span[0]}+{span[1]} have CRC32C {got_crcs[i]:08x}, the "
                        f"index says {shard.crcs[i]:08x}: a byte of its members changed; re-download or "
                        "re-pack the shard"
                    )
                )
            if layout is not None:
                found = [(m.name[len(key) + 1 :], m.size) for m in members]
                listed = list(zip(layout.fields, layout.sizes[i], strict=True))
                if found != listed:
                    problems.append(
                        problem(f"members (field, size) are {found}, the index's layout says {listed}")
                    )
            i += 1
    except TarFormatError as exc:
        problems.append(
            VerifyError(str(exc), shard=shard.name, key=shard.keys[i] if i < shard.samples else None)
        )
        return problems
    if not problems and i != shard.samples:
        problems.append(
            VerifyError(
                f"holds {i} samples, index says {shard.samples}",
                shard=shard.name,
                key=shard.keys[i] if i < shard.samples else None,
            )
        )
    return problems


def lint_tar(path: str, s3_config: S3Config | None) -> tuple[list[VerifyError], int, int]:
    problems: list[VerifyError] = []
    seen_keys: dict[str, int] = {}
    seen_names: set[str] = set()
    samples = 0
    name = path.rsplit("/", 1)[-1]
    with storage.open_read(path, config=s3_config) as f:
        size = f.seek(0, io.SEEK_END)
        f.seek(0)
        reader = ChecksumReader(f)
        try:
            for key, members in samples_of(iter_members(reader)):
                for m in members:

                    def problem(message: str, m: Member = m, key: str = key) -> VerifyError:
                        return VerifyError(message, shard=name, key=key or None, offset=m.header_offset)

                    if m.typeflag not in ("0", "\0", "7"):
                        problems.append(
                            problem(
                                f"member {m.name!r} is not a regular file (type {m.typeflag!r}); "
                                "WebDataset skips it"
                            )
                        )
                        continue
                    if m.name in seen_names:
                        problems.append(problem(f"duplicate member {m.name!r}"))
                    seen_names.add(m.name)
                    why = lint_member_name(m.name)
                    if why:
                        problems.append(problem(f"member {m.name!r}: {why}"))
                if not key:
                    continue
                if key in seen_keys:
                    problems.append(
                        VerifyError(
                            f"members of sample {key!r} are not adjacent (also at byte {seen_keys[key]}); "
                            "WebDataset would yield it as two samples",
                            shard=name,
                            key=key,
                            offset=members[0].header_offset,
                        )
                    )
                else:
                    seen_keys[key] = members[0].header_offset
                    samples += 1
        except TarFormatError as exc:
            problems.append(VerifyError(str(exc), shard=name))
    return problems, samples, size
