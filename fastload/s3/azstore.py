"""Azure Blob Storage (``az://CONTAINER/PATH``) as a store: its transport behind ``s3.objectio``'s seam, so
its blobs are read by the same ranged reader as S3's (retries, the 206/``Content-Range`` checks, the
whole-object-200 rule, hedging, counters). Blob GETs carry ``Range`` and ``If-Match`` (the ETag, which Azure
honours), signed with the account's Shared Key or carrying a SAS token, over fastload's pooled HTTP/1.1
(:class:`~fastload.s3.transport.HttpPools`); folders are listed with ``comp=list`` (paged by ``NextMarker``).

Configured as Azure's own clients are: ``AZURE_STORAGE_CONNECTION_STRING`` (``AccountName``,
``AccountKey``, ``BlobEndpoint``, ``SharedAccessSignature``; ``UseDevelopmentStorage=true`` for Azurite), or
``AZURE_STORAGE_ACCOUNT`` with ``AZURE_STORAGE_KEY`` or ``AZURE_STORAGE_SAS_TOKEN``. The key and SAS never
reach a message. Writes: ``s3.azwrite``.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import hmac
import os
import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, quote, urlsplit

from fastload.config import S3Config
from fastload.errors import ConfigError, IndexFormatError
from fastload.s3.httpstore import get_document, http_pools
from fastload.s3.objectio import Abort, Body
from fastload.s3.reader import RangedReader
from fastload.s3.transport import HttpPools

VERSION = "2021-08-06"
# Azurite's well-known development account (public, in Azure's documentation)
_DEV_ACCOUNT = "devstoreaccount1"
_DEV_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
_SIGNED = (
    "content-encoding",
    "content-language",
    "content-length",
    "content-md5",
    "content-type",
    "date",
    "if-modified-since",
    "if-match",
    "if-none-match",
    "if-unmodified-since",
    "range",
)


@dataclass(frozen=True)
class AzureAccount:
    """Where blobs are (``endpoint``: ``https://ACCOUNT.blob.core.windows.net`` or Azurite's URL) and how
    requests are authorised (a Shared Key, a SAS token, or neither: a public container)."""

    name: str
    endpoint: str
    key: bytes | None = field(default=None, repr=False)
    sas: str | None = field(default=None, repr=False)

    def url(self, container: str, blob: str = "") -> str:
        path = f"/{quote(container, safe='')}" + (f"/{quote(blob)}" if blob else "")
        return self.endpoint + path

    def sign(self, method: str, url: str, headers: dict[str, str]) -> dict[str, str]:
        """``headers`` with ``x-ms-date``, ``x-ms-version`` and ``Authorization`` (Shared Key)."""
        sent = {**headers, "x-ms-date": email.utils.formatdate(usegmt=True), "x-ms-version": VERSION}
        if self.key is None:
            return sent
        lower = {k.lower(): v for k, v in sent.items()}
        parts = urlsplit(url)
        lines = [method, *(lower.get(h, "") for h in _SIGNED)]
        if lines[3] == "0":  # Content-Length
            lines[3] = ""
        ms = sorted((k, v.strip()) for k, v in lower.items() if k.startswith("x-ms-"))
        canon_headers = "".join(f"{k}:{v}\n" for k, v in ms)
        resource = f"/{self.name}{parts.path}"
        query: dict[str, list[str]] = {}
        for k, v in parse_qsl(parts.query, keep_blank_values=True):
            query.setdefault(k.lower(), []).append(v)
        resource += "".join(f"\n{k}:{','.join(sorted(v))}" for k, v in sorted(query.items()))
        text = "\n".join(lines) + "\n" + canon_headers + resource
        mac = hmac.new(self.key, text.encode("utf-8"), hashlib.sha256).digest()
        sent["Authorization"] = f"SharedKey {self.name}:{base64.b64encode(mac).decode()}"
        return sent

    def with_sas(self, url: str) -> str:
        if not self.sas:
            return url
        return f"{url}{'&' if '?' in url else '?'}{self.sas.lstrip('?')}"


def _parse_connection_string(text: str) -> dict[str, str]:
    pairs = [p.split("=", 1) for p in text.split(";") if "=" in p]
    return {k.strip(): v.strip() for k, v in pairs}


def azure_account() -> AzureAccount:
    """The account from the environment, as Azure's clients read it (see the module docstring)."""
    conn = os.environ.get("AZURE_STORAGE_CONNECTION_STRING", "").strip()
    if conn:
        values = _parse_connection_string(conn)
        if values.get("UseDevelopmentStorage", "").lower() == "true":
            proxy = values.get("DevelopmentStorageProxyUri", "http://127.0.0.1").rstrip("/")
            values = {
                "AccountName": _DEV_ACCOUNT,
                "AccountKey": _DEV_KEY,
                "BlobEndpoint": f"{proxy}:10000/{_DEV_ACCOUNT}",
            }
        name = values.get("AccountName", "")
        endpoint = values.get("BlobEndpoint") or (
            f"{values.get('DefaultEndpointsProtocol', 'https')}://{name}.blob."
            f"{values.get('EndpointSuffix', 'core.windows.net')}"
        )
        key, sas = values.get("AccountKey"), values.get("SharedAccessSignature")
    else:
        name = os.environ.get("AZURE_STORAGE_ACCOUNT", "").strip()
        if not name:
            raise ConfigError(
                "az:// needs an Azure storage account: set AZURE_STORAGE_CONNECTION_STRING, or "
                "AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN"
            )
        endpoint = f"https://{name}.blob.core.windows.net"
        key = os.environ.get("AZURE_STORAGE_KEY") or None
        sas = os.environ.get("AZURE_STORAGE_SAS_TOKEN") or None
    if not name and key:
        raise ConfigError("AZURE_STORAGE_CONNECTION_STRING has an AccountKey but no AccountName")
    try:
        secret = base64.b64decode(key, validate=True) if key else None
    except ValueError:
        raise ConfigError("the Azure account key is not base64 (AZURE_STORAGE_KEY / AccountKey)") from None
    return AzureAccount(name, endpoint.rstrip("/"), secret, sas)


def parse_az_url(url: str) -> tuple[str, str]:
    """``(container, blob path)`` of ``az://CONTAINER/PATH``."""
    if not url.startswith("az://"):
        raise ConfigError(f"{url!r} is not an az:// URL")
    container, _, path = url[len("az://") :].partition("/")
    if not container:
        raise ConfigError(f"{url!r}: write az://CONTAINER/PATH")
    return container, path


class AzureBlob:
    """Requests on one blob: GETs with ``Range`` and ``If-Match``, a HEAD (Get Blob Properties)."""

    abortable = True

    def __init__(self, pools: HttpPools, account: AzureAccount, container: str, blob: str) -> None:
        self._pools, self._account = pools, account
        self._url = account.with_sas(account.url(container, blob))

    def get(self, headers: dict[str, str], *, abort: Abort | None = None, fresh: bool = False) -> Body:
        return self._pools.send("GET", self._url, self._account.sign("GET", self._url, headers), abort, fresh)

    def head(self, headers: dict[str, str]) -> Body:
        return self._pools.send("HEAD", self._url, self._account.sign("HEAD", self._url, headers))


def open_azure(url: str, config: S3Config) -> RangedReader:
    container, blob = parse_az_url(url)
    if not blob or blob.endswith("/"):
        raise ConfigError(f"{url!r} names a folder, not a blob; give the blob's full path")
    account = azure_account()

    def store() -> AzureBlob:
        return AzureBlob(http_pools(config), account, container, blob)

    return RangedReader("", url, config=config, store=store, url=url)


_BLOB = re.compile(r"<Blob>.*?<Name>(.*?)</Name>.*?<Content-Length>(\d+)</Content-Length>.*?</Blob>", re.S)
_MARKER = re.compile(r"<NextMarker>(.*?)</NextMarker>", re.S)


def _xml_text(text: str) -> str:
    return (
        text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", '"')
        .replace("&apos;", "'")
        .replace("&amp;", "&")
    )


def list_azure(root: str, config: S3Config) -> list[tuple[str, int]]:
    """``(az:// URL, size)`` of every blob under the folder ``root`` (recursive), in name order."""
    container, prefix = parse_az_url(root)
    prefix = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
    account = azure_account()
    base = account.url(container) + f"?restype=container&comp=list&prefix={quote(prefix, safe='')}"
    found: list[tuple[str, int]] = []
    marker = ""
    while True:
        url = account.with_sas(base + (f"&marker={quote(marker, safe='')}" if marker else ""))
        data, _ = get_document(url, config, account.sign("GET", url, {}))
        text = data.decode("utf-8", "replace")
        if "<EnumerationResults" not in text:
            raise IndexFormatError(f"{root}: Azure's blob listing answered something that is not its XML")
        found += [
            (f"az://{container}/{_xml_text(m.group(1))}", int(m.group(2))) for m in _BLOB.finditer(text)
        ]
        next_marker = _MARKER.search(text)
        marker = _xml_text(next_marker.group(1)) if next_marker else ""
        if not marker:
            return sorted(found)
