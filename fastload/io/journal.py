"""The resume journal of a pack run: a fingerprint of the plan, and one JSON line per finished shard."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

from fastload.errors import PackError
from fastload.io.localfs import atomic_write

STATE_DIR = ".fastload-pack"


class PackJournal:
    """State kept under ``DST/.fastload-pack/`` while a pack runs; removed when the index is written."""

    def __init__(self, dst: str) -> None:
        self.dir = os.path.join(dst, STATE_DIR)
        self.tmp_dir = os.path.join(self.dir, "tmp")
        self._state = os.path.join(self.dir, "state.json")
        self._lines = os.path.join(self.dir, "journal.jsonl")
        self._file: Any = None

    def exists(self) -> bool:
        return os.path.exists(self._state)

    def start(self, fingerprint: str, shards: int) -> None:
        """Begin a fresh run."""
        os.makedirs(self.tmp_dir, exist_ok=True)
        atomic_write(self._state, json.dumps({"fingerprint": fingerprint, "shards": shards}).encode())
        with open(self._lines, "wb"):
            pass

    def fingerprint(self) -> str:
        try:
            with open(self._state, "rb") as f:
                return str(json.load(f)["fingerprint"])
        except (OSError, ValueError, KeyError) as exc:
            raise PackError(
                f"the resume state in {self.dir} is unreadable ({exc}); "
                "delete the destination folder and pack again"
            ) from None

    def finished(self) -> dict[int, dict[str, Any]]:
        """Shard number -> recorded result, for every complete journal line (a torn last line is ignored)."""
        out: dict[int, dict[str, Any]] = {}
        try:
            with open(self._lines, "rb") as f:
                for line in f:
                    try:
                        record = json.loads(line)
                    except ValueError:
                        continue
                    out[int(record["number"])] = record
        except FileNotFoundError:
            pass
        shutil.rmtree(self.tmp_dir, ignore_errors=True)
        os.makedirs(self.tmp_dir, exist_ok=True)
        return out

    def record(self, record: dict[str, Any], *, fsync: bool) -> None:
        """Append one finished shard (its index entry and skips), flushed before returning."""
        if self._file is None:
            self._file = open(self._lines, "ab")  # noqa: SIM115 - closed in close()
        self._file.write(json.dumps(record, ensure_ascii=False).encode() + b"\n")
        self._file.flush()
        if fsync:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def remove(self) -> None:
        self.close()
        shutil.rmtree(self.dir, ignore_errors=True)
