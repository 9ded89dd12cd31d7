"""Reading a run of consecutive samples of an indexed tar shard: :func:`read_run`, the one read path.

The samples come from the run's bytes (read by the caller, e.g. a prefetch thread or a ranged GET) or from
a local file descriptor. Every member header is understood by one parser (:func:`.scan.iter_members`, every
dialect); in front of it sit fast paths that take a member only where its header says exactly what the
index or the plain ustar form says (so they take the bytes the parser would), and hand anything else to it:

- with the index's member layout (each sample's fields and sizes): members cut out by position, each header
  compared with the index (:func:`.header.is_header_of`: name, size, type, no prefix); from a file, in C
  (``fastload._native.layout_run``) when built, else in Python, big members read straight into their bytes;
- without it: plain ustar headers (checksums verified) matched to the index's keys as they come
  (:func:`samples_of_run`).

With the CRC32C of each sample in the index (v2 ``crcs``), every byte of each sample's range (headers, data,
padding) is checked before its sample is made (:func:`check_crcs`; in C on the direct path): damage the tar
structure cannot show (a flipped data byte, a size shrunk within its last block) is caught on every read.

Whatever the path, a shard that does not match its index raises :class:`~fastload.errors.VerifyError` naming
the shard, the sample and what to do; the C reader never raises for the content, it stops and the Python
parser names the problem, so both give the same samples and the same errors.

(Over 400 lines on purpose: the one read function, its fast paths and the parser they fall back to are
kept side by side, so that what each fast path takes is visibly what the parser would.)
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator
from typing import Any

from crc32c import crc32c

from fastload.core.index import ShardEntry
from fastload.core.keys import KeyRuleError, split_key
from fastload.core.table import Keys
from fastload.errors import VerifyError
from fastload.formats import native
from fastload.formats.shard import short_read
from fastload.formats.tar.crcs import check_crcs
from fastload.formats.tar.header import BLOCK, Member, TarFormatError, UnsupportedMember, is_header_of
from fastload.formats.tar.layout import TarLayout, layout_of
from fastload.formats.tar.scan import BufferCursor, iter_members

RawSample = dict[str, Any]
LOCAL_READ_BYTES = 256 << 10
# a local sample at least this big has each member read into its own bytes; smaller ones are read together
DIRECT_MEMBER_BYTES = 16 << 10
# the C reader's batches: one preadv of about this many bytes, then their samples one by one
# bytes per C read: small enough that the CRC32C runs over bytes still in L2 (1 MiB cost 2.5x the CRC time)
NATIVE_BATCH_BYTES = 256 << 10


def read_run(
    source: bytes | int, entry: ShardEntry, first: int, stop: int, *, shard: str
) -> Iterable[RawSample]:
    """Samples ``first..stop-1`` of a tar shard, in order, as dicts with ``__key__``, ``__index__`` and one
    bytes value per field.

    ``source``: the run's bytes (from ``entry.offsets[first]`` to the end of sample ``stop - 1``), or the
    descriptor of the local shard file (read here with ``pread``; the C reader when the index has the
    member layout; samples come as they are read). Raises :class:`VerifyError` where the shard does not
    match the index.
    """
    if isinstance(source, int):
        layout = layout_of(entry)
        if layout is not None and native.layout_run is not None:
            # the C reader's batches chained in C: no Python frame resumed per sample
            return itertools.chain.from_iterable(_native_batches(source, entry, layout, first, stop, shard))
        if layout is not None:
            return _direct_run(source, entry, layout, first, stop, shard)
        return _file_run(source, entry, first, stop, shard)
    return samples_of_bytes(source, entry, first, stop, shard=shard)


def pieces(entry: ShardEntry, first: int, stop: int, limit: int = LOCAL_READ_BYTES) -> list[tuple[int, int]]:
    """Samples ``first..stop-1`` as reads of whole samples of at most ``limit`` bytes each (one read for a
    sample bigger than that): small buffers are recycled by the allocator and stay in cache, while a fresh
    multi-MiB buffer per read costs a page fault per 4 KiB."""
    out: list[tuple[int, int]] = []
    a = first
    while a < stop:
        end = entry.offsets[a] + limit
        b = a + 1
        while b < stop and entry.offsets[b] + entry.sizes[b] <= end:
            b += 1
        out.append((a, b))
        a = b
    return out


def span(entry: ShardEntry, first: int, stop: int) -> tuple[int, int]:
    """``(offset, size)`` of samples ``first..stop-1`` in the shard."""
    offset = entry.offsets[first]
    return offset, entry.offsets[stop - 1] + entry.sizes[stop - 1] - offset


def parse_tar_fragment(
    data: bytes | memoryview, *, shard: str, base: int = 0
) -> Iterator[tuple[str, str, bytes]]:
    """``(key, field, bytes)`` of each regular member in a tar fragment of whole members (starting at
    archive offset ``base``), through the one header parser; raises :class:`VerifyError`."""
    for _, key, field_name, value in _parse(data, shard=shard, base=base):
        yield key, field_name, value


def _parse(data: bytes | memoryview, *, shard: str, base: int) -> Iterator[tuple[Member, str, str, bytes]]:
    view = memoryview(data)
    members = iter_members(BufferCursor(view, base), end_required=False)
    while True:
        try:
            member = next(members, None)
        except UnsupportedMember as exc:
            raise VerifyError(str(exc), shard=shard, offset=base) from None
        except TarFormatError as exc:
            raise VerifyError(
                f"corrupt tar header or member in the bytes the index lists ({exc}); run `fastload verify`",
                shard=shard,
                offset=base,
            ) from None
        if member is None:
            return
        try:
            key, field_name = split_key(member.name)
        except KeyRuleError as exc:
            raise VerifyError(
                f"member {member.name!r}: {exc}", shard=shard, offset=member.header_offset
            ) from None
        at = member.data_offset - base
        yield member, key, field_name, bytes(view[at : at + member.size])


def group_members(members: Iterator[tuple[str, str, bytes]]) -> Iterator[RawSample]:
    """Consecutive members with the same key as one sample dict."""
    current: RawSample | None = None
    for key, field_name, data in members:
        if current is None or current["__key__"] != key:
            if current is not None:
                yield current
            current = {"__key__": key}
        current[field_name] = data
    if current is not None:
        yield current


def samples_of_bytes(data: bytes, entry: ShardEntry, first: int, stop: int, *, shard: str) -> list[RawSample]:
    """Samples ``first..stop-1`` from their bytes (see :func:`read_run`): the tar structure checked against
    the index first (its errors say what is wrong), then each sample's bytes against its CRC32C."""
    samples = _structured(data, entry, first, stop, shard)
    check_crcs(data, entry, first, stop, shard=shard)
    return samples


def _structured(data: bytes, entry: ShardEntry, first: int, stop: int, shard: str) -> list[RawSample]:
    layout = layout_of(entry)
    if layout is not None:
        samples = slice_by_layout(data, entry, layout, first, stop)
        if samples is not None:
            return samples
    samples = samples_of_run(data, entry, first, stop, shard=shard)
    if layout is not None:  # well-formed, but does it hold what the index says?
        for sample in samples:
            i = sample["__index__"]
            found = [(k, len(v)) for k, v in sample.items() if not k.startswith("__")]
            if found != list(zip(layout.fields, layout.sizes[i], strict=True)):
                raise VerifyError(
                    f"the shard's members of this sample ({found}) are not the fields and sizes the "
                    "index lists; the shard was changed after packing: run `fastload verify`",
                    shard=shard,
                    key=entry.keys[i],
                    offset=entry.offsets[i],
                )
    return samples


def samples_of_run(data: bytes, entry: ShardEntry, first: int, stop: int, *, shard: str) -> list[RawSample]:
    """The samples ``first..stop-1`` of an indexed shard from their bytes, each where the index says.

    The fast path of the parser for shards without a member layout: plain ustar members are matched to
    the index's keys as they come (a member named ``KEY.FIELD`` with no ``/`` in ``FIELD``), so the key
    rule need not be re-derived per member; header checksums are still verified. Anything else (pax or
    GNU headers, other member types, a mismatch) goes through the general parser, which reads every
    dialect or names the problem.
    """
    keys, offsets, sizes = entry.keys, entry.offsets, entry.sizes
    base = offsets[first]
    n = len(data)
    samples: list[RawSample] = []
    k = first - 1
    prefix = ""
    current: RawSample = {}
    pos = 0
    while pos + BLOCK <= n:
        header = data[pos : pos + BLOCK]
        size_field, checksum = header[124:135], header[148:156]
        if (
            header[156] not in _REGULAR
            or header[257:262] != b"ustar"
            or header[345] != 0
            or header[135] != 0
            or not size_field.isdigit()
            or checksum != b"%06o\0 " % (sum(header) - sum(checksum) + 256)
        ):
            return _general(data, entry, first, stop, shard)
        try:
            size = int(size_field, 8)
        except ValueError:  # (an 8 or 9)
            return _general(data, entry, first, stop, shard)
        start = pos + BLOCK
        end = start + ((size + BLOCK - 1) & ~(BLOCK - 1))
        if end > n:
            return _general(data, entry, first, stop, shard)
        name = header[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        if k < first or not name.startswith(prefix):
            k += 1
            if (
                k >= stop
                or not name.startswith(keys[k] + ".")
                or base + pos != offsets[k]
                or (k > first and offsets[k - 1] + sizes[k - 1] != offsets[k])
            ):
                return _general(data, entry, first, stop, shard)
            prefix = keys[k] + "."
            current = {"__key__": keys[k], "__index__": k}
            samples.append(current)
        field = name[len(prefix) :]
        if not field or "/" in field:
            return _general(data, entry, first, stop, shard)
        current[field] = data[start : start + size]
        pos = end
    if k != stop - 1 or pos != n:
        return _general(data, entry, first, stop, shard)
    return samples


_REGULAR = frozenset(b"0\0")


def _general(data: bytes, entry: ShardEntry, first: int, stop: int, shard: str) -> list[RawSample]:
    """The general parser over a run's bytes: handles every header kind, or raises with the exact
    problem, including samples that are not the keys, or not at the byte ranges, the index lists."""
    keys, offsets, sizes = entry.keys, entry.offsets, entry.sizes
    base = offsets[first]
    samples: list[RawSample] = []
    ends: list[int] = []
    for member, key, field_name, value in _parse(data, shard=shard, base=base):
        if not samples or samples[-1]["__key__"] != key:
            i = first + len(samples)
            if i >= stop or key != keys[i]:
                break
            if member.header_offset != offsets[i]:
                raise _elsewhere(shard, keys[i], member.header_offset, offsets[i], sizes[i])
            samples.append({"__key__": key, "__index__": i})
            ends.append(0)
        samples[-1][field_name] = value
        ends[-1] = member.end
    if len(samples) != stop - first or [s["__key__"] for s in samples] != keys[first:stop]:
        raise VerifyError(
            f"samples at index positions {first}..{stop - 1} are not the keys the index lists; "
            "run `fastload verify`",
            shard=shard,
            key=keys[first + len(samples)] if len(samples) < stop - first else keys[first],
            offset=base,
        )
    for i, end in enumerate(ends, first):
        if end != offsets[i] + sizes[i]:
            raise _elsewhere(shard, keys[i], offsets[i], offsets[i], sizes[i], end=end)
    return samples


def _elsewhere(
    shard: str, key: str, at: int, offset: int, size: int, *, end: int | None = None
) -> VerifyError:
    found = f"ends at byte {end}" if end is not None else f"starts at byte {at}"
    return VerifyError(
        f"sample {found}, the index says bytes {offset}+{size}: the shard does not match its index "
        "(changed after indexing); run `fastload verify`",
        shard=shard,
        key=key,
        offset=at,
    )


def slice_by_layout(
    data: bytes, entry: ShardEntry, layout: TarLayout, first: int, stop: int
) -> list[RawSample] | None:
    """Samples ``first..stop-1`` cut out of ``data`` (their bytes, from sample ``first``'s offset) using the
    index's member layout, each member's header checked against it (:func:`is_header_of`); None at the
    first header that does not match (the caller's general parser then names the problem)."""
    keys, rows, fields = entry.keys, layout.sizes, layout.fields
    dots = _dotted(fields)
    base = entry.offsets[first]
    out: list[RawSample] = []
    for i in range(first, stop):
        key = keys[i]
        raw_key = key.encode()
        sample: RawSample = {"__key__": key, "__index__": i}
        pos = entry.offsets[i] - base
        for field_name, dot, size in zip(fields, dots, rows[i], strict=True):
            if not is_header_of(data, pos, raw_key + dot, size) or pos + BLOCK + size > len(data):
                return None
            pos += BLOCK
            sample[field_name] = data[pos : pos + size]
            pos += (size + BLOCK - 1) & ~(BLOCK - 1)
        out.append(sample)
    return out


def _dotted(fields: list[str]) -> list[bytes]:
    """``.FIELD`` as bytes for each field: a member's name is its sample's key + one of these."""
    return [b"." + f.encode() for f in fields]


def _file_run(fd: int, entry: ShardEntry, first: int, stop: int, shard: str) -> Iterator[RawSample]:
    """Samples ``first..stop-1`` of a local shard: whole samples read (:func:`pieces`), then parsed."""
    for a, b in pieces(entry, first, stop):
        offset, size = span(entry, a, b)
        data = os.pread(fd, size, offset)
        if len(data) != size:
            raise short_read(shard, size, offset, entry.keys[a])
        yield from samples_of_bytes(data, entry, a, b, shard=shard)


def _native_batches(
    fd: int, entry: ShardEntry, layout: TarLayout, first: int, stop: int, shard: str
) -> Iterator[Iterable[RawSample]]:
    """:func:`_direct_run` in C: lists of samples, each from one ``preadv`` of about ``NATIVE_BATCH_BYTES``
    (a batch is dropped before the next is read, so the allocator hands the same, cached, memory back);
    at the first sample that does not match, the parsing reader's samples from there on."""
    layout_run = native.layout_run
    if layout_run is None:
        raise RuntimeError("fastload._native is not in use")  # (read_run calls this only with it)
    dots = _dotted(layout.fields)
    keys: list[str] | tuple[bytes, list[int]]
    if isinstance(entry.keys, Keys):  # a v2 table's: each key decoded in C as its sample is made
        keys, key_base = entry.keys.parts(), 0
    else:
        keys, key_base = list(entry.keys[first:stop]), first
    crcs = entry.crcs if entry.crcs else []
    i = first
    while i < stop:
        samples, i, whole = layout_run(
            fd,
            entry.offsets,
            keys,
            key_base,
            layout.sizes,
            layout.fields,
            dots,
            crcs,
            i,
            stop,
            NATIVE_BATCH_BYTES,
        )
        yield samples
        del samples
        if not whole:
            yield _file_run(fd, entry, i, stop, shard)
            return


def _direct_run(
    fd: int, entry: ShardEntry, layout: TarLayout, first: int, stop: int, shard: str
) -> Iterator[RawSample]:
    """Samples ``first..stop-1`` of a local tar shard whose index has the member layout, read with no
    header parsing: each member's header is checked against the index (:func:`is_header_of`), small
    members are cut from one read of the headers around them, and each big member's bytes are read
    straight into its own ``bytes`` (one copy, like ``cat``); small samples are read several at a time.
    At the first header that does not match, the rest of the run goes through the parsing reader,
    which names the problem."""
    # (with the C reader built, read_run uses _native_batches instead: the same, a batch per call)
    keys, offsets, sizes, rows = entry.keys, entry.offsets, entry.sizes, layout.sizes
    fields, crcs = layout.fields, entry.crcs
    dots = _dotted(fields)
    pread = os.pread
    run_end = offsets[stop - 1] + sizes[stop - 1]
    file_end = -1
    buf, b0, b1 = b"", 0, 0
    for i in range(first, stop):
        key = keys[i]
        raw_key = key.encode()
        sample: RawSample = {"__key__": key, "__index__": i}
        pos = offsets[i]
        # a sample is taken only when all its bytes are there (padding too), as in C
        if sizes[i] < DIRECT_MEMBER_BYTES:
            if not (b0 <= pos and pos + sizes[i] <= b1):
                buf = pread(fd, min(LOCAL_READ_BYTES, run_end - pos), pos)
                b0, b1 = pos, pos + len(buf)
                if pos + sizes[i] > b1:
                    yield from _file_run(fd, entry, i, stop, shard)
                    return
        else:
            if file_end < 0:
                file_end = os.fstat(fd).st_size
            if pos + sizes[i] > file_end:
                yield from _file_run(fd, entry, i, stop, shard)
                return
        row = rows[i]
        crc = 0  # over every byte of the sample's range, as read (with crcs)
        for k, field_name in enumerate(fields):
            size = row[k]
            if not (b0 <= pos and pos + BLOCK <= b1):
                # the headers and small members from here up to the next big member's data
                end = pos + BLOCK
                for later in row[k:]:
                    if later >= DIRECT_MEMBER_BYTES:
                        break
                    end += ((later + BLOCK - 1) & ~(BLOCK - 1)) + BLOCK
                buf = pread(fd, min(end, run_end) - pos, pos)
                b0, b1 = pos, pos + len(buf)
            if not is_header_of(buf, pos - b0, raw_key + dots[k], size):
                yield from _file_run(fd, entry, i, stop, shard)
                return
            padded = (size + BLOCK - 1) & ~(BLOCK - 1)
            if pos + BLOCK + padded <= b1:
                if crcs:
                    crc = crc32c(memoryview(buf)[pos - b0 : pos - b0 + BLOCK + padded], crc)
                pos += BLOCK
                value = buf[pos - b0 : pos - b0 + size]
            else:
                if crcs:
                    crc = crc32c(memoryview(buf)[pos - b0 : pos - b0 + BLOCK], crc)
                pos += BLOCK
                value = pread(fd, size, pos)
                if len(value) != size:
                    yield from _file_run(fd, entry, i, stop, shard)
                    return
                if crcs:
                    crc = crc32c(value, crc)
                    if padded > size:
                        crc = crc32c(pread(fd, padded - size, pos + size), crc)
            sample[field_name] = value
            pos += padded
        if crcs and crc != crcs[i]:  # the parsing reader names it
            yield from _file_run(fd, entry, i, stop, shard)
            return
        yield sample
