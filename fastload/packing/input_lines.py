"""The inputs of ``fastload optimize --inputs FILE``: a text file, one input a line."""

from __future__ import annotations

import os
from collections.abc import Iterator

from fastload.errors import ConfigError


class InputLines:
    """The inputs of a text file, one per line (``-``: standard input, read whole): each line without its
    line break, empty lines left out. Counted on the first ``len()`` (a pass over the file), so that the
    progress bar has an ETA; read again, a line at a time, when iterated."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lines: list[str] | None = None
        self._count: int | None = None
        if path == "-":
            import sys

            self._lines = [ln for ln in sys.stdin.read().splitlines() if ln]
        elif not os.path.isfile(path):
            raise ConfigError(f"--inputs {path}: no such file (give a text file of inputs, one per line)")

    def __iter__(self) -> Iterator[str]:
        if self._lines is not None:
            yield from self._lines
            return
        with open(self.path, encoding="utf-8", newline=None) as f:
            for line in f:
                line = line.rstrip("\n")
                if line:
                    yield line

    def __len__(self) -> int:
        if self._count is None:
            self._count = sum(1 for _ in self)
        return self._count


__all__ = ["InputLines"]
