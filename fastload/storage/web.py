"""``http(s)://`` and ``hf://`` URLs as storage: an object opened for ranged reads (``hf://`` resolved to the
Hub's ``/resolve/`` URL, its token sent to the Hub only; ``gs://`` by ``s3.gcsstore``), and a folder
listed where the store can list (the Hub's tree API, GCS's listing; a plain web server cannot be listed: a
dataset there has an ``index.json``, or its shards are given as a brace pattern)."""

from __future__ import annotations

import json
import re

from fastload.config import S3Config
from fastload.core.weburls import parse_hf_url
from fastload.errors import ConfigError, IndexFormatError
from fastload.s3.httpstore import get_document, open_http
from fastload.s3.reader import RangedReader

HUB_ENDPOINT = "https://huggingface.co"
_NEXT = re.compile(r'<([^>]+)>\s*;\s*rel="?next"?')


def hub_endpoint(config: S3Config) -> str:
    return (config.hf_endpoint or HUB_ENDPOINT).rstrip("/")


def _hub_headers(config: S3Config) -> dict[str, str]:
    return {"Authorization": f"Bearer {config.hf_token}"} if config.hf_token else {}


def http_url(url: str, config: S3Config) -> str:
    """The http(s) URL the bytes of ``url`` are read from (``hf://`` resolved; others as they are)."""
    if url.startswith("hf://"):
        return parse_hf_url(url).resolve_url(hub_endpoint(config))
    return url


def open_web(url: str, config: S3Config) -> RangedReader:
    """The ranged reader of the object at ``url`` (``http://``, ``https://``, ``hf://`` or ``gs://``)."""
    if url.startswith("gs://"):
        from fastload.s3.gcsstore import open_gcs

        return open_gcs(url, config)
    if url.startswith("az://"):
        from fastload.s3.azstore import open_azure

        return open_azure(url, config)
    if url.startswith("hf://"):
        hub = parse_hf_url(url)
        if not hub.path:
            raise ConfigError(f"{url!r} names a repository, not a file; add the file's path")
        return open_http(hub.resolve_url(hub_endpoint(config)), config, headers=_hub_headers(config))
    return open_http(url, config)


def list_web(root: str, suffix: str, config: S3Config) -> list[str]:
    """The files under ``root`` whose names end with ``suffix``, sorted (``hf://``: the Hub's tree API,
    recursive; ``gs://``: GCS's object listing; ``http(s)://``: :class:`ConfigError`, a web server cannot
    be listed)."""
    if root.startswith("gs://"):
        from fastload.s3.gcsstore import list_gcs

        return [url for url, _size in list_gcs(root, config) if url.endswith(suffix)]
    if root.startswith("az://"):
        from fastload.s3.azstore import list_azure

        return [url for url, _size in list_azure(root, config) if url.endswith(suffix)]
    if not root.startswith("hf://"):
        raise ConfigError(
            f"{root}: a web server's folders cannot be listed; read a dataset there by its index.json "
            f"(`fastload pack` or `fastload index` writes one), or give its shards as a brace pattern "
            f"({root.rstrip('/')}/shard-{{000000..000099}}.tar)"
        )
    hub = parse_hf_url(root)
    url: str | None = hub.tree_url(hub_endpoint(config))
    found: list[str] = []
    headers = _hub_headers(config)
    while url is not None:
        data, answer = get_document(url, config, headers)
        try:
            entries = json.loads(data)
        except ValueError:
            raise IndexFormatError(f"{url}: the Hub's tree API answered something that is not JSON") from None
        if not isinstance(entries, list):
            raise IndexFormatError(f"{url}: the Hub's tree API answered {type(entries).__name__}, not a list")
        found += [
            hub.child(e["path"])
            for e in entries
            if isinstance(e, dict) and e.get("type") == "file" and str(e.get("path", "")).endswith(suffix)
        ]
        link = _NEXT.search(answer.get("link", ""))
        url = link.group(1) if link else None
    return sorted(found)
