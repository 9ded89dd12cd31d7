"""What the test servers (:mod:`.s3serve`, :mod:`.httpserve`) share: a ``socketserver`` served on a daemon
thread, closed (shut down, socket closed, thread joined) by ``close()`` or at the end of a ``with`` block."""

from __future__ import annotations

import socketserver
import threading
from types import TracebackType
from typing import Any, TypeVar

S = TypeVar("S", bound="ServedOnAThread")


class ServedOnAThread:
    """The lifecycle half of a test server; a subclass's ``start()`` builds its server and calls
    :meth:`_serve`."""

    _server: Any = None
    _thread: threading.Thread | None = None

    def start(self: S) -> S:
        raise NotImplementedError

    def _serve(self, server: socketserver.BaseServer, name: str) -> None:
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.1}, name=name, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None

    def __enter__(self: S) -> S:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


__all__ = ["ServedOnAThread"]
