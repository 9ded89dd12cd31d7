"""Azurite's blob service on 127.0.0.1 (npm ``azurite``, installed by ``.ci/install-s3-servers``), in
memory, with the public development account: point fastload at it with
``AZURE_STORAGE_CONNECTION_STRING`` (:attr:`Azurite.connection_string`)."""

from __future__ import annotations

import shutil
import urllib.error
import urllib.request

from fastload.s3.azstore import _DEV_ACCOUNT, _DEV_KEY, azure_account
from tests.servers.process import ServerProcess


class Azurite(ServerProcess):
    name = "azurite"

    def __init__(self) -> None:
        super().__init__()
        self.endpoint = f"http://127.0.0.1:{self.port}/{_DEV_ACCOUNT}"
        self.connection_string = (
            f"DefaultEndpointsProtocol=http;AccountName={_DEV_ACCOUNT};AccountKey={_DEV_KEY};"
            f"BlobEndpoint={self.endpoint};"
        )

    def command(self) -> list[str]:
        exe = shutil.which("azurite-blob")
        if exe is None:
            raise RuntimeError("azurite-blob is not installed (npm install -g azurite)")
        where = ["--blobHost", "127.0.0.1", "--blobPort", str(self.port)]
        return [exe, "--silent", "--inMemoryPersistence", *where, "--skipApiVersionCheck"]

    def answers(self) -> bool:
        try:
            urllib.request.urlopen(f"{self.endpoint}?comp=list", timeout=1)
        except urllib.error.HTTPError:
            return True  # it answers (403: the request was not signed)
        return True

    def connection_string_via(self, endpoint_url: str) -> str:
        """The connection string with every request sent to ``endpoint_url`` (a proxy in front)."""
        return self.connection_string.replace(f"http://127.0.0.1:{self.port}", endpoint_url.rstrip("/"))

    def _send(self, method: str, url: str, data: bytes | None, headers: dict[str, str]) -> None:
        """A request signed with the development account's key (the environment must name Azurite)."""
        headers = {
            **headers,
            "Content-Length": str(len(data or b"")),
            "Content-Type": "application/octet-stream",
        }
        signed = azure_account().sign(method, url, headers)
        urllib.request.urlopen(urllib.request.Request(url, data=data, method=method, headers=signed)).read()

    def make_container(self, name: str) -> None:
        self._send("PUT", f"{self.endpoint}/{name}?restype=container", b"", {})

    def put(self, container: str, blob: str, data: bytes) -> None:
        self._send("PUT", f"{self.endpoint}/{container}/{blob}", data, {"x-ms-blob-type": "BlockBlob"})
