"""The resume journal of a pack run, kept in the destination under ``.fastload-pack/``: the plan's
fingerprint, and one small record per finished shard (its index entry and skips)."""

from __future__ import annotations

import json
from typing import Any

from fastload.errors import PackError
from fastload.packing.dest import Destination

STATE_DIR = ".fastload-pack"
_STATE = f"{STATE_DIR}/state.json"
_DONE = f"{STATE_DIR}/done"


class PackJournal:
    """State kept while a pack runs; removed once the index is written."""

    def __init__(self, dest: Destination) -> None:
        self.dest = dest

    def exists(self) -> bool:
        return self.dest.read_bytes(_STATE) is not None

    def start(self, fingerprint: str, shards: int) -> None:
        """Begin a fresh run."""
        self.dest.write_bytes(_STATE, json.dumps({"fingerprint": fingerprint, "shards": shards}).encode())

    def fingerprint(self) -> str:
        raw = self.dest.read_bytes(_STATE)
        try:
            return str(json.loads(raw or b"")["fingerprint"])
        except (ValueError, KeyError, TypeError) as exc:
            raise PackError(
                f"the resume state in {self.dest.url}/{STATE_DIR} is unreadable ({exc}); delete the "
                "destination and pack again"
            ) from None

    def finished(self) -> dict[int, dict[str, Any]]:
        """Shard number -> recorded result, for every complete record (records are written atomically)."""
        out: dict[int, dict[str, Any]] = {}
        for name in self.dest.list(_DONE):
            raw = self.dest.read_bytes(name)
            try:
                record = json.loads(raw or b"")
                out[int(record["number"])] = record
            except (ValueError, KeyError, TypeError):
                continue
        return out

    def record(self, record: dict[str, Any]) -> None:
        """Store one finished shard's record (after the shard itself is published)."""
        self.dest.write_bytes(
            f"{_DONE}/{int(record['number']):06d}.json", json.dumps(record, ensure_ascii=False).encode()
        )

    def remove(self) -> None:
        self.dest.remove_tree(STATE_DIR)
        self.dest.cleanup()
