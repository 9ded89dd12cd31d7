"""Byte sizes with units: parsing user input and formatting for people."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fastload.core.units import format_size, parse_size

SETTINGS = settings(max_examples=200, deadline=None)

# Written out here independently of the module's table.
FACTORS = {
    "": 1,
    "B": 1,
    "k": 10**3,
    "kB": 10**3,
    "M": 10**6,
    "MB": 10**6,
    "G": 10**9,
    "GB": 10**9,
    "T": 10**12,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("256MiB", 256 * 1024 * 1024),
        ("1GB", 1_000_000_000),
        ("1.5GiB", 1_610_612_736),
        ("4096", 4096),
        ("10 kb", 10_000),
        ("10KB", 10_000),
        ("1gib", 2**30),
        ("1GIB", 2**30),
        ("1GiB", 2**30),
        (" 2 MiB ", 2 * 2**20),
        ("0", 0),
        ("7B", 7),
        (".5KiB", 512),
        ("2.", 2),
        ("3TB", 3 * 10**12),
        ("1TiB", 2**40),
        ("64mib", 64 * 2**20),
    ],
)
def test_parse_size_examples(text: str, expected: int) -> None:
    assert parse_size(text) == expected


def test_parse_size_passes_ints_through() -> None:
    assert parse_size(12345) == 12345


@pytest.mark.parametrize(
    "text", ["abc", "12XB", "-5", "", "  ", "MiB", "1.2.3", "1 2 MB", "1e6", "0x10", "5 MiB s"]
)
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_size(text)
    message = str(info.value)
    assert repr(text) in message  # names the bad value
    assert "256MiB" in message  # and shows what to write instead


@SETTINGS
@given(st.integers(0, 10**6), st.sampled_from(sorted(FACTORS)), st.sampled_from(["", " "]), st.booleans())
def test_parse_size_integers_with_units(n: int, unit: str, space: str, upper: bool) -> None:
    text = f"{n}{space}{unit.upper() if upper else unit}"
    assert parse_size(text) == n * FACTORS[unit]


@pytest.mark.parametrize(
    ("text", "expected"), [("9007199254740993", 2**53 + 1), ("36893489T", 36893489 * 10**12)]
)
def test_parse_size_large_integers_are_exact(text: str, expected: int) -> None:
    """Whole numbers are exact at any size (they must not go through a 53-bit float)."""
    assert parse_size(text) == expected


@SETTINGS
@given(st.integers(0, 10**6), st.integers(0, 99), st.sampled_from(sorted(FACTORS)))
@example(2, 1, "kB")  # "2.01kB" is exactly 2010 bytes
@example(8, 3, "kB")  # "8.03kB" is exactly 8030 bytes
def test_parse_size_decimals_are_exact(whole: int, hundredths: int, unit: str) -> None:
    """A decimal that names a whole number of bytes gives exactly that number (no binary float rounding)."""
    text = f"{whole}.{hundredths:02d}{unit}"
    exact = Fraction(f"{whole}.{hundredths:02d}") * FACTORS[unit]
    if exact.denominator == 1:
        assert parse_size(text) == exact
    else:
        assert abs(parse_size(text) - exact) < 1


# --- format_size --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (0, "0 B"),
        (1, "1 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (5 * 2**20, "5.0 MiB"),
        (1.5 * 2**30, "1.5 GiB"),
        (2**40, "1.0 TiB"),
        (2**50, "1024.0 TiB"),
        (-2048, "-2.0 KiB"),
    ],
)
def test_format_size_examples(n: float, expected: str) -> None:
    assert format_size(n) == expected


@SETTINGS
@given(st.integers(0, 2**50))
def test_format_size_reads_back_approximately(n: int) -> None:
    """What format_size prints parses back to within its one-decimal rounding (5% of the unit shown)."""
    text = format_size(n)
    number, unit = text.split(" ")
    assert unit in ("B", "KiB", "MiB", "GiB", "TiB")
    assert float(number) < 1024 or unit == "TiB"
    back = parse_size(text)
    assert abs(back - n) <= 0.05 * FACTORS[unit] + 1
