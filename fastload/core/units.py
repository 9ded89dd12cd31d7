"""Byte sizes with units: ``"256MiB"``, ``"1.5GB"``, ``"4096"``."""

from __future__ import annotations

import re
from decimal import Decimal

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_PATTERN = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes in ``text``; decimal (kB, MB, GB) and binary (KiB, MiB, GiB) units, case-insensitive."""
    if isinstance(text, int):
        return text
    match = _PATTERN.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise ValueError(
            f"{text!r} is not a size; write a number with an optional unit such as 256MiB, 1GB or 4096"
        )
    return int(Decimal(match.group(1)) * _UNITS[unit])


def format_size(n: float) -> str:
    """Human-readable binary size: ``1.5 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        limit = 1024 if unit == "B" else 1023.95  # what rounds to 1024.0 is shown in the next unit
        if abs(n) < limit or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
