"""``fastload cp``: copy an object or a prefix between S3 and local disk with the parallel reader/uploader,
or between two S3 places server-side; objects already at the destination with the same bytes are skipped
(the decision: :mod:`fastload.core.syncplan`; the listings and checksums: :mod:`fastload.storage.syncscan`).

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
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from io import RawIOBase

from fastload.config import S3Config
from fastload.core.index import INDEX_NAME
from fastload.core.syncplan import Step
from fastload.core.weburls import expand_braces, has_braces, is_web
from fastload.errors import AccessDeniedError, ConfigError, FastloadError, write_error
from fastload.packing.progress import Progress
from fastload.storage import access as storage
from fastload.storage.localfs import file_mode
from fastload.storage.syncscan import PART, Item, list_ends, scan
from fastload.storage.urls import check_url, check_writable


@dataclass
class CopyReport:
    """What a copy did (or, with ``dry_run``, would do): the objects copied (``files``, ``bytes``,
    ``copied``: their destinations), those already at the destination with the same bytes (``same``,
    ``same_bytes``), why (``reasons``: reason -> count, for both), every object's fate in order (``plan``:
    destination, copied?, reason), and the unfinished downloads an upload left out (``skipped``)."""

    files: int = 0
    bytes: int = 0
    copied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # unfinished downloads left out of an upload
    journal: list[str] = field(default_factory=list)  # an append's journal (.fastload-pack/) left out
    same: list[str] = field(default_factory=list)
    same_bytes: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    plan: list[tuple[str, bool, str]] = field(default_factory=list)
    dry_run: bool = False
    server_side: bool = False

    def summary(self) -> str:
        copied = [(r, n) for r, n in self.reasons.items() if r in self._copy_reasons()]
        text = f"{'would copy' if self.dry_run else 'copied'} {self.files} file(s), {self.bytes:,} bytes"
        if self.server_side and self.files:
            text += " server-side"
        if copied:
            text += " (" + ", ".join(f"{r}: {n}" for r, n in copied) + ")"
        if self.same:
            kept = ", ".join(f"{r}: {n}" for r, n in self.reasons.items() if r not in self._copy_reasons())
            text += (
                f"; {'would skip' if self.dry_run else 'skipped'} {len(self.same)} already at the "
                f"destination, {self.same_bytes:,} bytes ({kept})"
            )
        if self.skipped:
            text += (
                f"; skipped {len(self.skipped)} unfinished download(s) of fastload cp (.NAME.XXXXXXXX.part, "
                f"e.g. {self.skipped[0]}): delete them, or download again to have them removed"
            )
        if self.journal:
            text += (
                f"; left out {len(self.journal)} file(s) of a pack journal (.fastload-pack/) beside the "
                "source's index.json: an append runs or was killed there; the copy holds the dataset its "
                "index.json lists (copy again once the append has finished)"
            )
        return text

    def plan_lines(self) -> list[str]:
        """``copy  DESTINATION  (reason)`` / ``skip  DESTINATION  (reason)``, one line per object."""
        return [f"{'copy' if c else 'skip'}  {where}  ({why})" for where, c, why in self.plan]

    def _copy_reasons(self) -> set[str]:
        return {why for _, c, why in self.plan if c}


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
    dry_run: bool = False,
    max_single_copy_bytes: int | None = None,
) -> CopyReport:
    """Copy between S3 and local paths, between two S3 places (server-side), or from ``http(s)://``/
    ``hf://`` to a local path (a web folder: a dataset's files, named by its index.json; the Hub's:
    listed); ``recursive`` (or SRC ending in ``/``) copies a prefix/folder. An object already at the
    destination with the same bytes is left as it is (:mod:`fastload.core.syncplan` says how that is
    told), so a copy run again sends only what changed; ``dry_run`` only says what would be copied
    (:meth:`CopyReport.plan_lines`). ``progress``: a bar of bytes copied on stderr (None: only when stderr
    is a terminal). ``max_single_copy_bytes``: S3 to S3, the largest object copied with one CopyObject
    (None: 5 GiB, S3's limit; larger: UploadPartCopy parts)."""
    from fastload.s3.servercopy import MAX_COPY_OBJECT_BYTES, copy_object
    from fastload.s3.upload import upload_file
    from fastload.storecopy import copy_between, is_store_copy

    check_url(src)  # a mistyped s3:// or a gs:// URL is not a local path
    check_writable(dst)
    if is_store_copy(src, dst):  # to another kind of store: streamed, checked (storecopy)
        if dry_run:
            raise ConfigError(
                f"--dry-run is for copies to or from local paths and S3 to S3, not {src} to {dst}"
            )
        sent = copy_between(src, dst, recursive=recursive, config=config or S3Config.from_env(), jobs=jobs)
        return CopyReport(files=len(sent), bytes=sum(n for _, n in sent), copied=[u for u, _ in sent])
    if is_web(src) and storage.is_remote(dst):  # (was downloaded to a local folder named "s3:")
        raise ConfigError(f"fastload cp copies {src} to a local path only; copy it there, then to {dst}")
    if is_web(src):
        return _copy_web(
            src, dst, recursive=recursive, config=config or S3Config.from_env(), jobs=jobs, progress=progress
        )
    if dst.startswith(("gs://", "az://")) and not storage.is_remote(src):
        from fastload.storage.gcsupload import upload_to_gcs

        sent = upload_to_gcs(src, dst, recursive=recursive, config=config or S3Config.from_env(), jobs=jobs)
        return CopyReport(files=len(sent), bytes=sum(n for _, n in sent), copied=[u for u, _ in sent])
    src_remote, dst_remote = storage.is_remote(src), storage.is_remote(dst)
    if not src_remote and not dst_remote:
        raise ConfigError(
            "fastload cp copies to or from S3: at least one of SRC and DST must be s3:// (copy local folders "
            "with cp or rsync)"
        )
    config = config or S3Config.from_env()
    single_max = MAX_COPY_OBJECT_BYTES if max_single_copy_bytes is None else max_single_copy_bytes
    shown = sys.stderr.isatty() if progress is None else progress
    recursive = recursive or src.endswith("/")
    report = CopyReport(dry_run=dry_run, server_side=src_remote and dst_remote)
    ends = list_ends(src, dst, recursive=recursive, config=config)
    report.skipped, report.journal = ends.unfinished, ends.journal
    items, src_bucket, dst_bucket = ends.items, ends.src_bucket, ends.dst_bucket
    if ends.unlisted:  # one object to a local path, copied without a request to decide
        steps = [Step(items[0].name, True, ends.unlisted)]
    else:
        steps = scan(
            items,
            src_bucket=src_bucket,
            dst_bucket=dst_bucket,
            dst_prefix=ends.dst_prefix,
            config=config,
            jobs=jobs,
        )
    todo: list[Item] = []
    for item, step in zip(items, steps, strict=True):
        where = f"s3://{dst_bucket}/{item.dst}" if dst_bucket else item.dst
        report.plan.append((where, bool(step.copy), step.reason))
        report.reasons[step.reason] += 1
        if step.copy:
            todo.append(item)
        else:
            report.same.append(where)
            report.same_bytes += item.size
    if dry_run:
        report.files, report.bytes = len(todo), sum(max(0, i.size) for i in todo)
        report.copied = [w for w, c, _ in report.plan if c]
        return report
    if dst_bucket is not None:
        big = single_max if src_bucket else None
        _abort_stale_uploads(dst_bucket, ends.dst_prefix, todo, big, config)
    elif recursive:
        for folder in {os.path.dirname(os.path.abspath(i.dst)) for i in todo}:
            sweep_parts(folder)  # killed downloads' files, one scan a folder (not one a file)

    def copy_one(item: Item) -> int:
        on_bytes = lambda n: bar.advance(n, 0)  # noqa: E731
        if dst_bucket is None:
            assert src_bucket is not None  # (local to local is refused above)
            return download(src_bucket, item.src, item.dst, config=config, progress=bar, sweep=not recursive)
        if src_bucket is None:
            upload_file(item.src, dst_bucket, item.dst, config=config, on_bytes=on_bytes)
        else:
            copy_object(
                src_bucket,
                item.src,
                dst_bucket,
                item.dst,
                size=item.size,
                etag=item.etag,
                config=config,
                max_single_bytes=single_max,
                on_bytes=on_bytes,
            )
        bar.advance(0, 1)
        return item.size

    total = sum(i.size for i in todo)
    if ends.unlisted and shown:
        total = storage.size_of(src, config=config)  # one HEAD, for the bar only
    by_pair = {(i.src, i.dst): i for i in todo}
    with _bar(max(0, total), len(todo), shown) as bar:
        sizes = _in_order(list(by_pair), 1, lambda p: copy_one(by_pair[p]), jobs)
    report.files, report.bytes = len(todo), sum(sizes)
    report.copied = [f"s3://{dst_bucket}/{i.dst}" if dst_bucket else i.dst for i in todo]
    return report


def _abort_stale_uploads(
    bucket: str, prefix: str, items: list[Item], single_max: int | None, config: S3Config
) -> None:
    """Abort the multipart uploads left open (by a killed ``fastload cp``) on the keys of ``items`` that go
    up in parts (``single_max``: the largest a server-side copy sends whole; None: an upload's part size
    decides); without the permission to list them (s3:ListBucketMultipartUploads), leave them."""
    from fastload.s3.client import get_client
    from fastload.s3.upload import abort_stale_uploads, part_size_for

    def in_parts(item: Item) -> bool:
        if single_max is not None:
            return item.size > single_max
        return item.size > part_size_for(item.size, config.part_size_bytes)

    keys = {i.dst for i in items if in_parts(i)}
    if keys:
        with contextlib.suppress(AccessDeniedError):
            abort_stale_uploads(get_client(config), bucket, prefix, config=config, keys=keys)


def _copy_web(
    src: str, dst: str, *, recursive: bool, config: S3Config, jobs: int, progress: bool | None
) -> CopyReport:
    """``fastload cp`` from ``http(s)://`` or ``hf://`` to a local path (see :func:`web_names`)."""
    from fastload.storage.s3source import unsafe_key_part
    from fastload.storage.web import open_web
    from fastload.storecopy import web_names

    shown = sys.stderr.isatty() if progress is None else progress
    report = CopyReport()
    if has_braces(src):  # shard-{000000..000099}.tar: each shard into the folder dst, as laid out there
        root, names = storage.split_root(expand_braces(src))
    elif not (recursive or src.endswith("/")):
        name = src.rsplit("/", 1)[-1]
        target = os.path.join(dst, name) if dst.endswith("/") or os.path.isdir(dst) else dst
        with _bar(0, 1, shown) as bar:
            report.bytes = download(
                "", src, target, config=config, progress=bar, opener=lambda: open_web(src, config)
            )
        report.files, report.copied = 1, [target]
        return report
    else:
        root = src.rstrip("/")
        names = web_names(root, config)
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
