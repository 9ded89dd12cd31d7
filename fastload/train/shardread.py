"""Reading samples out of shards: runs of consecutive samples of a tar shard with one ranged read each
(offsets from the index), Parquet rows by row group, TFRecord records
(:mod:`fastload.formats.tfrecord.reader`), and whole tar shards without an index."""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

from fastload.config import S3Config
from fastload.core.index import ShardEntry
from fastload.core.keys import KeyRuleError, split_key
from fastload.core.readplan import ReadTask, runs
from fastload.errors import VerifyError
from fastload.formats import native
from fastload.formats.tar.header import BLOCK, TarFormatError, is_header_of, padded, parse_block, parse_pax
from fastload.formats.tfrecord.codec import is_tfrecord_name
from fastload.formats.tfrecord.reader import TFRecordSamples
from fastload.storage import access as storage

if TYPE_CHECKING:
    from fastload.storage.cache import ShardCache

RawSample = dict[str, Any]
LOCAL_READ_BYTES = 256 << 10
# a local sample at least this big has each member read into its own bytes; smaller ones are read together
DIRECT_MEMBER_BYTES = 16 << 10
# the C reader's batches: one preadv of about this many bytes, then their samples one by one
NATIVE_BATCH_BYTES = 1 << 20


def parse_tar_fragment(
    data: bytes | memoryview, *, shard: str, base: int = 0
) -> Iterator[tuple[str, str, bytes]]:
    """``(key, field, bytes)`` for each regular member in a tar fragment (one or more whole samples)."""
    view = memoryview(data)
    pos = 0
    path: bytes | None = None
    while pos + BLOCK <= len(view):
        try:
            parsed = parse_block(bytes(view[pos : pos + BLOCK]))
        except TarFormatError as exc:
            raise VerifyError(
                f"corrupt tar header ({exc}); run `fastload verify`", shard=shard, offset=base + pos
            ) from None
        if parsed is None:
            return
        name, size, typeflag = parsed
        start = pos + BLOCK
        end = start + size
        if end > len(view):
            raise VerifyError(
                "member runs past the end of the sample's byte range; the index does not match "
                "the shard: run `fastload verify`",
                shard=shard,
                offset=base + pos,
            )
        if typeflag == b"x":
            path = parse_pax(bytes(view[start:end])).get("path", path)
        elif typeflag in (b"0", b"\0"):
            member = (path or name).decode("utf-8", "surrogateescape")
            path = None
            try:
                key, field_name = split_key(member)
            except KeyRuleError as exc:
                raise VerifyError(f"member {member!r}: {exc}", shard=shard, offset=base + pos) from None
            yield key, field_name, bytes(view[start:end])
        pos = start + padded(size)


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


def samples_of_run(
    data: bytes, keys: Sequence[str], *, first: int, shard: str, base: int = 0
) -> list[RawSample]:
    """The samples of a tar fragment holding exactly the samples ``keys`` (index positions ``first``...),
    as dicts with ``__key__``, ``__index__`` and one bytes value per field.

    The fast path of :func:`parse_tar_fragment` + :func:`group_members` for indexed shards: members are
    matched to the index's keys as they come (a member named ``KEY.FIELD`` with no ``/`` in ``FIELD``), so
    the key rule need not be re-derived per member; header checksums are still verified. Anything else
    (pax headers, other member types, a mismatch) goes through the general parser, which names the problem.
    """
    n = len(data)
    samples: list[RawSample] = []
    k = -1
    prefix = ""
    current: RawSample = {}
    pos = 0
    while pos + BLOCK <= n:
        header = data[pos : pos + BLOCK]
        if header[156] not in _REGULAR or header[257:262] != b"ustar" or header[345] != 0:
            return _general(data, keys, first=first, shard=shard, base=base)
        checksum = header[148:156]
        if sum(header) - sum(checksum) + 256 != int(checksum.rstrip(b"\0 ") or b"0", 8):
            return _general(data, keys, first=first, shard=shard, base=base)
        size = int(header[124:136].rstrip(b"\0 ") or b"0", 8)
        start = pos + BLOCK
        pos = start + ((size + BLOCK - 1) & ~(BLOCK - 1))
        if start + size > n:
            return _general(data, keys, first=first, shard=shard, base=base)
        name = header[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        if k < 0 or not name.startswith(prefix):
            k += 1
            if k >= len(keys):
                return _general(data, keys, first=first, shard=shard, base=base)
            prefix = keys[k] + "."
            if not name.startswith(prefix):
                return _general(data, keys, first=first, shard=shard, base=base)
            current = {"__key__": keys[k], "__index__": first + k}
            samples.append(current)
        field = name[len(prefix) :]
        if not field or "/" in field:
            return _general(data, keys, first=first, shard=shard, base=base)
        current[field] = data[start : start + size]
    if len(samples) != len(keys) or pos != n:
        return _general(data, keys, first=first, shard=shard, base=base)
    return samples


_REGULAR = frozenset(b"0\0")


def _general(data: bytes, keys: Sequence[str], *, first: int, shard: str, base: int) -> list[RawSample]:
    """The general parser over a fragment: handles every header kind, or raises with the exact problem."""
    samples = list(group_members(parse_tar_fragment(data, shard=shard, base=base)))
    if [s["__key__"] for s in samples] != list(keys):
        raise VerifyError(
            f"samples at index positions {first}..{first + len(keys) - 1} are not the keys the index "
            "lists; run `fastload verify`",
            shard=shard,
            key=keys[0] if keys else None,
            offset=base,
        )
    for i, s in enumerate(samples):
        s["__index__"] = first + i
    return samples


def _slice_by_layout(data: bytes, entry: ShardEntry, first: int, stop: int) -> list[RawSample] | None:
    """Samples ``first..stop-1`` cut out of ``data`` (their bytes, from sample ``first``'s offset) using the
    index's member layout, each member's header checked against it (:func:`is_header_of`); None at the
    first header that does not match (the caller's general parser then names the problem)."""
    keys, rows, fields = entry.keys, entry.member_sizes, entry.member_fields
    base = entry.offsets[first]
    out: list[RawSample] = []
    for i in range(first, stop):
        key = keys[i]
        sample: RawSample = {"__key__": key, "__index__": i}
        pos = entry.offsets[i] - base
        for field_name, size in zip(fields, rows[i], strict=True):
            if not is_header_of(data, pos, f"{key}.{field_name}".encode(), size) or pos + BLOCK + size > len(
                data
            ):
                return None
            pos += BLOCK
            sample[field_name] = data[pos : pos + size]
            pos += (size + BLOCK - 1) & ~(BLOCK - 1)
        out.append(sample)
    return out


def _shorter(shard: str, size: int, offset: int, key: str | None = None) -> VerifyError:
    return VerifyError(
        f"shard is shorter than its index says (wanted {size} bytes at {offset}); "
        "it was truncated or replaced: re-download or re-pack it",
        shard=shard,
        key=key,
        offset=offset,
    )


class ShardReader:
    """Random access to one shard's samples (local file or S3 object); open it, read runs, close it."""

    def __init__(
        self,
        url: str,
        entry: ShardEntry | None,
        *,
        config: S3Config | None = None,
        file: BinaryIO | None = None,
    ) -> None:
        """``file``: the shard already open (a local file, e.g. from the cache); the reader closes it."""
        self.url = url
        self.entry = entry
        self.name = entry.name if entry is not None else url.rsplit("/", 1)[-1]
        self._file: BinaryIO = file if file is not None else storage.open_read(url, config=config)
        self._fd = self._file.fileno() if file is not None or not storage.is_remote(url) else None
        self._seek_lock = threading.Lock()  # for readers that go through the file position (Parquet)
        self._tfrecord: TFRecordSamples | None = None
        if entry is not None and is_tfrecord_name(self.name):
            self._tfrecord = TFRecordSamples(entry, read=self._read, file=self._file)

    def close(self) -> None:
        if self._tfrecord is not None:
            self._tfrecord.close()
        self._file.close()

    def _read(self, offset: int, size: int) -> bytes:
        """Exactly ``size`` bytes at ``offset``; safe to call from several threads at once."""
        if self._fd is not None:
            data = os.pread(self._fd, size, offset)
        else:
            fetch_range = getattr(self._file, "fetch_range", None)
            if fetch_range is not None:
                data = fetch_range(offset, offset + size)
            else:
                with self._seek_lock:
                    self._file.seek(offset)
                    data = self._file.read(size)
        if len(data) != size:
            raise _shorter(self.name, size, offset)
        return data

    def read_samples(
        self, positions: Sequence[int], columns: Sequence[str] | None = None
    ) -> Iterator[list[RawSample]]:
        """The samples at index ``positions`` of this shard, in that order, as lists (one per read).
        Dispatches on the shard's format; ``columns`` projects Parquet fields."""
        if self.name.endswith(".parquet"):
            yield self.read_rows(positions, columns)
            return
        if self._tfrecord is not None:
            yield from self._tfrecord.read_samples(positions)
            return
        for first, stop in runs(positions):
            yield self.read_run(first, stop)

    def load(
        self, positions: Sequence[int], columns: Sequence[str] | None = None, *, defer: bool = False
    ) -> Callable[[], Iterable[RawSample]]:
        """Do the I/O for the samples at ``positions`` now and return a function that makes them into
        samples. For tar shards that second step (parsing, pure Python) is left to the caller's thread, so
        prefetch threads spend their time in I/O that releases the GIL instead of competing for it.
        ``defer``: the caller calls the function at once, in its own thread (no prefetch), so local
        shards with a member layout may do their I/O there too (:meth:`_direct_run`), and so may plain
        local TFRecord shards (:meth:`TFRecordSamples.direct_run`)."""
        tfr, fd = self._tfrecord, self._fd
        if defer and tfr is not None and fd is not None and tfr.direct:
            spans = runs(positions)
            return lambda: (s for first, stop in spans for s in tfr.direct_run(fd, first, stop))
        if self.name.endswith(".parquet") or self._tfrecord is not None:
            samples = [s for chunk in self.read_samples(positions, columns) for s in chunk]
            return lambda: samples
        if defer and self._fd is not None and self.entry is not None and self.entry.member_fields:
            spans = runs(positions)
            return lambda: (s for first, stop in spans for s in self._direct_run(first, stop))
        pieces = [
            self._read_piece(a, b) for first, stop in runs(positions) for a, b in self._pieces(first, stop)
        ]
        return lambda: [s for piece in pieces for s in self._parse_piece(*piece)]

    def read_run(self, first: int, stop: int) -> list[RawSample]:
        """Samples ``first..stop-1`` of a tar shard, read and parsed now."""
        return [s for a, b in self._pieces(first, stop) for s in self._parse_piece(*self._read_piece(a, b))]

    def _pieces(self, first: int, stop: int) -> list[tuple[int, int]]:
        """Samples ``first..stop-1`` as reads: one from S3; from a local file, reads of whole samples of at
        most ``LOCAL_READ_BYTES`` each (small buffers are recycled by the allocator and stay in cache; a
        fresh multi-MiB buffer per read costs a page fault per 4 KiB)."""
        entry = self.entry
        assert entry is not None and entry.offsets
        if self._fd is None:
            return [(first, stop)]
        out: list[tuple[int, int]] = []
        a = first
        while a < stop:
            limit = entry.offsets[a] + LOCAL_READ_BYTES
            b = a + 1
            while b < stop and entry.offsets[b] + entry.sizes[b] <= limit:
                b += 1
            out.append((a, b))
            a = b
        return out

    def _read_piece(self, first: int, stop: int) -> tuple[int, int, int, bytes]:
        entry = self.entry
        assert entry is not None and entry.offsets
        offset = entry.offsets[first]
        end = entry.offsets[stop - 1] + entry.sizes[stop - 1]
        return first, stop, offset, self._read(offset, end - offset)

    def _parse_piece(self, first: int, stop: int, offset: int, data: bytes) -> list[RawSample]:
        entry = self.entry
        assert entry is not None
        if entry.member_fields:
            samples = _slice_by_layout(data, entry, first, stop)
            if samples is not None:
                return samples
        samples = samples_of_run(data, entry.keys[first:stop], first=first, shard=self.name, base=offset)
        if entry.member_fields:  # well-formed, but does it hold what the index says?
            for sample in samples:
                i = sample["__index__"]
                found = [(k, len(v)) for k, v in sample.items() if not k.startswith("__")]
                if found != list(zip(entry.member_fields, entry.member_sizes[i], strict=True)):
                    raise VerifyError(
                        f"the shard's members of this sample ({found}) are not the fields and sizes the "
                        "index lists; the shard was changed after packing: run `fastload verify`",
                        shard=self.name,
                        key=entry.keys[i],
                        offset=entry.offsets[i],
                    )
        return samples

    def _direct_run(self, first: int, stop: int) -> Iterator[RawSample]:
        """Samples ``first..stop-1`` of a local tar shard whose index has the member layout, read with no
        header parsing: each member's header is checked against the index (:func:`is_header_of`), small
        members are cut from one read of the headers around them, and each big member's bytes are read
        straight into its own ``bytes`` (one copy, like ``cat``); small samples are read several at a time.
        At the first header that does not match, the rest of the run goes through the parsing reader,
        which names the problem."""
        entry = self.entry
        fd = self._fd
        assert entry is not None and fd is not None
        layout_run = native.layout_run
        if layout_run is not None:  # the same, in C (fastload/_native.c), a batch of samples per call
            dots = [b"." + f.encode() for f in entry.member_fields]
            i = first
            while i < stop:
                samples, i, whole = layout_run(
                    fd,
                    entry.offsets,
                    entry.keys,
                    entry.member_sizes,
                    entry.member_fields,
                    dots,
                    i,
                    stop,
                    NATIVE_BATCH_BYTES,
                )
                yield from samples
                if not whole:
                    yield from self.read_run(i, stop)
                    return
            return
        keys, offsets, sizes, rows = entry.keys, entry.offsets, entry.sizes, entry.member_sizes
        fields = entry.member_fields
        pread = os.pread
        run_end = offsets[stop - 1] + sizes[stop - 1]
        buf, b0, b1 = b"", 0, 0
        for i in range(first, stop):
            key = keys[i]
            sample: RawSample = {"__key__": key, "__index__": i}
            pos = offsets[i]
            if sizes[i] < DIRECT_MEMBER_BYTES and not (b0 <= pos and pos + sizes[i] <= b1):
                buf = pread(fd, min(LOCAL_READ_BYTES, run_end - pos), pos)
                b0, b1 = pos, pos + len(buf)
            row = rows[i]
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
                if not is_header_of(buf, pos - b0, f"{key}.{field_name}".encode(), size):
                    yield from self.read_run(i, stop)
                    return
                pos += BLOCK
                if pos + size <= b1:
                    value = buf[pos - b0 : pos - b0 + size]
                else:
                    value = pread(fd, size, pos)
                    if len(value) != size:
                        raise _shorter(self.name, size, pos, key)
                sample[field_name] = value
                pos += (size + BLOCK - 1) & ~(BLOCK - 1)
            yield sample

    def read_rows(self, positions: Sequence[int], columns: Sequence[str] | None) -> list[RawSample]:
        """Rows of a Parquet shard (whole row groups are read, then the wanted rows picked)."""
        with self._seek_lock:
            return self._read_rows(positions, columns)

    def _read_rows(self, positions: Sequence[int], columns: Sequence[str] | None) -> list[RawSample]:
        import pyarrow.parquet as pq

        entry = self.entry
        assert entry is not None
        self._file.seek(0)
        parquet = pq.ParquetFile(self._file)
        starts = [0]
        for rg in entry.row_groups:
            starts.append(starts[-1] + rg[2])
        wanted_set = set(positions)
        wanted = sorted(wanted_set)
        cols = None if columns is None else ["__key__", *[c for c in columns if c != "__key__"]]
        rows: dict[int, RawSample] = {}
        g = 0
        for p in wanted:
            while starts[g + 1] <= p:
                g += 1
            if p in rows:
                continue
            table = parquet.read_row_group(g, columns=cols).to_pydict()
            names = list(table)
            for r in range(len(table["__key__"])):
                pos = starts[g] + r
                if pos in wanted_set:
                    sample: RawSample = {n: table[n][r] for n in names if table[n][r] is not None}
                    sample["__index__"] = pos
                    rows[pos] = sample
        return [rows[p] for p in positions]


class ShardReaders:
    """The readers a list of read tasks needs: each shard opened on first use (from the local cache when
    there is one and the shard is remote), shared by the threads reading it, and closed after its last task.
    Use as the ``fetch``/``release`` pair of a :class:`~fastload.train.prefetch.Prefetcher`."""

    def __init__(
        self,
        root: str,
        shards: Sequence[ShardEntry],
        tasks: Sequence[ReadTask],
        *,
        columns: Sequence[str] | None = None,
        config: S3Config | None = None,
        cache: ShardCache | None = None,
        defer: bool = False,
    ) -> None:
        """``defer``: each fetch's result is used at once in the fetching thread (no prefetch), so local
        reads may be done there (see :meth:`ShardReader.load`)."""
        self.root, self.shards, self.columns = root, shards, columns
        self.config, self.cache, self.defer = config, cache, defer
        self._left = Counter(t.shard for t in tasks)
        self._open: dict[int, ShardReader] = {}
        self._opening: dict[int, threading.Lock] = {}
        self._lock = threading.Lock()
        self._closed = False

    def fetch(self, task: ReadTask, stop: threading.Event | None = None) -> Callable[[], Iterable[RawSample]]:
        """Do the I/O of ``task``; the returned function gives its samples, in its order."""
        return self._reader(task.shard, stop).load(task.positions, self.columns, defer=self.defer)

    def release(self, task: ReadTask) -> None:
        with self._lock:
            self._left[task.shard] -= 1
            reader = self._open.pop(task.shard) if self._left[task.shard] <= 0 else None
        if reader is not None:
            reader.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            readers, self._open = list(self._open.values()), {}
        for reader in readers:
            reader.close()

    def _reader(self, shard: int, stop: threading.Event | None = None) -> ShardReader:
        with self._lock:
            reader = self._open.get(shard)
            if reader is not None:
                return reader
            opening = self._opening.setdefault(shard, threading.Lock())
        with opening:
            with self._lock:
                reader = self._open.get(shard)
            if reader is not None:
                return reader
            entry = self.shards[shard]
            url = storage.join(self.root, entry.name)
            cached = None
            if self.cache is not None and storage.is_remote(url) and self.cache.cacheable(entry):
                cached = self.cache.open(url, entry, stop=stop)
            reader = ShardReader(url, entry, config=self.config, file=cached)
            with self._lock:
                if self._closed:
                    reader.close()
                    raise RuntimeError("shard readers closed")
                self._open[shard] = reader
            return reader
