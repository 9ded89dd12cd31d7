"""The fast Example decoder (``simple_example``/``simple_entry``) and the pieces of the direct read path
(``crc_update``, ``header_length``, ``footer_matches``) against the general decoder and framing: wherever
the fast decoder answers it agrees with ``decode_example``, it answers for the common shape (fastload's own
records, protobuf's serialisation of single bytes values), and it declines everything else, malformed bytes
included."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_tfr_codec import _len, _varint, features, names, protobuf_example

from fastload.errors import VerifyError
from fastload.formats.tfrecord import codec as tfr

SETTINGS = settings(max_examples=150, deadline=None)
# values around the one/two/three-byte length boundaries (127/128, 16383/16384)
sizes = st.one_of(st.integers(0, 300), st.sampled_from([127, 128, 129, 16_383, 16_384, 16_385, 70_000]))
simple = st.lists(st.tuples(names, sizes), max_size=5, unique_by=lambda x: x[0])


def _general(payload: bytes) -> dict[str, object] | None:
    try:
        return dict(tfr.decode_example(payload))
    except tfr.ExampleFormatError:
        return None


def _agrees(payload: bytes) -> dict[str, bytes] | None:
    """The fast decoder's answer, checked against the general decoder's (wrapped in a buffer, too)."""
    fast = tfr.simple_example(payload, 0, len(payload))
    if fast is not None:
        assert _general(payload) == {k: [v] for k, v in fast.items()}
        assert all(type(v) is bytes for v in fast.values())
    padded = b"\x0a\x0a" + payload + b"\x12\x12"  # the same payload inside a bigger buffer
    assert tfr.simple_example(padded, 2, 2 + len(payload)) == fast
    return fast


def _values(fields: list[tuple[str, int]]) -> list[tuple[str, bytes]]:
    return [(n, bytes([i % 251]) * size) for i, (n, size) in enumerate(fields)]


@SETTINGS
@given(simple)
def test_accepts_fastloads_records_and_protobufs(fields: list[tuple[str, int]]) -> None:
    feats = _values(fields)
    assert _agrees(tfr.encode_example(feats)) == dict(feats)
    assert _agrees(protobuf_example({n: ("bytes", [v]) for n, v in feats})) == dict(feats)


@SETTINGS
@given(features)
def test_other_kinds_are_declined_or_agree(feats: dict[str, tuple[str, list]]) -> None:  # type: ignore[type-arg]
    fast = _agrees(protobuf_example(feats))
    common = all(kind == "bytes" and len(values) == 1 for kind, values in feats.values())
    assert (fast is not None) == common


def test_every_one_byte_change_is_declined_or_agrees() -> None:
    good = tfr.encode_example([("__key__", b"k/1"), ("jpg", b"\x0a\x12" * 70), ("cls", b"3")])
    declined = 0
    for at in range(len(good)):
        for value in {0x00, 0x01, 0x0A, 0x12, 0x1A, 0x7F, 0x80, 0xFF, good[at] ^ 1, good[at] + 1 & 0xFF}:
            payload = bytearray(good)
            payload[at] = value
            declined += _agrees(bytes(payload)) is None
        declined += _agrees(good[:at] + good[at + 1 :]) is None
        declined += _agrees(good[:at]) is None
    assert declined > len(good) * 3  # (most changes of the structure are caught)


@SETTINGS
@given(st.lists(st.tuples(names, st.integers(0, 12)), max_size=4, unique_by=lambda x: x[0]), st.data())
def test_damaged_bytes_are_declined_or_agree(fields: list[tuple[str, int]], data: st.DataObject) -> None:
    payload = bytearray(tfr.encode_example(_values(fields)))
    for _ in range(data.draw(st.integers(1, 3))):
        action = data.draw(st.sampled_from(["flip", "set", "insert", "delete", "cut"]))
        at = data.draw(st.integers(0, max(0, len(payload) - 1)))
        if action == "flip" and payload:
            payload[at] ^= 1 << data.draw(st.integers(0, 7))
        elif action == "set" and payload:
            payload[at] = data.draw(st.sampled_from([0x00, 0x0A, 0x12, 0x1A, 0x7F, 0x80, 0xFF]))
        elif action == "insert":
            payload[at:at] = data.draw(st.binary(min_size=1, max_size=3))
        elif action == "delete":
            del payload[at : at + data.draw(st.integers(1, 3))]
        else:
            del payload[at:]
    _agrees(bytes(payload))


@SETTINGS
@given(st.binary(max_size=80))
def test_any_bytes_are_declined_or_agree(payload: bytes) -> None:
    _agrees(payload)


def _entry(name: bytes, feature: bytes) -> bytes:
    return _len(1, _len(1, name) + _len(2, feature))


def _example(*entries: bytes) -> bytes:
    return _len(1, b"".join(entries))


ONE = _len(1, _len(1, b"v"))  # a Feature holding a BytesList of one value


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(_example(_entry(b"a", _len(1, b""))), id="no values"),
        pytest.param(_example(_entry(b"a", _len(1, _len(1, b"v") * 2))), id="two values"),
        pytest.param(_example(_entry(b"a", _len(3, _varint(1 << 3) + _varint(5)))), id="int64"),
        pytest.param(_example(_entry(b"a", _len(2, b"\x0d" + struct.pack("<f", 1.5)))), id="float"),
        pytest.param(_example(_entry(b"a", b"")), id="no kind"),
        pytest.param(_example(_entry(b"a", ONE + _varint(9 << 3) + b"\x01")), id="unknown in Feature"),
        pytest.param(_example(_entry(b"a", ONE + ONE)), id="kind twice"),
        pytest.param(_example(_len(1, _len(2, ONE) + _len(1, b"a"))), id="value before name"),
        pytest.param(_example(_len(1, _len(2, ONE))), id="no name"),
        pytest.param(_example(_len(1, _len(1, b"a") + _len(2, ONE) + _len(3, b""))), id="unknown in entry"),
        pytest.param(_example(_entry(b"a", ONE)) + _len(3, b"x"), id="unknown in Example"),
        pytest.param(_example(_entry(b"a", ONE)) * 2, id="Features twice"),
        pytest.param(_example(_entry(b"a", ONE)) + _len(2, b""), id="SequenceExample"),
        pytest.param(_example(_entry(b"\xff", ONE)), id="name not UTF-8"),
        pytest.param(_example(_entry(b"a", ONE))[:-1], id="truncated"),
        pytest.param(b"\x0a\x85\x80\x80\x80\x80\x00" + _entry(b"a", ONE), id="6-byte length"),
    ],
)
def test_other_shapes_are_declined(payload: bytes) -> None:
    assert tfr.simple_example(payload, 0, len(payload)) is None
    _agrees(payload)


def test_what_the_general_decoder_also_gives() -> None:
    dup = _example(_entry(b"a", _len(1, _len(1, b"x"))), _entry(b"b", ONE), _entry(b"a", ONE))
    assert _agrees(dup) == {"a": b"v", "b": b"v"}  # the last duplicate wins, in first-seen order
    assert list(_agrees(dup) or {}) == ["a", "b"]
    inner = b"\x0a\x81\x00a" + _len(2, ONE)  # lengths written with more bytes than needed
    entry = bytes([0x0A, len(inner) | 0x80, 0x00]) + inner
    assert _agrees(bytes([0x0A, len(entry) | 0x80, 0x80, 0x00]) + entry) == {"a": b"v"}
    assert _agrees(b"") == {} and _agrees(b"\x0a\x00") == {}
    assert _agrees(_example(_entry(b"", ONE))) == {"": b"v"}


def test_entry_head_and_values_past_the_buffer() -> None:
    entry = _entry("é".encode(), _len(1, _len(1, b"z" * 200)))
    head = len(entry) - 200
    assert tfr.simple_entry(entry, 0, len(entry)) == ("é", head, len(entry))
    assert tfr.simple_entry(entry[:head], 0, len(entry)) == ("é", head, len(entry))  # value not held
    assert tfr.simple_entry(entry, 0, len(entry) - 1) is None  # runs past ``end``
    for cut in range(head):
        assert tfr.simple_entry(entry[:cut], 0, len(entry)) is None  # its head cut off
    payload = _example(entry)
    assert tfr.example_start(payload, 0, len(payload)) == len(payload) - len(entry)
    assert tfr.example_start(payload, 0, len(payload) + 1) is None


@SETTINGS
@given(st.lists(st.binary(max_size=3000), max_size=4), st.binary(max_size=100))
def test_pieces_of_the_direct_path_match_the_framing(pieces: list[bytes], extra: bytes) -> None:
    payload = b"".join(pieces)
    crc = 0
    for piece in pieces:
        crc = tfr.crc_update(memoryview(piece), crc)
    assert crc == tfr.record_crc(payload)
    record = extra + tfr.frame(payload)
    at, end = len(extra), len(extra) + tfr.HEADER_BYTES + len(payload)
    assert tfr.header_length(record, at) == len(payload)
    assert tfr.footer_matches(record, end, crc)
    assert not tfr.footer_matches(record, end, crc ^ 1)
    assert not tfr.footer_matches(record[:-1], end, crc)
    assert tfr.header_length(record[: at + 11], at) is None
    for i in range(tfr.HEADER_BYTES):
        bad = bytearray(record)
        bad[at + i] ^= 0x10
        assert tfr.header_length(bytes(bad), at) is None
        with pytest.raises(VerifyError, match="length field's CRC"):
            tfr.parse_header(bad[at : at + 12], shard="s", record=0, offset=at)
