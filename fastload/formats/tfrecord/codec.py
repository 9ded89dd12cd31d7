"""TFRecord framing and ``tf.train.Example`` encoding/decoding, as bytes in and out (no TensorFlow).

A TFRecord file is a sequence of records, each::

    uint64 length (little-endian) | uint32 masked CRC32C of those 8 bytes | payload | uint32 masked CRC32C

The mask is TensorFlow's: ``((crc >> 15 | crc << 17) + 0xA282EAD8) mod 2**32``. A record's payload is a
serialised ``tf.train.Example``::

    Example  { Features features = 1; }
    Features { map<string, Feature> feature = 1; }
    Feature  { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }   FloatList { repeated float value = 1; }
    Int64List { repeated int64 value = 1; }

decoded here by a small protobuf wire-format reader (packed and unpacked numeric lists, unknown fields
skipped, the last duplicate map key wins, as protobuf does). A record that holds a
``tf.train.SequenceExample`` is refused rather than read without its feature lists.

Samples: fastload writes a ``__key__`` bytes feature; files without one key record ``i`` of shard
``dir/name.tfrecord`` as ``dir/name/{i:06d}`` (:func:`derived_key`).

(Over 400 lines on purpose: one wire format, encoder and decoder side by side so that each field's two
halves can be read together; the decoder's hot loop is written out inline, measured faster than helpers.)
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterator, Sequence
from typing import TypeAlias

from crc32c import crc32c

from fastload.errors import SampleChecksumError, VerifyError

HEADER_BYTES = 12
FOOTER_BYTES = 4
OVERHEAD_BYTES = HEADER_BYTES + FOOTER_BYTES
SUFFIXES = (".tfrecord", ".tfrecords", ".tfrec")
GZIP_SUFFIX = ".gz"
KEY_FEATURE = "__key__"
_MASK_DELTA = 0xA282EAD8
_GIL_RELEASE_BYTES = 4 << 20
_U32 = 0xFFFFFFFF
_U64 = (1 << 64) - 1
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")

# ``Feature`` kinds, as decoded: BytesList -> list of bytes, Int64List -> array('q'), FloatList -> array('f')
FeatureValue: TypeAlias = "list[bytes] | array[int] | array[float]"


class ExampleFormatError(ValueError):
    """A record's payload is not a well-formed ``tf.train.Example``; the message says what is wrong."""


# -- names --------------------------------------------------------------------------------------------------


def is_tfrecord_name(name: str) -> bool:
    """True for ``*.tfrecord``, ``*.tfrecords``, ``*.tfrec`` and their ``.gz`` forms."""
    base = name[: -len(GZIP_SUFFIX)] if name.endswith(GZIP_SUFFIX) else name
    return base.endswith(SUFFIXES)


def is_gzip_name(name: str) -> bool:
    return name.endswith(GZIP_SUFFIX)


def shard_stem(name: str) -> str:
    """``dir/train-0001.tfrecord.gz`` -> ``dir/train-0001``."""
    base = name[: -len(GZIP_SUFFIX)] if name.endswith(GZIP_SUFFIX) else name
    for suffix in SUFFIXES:
        if base.endswith(suffix):
            return base[: -len(suffix)]
    return base


def derived_key(shard: str, record: int) -> str:
    """The key of record ``record`` of shard ``shard`` when the record has no ``__key__`` feature."""
    return f"{shard_stem(shard)}/{record:06d}"


# -- framing ------------------------------------------------------------------------------------------------


def masked_crc(data: bytes | bytearray | memoryview, crc: int | None = None) -> int:
    """TensorFlow's masked CRC32C of ``data`` (or of a CRC32C already computed, ``crc``)."""
    c = crc32c(data) if crc is None else crc
    return (((c >> 15) | (c << 17)) + _MASK_DELTA) & _U32


def record_crc(payload: bytes | bytearray | memoryview) -> int:
    """CRC32C of a record's payload, keeping the GIL unless it is large: the crc32c package releases it from
    32 KiB, and taking it back behind a thread that is running Python can cost a whole switch interval
    (5 ms) per record when prefetch threads and the training loop share a process."""
    return crc32c(payload, gil_release_mode=1 if len(payload) >= _GIL_RELEASE_BYTES else 0)


def crc_update(data: bytes | bytearray | memoryview, crc: int) -> int:
    """The CRC32C of the bytes already covered by ``crc`` followed by ``data`` (a payload's CRC computed
    piece by piece), with :func:`record_crc`'s GIL policy."""
    return crc32c(data, crc, gil_release_mode=1 if len(data) >= _GIL_RELEASE_BYTES else 0)


def record_header(length: int) -> bytes:
    """The 12 bytes before a payload of ``length`` bytes."""
    head = _LENGTH.pack(length)
    return head + _CRC.pack(masked_crc(head))


def record_footer(payload_crc: int) -> bytes:
    """The 4 bytes after a payload whose (unmasked) CRC32C is ``payload_crc``."""
    return _CRC.pack(masked_crc(b"", payload_crc))


def frame(payload: bytes | bytearray | memoryview) -> bytes:
    """One whole record holding ``payload``."""
    return record_header(len(payload)) + bytes(payload) + record_footer(crc32c(payload))


def record_size(payload_length: int) -> int:
    return OVERHEAD_BYTES + payload_length


def header_length(buf: bytes, pos: int = 0) -> int | None:
    """The payload length in the record header at ``buf[pos:pos + 12]``; None if its CRC does not match
    or ``buf`` cuts it off (:func:`parse_header` says which, as an error)."""
    if pos + HEADER_BYTES > len(buf):
        return None
    head = buf[pos : pos + 8]
    if _CRC.unpack_from(buf, pos + 8)[0] != masked_crc(head):
        return None
    return int(_LENGTH.unpack(head)[0])


def footer_matches(buf: bytes, pos: int, payload_crc: int) -> bool:
    """True if ``buf[pos:pos + 4]`` is the footer of a payload whose CRC32C is ``payload_crc``."""
    return pos + FOOTER_BYTES <= len(buf) and _CRC.unpack_from(buf, pos)[0] == masked_crc(b"", payload_crc)


def parse_header(header: bytes | memoryview, *, shard: str, record: int, offset: int) -> int:
    """The payload length from a record's 12 header bytes; :class:`VerifyError` if its CRC is wrong."""
    (length,) = _LENGTH.unpack_from(header, 0)
    (stored,) = _CRC.unpack_from(header, 8)
    expected = masked_crc(header[:8])
    if stored != expected:
        raise SampleChecksumError(
            f"record {record}: the length field's CRC does not match (stored {stored:08x}, computed "
            f"{expected:08x}), so the record header is corrupt or this is not a TFRecord file; "
            "re-download or re-create the shard",
            shard=shard,
            key=None,
            offset=offset,
            index=record,
        )
    return int(length)


def check_footer(
    footer: bytes | memoryview, payload_crc: int, *, shard: str, record: int, offset: int, length: int
) -> None:
    """Raise :class:`VerifyError` unless ``footer`` holds the masked ``payload_crc``."""
    (stored,) = _CRC.unpack_from(footer, 0)
    expected = masked_crc(b"", payload_crc)
    if stored != expected:
        raise SampleChecksumError(
            f"record {record}: the payload's CRC does not match (stored {stored:08x}, computed "
            f"{expected:08x} over its {length} bytes), so the record's data is corrupt; re-download or "
            "re-create the shard",
            shard=shard,
            key=None,
            offset=offset,
            index=record,
        )


def truncated(shard: str, record: int, offset: int, have: int, need: int, *, where: str) -> VerifyError:
    """The error for a record that ``where`` (``"the file"``, ``"the index's byte range"``) cuts short."""
    return VerifyError(
        f"record {record} is truncated: {where} ends after {have} of its {need} bytes; "
        + (
            "re-download or re-create the shard"
            if where == "the file"
            else "the index does not match the shard: run `fastload verify`"
        ),
        shard=shard,
        offset=offset,
    )


def iter_records(
    data: bytes | bytearray | memoryview,
    *,
    shard: str,
    first: int = 0,
    base: int = 0,
    where: str = "the index's byte range",
) -> Iterator[tuple[int, memoryview]]:
    """``(offset, payload)`` of each whole record in ``data`` (records ``first``, ``first + 1``, ...
    starting at byte ``base`` of the shard), both CRCs checked."""
    view = memoryview(data)
    pos = 0
    record = first
    while pos < len(view):
        offset = base + pos
        if pos + HEADER_BYTES > len(view):
            raise truncated(shard, record, offset, len(view) - pos, HEADER_BYTES, where=where)
        length = parse_header(view[pos : pos + HEADER_BYTES], shard=shard, record=record, offset=offset)
        end = pos + HEADER_BYTES + length
        if end + FOOTER_BYTES > len(view):
            raise truncated(shard, record, offset, len(view) - pos, record_size(length), where=where)
        payload = view[pos + HEADER_BYTES : end]
        check_footer(
            view[end : end + FOOTER_BYTES],
            record_crc(payload),
            shard=shard,
            record=record,
            offset=offset,
            length=length,
        )
        yield offset, payload
        pos = end + FOOTER_BYTES
        record += 1


# -- protobuf wire format ----------------------------------------------------------------------------------


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    value &= _U64
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _varint_len(value: int) -> int:
    n = 1
    while value > 0x7F:
        value >>= 7
        n += 1
    return n


def _varint(buf: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise ExampleFormatError("a varint runs past the end of its message")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result & _U64, pos
        shift += 7
        if shift >= 70:
            raise ExampleFormatError("a varint is longer than 10 bytes")


def _fields(buf: bytes | memoryview, pos: int, end: int) -> list[tuple[int, int, int, int]]:
    """``(field number, wire type, a, b)`` of each field of a message in ``buf[pos:end]``: for varints
    ``a`` is the value, for length-delimited fields and fixed32/64 ``[a, b)`` is the value's byte range.
    (One list per message, one-byte tags and lengths read inline: this runs for every record read.)"""
    out: list[tuple[int, int, int, int]] = []
    while pos < end:
        tag = buf[pos]
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = _varint(buf, pos, end)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise ExampleFormatError("a field has number 0")
        if wire == 2:
            if pos < end and buf[pos] < 0x80:
                size = buf[pos]
                pos += 1
            else:
                size, pos = _varint(buf, pos, end)
            if pos + size > end:
                raise ExampleFormatError(f"field {number} ({size} bytes) runs past the end of its message")
            out.append((number, wire, pos, pos + size))
            pos += size
        elif wire == 0:
            value, pos = _varint(buf, pos, end)
            out.append((number, wire, value, pos))
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            if pos + size > end:
                raise ExampleFormatError(f"field {number} runs past the end of its message")
            out.append((number, wire, pos, pos + size))
            pos += size
        else:
            raise ExampleFormatError(f"field {number} has wire type {wire} (groups are not used by Example)")
    return out


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >> 63 else value


def _feature(buf: bytes | memoryview, pos: int, end: int) -> FeatureValue:
    """Decode one ``Feature`` message (the last ``kind`` set wins; none set: an empty bytes list)."""
    out: FeatureValue = []
    for number, wire, a, b in _fields(buf, pos, end):
        if wire != 2 or number not in (1, 2, 3):
            continue  # an unknown field
        if number == 1:
            out = [bytes(buf[x:y]) for n, w, x, y in _fields(buf, a, b) if n == 1 and w == 2]
        elif number == 2:
            floats: array[float] = array("f")
            for n, w, x, y in _fields(buf, a, b):
                if n != 1:
                    continue
                if w == 5:
                    floats.append(struct.unpack_from("<f", buf, x)[0])
                elif w == 2:
                    if (y - x) % 4:
                        raise ExampleFormatError("a packed float list is not a whole number of floats")
                    floats.extend(struct.unpack_from(f"<{(y - x) // 4}f", buf, x))
            out = floats
        else:
            ints: array[int] = array("q")
            for n, w, x, y in _fields(buf, a, b):
                if n != 1:
                    continue
                if w == 0:
                    ints.append(_signed64(x))
                elif w == 2:
                    p = x
                    while p < y:
                        value, p = _varint(buf, p, y)
                        ints.append(_signed64(value))
            out = ints
    return out


def iter_features(payload: bytes | memoryview) -> Iterator[tuple[str, int, int]]:
    """``(name, start, end)`` of each feature entry of an Example: ``payload[start:end]`` is its
    ``Feature`` message. Raises :class:`ExampleFormatError` on malformed bytes."""
    end = len(payload)
    for number, wire, a, b in _fields(payload, 0, end):
        if number == 2 and wire == 2:
            raise ExampleFormatError(
                "the record holds a tf.train.SequenceExample (it has feature lists); fastload reads "
                "tf.train.Example records only"
            )
        if number != 1 or wire != 2:
            continue
        for n, w, x, y in _fields(payload, a, b):
            if n != 1 or w != 2:
                continue
            name: str | None = None
            start = stop = x
            for n2, w2, x2, y2 in _fields(payload, x, y):
                if n2 == 1 and w2 == 2:
                    try:
                        name = str(payload[x2:y2], "utf-8")
                    except UnicodeDecodeError:
                        raise ExampleFormatError("a feature name is not valid UTF-8") from None
                elif n2 == 2 and w2 == 2:
                    start, stop = x2, y2
            yield ("" if name is None else name), start, stop


def decode_example(payload: bytes | memoryview) -> dict[str, FeatureValue]:
    """A serialised ``tf.train.Example`` as ``{feature name: value}`` (bytes lists as ``list[bytes]``,
    int64 lists as ``array('q')``, float lists as ``array('f')``)."""
    return {name: _feature(payload, a, b) for name, a, b in iter_features(payload)}


# -- the common shape, fast ---------------------------------------------------------------------------------


def _long_length(buf: bytes, pos: int) -> tuple[int, int]:
    """A length varint of two or more bytes at ``buf[pos]`` (``buf[pos] >= 0x80``): ``(value, position
    after it)``; at most 5 bytes (a larger length cannot fit in a record here), else ExampleFormatError."""
    value = buf[pos] & 0x7F
    b = buf[pos + 1]
    if b < 0x80:
        return value | b << 7, pos + 2
    value |= (b & 0x7F) << 7
    b = buf[pos + 2]
    if b < 0x80:
        return value | b << 14, pos + 3
    value |= (b & 0x7F) << 14
    b = buf[pos + 3]
    if b < 0x80:
        return value | b << 21, pos + 4
    value |= (b & 0x7F) << 21
    b = buf[pos + 4]
    if b < 0x80:
        return value | b << 28, pos + 5
    raise ExampleFormatError("a length varint is longer than 5 bytes")


_VALUE_TAGS = (0x12, 0x0A, 0x0A)  # map entry value (a Feature), Feature.bytes_list, BytesList.value


def simple_entry(buf: bytes, pos: int, end: int) -> tuple[str, int, int] | None:
    """The ``Features`` map entry at ``buf[pos]`` if it has the common shape (a name, then a ``Feature``
    holding a ``BytesList`` of exactly one value, each written once, in that order, nothing else) and ends
    at or before ``end``: ``(name, value start, value end)``, the value ending the entry. None for any
    other entry, for malformed bytes, and for an entry whose head (everything before its value) ``buf``
    cuts off; the value itself may run past the end of ``buf``.

    (Unrolled, one-byte lengths inline: this runs for every feature of every record read.)"""
    try:
        if buf[pos] != 0x0A:
            return None
        size = buf[pos + 1]
        if size < 0x80:
            pos += 2
        else:
            size, pos = _long_length(buf, pos + 1)
        stop = pos + size
        if stop > end or buf[pos] != 0x0A:  # the entry's key: the name
            return None
        size = buf[pos + 1]
        if size < 0x80:
            pos += 2
        else:
            size, pos = _long_length(buf, pos + 1)
        raw = buf[pos : pos + size]
        pos += size
        # the entry's value (a Feature), its BytesList and its one bytes value: each a field with this tag
        # that ends where the entry does
        for tag in _VALUE_TAGS:
            if buf[pos] != tag:
                return None
            size = buf[pos + 1]
            if size < 0x80:
                pos += 2
            else:
                size, pos = _long_length(buf, pos + 1)
            if pos + size != stop:
                return None
        name = str(raw, "utf-8")
    except (IndexError, ExampleFormatError, UnicodeDecodeError):
        return None
    return name, pos, stop


def example_start(buf: bytes, pos: int, end: int) -> int | None:
    """Where the first ``Features`` entry of the Example at ``buf[pos:end]`` starts, if the Example has the
    common shape's outer framing (one ``features`` field, the whole payload); else None."""
    try:
        if buf[pos] != 0x0A:
            return None
        size = buf[pos + 1]
        if size < 0x80:
            pos += 2
        else:
            size, pos = _long_length(buf, pos + 1)
    except (IndexError, ExampleFormatError):
        return None
    return pos if pos + size == end else None


def simple_example(buf: bytes, start: int, end: int) -> dict[str, bytes] | None:
    """:func:`decode_example` of ``buf[start:end]`` for the common shape, fast: every feature a single
    bytes value (as fastload's writer and most image datasets make them), written canonically; returns
    ``{name: value}``. None for anything else (other kinds, 0 or 2+ values, unknown fields, another
    field order, a SequenceExample, malformed bytes): :func:`decode_example` then decodes it or says what
    is wrong. Where it returns a dict, ``decode_example`` gives the same with each value in a list."""
    if start == end:
        return {}
    pos = example_start(buf, start, end)
    if pos is None:
        return None
    out: dict[str, bytes] = {}
    while pos < end:
        entry = simple_entry(buf, pos, end)
        if entry is None:
            return None
        name, a, pos = entry
        out[name] = buf[a:pos]
    return out


def example_key(payload: bytes | memoryview) -> tuple[str | None, list[str]]:
    """The ``__key__`` feature's value (None if absent) and the other feature names, in record order."""
    key: str | None = None
    names: list[str] = []
    for name, a, b in iter_features(payload):
        if name == KEY_FEATURE:
            key = key_value(_feature(payload, a, b))
        elif name not in names:
            names.append(name)
    return key, names


def key_value(value: FeatureValue) -> str:
    """The text of a ``__key__`` feature: exactly one UTF-8 bytes value."""
    if not isinstance(value, list) or len(value) != 1:
        raise ExampleFormatError(f"the {KEY_FEATURE!r} feature must hold exactly one bytes value")
    try:
        return value[0].decode("utf-8")
    except UnicodeDecodeError:
        raise ExampleFormatError(f"the {KEY_FEATURE!r} feature is not valid UTF-8") from None


def example_layout(features: Sequence[tuple[str, int]]) -> tuple[int, list[bytes]]:
    """How to write an Example of single-value bytes features given as ``(name, value size)``: the
    payload's length and, per feature, the bytes to write just before its value (values follow unchanged,
    so a file's bytes can be copied straight into the record)."""
    prefixes: list[bytes] = []
    total = 0
    for name, size in features:
        raw = name.encode("utf-8")
        bytes_list = 1 + _varint_len(size) + size
        feature = 1 + _varint_len(bytes_list) + bytes_list
        entry = 1 + _varint_len(len(raw)) + len(raw) + 1 + _varint_len(feature) + feature
        prefix = (
            b"\x0a"
            + _varint_bytes(entry)
            + b"\x0a"
            + _varint_bytes(len(raw))
            + raw
            + b"\x12"
            + _varint_bytes(feature)
            + b"\x0a"
            + _varint_bytes(bytes_list)
            + b"\x0a"
            + _varint_bytes(size)
        )
        prefixes.append(prefix)
        total += len(prefix) + size
    head = b"\x0a" + _varint_bytes(total)
    if prefixes:
        prefixes[0] = head + prefixes[0]
    return len(head) + total, prefixes or [head]


def encode_example(features: Sequence[tuple[str, bytes]]) -> bytes:
    """A serialised ``tf.train.Example`` with one single-value bytes feature per ``(name, value)``."""
    _, prefixes = example_layout([(n, len(v)) for n, v in features])
    if not features:
        return prefixes[0]
    return b"".join(p + v for p, (_, v) in zip(prefixes, features, strict=True))


def sample_layout(key: str, fields: Sequence[tuple[str, int]]) -> tuple[int, bytes, list[bytes]]:
    """:func:`example_layout` for a fastload sample: the payload's length, the bytes that start it (the
    ``__key__`` feature with its value) and the bytes to write before each field's value."""
    raw = key.encode("utf-8")
    length, prefixes = example_layout([(KEY_FEATURE, len(raw)), *fields])
    return length, prefixes[0] + raw, prefixes[1:]
