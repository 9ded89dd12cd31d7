"""Progress bars (tqdm): bytes and files (or documents) per second, toward a total or open-ended; silent
when not on a terminal or when asked."""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import Any

from tqdm import tqdm


class Progress:
    """A thread-safe byte counter (or of another ``unit``: ``optimize`` counts inputs, toward their number for
    an ETA) shown as a tqdm bar with a files/s figure (``items``/s). When not shown, no tqdm object is
    made at all (even a disabled one starts tqdm's monitor thread)."""

    def __init__(
        self,
        *,
        total: int | None,
        initial: int = 0,
        enabled: bool | None,
        desc: str,
        items: str = "files",
        unit: str = "B",
    ) -> None:
        show = sys.stderr.isatty() if enabled is None else enabled
        self._bar: tqdm[Any] | None = None
        self._lock = threading.Lock()
        self._files = 0
        self._items = items
        self._start = time.monotonic()
        self._shown = self._start
        if not show:
            return
        self._bar = tqdm(
            total=total,
            initial=initial,
            unit=unit,
            unit_scale=unit == "B",
            unit_divisor=1024,
            desc=desc,
            disable=not show,
            file=sys.stderr,
            dynamic_ncols=True,
        )

    def advance(self, nbytes: int, files: int) -> None:
        if self._bar is None:
            return
        with self._lock:
            self._files += files
            self._bar.update(nbytes)
            now = time.monotonic()
            if now - self._shown >= 0.5:
                self._shown = now
                rate = f"{self._files / (now - self._start):,.0f} {self._items}/s"
                self._bar.set_postfix_str(rate, refresh=False)

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.close()
