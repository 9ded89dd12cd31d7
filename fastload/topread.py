"""Where ``fastload top`` reads a job's telemetry records: a local folder of ``telemetry-rank{R}.jsonl``
files, or an ``s3://``, ``gs://`` or ``az://`` prefix of the segment objects
``telemetry-rank{R}/{seq:08d}.jsonl`` that :class:`fastload.train.exporters.JsonLines` writes there (see
:mod:`fastload.storage.objectlog`; a copy of such a prefix in a local folder reads the same)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fastload.config import S3Config
from fastload.errors import ConfigError
from fastload.storage.objectlog import is_store, list_segments, read_lines

Records = dict[int, list[dict[str, Any]]]
_LOG = re.compile(r"telemetry-rank\d+")
_SEGMENT = re.compile(r"\d{8,}\.jsonl")
READERS = 16  # GETs at once from a store


def read_records(source: str, *, latest: bool = False, config: S3Config | None = None) -> Records:
    """Every whole record of every rank under ``source`` (a folder or a store URL), by rank, oldest first
    (a line still being written, or a damaged one, is left out). ``latest``: from a store, only each rank's
    newest segment (enough for the table; ``--plot`` reads them all)."""
    if is_store(source):
        return _from_store(source.rstrip("/"), latest, config or S3Config.from_env())
    if "://" in source and not source.startswith("file://"):
        raise ConfigError(
            f"{source!r}: fastload top reads a local folder or an s3://, gs:// or az:// URL, the one given "
            "as telemetry= to fastload.loader, or Prometheus endpoints (http://HOST:PORT/metrics[,...])"
        )
    return _from_folder(source.removeprefix("file://"))


def _from_folder(folder: str) -> Records:
    root = Path(folder)
    if not root.is_dir():
        raise ConfigError(
            f"{folder!r} is not a folder of telemetry files; pass the folder given as "
            "telemetry= to fastload.loader (it holds telemetry-rank0.jsonl, ...)"
        )
    files = sorted(root.glob("telemetry-rank*.jsonl"))  # appended by JsonLines(folder)
    for sub in sorted(p for p in root.iterdir() if p.is_dir() and _LOG.fullmatch(p.name)):
        files += sorted(p for p in sub.iterdir() if _SEGMENT.fullmatch(p.name))  # copied from a store
    return _parse(p.read_text(encoding="utf-8", errors="replace").splitlines() for p in files)


def _from_store(url: str, latest: bool, config: S3Config) -> Records:
    logs = {name: urls for name, urls in list_segments(url, config=config).items() if _LOG.fullmatch(name)}
    if not logs:
        return {}
    urls = [u for segments in logs.values() for u in (segments[-1:] if latest else segments)]
    with ThreadPoolExecutor(min(READERS, len(urls)), thread_name_prefix="fastload-top") as pool:
        texts = list(pool.map(lambda u: read_lines(u, config=config), urls))
    return _parse(texts)


def _parse(texts: Iterable[list[str]]) -> Records:
    out: Records = {}
    for lines in texts:
        records = []
        for line in lines:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and "rank" in record:
                records.append(record)
        if records:
            out.setdefault(int(records[-1]["rank"]), []).extend(records)
    return out


def no_records(source: str) -> ConfigError:
    """The error for a store URL that holds no telemetry (``--once``, ``--plot``)."""
    return ConfigError(
        f"{source} holds no telemetry (no telemetry-rank*/ segment objects under it); pass the URL given as "
        "telemetry= to fastload.loader (a job writes its first records telemetry_every steps in, and "
        "they reach the store a few seconds later)"
    )
