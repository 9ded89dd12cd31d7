"""The member layout of a tar shard's samples (``member_fields`` + ``member_sizes``): when every member has
one plain 512-byte ustar header, a sample's byte size is the sum of its members' header + padded data, which
readers use to read members' bytes without parsing every header. These checks keep a layout honest."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from fastload.core.table import SampleTable


class ShardEntry(Protocol):
    """What these checks read and set of :class:`fastload.core.index.ShardEntry` (not imported: it imports
    this module)."""

    member_fields: list[str]
    member_sizes: list[list[int]]
    offsets: list[int]
    sizes: list[int]

    @property
    def samples(self) -> int: ...


_TAR_BLOCK = 512  # the manifest checks its own tar layout fields; fastload.formats.tar owns the format


def plain_member_bytes(size: int) -> int:
    """Bytes a member of ``size`` data bytes takes in a tar shard with one plain 512-byte header."""
    return _TAR_BLOCK + -(-size // _TAR_BLOCK) * _TAR_BLOCK


def layout_problem(entry: ShardEntry) -> str | None:
    """Why ``entry``'s member layout cannot describe its tar shard, or None when it is consistent.

    The layout (``member_fields``: the fields every sample has, in member order; ``member_sizes``: each
    sample's data sizes in that order) is written only for shards whose members all carry one plain
    512-byte ustar header, so each sample's byte size must be the sum of its members' header + padded data.
    Readers use it to read members' bytes without parsing every header.
    """
    if not entry.member_fields:
        return "member_sizes without member_fields"
    if len(set(entry.member_fields)) != len(entry.member_fields):
        return "member_fields has duplicates"
    if not entry.offsets or len(entry.member_sizes) != entry.samples:
        return "needs offsets and one member_sizes row per sample"
    width = len(entry.member_fields)
    for i, (row, size) in enumerate(zip(entry.member_sizes, entry.sizes, strict=True)):
        if len(row) != width or sum(plain_member_bytes(s) for s in row) != size or min(row) < 0:
            return f"row {i} ({row}) does not add up to the sample's {size} bytes"
    return None


def set_layout(entry: ShardEntry, layouts: Sequence[tuple[Sequence[str], list[int]] | None]) -> None:
    """Record a tar shard's member layout in ``entry`` from each sample's ``(fields, data sizes)`` (None
    for a sample with a member that is not one plain 512-byte header + data), when every sample has the
    same fields in the same order and the layout adds up (:func:`layout_problem`); otherwise leave none."""
    entry.member_fields, entry.member_sizes = [], []
    if not layouts or len(layouts) != entry.samples:
        return
    first = layouts[0]
    if first is None or not first[0]:
        return
    fields = list(first[0])
    rows: list[list[int]] = []
    for lay in layouts:
        if lay is None or list(lay[0]) != fields:
            return
        rows.append(lay[1])
    entry.member_fields, entry.member_sizes = fields, rows
    if layout_problem(entry) is not None:
        entry.member_fields, entry.member_sizes = [], []


def layout_problem_arrays(table: SampleTable) -> str | None:
    """:func:`layout_problem` over a decoded table's numpy columns (one pass per column, no per-row loop)."""
    import numpy as np

    rows, sizes = table.arrays["member_sizes"], table.arrays.get("sizes")
    if sizes is None or rows.ndim != 2 or rows.shape != (table.samples, len(table.member_fields)):
        return "needs offsets and one member_sizes row per sample"
    if len(set(table.member_fields)) != len(table.member_fields):
        return "member_fields has duplicates"
    block = np.uint64(_TAR_BLOCK)
    spans = (block + (rows + block - np.uint64(1)) // block * block).sum(axis=1, dtype=np.uint64)
    bad = np.flatnonzero(spans != sizes)
    if bad.size:
        i = int(bad[0])
        return f"row {i} ({table.member_sizes[i]}) does not add up to the sample's {table.sizes[i]} bytes"
    return None
