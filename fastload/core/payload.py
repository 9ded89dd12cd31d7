"""A shard format's own per-shard data as core carries it: the payload a format makes and reads
(:class:`ShardPayload`), and what core keeps of it as stored until the format reads it (the shard object's
other keys in ``index.json``, :class:`TableExtra` of its sample table). Core reads none of it; which keys
and columns are core's is written here (``V2_KEYS``, ``V1_KEYS``; the table's: ``core.table.CORE_COLUMNS``).
``docs/INDEX-FORMAT.md``, "Index format note", has the rules."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


class ShardPayload(Protocol):
    """A shard format's own per-shard data (tar's member layout, Parquet's footer and statistics), made and
    read by that format (:meth:`fastload.formats.ShardFormat.read_payload`); core stores it without
    knowing what it holds."""

    def manifest(self, *, listed: bool) -> dict[str, Any]:
        """Its keys in the shard's ``index.json`` object (``listed``: a v1 manifest, every sample listed),
        beside core's; JSON values."""
        ...

    def table(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Its keys in the sample table's JSON header and its columns there (unsigned numpy arrays)."""
        ...

    def nbytes(self) -> int:
        """Roughly the memory it holds (what a cache of full entries counts)."""
        ...

    def slim(self) -> ShardPayload | None:
        """Itself without what can be read again from its shard (what a capped in-memory index keeps)."""
        ...


@dataclass(frozen=True)
class TableExtra:
    """A sample table's header keys and columns that are not core's, as decoded, until the shard's format
    reads them into its payload (:attr:`ShardEntry.payload`)."""

    header: dict[str, Any]
    columns: dict[str, np.ndarray]
    arrays: dict[str, np.ndarray]  # core's columns as decoded (``sizes``), for the format's column checks


# the one empty ``extra`` entries share (a Mapping: read-only to typed code; a dict, so entries pickle into
# DataLoader workers)
NO_EXTRA: Mapping[str, Any] = {}
# what core reads of a shard's object in index.json (v2, v1); its other keys are the format's
V2_KEYS = frozenset({"name", "format", "bytes", "samples", "checksum", "partition", "table"})
V1_KEYS = frozenset(
    {"name", "bytes", "samples", "checksum", "partition", "keys", "offsets", "sizes", "row_groups", "crcs"}
)
