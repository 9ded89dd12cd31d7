"""Tar member headers: read back by Python's tarfile and GNU tar, sizes computable in advance, parsing."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fastload.formats.tar.header import (
    BLOCK,
    END_OF_ARCHIVE,
    Header,
    TarFormatError,
    header_size,
    is_header_of,
    member_header,
    member_size,
    padded,
    parse_block,
    parse_header,
    parse_number,
    parse_pax,
)

SETTINGS = settings(max_examples=120, deadline=None)
MAX_OCTAL_SIZE = 8**11 - 1  # the largest size the 11-digit octal ustar field holds (8 GiB - 1)

# Names as they occur in packs: "/"-joined components of any character but NUL and "/" (and no surrogates,
# which cannot be encoded). Components are never empty, "." or "..".
_COMPONENT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\0/"), min_size=1, max_size=40
).filter(lambda c: c not in (".", ".."))
_NAMES = st.lists(_COMPONENT, min_size=1, max_size=6).map("/".join)

SHORT = "a/b/0001.jpg"
EXACTLY_100 = "d/" + "x" * 94 + ".jpg"
OVER_100 = "d/" + "x" * 95 + ".jpg"
NON_ASCII = ["é/café.jpg", "日本語/画像.png", "emoji/😀🎉.json", "ñandú/" + "ü" * 60 + ".cls"]


def _archive(members: list[tuple[str, bytes]], *, mtime: int = 0) -> bytes:
    """A whole archive built only from :func:`member_header`, the data, padding and the end marker."""
    out = bytearray()
    for name, data in members:
        out += member_header(name, len(data), mtime=mtime)
        out += data + bytes(padded(len(data)) - len(data))
    out += END_OF_ARCHIVE
    return bytes(out)


def _read_with_tarfile(archive: bytes) -> list[tuple[tarfile.TarInfo, bytes]]:
    out = []
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tf:
        for info in tf:
            f = tf.extractfile(info)
            assert f is not None
            out.append((info, f.read()))
    return out


def _check_tarinfo(info: tarfile.TarInfo, name: str, size: int, mtime: int = 0) -> None:
    assert info.name == name
    assert info.size == size
    assert info.isreg()
    assert info.mode == 0o644
    assert (info.uid, info.gid) == (0, 0)
    assert (info.uname, info.gname) == ("", "")
    assert info.mtime == mtime


# --- member_header read back by tarfile --------------------------------------------------------------


@pytest.mark.parametrize("name", [SHORT, EXACTLY_100, OVER_100, "x" * 300 + ".bin", *NON_ASCII])
@pytest.mark.parametrize("size", [0, 1, 511, 512, 513, 5000])
def test_member_header_read_by_tarfile(name: str, size: int) -> None:
    data = bytes((i * 7 + 3) % 256 for i in range(size))
    archive = _archive([(name, data)], mtime=1_700_000_000)
    assert len(archive) % BLOCK == 0
    [(info, got)] = _read_with_tarfile(archive)
    _check_tarinfo(info, name, size, mtime=1_700_000_000)
    assert got == data


def test_name_lengths_around_the_ustar_limit() -> None:
    assert len(EXACTLY_100.encode()) == 100
    assert len(OVER_100.encode()) == 101
    # 100 ASCII bytes fit the ustar name field: a single block, no pax header.
    assert len(member_header(EXACTLY_100, 10)) == BLOCK
    assert parse_block(member_header(EXACTLY_100, 10)) == (EXACTLY_100.encode(), 10, b"0")
    # 101 bytes, or any non-ASCII name, need a pax header in front: at least three blocks.
    assert len(member_header(OVER_100, 10)) >= 3 * BLOCK
    assert len(member_header("é.jpg", 10)) >= 3 * BLOCK


@SETTINGS
@given(
    st.lists(st.tuples(_NAMES, st.binary(max_size=1100)), min_size=1, max_size=4),
    st.integers(0, MAX_OCTAL_SIZE),
)
@example([("a" * 100, b"x")], 0)
@example([("é" * 50, b""), ("b" * 101, b"y" * 512)], MAX_OCTAL_SIZE)
def test_member_header_property_tarfile(members: list[tuple[str, bytes]], mtime: int) -> None:
    got = _read_with_tarfile(_archive(members, mtime=mtime))
    assert len(got) == len(members)
    for (info, data), (name, expected) in zip(got, members, strict=True):
        _check_tarinfo(info, name, len(expected), mtime)
        assert data == expected


@pytest.mark.parametrize("size", [MAX_OCTAL_SIZE, 8**11, 8**11 + 1, 10**13, 2**63])
@pytest.mark.parametrize("name", [SHORT, OVER_100, "é.bin"])
def test_huge_sizes_read_by_tarfile(size: int, name: str) -> None:
    """Sizes of 8 GiB and more need a pax ``size`` record; tarfile must see the exact size (its data is not
    allocated: reading the first member's header is enough)."""
    header = member_header(name, size)
    with tarfile.open(fileobj=io.BytesIO(header), mode="r:") as tf:
        info = tf.firstmember
        assert info is not None
        _check_tarinfo(info, name, size)
        assert info.offset_data == len(header)


def test_member_header_rejects_negative_size() -> None:
    with pytest.raises(ValueError, match="size"):
        member_header("a.jpg", -1)


def test_member_header_is_deterministic() -> None:
    assert member_header(OVER_100, 1234) == member_header(OVER_100, 1234)
    assert member_header(SHORT, 1, mtime=0) != member_header(SHORT, 1, mtime=1)


# --- GNU tar -----------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("tar") is None, reason="GNU tar is not installed")
def test_gnu_tar_lists_and_extracts_exact_names(tmp_path: Path) -> None:
    names = [SHORT, EXACTLY_100, OVER_100, "z" * 250 + ".bin", *NON_ASCII, "dir with space/a b.txt"]
    members = [(name, f"data of {name}\n".encode() * (i + 1)) for i, name in enumerate(names)]
    path = tmp_path / "shard.tar"
    path.write_bytes(_archive(members))
    env = {**os.environ, "LC_ALL": "C.UTF-8", "TZ": "UTC"}
    version = subprocess.run(["tar", "--version"], capture_output=True, check=True, env=env).stdout
    if b"GNU tar" not in version:
        pytest.skip("tar is not GNU tar")

    listing = subprocess.run(
        ["tar", "--numeric-owner", "--quoting-style=literal", "-tvf", str(path)],
        capture_output=True,
        check=True,
        env=env,
    )
    assert listing.stderr == b""
    lines = listing.stdout.decode("utf-8").splitlines()
    assert len(lines) == len(members)
    for line, (name, data) in zip(lines, members, strict=True):
        mode, owner, size, day, clock, listed = line.split(maxsplit=5)
        assert (mode, owner, int(size), day, clock) == ("-rw-r--r--", "0/0", len(data), "1970-01-01", "00:00")
        assert listed == name

    extracted = subprocess.run(["tar", "-xOf", str(path)], capture_output=True, check=True, env=env)
    assert extracted.stderr == b""
    assert extracted.stdout == b"".join(data for _, data in members)


# --- header_size and member_size ---------------------------------------------------------------------


@SETTINGS
@given(
    _NAMES,
    st.one_of(
        st.integers(0, 10**6),
        st.integers(MAX_OCTAL_SIZE - 3, MAX_OCTAL_SIZE + 3),
        st.integers(8**11, 10**30),
    ),
)
@example("a" * 100, 8**11)
@example("é", 8**11 - 1)
def test_header_size_matches_member_header(name: str, size: int) -> None:
    assert header_size(name, size) == len(member_header(name, size))


@pytest.mark.parametrize(
    "length",
    # The pax record "LEN path=NAME\n" changes its own length-prefix width near these name lengths.
    [*range(90, 112), *range(985, 996), *range(9985, 9996)],
)
@pytest.mark.parametrize("char", ["x", "é"])
def test_header_size_at_pax_record_length_boundaries(length: int, char: str) -> None:
    name = (char * length)[: max(1, length // len(char.encode()))]
    header = member_header(name, 3)
    assert header_size(name, 3) == len(header)
    [(info, data)] = _read_with_tarfile(header + b"abc" + bytes(BLOCK - 3) + END_OF_ARCHIVE)
    assert (info.name, data) == (name, b"abc")


@SETTINGS
@given(_NAMES, st.integers(0, 10**15))
def test_member_size(name: str, size: int) -> None:
    total = member_size(name, size)
    assert total == header_size(name, size) + padded(size)
    assert total % BLOCK == 0
    assert total >= size + BLOCK


@pytest.mark.parametrize("name", [SHORT, OVER_100, "é.jpg"])
@pytest.mark.parametrize("size", [0, 1, 511, 512, 513, 2000])
def test_member_size_is_the_archive_growth(name: str, size: int) -> None:
    one = _archive([(name, bytes(size))])
    assert len(one) - len(END_OF_ARCHIVE) == member_size(name, size)


@pytest.mark.parametrize(("n", "expected"), [(0, 0), (1, 512), (511, 512), (512, 512), (513, 1024)])
def test_padded(n: int, expected: int) -> None:
    assert padded(n) == expected


# --- parse_block --------------------------------------------------------------------------------------


@SETTINGS
@given(
    st.text(alphabet="abz09._-/", min_size=1, max_size=100),
    st.integers(0, MAX_OCTAL_SIZE),
    st.integers(0, MAX_OCTAL_SIZE),
)
def test_parse_block_round_trip(name: str, size: int, mtime: int) -> None:
    block = member_header(name, size, mtime=mtime)
    assert len(block) == BLOCK
    assert parse_block(block) == (name.encode(), size, b"0")


def test_parse_block_of_pax_header_then_ustar() -> None:
    header = member_header(OVER_100, 77)
    _, size, flag = parse_block(header[:BLOCK]) or (b"", 0, b"")
    assert flag == b"x"
    records = header[BLOCK : BLOCK + size]
    assert parse_pax(records) == {"path": OVER_100.encode()}
    ustar = parse_block(header[-BLOCK:])
    assert ustar is not None
    assert ustar[1:] == (77, b"0")


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_parse_block_reads_headers_written_by_tarfile(fmt: int) -> None:
    """Headers from an independent writer: plain names, and a long name split into ustar prefix + name."""
    name = "p" * 120 + "/" + "n" * 60 + ".jpg"
    info = tarfile.TarInfo(name)
    info.size = 12345
    buf = info.tobuf(format=fmt, encoding="utf-8", errors="strict")
    blocks = [buf[i : i + BLOCK] for i in range(0, len(buf), BLOCK)]
    parsed = parse_block(blocks[0])
    assert parsed is not None
    if fmt == tarfile.USTAR_FORMAT:
        assert parsed == (name.encode(), 12345, b"0")
    else:
        assert parsed[2] in (b"L", b"x")  # GNU long-name or pax header first
        last = parse_block(blocks[-1])
        assert last is not None
        assert last[1:] == (12345, b"0")


def test_parse_block_reads_gnu_base256_size() -> None:
    info = tarfile.TarInfo("big.bin")
    info.size = 8**11 + 12345
    buf = info.tobuf(format=tarfile.GNU_FORMAT, encoding="utf-8", errors="strict")
    assert buf[124] & 0x80  # tarfile really used base-256 here
    assert parse_block(buf[:BLOCK]) == (b"big.bin", 8**11 + 12345, b"0")


def test_parse_block_end_and_truncated() -> None:
    assert parse_block(bytes(BLOCK)) is None
    header = member_header(SHORT, 5)
    for cut in (0, 1, 511):
        with pytest.raises(TarFormatError, match="truncated"):
            parse_block(header[:cut])
    with pytest.raises(TarFormatError):
        parse_block(header + b"\0")


@SETTINGS
@given(
    st.integers(0, BLOCK - 1).filter(lambda i: not 148 <= i < 156),
    st.integers(1, 255),
    st.sampled_from([SHORT, EXACTLY_100]),
)
def test_parse_block_detects_a_flipped_byte(position: int, mask: int, name: str) -> None:
    block = bytearray(member_header(name, 1000))
    block[position] ^= mask
    with pytest.raises(TarFormatError, match="checksum"):
        parse_block(bytes(block))


def test_parse_block_rejects_garbage_checksum_field() -> None:
    block = bytearray(member_header(SHORT, 1))
    block[148:156] = b"zzzzzz\0 "
    with pytest.raises(TarFormatError, match="checksum"):
        parse_block(bytes(block))


# --- parse_pax ----------------------------------------------------------------------------------------


def _pax_records(pairs: list[tuple[bytes, bytes]]) -> bytes:
    """Reference encoder, written from POSIX: each record is "LEN KEY=VALUE\\n", LEN counting itself."""
    out = b""
    for key, value in pairs:
        body = b" " + key + b"=" + value + b"\n"
        length = next(n for n in range(len(body) + 1, len(body) + 30) if len(str(n)) + len(body) == n)
        out += str(length).encode() + body
    return out


@SETTINGS
@given(
    st.dictionaries(
        st.text(alphabet=st.characters(codec="utf-8", exclude_characters="=\0"), min_size=1, max_size=12),
        st.binary(max_size=1200),
        max_size=4,
    )
)
def test_parse_pax_round_trip(pairs: dict[str, bytes]) -> None:
    records = _pax_records([(k.encode(), v) for k, v in pairs.items()])
    assert parse_pax(records) == pairs


def test_parse_pax_reads_tarfile_pax_headers() -> None:
    name = "日本語/" + "x" * 150 + ".jpg"
    info = tarfile.TarInfo(name)
    info.size = 8**11 + 1
    buf = info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")
    first = parse_block(buf[:BLOCK])
    assert first is not None
    _, size, flag = first
    assert flag == b"x"
    pax = parse_pax(buf[BLOCK : BLOCK + size])
    assert pax["path"] == name.encode()
    assert int(pax["size"]) == 8**11 + 1


@SETTINGS
@given(_NAMES, st.one_of(st.integers(0, 100), st.integers(8**11, 10**20)))
def test_member_header_pax_records_parse(name: str, size: int) -> None:
    header = member_header(name, size)
    first = parse_block(header[:BLOCK])
    assert first is not None
    if len(header) == BLOCK:
        assert first == (name.encode(), size, b"0")
        return
    _, records_len, flag = first
    assert flag == b"x"
    pax = parse_pax(header[BLOCK : BLOCK + records_len])
    raw = name.encode()
    assert pax.get("path", raw) == raw
    assert ("path" in pax) == (len(raw) > 100 or not raw.isascii())
    assert int(pax.get("size", size)) == size
    assert ("size" in pax) == (size > MAX_OCTAL_SIZE)


def test_parse_pax_bad_length() -> None:
    with pytest.raises(TarFormatError, match="pax"):
        parse_pax(b"xx path=a\n")


# --- parse_header: every dialect's fields ------------------------------------------------------------


def _with_checksum(block: bytearray) -> bytes:
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def test_gnu_headers_keep_times_where_ustar_keeps_the_name_prefix() -> None:
    info = tarfile.TarInfo("a/b.jpg")
    info.size = 5
    gnu = bytearray(info.tobuf(format=tarfile.GNU_FORMAT))
    assert gnu[257:265] == b"ustar  \0"
    gnu[345:357] = b"%011o\0" % 1_700_000_000  # GNU's atime field
    assert parse_header(_with_checksum(gnu)) == Header(b"a/b.jpg", 5, b"0", b"")
    posix = bytearray(info.tobuf(format=tarfile.USTAR_FORMAT))
    posix[345:351] = b"prefix"
    assert parse_block(_with_checksum(posix)) == (b"prefix/a/b.jpg", 5, b"0")


def test_v7_regular_file_named_with_a_slash_is_a_directory() -> None:
    block = bytearray(member_header("dir/", 0))
    block[156:157] = b"\0"
    block[257:265] = bytes(8)
    assert parse_block(_with_checksum(block)) == (b"dir/", 0, b"5")


def test_a_signed_checksum_is_accepted_as_tarfile_accepts_it() -> None:
    block = bytearray(member_header("a.bin", 3))
    block[100:108] = b"\xff" * 8  # bytes over 127 outside the checksum field
    signed = sum(block[:148]) + 256 + sum(block[156:]) - 256 * 8
    block[148:156] = b"%06o\0 " % signed
    assert parse_block(bytes(block)) == (b"a.bin", 3, b"0")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        (b"00000000017\0", 15),
        (b"   17 \0\0\0\0\0\0", 15),
        (b"17\0garbage\0\0", 15),
        (b"\0" * 12, 0),
        (b"\x80" + (8**11 + 5).to_bytes(11, "big"), 8**11 + 5),
    ],
)
def test_parse_number_reads_octal_and_base256(field: bytes, value: int) -> None:
    assert parse_number(field, "size") == value


@pytest.mark.parametrize(
    "field", [b"-0000000001\0", b"0000001_000\0", b"00000000008\0", b"\xff" * 12, b"\x81" + bytes(11)]
)
def test_parse_number_refuses_what_is_not_a_size(field: bytes) -> None:
    with pytest.raises(TarFormatError, match="size"):
        parse_number(field, "size")


@pytest.mark.parametrize(
    "records", [b"12 path=abc", b"99 path=abc\n", b"6 pa\n", b"9 pathabc\n", b"10 path=ab\n"]
)
def test_parse_pax_refuses_cut_or_malformed_records(records: bytes) -> None:
    with pytest.raises(TarFormatError, match="pax"):
        parse_pax(records)


def test_parse_pax_allows_nul_padding() -> None:
    assert parse_pax(b"11 path=ab\n" + bytes(20)) == {"path": b"ab"}


@SETTINGS
@given(
    st.text(alphabet="abz09._-/", min_size=1, max_size=100),
    st.integers(0, 10**6),
    st.lists(st.tuples(st.integers(0, BLOCK - 1), st.integers(1, 255)), max_size=3),
    st.booleans(),
)
def test_what_is_header_of_accepts_the_parser_reads_the_same(
    name: str, size: int, flips: list[tuple[int, int]], fix: bool
) -> None:
    """The readers' fast check never accepts a header the parser would read differently: it reads the
    same name, size and type, or refuses the checksum (which the fast check does not recompute)."""
    block = bytearray(member_header(name, size))
    for at, mask in flips:
        block[at] ^= mask
    data = _with_checksum(block) if fix else bytes(block)
    if is_header_of(data, 0, name.encode(), size):
        try:
            header = parse_header(data)
        except TarFormatError as exc:
            assert "checksum" in str(exc)
        else:
            assert header is not None and (header.name, header.size, header.typeflag) == (
                name.encode(),
                size,
                b"0",
            )
    if not flips:
        assert is_header_of(data, 0, name.encode(), size)


@given(
    name=st.text(alphabet="abcxyz09/._-", max_size=100),
    size=st.integers(min_value=0, max_value=8**11 - 1),
    mtime=st.sampled_from([0, 1, 1_700_000_000, 8**11 - 1]),
)
def test_a_plain_header_from_its_template_is_the_header_built_field_by_field(
    name: str, size: int, mtime: int
) -> None:
    from fastload.formats.tar import header

    raw = name.encode()
    assert header._plain(raw, size, mtime) == header._ustar(raw, size, b"0", mtime)
    assert member_header(name, size, mtime=mtime) == header._ustar(raw, size, b"0", mtime)
