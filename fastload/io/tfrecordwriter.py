"""Writing one TFRecord shard: one ``tf.train.Example`` record per sample (a ``__key__`` bytes feature, then
one single-value bytes feature per field holding the file's bytes), files copied once into the output
buffer, record and shard CRCs computed on the fly."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from typing import BinaryIO

from crc32c import crc32c

from fastload.core.index import ShardEntry
from fastload.core.keys import Sample
from fastload.core.tfrecord import record_footer, record_header, record_size, sample_layout
from fastload.errors import Skip
from fastload.io.inputs import Input, Member, close_all, open_ahead, read_exactly, read_problem
from fastload.io.tarwriter import DEFAULT_BUFFER_BYTES, ShardOutput, ShardResult


def sample_record_size(key: str, field_sizes: Sequence[tuple[str, int]]) -> int:
    """Bytes of the record that holds a sample with these ``(field, size)`` members (exact)."""
    return record_size(sample_layout(key, field_sizes)[0])


def _copy_value(out: ShardOutput, f: BinaryIO, size: int, crc: int) -> int:
    """Copy ``size`` bytes of ``f`` into ``out``; return the payload CRC32C continued over them."""
    left = size
    while left:
        chunk = min(left, len(out.buf))
        room = out.reserve(chunk)
        read_exactly(f, room)
        crc = crc32c(room, crc)
        left -= chunk
    return crc


def _write_record(out: ShardOutput, key: str, members: Sequence[Member]) -> Skip | None:
    """Append one sample's record; on a read error return which input failed (the caller rolls back)."""
    length, lead, prefixes = sample_layout(key, [(m.field, m.size) for m in members])
    out.write(record_header(length))
    out.write(lead)
    crc = crc32c(lead)
    for prefix, m in zip(prefixes, members, strict=True):
        out.write(prefix)
        try:
            crc = _copy_value(out, m.file, m.size, crc32c(prefix, crc))
        except OSError as exc:
            return Skip(m.item.shown, read_problem(exc))
    out.write(record_footer(crc))
    return None


def write_tfrecord_shard(
    name: str,
    samples: Sequence[Sample[Input]],
    tmp_path: str,
    *,
    buffer_bytes: int = DEFAULT_BUFFER_BYTES,
    fsync: bool = False,
    open_threads: int = 0,
    window_bytes: int = 64 << 20,
    on_sample: Callable[[int, int], None] | None = None,
) -> ShardResult:
    """Write ``samples`` as a TFRecord shard at ``tmp_path``; return its index entry (named ``name``).

    As for tar shards: a sample whose file cannot be opened, or shrinks while being read, is rolled back
    out of the shard and reported in ``skipped``; ``on_sample(payload_bytes, files)`` follows each sample.
    """
    result = ShardResult(ShardEntry(name=name, bytes=0, checksum="", keys=[]))
    entry = result.entry
    fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        out = ShardOutput(fd, buffer_bytes)
        for sample, members, failed in open_ahead(samples, threads=open_threads, window_bytes=window_bytes):
            start, crc = out.position, out.crc
            try:
                if failed is None:
                    failed = _write_record(out, sample.key, members)
            finally:
                close_all(members)
            if failed is not None:
                out.rewind(start, crc)
                result.skipped.append(
                    Skip(failed.path, f"{failed.reason}; sample {sample.key!r} left out of {name}")
                )
                continue
            entry.keys.append(sample.key)
            entry.offsets.append(start)
            entry.sizes.append(out.position - start)
            nbytes = sum(m.size for m in members)
            result.payload_bytes += nbytes
            result.files += len(members)
            if on_sample is not None:
                on_sample(nbytes, len(members))
        out.flush()
        if fsync:
            os.fsync(fd)
        entry.bytes = out.position
        entry.checksum = f"{out.crc:08x}"
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp_path)
        raise
    os.close(fd)
    return result
