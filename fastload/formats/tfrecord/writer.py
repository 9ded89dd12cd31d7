"""Writing one TFRecord shard: one ``tf.train.Example`` record per sample (a ``__key__`` bytes feature, then
one single-value bytes feature per field holding the file's bytes), files copied once into the output
buffer, record and shard CRCs computed on the fly."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import BinaryIO

from crc32c import crc32c

from fastload.core.keys import Sample
from fastload.errors import DestinationWriteError, Skip
from fastload.formats.shard import DEFAULT_BUFFER_BYTES, ShardOutput, ShardResult, write_shard
from fastload.formats.tfrecord.codec import record_footer, record_header, record_size, sample_layout
from fastload.storage.inputs import Input, Member, changed_while_read, read_exactly, read_problem


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
        except DestinationWriteError:
            raise  # the destination's fault: the pack stops, naming it
        except OSError as exc:
            return Skip(m.item.shown, read_problem(exc))
    changed = changed_while_read(members)
    if changed is not None:
        return changed
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
    return write_shard(
        name,
        samples,
        tmp_path,
        _write_record,
        buffer_bytes=buffer_bytes,
        fsync=fsync,
        open_threads=open_threads,
        window_bytes=window_bytes,
        on_sample=on_sample,
    )
