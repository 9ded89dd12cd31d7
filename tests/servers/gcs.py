"""A Google Cloud Storage emulator on 127.0.0.1 (``gcp-storage-emulator`` from PyPI, installed by
``.ci/install-s3-servers``): GCS's JSON API (objects, listing, media and multipart uploads, ranged
downloads), in memory. It sends no ``x-goog-generation`` on downloads and ignores ``ifGenerationMatch``,
so against it fastload pins an object by the generation a HEAD (its metadata) reports and by its size.

    with GcsEmulator() as gcs:
        gcs.make_bucket("bk"); gcs.put("bk", "a/b.bin", b"...")
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from urllib.parse import quote


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class GcsEmulator:
    """``gcp-storage-emulator start`` in a subprocess; :attr:`host` is for ``STORAGE_EMULATOR_HOST``."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.host}"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> GcsEmulator:
        exe = shutil.which("gcp-storage-emulator")
        cmd = [exe] if exe else [sys.executable, "-m", "gcp_storage_emulator"]
        self._proc = subprocess.Popen(
            [*cmd, "start", "--host=127.0.0.1", f"--port={self.port}", "--in-memory"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.url}/", timeout=1).read()
                return self
            except OSError:
                if self._proc.poll() is not None:
                    raise RuntimeError("gcp-storage-emulator exited at start") from None
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("gcp-storage-emulator did not answer within 30 s")

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def __enter__(self) -> GcsEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def make_bucket(self, name: str) -> None:
        body = json.dumps({"name": name}).encode()
        req = urllib.request.Request(
            f"{self.url}/storage/v1/b?project=test", data=body, headers={"Content-Type": "application/json"}
        )
        urllib.request.urlopen(req).read()

    def put(self, bucket: str, name: str, data: bytes) -> dict[str, str]:
        """Upload ``data`` as ``gs://bucket/name``; its metadata (``generation``...)."""
        url = f"{self.url}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={quote(name, safe='')}"
        req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/octet-stream"})
        meta: dict[str, str] = json.loads(urllib.request.urlopen(req).read())
        return meta
