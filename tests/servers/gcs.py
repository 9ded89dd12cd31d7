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
import sys
import urllib.request
from urllib.parse import quote

from tests.servers.process import ServerProcess


class GcsEmulator(ServerProcess):
    """``gcp-storage-emulator start`` in a subprocess; :attr:`host` is for ``STORAGE_EMULATOR_HOST``."""

    name = "gcp-storage-emulator"

    def __init__(self) -> None:
        super().__init__()
        self.host = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.host}"

    def command(self) -> list[str]:
        exe = shutil.which("gcp-storage-emulator")
        cmd = [exe] if exe else [sys.executable, "-m", "gcp_storage_emulator"]
        return [*cmd, "start", "--host=127.0.0.1", f"--port={self.port}", "--in-memory"]

    def answers(self) -> bool:
        urllib.request.urlopen(f"{self.url}/", timeout=1).read()
        return True

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
