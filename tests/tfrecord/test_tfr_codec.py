"""The pure TFRecord core: framing and masked CRC32C against the ``tfrecord`` package, and the Example codec
against the official protobuf runtime (both directions), including encodings the writer never produces."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tfr_helpers import protobuf_features, reference_records
from tfrecord import example_pb2
from tfrecord.writer import TFRecordWriter

from fastload.errors import VerifyError
from fastload.formats.tfrecord import codec as tfr

SETTINGS = settings(max_examples=120, deadline=None)
names = st.text(min_size=1, max_size=12)
int64s = st.integers(min_value=-(2**63), max_value=2**63 - 1)
float32s = st.floats(width=32, allow_nan=False)
features = st.dictionaries(
    names,
    st.one_of(
        st.tuples(st.just("bytes"), st.lists(st.binary(max_size=300), max_size=3)),
        st.tuples(st.just("int"), st.lists(int64s, max_size=5)),
        st.tuples(st.just("float"), st.lists(float32s, max_size=5)),
    ),
    max_size=5,
)


def protobuf_example(feats: dict[str, tuple[str, list]]) -> bytes:  # type: ignore[type-arg]
    example = example_pb2.Example()
    for name, (kind, values) in feats.items():
        feature = example.features.feature[name]
        target = {"bytes": feature.bytes_list, "int": feature.int64_list, "float": feature.float_list}[kind]
        target.SetInParent()
        target.value.extend(values)
    return example.SerializeToString()


@SETTINGS
@given(st.binary(max_size=2000))
def test_masked_crc_and_framing_match_the_tfrecord_package(payload: bytes) -> None:
    assert struct.pack("<I", tfr.masked_crc(payload)) == TFRecordWriter.masked_crc(payload)
    record = tfr.frame(payload)
    assert len(record) == tfr.record_size(len(payload))
    assert reference_records(record) == [payload]


@SETTINGS
@given(st.lists(st.binary(max_size=200), max_size=6))
def test_iter_records_yields_each_payload_at_its_offset(payloads: list[bytes]) -> None:
    data = b"".join(tfr.frame(p) for p in payloads)
    got = list(tfr.iter_records(data, shard="s", base=100))
    assert [bytes(p) for _, p in got] == payloads
    offsets = [100 + sum(tfr.record_size(len(p)) for p in payloads[:i]) for i in range(len(payloads))]
    assert [o for o, _ in got] == offsets


@SETTINGS
@given(features)
def test_decode_matches_protobuf(feats: dict[str, tuple[str, list]]) -> None:  # type: ignore[type-arg]
    payload = protobuf_example(feats)
    decoded = tfr.decode_example(payload)
    assert set(decoded) == set(feats)
    for name, (kind, values) in feats.items():
        got = decoded[name]
        if kind == "bytes":
            assert got == values
        else:
            assert got.typecode == ("q" if kind == "int" else "f")  # type: ignore[union-attr]
            assert list(got) == values


@SETTINGS
@given(st.lists(st.tuples(names, st.binary(max_size=3000)), max_size=5, unique_by=lambda x: x[0]))
def test_encode_is_read_back_by_protobuf(feats: list[tuple[str, bytes]]) -> None:
    payload = tfr.encode_example(feats)
    assert protobuf_features(payload) == {n: [v] for n, v in feats}
    assert tfr.example_layout([(n, len(v)) for n, v in feats])[0] == len(payload)


@SETTINGS
@given(names, st.lists(st.tuples(names, st.integers(0, 70_000)), max_size=4, unique_by=lambda x: x[0]))
def test_sample_layout_gives_a_key_feature_and_the_exact_length(
    key: str, fields: list[tuple[str, int]]
) -> None:
    fields = [(f, n) for f, n in fields if f != tfr.KEY_FEATURE]
    length, lead, prefixes = tfr.sample_layout(key, fields)
    payload = lead + b"".join(
        p + bytes([i % 251]) * n for i, (p, (_, n)) in enumerate(zip(prefixes, fields, strict=True))
    )
    assert len(payload) == length
    decoded = protobuf_features(payload)
    assert decoded.pop(tfr.KEY_FEATURE) == [key.encode()]
    assert decoded == {f: [bytes([i % 251]) * n] for i, (f, n) in enumerate(fields)}
    assert tfr.example_key(payload) == (key, [f for f, _ in fields])


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes([*out, n])


def _len(field: int, body: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(body)) + body


def test_unpacked_numbers_unknown_fields_and_duplicates() -> None:
    ints = _varint(1 << 3 | 0) + _varint(-3) + _varint(1 << 3 | 0) + _varint(7)
    floats = (_varint(1 << 3 | 5) + struct.pack("<f", 1.5)) * 2
    entry_i = _len(1, b"i") + _len(2, _len(3, ints) + _varint(9 << 3 | 0) + _varint(5))  # unknown field 9
    entry_f = _len(1, b"f") + _len(2, _len(2, floats))
    entry_dup = _len(1, b"i") + _len(2, _len(1, _len(1, b"last")))  # a second "i": the last one wins
    payload = _len(1, _len(1, entry_i) + _len(1, entry_f)) + _len(1, _len(1, entry_dup))
    decoded = tfr.decode_example(payload)
    assert list(decoded["f"]) == [1.5, 1.5]
    assert decoded["i"] == [b"last"]
    assert list(tfr.decode_example(_len(1, _len(1, entry_i)))["i"]) == [-3, 7]


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (b"\x0a\x05\x0a", "past the end"),
        (b"\x0a\x01\x80", "varint"),
        (b"\x0b", "wire type 3"),
        (_len(2, b""), "SequenceExample"),
        (_len(1, _len(1, _len(1, b"\xff") + _len(2, b""))), "UTF-8"),
        (_len(1, _len(1, _len(1, b"f") + _len(2, _len(2, _len(1, b"abc"))))), "whole number of floats"),
    ],
)
def test_malformed_examples_are_refused_with_a_reason(payload: bytes, match: str) -> None:
    with pytest.raises(tfr.ExampleFormatError, match=match):
        tfr.decode_example(payload)


@SETTINGS
@given(st.binary(max_size=64))
def test_any_bytes_decode_or_raise_example_format_error(payload: bytes) -> None:
    with contextlib.suppress(tfr.ExampleFormatError):
        tfr.decode_example(payload)


def test_framing_errors_name_shard_record_and_offset() -> None:
    good = [tfr.frame(b"x" * n) for n in (5, 9, 13)]
    data = bytearray(b"".join(good))
    second = len(good[0])
    bad_length = bytearray(data)
    bad_length[second + 9] ^= 0x01
    with pytest.raises(
        VerifyError, match=rf"^s\.tfrecord, byte offset {1000 + second}: record 4: the length"
    ) as e:
        list(tfr.iter_records(bad_length, shard="s.tfrecord", first=3, base=1000))
    assert e.value.shard == "s.tfrecord" and e.value.offset == 1000 + second
    bad_payload = bytearray(data)
    bad_payload[second + 12] ^= 0x40
    with pytest.raises(VerifyError, match=rf"byte offset {second}: record 1: the payload's CRC"):
        list(tfr.iter_records(bad_payload, shard="s.tfrecord"))
    with pytest.raises(VerifyError, match=rf"byte offset {len(data) - len(good[2])}: record 2 is truncated"):
        list(tfr.iter_records(data[:-1], shard="s.tfrecord"))


def test_names_and_derived_keys() -> None:
    assert all(tfr.is_tfrecord_name(n) for n in ("a.tfrecord", "a/b.tfrecords.gz", "x.tfrec"))
    assert not any(tfr.is_tfrecord_name(n) for n in ("a.tar", "a.gz", "a.tfrecord.zst", "tfrecord"))
    assert tfr.derived_key("d/train-01.tfrecord.gz", 7) == "d/train-01/000007"
    assert tfr.derived_key("x.tfrec", 1234567) == "x/1234567"
