"""``fastload cp``: copy an object or a prefix between S3 and local disk with the parallel reader/uploader.

Downloads land under their final name only when complete (temporary name, then rename); a prefix copy
never writes outside DST: keys with ``..`` or ``.`` segments, absolute paths or NUL are refused. A prefix
copy publishes every dataset's ``index.json`` last, in either direction, once everything else has arrived
(:func:`manifests_last`): a copy that fails or is interrupted leaves no ``index.json`` at the destination,
so it never opens as a dataset missing shards. A progress bar (bytes, files/s) runs on stderr when it is a
terminal.

Leftovers of killed runs: a download holds an ``flock`` on its temporary ``.NAME.XXXXXXXX.part`` while it
writes, so the next download of NAME deletes the ones nobody holds, and an upload of a folder skips them
(they are not data); an upload aborts the multipart uploads a killed upload left open on the keys it writes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from io import RawIOBase

from fastload.config import S3Config
from fastload.core.index import INDEX_NAME
from fastload.core.weburls import is_web
from fastload.errors import AccessDeniedError, ConfigError, FastloadError, NotFoundError, write_error
from fastload.packing.progress import Progress
from fastload.storage import access as storage
from fastload.storage.localfs import file_mode
from fastload.storage.urls import check_url, check_writable

PART = re.compile(r"\.(?P<name>.+)\.[a-z0-9_]{8}\.part")  # a download's temporary name (mkstemp's letters)


@dataclass
class CopyReport:
    files: int = 0
    bytes: int = 0
    copied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # unfinished downloads left out of an upload

    def summary(self) -> str:
        text = f"copied {self.files} file(s), {self.bytes:,} bytes"
        if self.skipped:
            text += (
                f"; skipped {len(self.skipped)} unfinished download(s) of fastload cp (.NAME.XXXXXXXX.part, "
                f"e.g. {self.skipped[0]}): delete them, or download again to have them removed"
            )
        return text


def sweep_parts(folder: str, name: str | None = None) -> int:
    """Delete the temporary files of downloads of ``name`` (None: of any name) into ``folder`` that no live
    download holds (left by a killed ``fastload cp``); return how many."""
    removed = 0
    stale: list[str] = []  # (a folder not made yet holds none)
    with contextlib.suppress(OSError), os.scandir(folder) as it:
        stale = [e.path for e in it if (m := PART.fullmatch(e.name)) and name in (None, m["name"])]
    for path in stale:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.unlink(path)
            removed += 1
        except OSError:  # (BlockingIOError: a live download's)
            pass
        finally:
            os.close(fd)
    return removed


def download(
    bucket: str,
    key: str,
    path: str,
    *,
    config: S3Config,
    progress: Progress | None = None,
    sweep: bool = True,
    opener: Callable[[], RawIOBase] | None = None,
) -> int:
    """Download ``s3://bucket/key`` to ``path`` (atomically: a temporary name, renamed when complete);
    ``progress`` advances by each piece written and by one file when it is renamed into place. ``sweep``:
    first remove the temporary files killed downloads of it left (a prefix copy sweeps each folder once).
    ``opener``: the reader of another store's object (``bucket`` and ``key`` then unused)."""
    from fastload.s3.reader import RangedReader

    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    if sweep:
        sweep_parts(folder, os.path.basename(path))  # those of killed downloads
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".part")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held while it is written: a later sweep_parts leaves it alone
        os.fchmod(fd, file_mode())  # as cp and open() make it, not mkstemp's 0600
        total = 0
        reader = opener() if opener is not None else RangedReader(bucket, key, config=config)
        with os.fdopen(fd, "wb") as out, reader:
            buf = memoryview(bytearray(config.part_size_bytes))
            while n := reader.readinto(buf):
                out.write(buf[:n])
                total += n
                if progress is not None:
                    progress.advance(n, 0)
        os.replace(tmp, path)
        if progress is not None:
            progress.advance(0, 1)
        return total
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, FastloadError):
            # the disk's fault (S3 reads fail as FastloadErrors): name the file, not only "No space left"
            raise write_error(exc, path, command="cp") from exc
        raise


def manifests_last(names: list[str]) -> tuple[list[str], list[str]]:
    """``(everything else, manifests)``: the names of a prefix copy split so that every ``index.json``
    (``/``-separated names; one per dataset, at any depth) is copied after all the rest."""
    last = [n for n in names if n.rsplit("/", 1)[-1] == INDEX_NAME]
    return [n for n in names if n.rsplit("/", 1)[-1] != INDEX_NAME], last


def _in_order(
    pairs: list[tuple[str, str]], name: int, copy_one: Callable[[tuple[str, str]], int], jobs: int
) -> list[int]:
    """``copy_one`` of each pair, ``jobs`` at a time: every pair whose ``pair[name]`` (its key) is not an
    ``index.json`` first, the manifests only once all those succeeded (the first failure raises and no
    manifest is copied). Returns the results in ``pairs`` order."""
    _, last = manifests_last([p[name] for p in pairs])
    later = set(last)
    waves = (
        [i for i, p in enumerate(pairs) if p[name] not in later],
        [i for i, p in enumerate(pairs) if p[name] in later],
    )
    results = [0] * len(pairs)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for wave in waves:
            for i, result in zip(wave, pool.map(lambda i: copy_one(pairs[i]), wave), strict=True):
                results[i] = result
    return results


def _bar(total: int, files: int, progress: bool | None) -> Progress:
    return Progress(total=total, enabled=progress, desc=f"copying {files:,} file(s)")


def copy(
    src: str,
    dst: str,
    *,
    recursive: bool = False,
    config: S3Config | None = None,
    jobs: int = 8,
    progress: bool | None = None,
) -> CopyReport:
    """Copy between S3 and local paths, or from ``http(s)://``/``hf://`` to a local path (a web folder: a
    dataset's files, named by its index.json; the Hub's: listed); ``recursive`` (or SRC ending in ``/``)
    copies a prefix/folder.
    ``progress``: a bar of bytes copied on stderr (None: only when stderr is a terminal)."""
    from fastload.s3.client import parse_s3_url
    from fastload.s3.listing import ObjectInfo, list_objects
    from fastload.s3.upload import upload_file
    from fastload.storage.s3source import unsafe_key_part

    check_url(src)  # a mistyped s3:// or a gs:// URL is not a local path
    check_writable(dst)
    if is_web(src):
        return _copy_web(
            src, dst, recursive=recursive, config=config or S3Config.from_env(), jobs=jobs, progress=progress
        )
    src_remote, dst_remote = storage.is_remote(src), storage.is_remote(dst)
    if src_remote == dst_remote:
        raise ConfigError(
            "fastload cp copies between S3 and local disk: exactly one of SRC and DST must be s3://"
        )
    config = config or S3Config.from_env()
    shown = sys.stderr.isatty() if progress is None else progress
    report = CopyReport()
    recursive = recursive or src.endswith("/")
    if src_remote:
        bucket, key = parse_s3_url(src)
        if not recursive:
            target = (
                os.path.join(dst, key.rsplit("/", 1)[-1]) if dst.endswith("/") or os.path.isdir(dst) else dst
            )
            total = storage.size_of(src, config=config) if shown else 0  # one HEAD, for the bar only
            with _bar(total, 1, shown) as bar:
                report.bytes += download(bucket, key, target, config=config, progress=bar)
            report.files, report.copied = 1, [target]
            return report
        prefix = key if not key or key.endswith("/") else key + "/"
        objects = [o for o in list_objects(bucket, prefix, config=config) if isinstance(o, ObjectInfo)]
        pairs: list[tuple[str, str]] = []
        for obj in objects:
            rel = obj.key[len(prefix) :]
            if obj.key.endswith("/") and obj.size == 0:
                continue
            problem = unsafe_key_part(rel)
            if problem:
                raise ConfigError(
                    f"refusing to copy s3://{bucket}/{obj.key}: its key {problem}, so it could land outside "
                    f"{dst}; copy the other objects by narrower prefixes or rename it"
                )
            pairs.append((obj.key, os.path.join(dst, *rel.split("/"))))
        root = os.path.realpath(dst)
        for _, target in pairs:
            if not os.path.realpath(target).startswith(root + os.sep):
                raise ConfigError(f"refusing to write {target}: it resolves outside {dst}")
        sizes = {o.key: o.size for o in objects}
        for folder in {os.path.dirname(os.path.abspath(t)) for _, t in pairs}:
            sweep_parts(folder)  # killed downloads' files, one scan a folder (not one a file)

        def fetch(p: tuple[str, str]) -> int:
            return download(bucket, p[0], p[1], config=config, progress=bar, sweep=False)

        with _bar(sum(sizes[k] for k, _ in pairs), len(pairs), shown) as bar:
            fetched = _in_order(pairs, 0, fetch, jobs)
            for (_, target), size in zip(pairs, fetched, strict=True):
                report.files += 1
                report.bytes += size
                report.copied.append(target)
        if not pairs:
            raise NotFoundError(f"no objects under {src}", path=src)
        return report
    bucket, key = parse_s3_url(dst)
    if not recursive:
        if not os.path.isfile(src):
            raise NotFoundError(f"{src} is not a file (use --recursive for a folder)", path=src)
        target_key = key + os.path.basename(src) if not key or key.endswith("/") else key
        _abort_stale_uploads(bucket, target_key, [(src, target_key)], config)
        with _bar(os.path.getsize(src), 1, shown) as bar:
            upload_file(src, bucket, target_key, config=config, on_bytes=lambda n: bar.advance(n, 0))
            bar.advance(0, 1)
        report.files, report.bytes, report.copied = 1, os.path.getsize(src), [f"s3://{bucket}/{target_key}"]
        return report
    if not os.path.isdir(src):
        what = "a file: drop --recursive (-r) to copy one file" if os.path.isfile(src) else "not found"
        raise NotFoundError(f"{src} is {what}", path=src)
    files = storage.list_files(storage.normalise(src), "")
    report.skipped = [f for f in files if PART.fullmatch(os.path.basename(f))]
    files = [f for f in files if not PART.fullmatch(os.path.basename(f))]
    if not files:
        raise NotFoundError(f"no files under {src}: nothing to copy", path=src)
    prefix = key if not key or key.endswith("/") else key + "/"
    base = storage.normalise(src)
    jobs_list = [(f, prefix + os.path.relpath(f, base).replace(os.sep, "/")) for f in files]
    report.bytes = sum(os.path.getsize(f) for f, _ in jobs_list)
    _abort_stale_uploads(bucket, prefix, jobs_list, config)

    def send(pair: tuple[str, str], bar: Progress) -> int:
        upload_file(pair[0], bucket, pair[1], config=config, on_bytes=lambda n: bar.advance(n, 0))
        bar.advance(0, 1)
        return 0

    with _bar(report.bytes, len(jobs_list), shown) as bar:
        _in_order(jobs_list, 1, lambda p: send(p, bar), jobs)
    report.files = len(jobs_list)
    report.copied = [f"s3://{bucket}/{k}" for _, k in jobs_list]
    return report


def _abort_stale_uploads(bucket: str, prefix: str, pairs: list[tuple[str, str]], config: S3Config) -> None:
    """Abort the multipart uploads left open (by a killed ``fastload cp``) on the keys of ``pairs`` that go
    up in parts; without the permission to list them (s3:ListBucketMultipartUploads), leave them."""
    from fastload.s3.client import get_client
    from fastload.s3.upload import abort_stale_uploads, part_size_for

    keys = {k for f, k in pairs if (size := os.path.getsize(f)) > part_size_for(size, config.part_size_bytes)}
    if keys:
        with contextlib.suppress(AccessDeniedError):
            abort_stale_uploads(get_client(config), bucket, prefix, config=config, keys=keys)


def listing(url: str, *, recursive: bool = False, config: S3Config | None = None) -> list[str]:
    """Lines for ``fastload ls``: ``size  name`` for objects, ``PRE name/`` for common prefixes."""
    if not storage.is_remote(url):
        from fastload.storage.listing import FileEntry, LocalSource

        source = LocalSource(storage.normalise(url))
        return [
            f"{found.size:>12}  {found.relpath}" if isinstance(found, FileEntry) else f"{'SKIP':>12}  {found}"
            for found in source.list()
        ]
    if is_web(url):  # the Hub lists (recursively); a web server cannot (list_files says so)
        root = url.rstrip("/")
        return [
            u[len(root) + 1 :] for u in storage.list_files(root, "", config=config or S3Config.from_env())
        ]
    from fastload.s3.client import parse_s3_url
    from fastload.s3.listing import list_objects

    bucket, prefix = parse_s3_url(url)
    lines = []
    for item in list_objects(
        bucket, prefix, config=config or S3Config.from_env(), delimiter=None if recursive else "/"
    ):
        if isinstance(item, str):
            lines.append(f"{'PRE':>12}  {item}")
        else:
            lines.append(f"{item.size:>12}  {item.key}")
    return lines


def _web_names(root: str, config: S3Config) -> list[str]:
    """The files of the web folder ``root``, relative to it: listed (the Hub), else a dataset's own
    (``index.json``, its shards and their sample tables: a web server cannot be listed)."""
    from fastload.core.index import parse_index
    from fastload.storage.manifest import read_manifest

    if root.startswith("hf://"):
        return [u[len(root) + 1 :] for u in storage.list_files(root, "", config=config)]
    found = read_manifest(root, s3_config=config)
    if found is None:
        raise NotFoundError(
            f"{root} has no index.json; a web server's folders cannot be listed, so fastload cp copies a "
            "dataset folder (its index.json names the files) or one file by its URL",
            path=root,
        )
    url, data = found
    index = parse_index(data, where=url)
    names = [url[len(root) + 1 :]]
    for shard in index.shards:
        names.append(shard.name)
        if shard.table is not None:
            names.append(shard.table.name)
    return names


def _copy_web(
    src: str, dst: str, *, recursive: bool, config: S3Config, jobs: int, progress: bool | None
) -> CopyReport:
    """``fastload cp`` from ``http(s)://`` or ``hf://`` to a local path (see :func:`_web_names`)."""
    from fastload.storage.s3source import unsafe_key_part
    from fastload.storage.web import open_web

    shown = sys.stderr.isatty() if progress is None else progress
    report = CopyReport()
    if not (recursive or src.endswith("/")):
        name = src.rsplit("/", 1)[-1]
        target = os.path.join(dst, name) if dst.endswith("/") or os.path.isdir(dst) else dst
        with _bar(0, 1, shown) as bar:
            report.bytes = download(
                "", src, target, config=config, progress=bar, opener=lambda: open_web(src, config)
            )
        report.files, report.copied = 1, [target]
        return report
    root = src.rstrip("/")
    names = _web_names(root, config)
    for name in names:
        problem = unsafe_key_part(name)
        if problem:
            raise ConfigError(
                f"refusing to copy {root}/{name}: its name {problem}, so it could land outside {dst}"
            )
    pairs = [(n, os.path.join(dst, *n.split("/"))) for n in names]
    for folder in {os.path.dirname(os.path.abspath(t)) for _, t in pairs}:
        sweep_parts(folder)

    def fetch(p: tuple[str, str]) -> int:
        url = f"{root}/{p[0]}"
        return download(
            "", url, p[1], config=config, progress=bar, sweep=False, opener=lambda: open_web(url, config)
        )

    with _bar(0, len(pairs), shown) as bar:
        fetched = _in_order(pairs, 0, fetch, jobs)
    for (_, target), size in zip(pairs, fetched, strict=True):
        report.files += 1
        report.bytes += size
        report.copied.append(target)
    return report
