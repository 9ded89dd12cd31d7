"""What a ``fastload cp`` finds at both ends, and which objects are already the same there: the I/O half
of the sync decision (:mod:`fastload.core.syncplan` is the pure half).

The destination is listed once (one ListObjectsV2 walk, or one ``stat`` per local target). A check of an
object of equal size reads the local copy (CRC32C, MD5 or a multipart ETag; ``jobs`` files at once) or,
for S3 to S3, HEADs the destination for the source ETag a server-side copy recorded. For S3 to local the
source's ``index.json`` gives each shard's and table's CRC32C: it is read from the local copy when that is
already the same object (its MD5 equals the ETag), else with one GET, and only when some local file of
its dataset has the size of its source."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from crc32c import crc32c

from fastload.config import S3Config
from fastload.core.index import INDEX_NAME, INDEX_NAMES, SIDECAR_DIR
from fastload.core.syncplan import (
    Check,
    Found,
    Known,
    Step,
    crc_digest,
    decide,
    index_checksums,
    plain_md5,
    verdict,
)
from fastload.errors import AccessDeniedError, ConfigError, NotFoundError
from fastload.storage import access as storage
from fastload.storage.manifest import JOURNAL_DIR

PART = re.compile(r"\.(?P<name>.+)\.[a-z0-9_]{8}\.part")  # a download's temporary name (mkstemp's letters)
CHUNK_BYTES = 8 << 20
NOT_LISTED = "not listed (ListObjectsV2 denied): copied without a comparison"
AWS_CLI_PART_BYTES = 8 << 20  # the AWS CLI's (and boto3's) default multipart chunk size


@dataclass(frozen=True)
class Item:
    """One object of a copy: its ``name`` relative to the copied prefix or folder (``/``-separated), where
    it is at the source and goes at the destination (an S3 key or a local path), its size and, from S3,
    its ETag."""

    name: str
    src: str
    dst: str
    size: int
    etag: str = ""


@dataclass
class Ends:
    """The objects of a copy and its two ends (a bucket, or None for local disk)."""

    items: list[Item]
    src_bucket: str | None
    dst_bucket: str | None
    dst_prefix: str  # the destination prefix listed for a sync (S3)
    unlisted: str = ""  # one object to a local path copied without a request to decide: why
    unfinished: list[str] = field(default_factory=list)  # downloads' .part files left out of an upload
    journal: list[str] = field(default_factory=list)  # an append's journal left out (:func:`_journal_apart`)


def _journal_apart(items: list[Item]) -> tuple[list[Item], list[str]]:
    """``items`` less the files of a pack journal (``.fastload-pack/``) beside a dataset's ``index.json``:
    an append running or killed at the source. Copied, they would make the destination look like an append
    of its own in progress; without an ``index.json`` (a first pack unfinished) the journal is what says the
    folder is unfinished, so it is copied then."""
    if not any(i.name in INDEX_NAMES for i in items):
        return items, []
    mine = [i for i in items if i.name.split("/", 1)[0] == JOURNAL_DIR]
    return [i for i in items if i.name.split("/", 1)[0] != JOURNAL_DIR], [i.src for i in mine]


def list_ends(src: str, dst: str, *, recursive: bool, config: S3Config) -> Ends:
    """Every object of a copy from ``src`` to ``dst``, where it goes, and what the source says of it (size,
    ETag): listed, and checked for keys that would land outside a local DST."""
    from fastload.s3.client import parse_s3_url
    from fastload.s3.listing import ObjectInfo, list_objects
    from fastload.storage.s3source import unsafe_key_part

    src_bucket, key = parse_s3_url(src) if storage.is_remote(src) else (None, "")
    dst_bucket, dst_key = parse_s3_url(dst) if storage.is_remote(dst) else (None, "")
    if src_bucket is not None and not recursive:
        base = key.rsplit("/", 1)[-1]
        if dst_bucket is None:
            target = os.path.join(dst, base) if dst.endswith("/") or os.path.isdir(dst) else dst
            if not os.path.lexists(target):
                return Ends([Item(base, key, target, -1)], src_bucket, None, "", unlisted="new")
        else:
            target = dst_key + base if not dst_key or dst_key.endswith("/") else dst_key
        try:
            listed = list(list_objects(src_bucket, key, config=config))
        except AccessDeniedError:
            if dst_bucket is not None:
                raise
            return Ends([Item(base, key, target, -1)], src_bucket, None, "", unlisted=NOT_LISTED)
        found = [o for o in listed if isinstance(o, ObjectInfo) and o.key == key]
        if not found:
            raise NotFoundError(
                f"{src}: no such object (check the key; use --recursive for a prefix)", path=src
            )
        item = Item(base, key, target, found[0].size, found[0].etag.strip('"'))
        return Ends([item], src_bucket, dst_bucket, target)
    if src_bucket is not None:
        prefix = key if not key or key.endswith("/") else key + "/"
        to = dst_key if not dst_key or dst_key.endswith("/") else dst_key + "/"
        items: list[Item] = []
        for obj in list_objects(src_bucket, prefix, config=config):
            if not isinstance(obj, ObjectInfo) or (obj.key.endswith("/") and obj.size == 0):
                continue
            rel = obj.key[len(prefix) :]
            if dst_bucket is None:
                problem = unsafe_key_part(rel)
                if problem:
                    raise ConfigError(
                        f"refusing to copy s3://{src_bucket}/{obj.key}: its key {problem}, so it could land "
                        f"outside {dst}; copy the other objects by narrower prefixes or rename it"
                    )
                target = os.path.join(dst, *rel.split("/"))
            else:
                target = to + rel
            items.append(Item(rel, obj.key, target, obj.size, obj.etag.strip('"')))
        if dst_bucket is None:
            root = os.path.realpath(dst)
            for item in items:
                if not os.path.realpath(item.dst).startswith(root + os.sep):
                    raise ConfigError(f"refusing to write {item.dst}: it resolves outside {dst}")
        if not items:
            raise NotFoundError(f"no objects under {src}", path=src)
        items, journal = _journal_apart(items)
        return Ends(items, src_bucket, dst_bucket, to, journal=journal)
    assert dst_bucket is not None  # (local to local is refused before)
    if not recursive:
        if not os.path.isfile(src):
            raise NotFoundError(f"{src} is not a file (use --recursive for a folder)", path=src)
        target = dst_key + os.path.basename(src) if not dst_key or dst_key.endswith("/") else dst_key
        item = Item(os.path.basename(src), src, target, os.path.getsize(src))
        return Ends([item], None, dst_bucket, target)
    if not os.path.isdir(src):
        what = "a file: drop --recursive (-r) to copy one file" if os.path.isfile(src) else "not found"
        raise NotFoundError(f"{src} is {what}", path=src)
    files = storage.list_files(storage.normalise(src), "")
    unfinished = [f for f in files if PART.fullmatch(os.path.basename(f))]
    files = [f for f in files if not PART.fullmatch(os.path.basename(f))]
    if not files:
        raise NotFoundError(f"no files under {src}: nothing to copy", path=src)
    prefix = dst_key if not dst_key or dst_key.endswith("/") else dst_key + "/"
    base = storage.normalise(src)
    items = []
    for f in files:
        rel = os.path.relpath(f, base).replace(os.sep, "/")
        items.append(Item(rel, f, prefix + rel, os.path.getsize(f)))
    items, journal = _journal_apart(items)
    return Ends(items, None, dst_bucket, prefix, unfinished=unfinished, journal=journal)


def scan(
    items: Sequence[Item],
    *,
    src_bucket: str | None,
    dst_bucket: str | None,
    dst_prefix: str,
    config: S3Config,
    jobs: int,
) -> list[Step]:
    """Each item's :class:`~fastload.core.syncplan.Step` (copy or skip, and why), in ``items`` order.
    ``src_bucket``/``dst_bucket``: the bucket of an S3 end, None for local disk; ``dst_prefix``: the
    destination prefix to list (S3)."""
    from fastload.s3.upload import part_size_for

    there = _destination(items, dst_bucket, dst_prefix, config)
    if there is None:  # credentials that may write but not list (s3:ListBucket): copy, as cp did before
        return [Step(item.name, True, NOT_LISTED) for item in items]
    known = _index_checksums(items, there, src_bucket, config) if src_bucket and not dst_bucket else {}
    steps = [
        decide(
            item.name,
            Found(item.size, item.etag),
            there.get(item.dst),
            src_remote=src_bucket is not None,
            dst_remote=dst_bucket is not None,
            known=known.get(item.name),
            part_sizes=[part_size_for(item.size, p) for p in (config.part_size_bytes, AWS_CLI_PART_BYTES)],
        )
        for item in items
    ]
    pending = [i for i, step in enumerate(steps) if step.check is not None and step.copy is None]
    if pending:

        def digest(i: int) -> str | None:
            check = steps[i].check
            assert check is not None  # (pending holds only steps with a check)
            return _digest(check, items[i], dst_bucket, config)

        with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="fastload-sync") as pool:
            for i, found in zip(pending, pool.map(digest, pending), strict=True):
                steps[i] = verdict(steps[i], found)
    return steps


def _destination(
    items: Sequence[Item], dst_bucket: str | None, dst_prefix: str, config: S3Config
) -> dict[str, Found] | None:
    """What is at the destination of each item (absent: nothing there); None when it may not be listed."""
    out: dict[str, Found] = {}
    if dst_bucket is None:
        for item in items:
            with contextlib.suppress(OSError):
                st = os.stat(item.dst)
                if os.path.isfile(item.dst):
                    out[item.dst] = Found(st.st_size)
        return out
    from fastload.s3.listing import ObjectInfo, list_objects

    wanted = {item.dst for item in items}
    try:
        for obj in list_objects(dst_bucket, dst_prefix, config=config):
            if isinstance(obj, ObjectInfo) and obj.key in wanted:
                out[obj.key] = Found(obj.size, obj.etag.strip('"'))
    except AccessDeniedError:
        return None
    return out


def _index_checksums(
    items: Sequence[Item], there: dict[str, Found], src_bucket: str, config: S3Config
) -> dict[str, Known]:
    """Name -> the CRC32C the source's ``index.json`` files record (S3 to local), read only for datasets
    with a local file of its source's size."""
    from fastload.storage.access import read_bytes

    out: dict[str, Known] = {}
    by_name = {item.name: item for item in items}
    for item in items:
        if item.name.rsplit("/", 1)[-1] != INDEX_NAME:
            continue
        folder = item.name[: -len(INDEX_NAME)]  # "" or ending in "/"
        parquet = folder == f"{SIDECAR_DIR}/" or folder.endswith(f"/{SIDECAR_DIR}/")
        root = folder[: -len(SIDECAR_DIR) - 1] if parquet else folder  # the dataset's folder
        if not any(
            name.startswith(root) and name != item.name and (at := there.get(o.dst)) and at.size == o.size
            for name, o in by_name.items()
        ):
            continue
        local = there.get(item.dst)
        data: bytes | None = None
        if local is not None and local.size == item.size and plain_md5(item.etag):
            with contextlib.suppress(OSError):
                if md5_file(item.dst) == item.etag.strip('"').lower():
                    with open(item.dst, "rb") as held:
                        data = held.read()
        if data is None:
            data = read_bytes(f"s3://{src_bucket}/{item.src}", config=config)
        try:
            raw = json.loads(data)
        except ValueError:
            continue  # not JSON: its dataset's objects are compared by ETag
        if isinstance(raw, dict):
            out.update(index_checksums(raw, root))
    return out


def _digest(check: Check, item: Item, dst_bucket: str | None, config: S3Config) -> str | None:
    """The digest ``check`` asks for of ``item`` (None when it cannot be had)."""
    if check.kind == "recorded-etag":
        from fastload.s3.servercopy import recorded_source_etag

        assert dst_bucket is not None  # (S3 to S3)
        return recorded_source_etag(dst_bucket, item.dst, config=config)
    path = item.dst if check.local == "dst" else item.src
    try:
        if check.kind == "crc32c":
            return crc_file(path, trailer=check.content is not None)
        if check.kind == "md5":
            return md5_file(path)
        found = None
        for part in check.part_sizes:
            found = multipart_etag(path, part)
            if found == check.expected:
                break
        return found
    except OSError:
        return None  # gone or unreadable since listed: copied (and an error there names it)


def crc_file(path: str, *, trailer: bool = False) -> str:
    """:func:`~fastload.core.syncplan.crc_digest` of a local file (with its last 4 bytes, for a table)."""
    crc = 0
    last = b""
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            crc = crc32c(chunk, crc)
            last = (last + chunk[-4:])[-4:]
    return crc_digest(crc, last if trailer else None)


def md5_file(path: str) -> str:
    """The MD5 of a local file, in hex (a plain S3 ETag's)."""
    md5 = hashlib.md5()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            md5.update(chunk)
    return md5.hexdigest()


def multipart_etag(path: str, part_bytes: int) -> str:
    """The ETag S3 gives a multipart upload of a local file in parts of ``part_bytes``: the MD5 of its
    parts' MD5s, ``-`` and the part count."""
    digests = []
    with open(path, "rb") as f:
        while True:
            md5 = hashlib.md5()
            left = part_bytes
            while left and (chunk := f.read(min(left, CHUNK_BYTES))):
                md5.update(chunk)
                left -= len(chunk)
            if left == part_bytes:
                break
            digests.append(md5.digest())
    return f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(digests)}"
