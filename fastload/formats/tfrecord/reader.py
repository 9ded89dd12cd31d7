"""Reading TFRecord shards: runs of records by index byte range (both CRCs checked), gzip shards through a
decompressed spool, ``tf.train.Example`` records as sample dicts, and whole-file scans for
``fastload index`` and ``fastload verify``.

Sample dicts: ``__key__`` is the record's ``__key__`` bytes feature (fastload pack writes one), else
``<shard stem>/<record index:06d>``; a bytes feature with one value becomes ``bytes`` (so decoding by
extension still applies), with 0 or 2+ values a ``list[bytes]``; int64 and float lists become 1-D numpy
arrays (``int64``, ``float32``), as ``tfrecord.torch.TFRecordDataset`` gives them.

A gzip shard (``.tfrecord.gz``) cannot be range-read: its index offsets refer to the decompressed stream,
which is decompressed once per open shard, front to back and only as far as asked, into an anonymous
temporary file (in ``TMPDIR``) that the ranged reads then use; it is gone when the shard is closed.

(Over 400 lines on purpose: the ranged run reader, the gzip spool and the whole-file scan share the record
framing checks and the one Example-to-sample conversion; the wire codec itself is in ``codec``.)
"""

from __future__ import annotations

import gzip
import os
import tempfile
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np

from fastload.config import S3Config
from fastload.core.index import ShardEntry
from fastload.core.readplan import runs
from fastload.errors import VerifyError
from fastload.formats import native
from fastload.formats.shard import ChecksumReader
from fastload.formats.tfrecord.codec import (
    FOOTER_BYTES,
    HEADER_BYTES,
    KEY_FEATURE,
    OVERHEAD_BYTES,
    ExampleFormatError,
    FeatureValue,
    check_footer,
    crc_update,
    decode_example,
    derived_key,
    example_key,
    example_start,
    footer_matches,
    header_length,
    is_gzip_name,
    iter_records,
    key_value,
    parse_header,
    record_crc,
    record_size,
    shard_stem,
    simple_entry,
    simple_example,
    truncated,
)
from fastload.storage import access as storage

RawSample = dict[str, Any]
_SPOOL_CHUNK = 4 << 20
# direct reads (local, no prefetch): a record at least this big has each value read into its own bytes after
# a read of its head; smaller records are read several at a time, up to SMALL_READ_BYTES (as tar members)
DIRECT_RECORD_BYTES = 16 << 10
SMALL_READ_BYTES = 256 << 10
HEAD_READ_BYTES = 1 << 10
_HEAD_MIN_BYTES = HEADER_BYTES + 16  # a record header and an Example's start
NATIVE_BATCH_BYTES = 512 << 10  # records per call of the C reader (2 MiB: slower here, out of cache)
GZIP_ERRORS = (OSError, EOFError, zlib.error)


def _value(value: FeatureValue) -> Any:
    if isinstance(value, list):
        return value[0] if len(value) == 1 else value
    dtype = np.int64 if value.typecode == "q" else np.float32
    return np.frombuffer(value, dtype=dtype) if len(value) else np.zeros(0, dtype=dtype)


def not_an_example(shard: str, record: int, offset: int, exc: ExampleFormatError) -> VerifyError:
    return VerifyError(
        f"record {record} is not a readable tf.train.Example ({exc}); fastload reads Example records "
        "only: re-create the shard, or read it with a reader for its record type",
        shard=shard,
        offset=offset,
    )


def to_sample(payload: bytes | memoryview, *, shard: str, record: int, offset: int) -> RawSample:
    """Record ``record`` of ``shard`` (at byte ``offset``) as a sample dict (see the module docstring)."""
    try:
        features = decode_example(payload)
        raw_key = features.pop(KEY_FEATURE, None)
        key = derived_key(shard, record) if raw_key is None else key_value(raw_key)
    except ExampleFormatError as exc:
        raise not_an_example(shard, record, offset, exc) from None
    sample: RawSample = {"__key__": key}
    for name, value in features.items():
        sample[name] = _value(value)
    return sample


def fast_sample(buf: bytes, start: int, end: int, *, shard: str, record: int) -> RawSample | None:
    """:func:`to_sample` of the payload ``buf[start:end]`` when its Example has the common shape
    (:func:`~fastload.formats.tfrecord.codec.simple_example`); None otherwise (``to_sample`` then reads
    it)."""
    features = simple_example(buf, start, end)
    if features is None:
        return None
    raw_key = features.pop(KEY_FEATURE, None)
    if raw_key is None:
        sample: RawSample = {"__key__": derived_key(shard, record)}
    else:
        try:
            sample = {"__key__": str(raw_key, "utf-8")}
        except UnicodeDecodeError:
            return None
    sample.update(features)
    return sample


class GzipSpool:
    """A gzip stream's decompressed bytes, made on demand into a temporary file and read by offset;
    safe for several threads (one decompresses at a time; reads of bytes already there do not wait)."""

    def __init__(self, file: BinaryIO, shard: str) -> None:
        self.shard = shard
        self._gz = gzip.GzipFile(fileobj=file, mode="rb")
        self._tmp = tempfile.TemporaryFile(prefix="fastload-tfrecord-")  # noqa: SIM115 (closed by close())
        self._fd = self._tmp.fileno()
        self._have = 0
        self._eof = False
        self._lock = threading.Lock()

    def read(self, offset: int, size: int) -> bytes:
        end = offset + size
        if end > self._have and not self._eof:
            with self._lock:
                self._fill(end)
        data = os.pread(self._fd, size, offset) if size else b""
        if len(data) != size:
            raise VerifyError(
                f"the decompressed shard is {self._have} bytes, shorter than its index says (wanted {size} "
                f"bytes at decompressed offset {offset}); it was truncated or replaced: re-download it or "
                "re-run `fastload index`",
                shard=self.shard,
                offset=offset,
            )
        return data

    def _fill(self, end: int) -> None:
        while self._have < end and not self._eof:
            try:
                chunk = self._gz.read(_SPOOL_CHUNK)
            except GZIP_ERRORS as exc:
                raise VerifyError(
                    f"the gzip stream is corrupt or truncated ({exc}) after {self._have} decompressed bytes; "
                    "re-download or re-create the shard",
                    shard=self.shard,
                ) from None
            if not chunk:
                self._eof = True
                break
            view = memoryview(chunk)
            while view:
                n = os.pwrite(self._fd, view, self._have)
                self._have += n
                view = view[n:]

    def close(self) -> None:
        self._tmp.close()


class TFRecordSamples:
    """Samples of one indexed TFRecord shard, read as runs of consecutive records: one read per run of
    ``read(offset, size)`` (plain shards) or of the decompressed spool (gzip shards)."""

    def __init__(self, entry: ShardEntry, *, read: Callable[[int, int], bytes], file: BinaryIO) -> None:
        self.entry = entry
        self.name = entry.name
        self._spool = GzipSpool(file, entry.name) if is_gzip_name(entry.name) else None
        self._read = self._spool.read if self._spool is not None else read
        self._direct = True
        self._keys: list[str] | None = None

    def _key_list(self) -> list[str]:
        """The entry's keys as a list (what the C reader takes; a v2 table's keys are decoded lazily)."""
        if self._keys is None:
            keys = self.entry.keys
            self._keys = keys if isinstance(keys, list) else list(keys)
        return self._keys

    def close(self) -> None:
        if self._spool is not None:
            self._spool.close()

    def read_samples(self, positions: Sequence[int]) -> Iterator[list[RawSample]]:
        """The samples at index ``positions``, in that order, one list per run of consecutive records."""
        for first, stop in runs(positions):
            yield self.read_run(first, stop)

    def read_run(self, first: int, stop: int) -> list[RawSample]:
        """Records ``first..stop-1`` with one read of their byte range."""
        entry = self.entry
        if not entry.offsets or stop > len(entry.offsets):
            raise VerifyError(
                f"records {first}..{stop - 1} are not in the index's offsets; re-run `fastload index`",
                shard=self.name,
            )
        offset = entry.offsets[first]
        end = entry.offsets[stop - 1] + entry.sizes[stop - 1]
        try:
            data = self._read(offset, end - offset)
        except VerifyError:
            if self._spool is None:  # (a gzip shard's error already says what is wrong with its stream)
                self._find_short_record(first, stop)
            raise

        if type(data) is not bytes:
            data = bytes(data)
        samples: list[RawSample] = []
        for at, payload in iter_records(data, shard=self.name, first=first, base=offset):
            record = first + len(samples)
            start = at - offset + HEADER_BYTES
            sample = fast_sample(data, start, start + len(payload), shard=self.name, record=record)
            if sample is None:
                sample = to_sample(payload, shard=self.name, record=record, offset=at)
            samples.append(sample)
        keys = entry.keys[first:stop]
        got = [s["__key__"] for s in samples]
        if got != keys:
            bad = next((i for i, (a, b) in enumerate(zip(got, keys, strict=False)) if a != b), len(got))
            raise VerifyError(
                f"the records at index positions {first}..{stop - 1} are not the ones the index lists "
                f"(record {first + bad}: {got[bad] if bad < len(got) else None!r}, index says "
                f"{keys[bad] if bad < len(keys) else None!r}); run `fastload verify`",
                shard=self.name,
                key=keys[bad] if bad < len(keys) else None,
                offset=offset,
            )
        for i, s in enumerate(samples):
            s["__index__"] = first + i
        return samples

    @property
    def direct(self) -> bool:
        """Whether :meth:`direct_run` may read this shard (a plain one whose records have, so far, all had
        the common shape)."""
        return self._spool is None and self._direct

    def direct_run(self, fd: int, first: int, stop: int) -> Iterator[RawSample]:
        """Records ``first..stop-1`` of a plain local shard (open as ``fd``), one by one, each value read
        once: a record of at least ``DIRECT_RECORD_BYTES`` as a small read of its head (which also holds the
        end of the record before), then each value that the head does not hold read straight into its own
        ``bytes`` (the payload's CRC is computed over the pieces in turn); smaller records several at a
        time. Both CRCs and each key are checked as :meth:`read_run` does; at the first record that is
        damaged, that is not where the index says, or whose Example does not have the common shape, the
        rest of the run goes through :meth:`read_run`, which reads it or names the problem (and this shard
        is read that way from then on). The C reader (``fastload/_native.c``), where built, does the same a
        batch of records per call."""
        entry = self.entry
        if not entry.offsets or stop > len(entry.offsets):
            yield from self.read_run(first, stop)  # (which raises)
            return
        tfrecord_run = native.tfrecord_run
        if tfrecord_run is not None:
            stem = shard_stem(self.name)
            i = first
            while i < stop:
                args = (fd, entry.offsets, entry.sizes, self._key_list(), stem, i, stop, NATIVE_BATCH_BYTES)
                samples, i, whole = tfrecord_run(*args)
                yield from samples
                if not whole:
                    self._direct = False
                    yield from self.read_run(i, stop)
                    return
            return
        offsets, sizes = entry.offsets, entry.sizes
        run_end = offsets[stop - 1] + sizes[stop - 1]
        buf, b0 = b"", 0  # buf holds the shard's bytes [b0, b0 + len(buf))
        for i in range(first, stop):
            at, size = offsets[i], sizes[i]
            if size >= DIRECT_RECORD_BYTES:
                sample, buf, b0 = self._big_record(fd, i, buf, b0, run_end)
            else:
                if not (b0 <= at and at + size <= b0 + len(buf)):
                    j, limit = i + 1, at + SMALL_READ_BYTES
                    while j < stop and sizes[j] < DIRECT_RECORD_BYTES and offsets[j] + sizes[j] <= limit:
                        j += 1
                    end = min(offsets[j - 1] + sizes[j - 1] + HEAD_READ_BYTES, run_end)
                    buf, b0 = os.pread(fd, end - at, at), at
                sample = self._small_record(buf, at - b0, i) if at + size <= b0 + len(buf) else None
            if sample is None:
                self._direct = False
                yield from self.read_run(i, stop)
                return
            yield sample

    def _small_record(self, buf: bytes, pos: int, i: int) -> RawSample | None:
        """Record ``i``, whole in ``buf`` at ``pos``, as a sample; None if anything is not as expected."""
        size = self.entry.sizes[i]
        length = header_length(buf, pos)
        if length is None or length + OVERHEAD_BYTES != size:
            return None
        start = pos + HEADER_BYTES
        end = start + length
        if not footer_matches(buf, end, record_crc(memoryview(buf)[start:end])):
            return None
        sample = fast_sample(buf, start, end, shard=self.name, record=i)
        if sample is None or sample["__key__"] != self.entry.keys[i]:
            return None
        sample["__index__"] = i
        return sample

    def _big_record(
        self, fd: int, i: int, buf: bytes, b0: int, run_end: int
    ) -> tuple[RawSample | None, bytes, int]:
        """Record ``i`` read piece by piece, ``buf`` holding the shard's bytes ``[b0, b0 + len(buf))`` (read
        on from a position when what is needed there is not in it); the sample (None if anything is not as
        expected) and the buffer after it. Positions are the shard's; the payload's CRC covers
        ``[start, crc_at)``."""
        at, size = self.entry.offsets[i], self.entry.sizes[i]
        pread = os.pread
        if not (b0 <= at and at + _HEAD_MIN_BYTES <= b0 + len(buf)):  # (entries cut off are read on below)
            buf, b0 = pread(fd, min(HEAD_READ_BYTES, run_end - at), at), at
        length = header_length(buf, at - b0)
        if length is None or length + OVERHEAD_BYTES != size:
            return None, buf, b0
        start = at + HEADER_BYTES
        end = start + length
        pos = example_start(buf, start - b0, end - b0)
        if pos is None:
            return None, buf, b0
        pos += b0
        crc, crc_at = 0, start
        key: str | None = None
        sample: RawSample = {"__key__": None}
        while pos < end:
            found = simple_entry(buf, pos - b0, end - b0)
            if found is None and b0 + len(buf) < run_end:  # perhaps the entry's head is cut off: read on
                crc = crc_update(memoryview(buf)[crc_at - b0 : pos - b0], crc)
                buf, b0, crc_at = pread(fd, min(HEAD_READ_BYTES, run_end - pos), pos), pos, pos
                found = simple_entry(buf, 0, end - pos)
            if found is None:
                return None, buf, b0
            name, a, b = found
            a, b = a + b0, b + b0
            if b <= b0 + len(buf):
                value = buf[a - b0 : b - b0]
            else:
                crc = crc_update(memoryview(buf)[crc_at - b0 : a - b0], crc)
                value = pread(fd, b - a, a)
                if len(value) != b - a:
                    return None, buf, b0
                crc = crc_update(value, crc)
                buf, b0, crc_at = b"", b, b
            if name == KEY_FEATURE:
                try:
                    key = str(value, "utf-8")
                except UnicodeDecodeError:
                    return None, buf, b0
            else:
                sample[name] = value
            pos = b
        crc = crc_update(memoryview(buf)[crc_at - b0 : end - b0], crc)
        if end + FOOTER_BYTES > b0 + len(buf):  # the footer and the next record's head
            buf, b0 = pread(fd, min(HEAD_READ_BYTES, run_end - end), end), end
        if not footer_matches(buf, end - b0, crc):
            return None, buf, b0
        if key is None:
            key = derived_key(self.name, i)
        if key != self.entry.keys[i]:
            return None, buf, b0
        sample["__key__"] = key
        sample["__index__"] = i
        return sample, buf, b0

    def _find_short_record(self, first: int, stop: int) -> None:
        """After a run's read came up short: raise for the first of its records the shard cuts off."""
        for record in range(first, stop):
            offset, size = self.entry.offsets[record], self.entry.sizes[record]
            try:
                self._read(offset, size)
            except VerifyError:
                raise VerifyError(
                    f"record {record} ({size} bytes) is truncated: the shard ends before the end of it "
                    "(it was truncated or replaced); re-download or re-create the shard",
                    shard=self.name,
                    key=self.entry.keys[record],
                    offset=offset,
                ) from None


# -- whole-file scans ---------------------------------------------------------------------------------------


_SCAN_PIECE = 16 << 20


def _read_upto(f: Any, n: int) -> bytes:
    """Up to ``n`` bytes of ``f`` (fewer at its end), read at most ``_SCAN_PIECE`` at a time: a damaged
    record length (up to 2**64 - 1, its CRC right) then ends at the end of the file as a truncation, not as
    one huge read (``OverflowError``/``MemoryError``)."""
    data = f.read(min(n, _SCAN_PIECE))
    if len(data) == n or not data:
        return bytes(data)
    parts = [data]
    got = len(data)
    while got < n:
        more = f.read(min(n - got, _SCAN_PIECE))
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def iter_stream(f: Any, *, shard: str) -> Iterator[tuple[int, int, memoryview]]:
    """``(record, offset, payload)`` of every record read front to back from ``f``, both CRCs checked;
    :class:`VerifyError` naming the record and byte offset at the first bad or truncated one."""
    pos = record = 0
    while True:
        head = _read_upto(f, HEADER_BYTES)
        if not head:
            return
        if len(head) < HEADER_BYTES:
            raise truncated(shard, record, pos, len(head), HEADER_BYTES, where="the file")
        length = parse_header(head, shard=shard, record=record, offset=pos)
        rest = _read_upto(f, length + 4)
        if len(rest) < length + 4:
            raise truncated(
                shard, record, pos, HEADER_BYTES + len(rest), record_size(length), where="the file"
            )
        payload = memoryview(rest)[:length]
        check_footer(
            rest[length:], record_crc(payload), shard=shard, record=record, offset=pos, length=length
        )
        yield record, pos, payload
        pos += record_size(length)
        record += 1


@dataclass
class ShardScan:
    """What a front-to-back read of a TFRecord shard found (offsets in the decompressed stream for gzip)."""

    offsets: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    fields: list[str] = field(default_factory=list)
    payload_bytes: int = 0
    problem: VerifyError | None = None  # the first bad record, gzip or Example error: the scan stopped there


def scan(raw: ChecksumReader, name: str) -> ShardScan:
    """Read a whole shard through ``raw`` (which sees every stored byte, for the file's CRC32C)."""
    out = ShardScan()
    seen: set[str] = set()
    stream: Any = gzip.GzipFile(fileobj=raw, mode="rb") if is_gzip_name(name) else raw  # type: ignore[call-overload]
    try:
        for record, offset, payload in iter_stream(stream, shard=name):
            try:
                key, names = example_key(payload)
            except ExampleFormatError as exc:
                raise not_an_example(name, record, offset, exc) from None
            out.offsets.append(offset)
            out.sizes.append(record_size(len(payload)))
            out.keys.append(derived_key(name, record) if key is None else key)
            out.payload_bytes += len(payload)
            for n in names:
                if n not in seen:
                    seen.add(n)
                    out.fields.append(n)
    except VerifyError as exc:
        out.problem = exc
    except GZIP_ERRORS as exc:
        out.problem = VerifyError(
            f"the gzip stream is corrupt or truncated ({exc}) after record {len(out.keys) - 1}; "
            "re-download or re-create the shard",
            shard=name,
        )
    return out


def check_against_index(raw: ChecksumReader, shard: ShardEntry) -> list[VerifyError]:
    """``fastload verify`` for one TFRecord shard: every record's two CRCs, its Example, the record count,
    and each record's byte range and key against the index (the caller checks size and CRC32C)."""
    found = scan(raw, shard.name)
    problems = [found.problem] if found.problem is not None else []
    n = len(found.keys)
    for i in range(min(n, shard.samples)):
        span, want = (found.offsets[i], found.sizes[i]), (shard.offsets[i], shard.sizes[i])
        if span != want or found.keys[i] != shard.keys[i]:
            problems.append(
                VerifyError(
                    f"record {i} spans bytes {span[0]}+{span[1]} with key {found.keys[i]!r}; the index says "
                    f"{want[0]}+{want[1]} with key {shard.keys[i]!r}: re-run `fastload index` or re-pack",
                    shard=shard.name,
                    key=shard.keys[i],
                    offset=span[0],
                )
            )
            break
    if found.problem is None and n != shard.samples:
        problems.append(
            VerifyError(
                f"holds {n} records, index says {shard.samples}",
                shard=shard.name,
                key=shard.keys[n] if n < shard.samples else None,
            )
        )
    return problems


def lint_tfrecord(url: str, s3_config: S3Config | None) -> tuple[list[VerifyError], int, int]:
    """``fastload verify`` of a TFRecord file without an index: its problems, records and stored bytes."""
    name = url.rsplit("/", 1)[-1]
    with storage.open_read(url, config=s3_config) as f:
        reader = ChecksumReader(f)
        found = scan(reader, name)
        reader.drain()
    return ([found.problem] if found.problem is not None else []), len(found.keys), reader.pos
