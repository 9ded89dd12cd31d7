"""A test server run as a subprocess on a free 127.0.0.1 port: started, waited for until it answers (30 s
at most), stopped (terminate, then kill); a context manager. A server says how it is started
(:meth:`ServerProcess.command`) and how it is seen to answer (:meth:`ServerProcess.answers`):
``gcs.GcsEmulator``, ``azurite.Azurite``."""

from __future__ import annotations

import socket
import subprocess
import time
from typing import TypeVar

START_TIMEOUT_S = 30.0
_S = TypeVar("_S", bound="ServerProcess")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ServerProcess:
    """One server process on :attr:`port` (picked free when made)."""

    name = "server"

    def __init__(self) -> None:
        self.port = free_port()
        self._proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        """The command line that serves on :attr:`port`."""
        raise NotImplementedError

    def answers(self) -> bool:
        """True once the server answers a request; an OSError (nothing listening yet) means not yet."""
        raise NotImplementedError

    def start(self: _S) -> _S:
        cmd = self.command()
        self._proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                if self.answers():
                    return self
            except OSError:
                if self._proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited at start ({' '.join(cmd)})") from None
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer within {START_TIMEOUT_S:g} s")

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def __enter__(self: _S) -> _S:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
