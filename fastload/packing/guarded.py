"""Rewrite a dataset's ``index.json`` only if no one else published it meanwhile: what ``fastload index
--upgrade`` does, which reads the index, works for a while (rebuilding sample tables), then writes the index
again. An append that published a version in between would otherwise be lost (its shards left unlisted).

Locally the check and the write happen under the lock appends publish under (``.fastload-pack/index.lock``,
:mod:`fastload.storage.locks`); on S3, GCS and Azure the write is conditional on the version of the index
as checked (S3: a PUT with ``If-Match`` on its ETag; GCS: an upload with ``ifGenerationMatch`` on its
generation; Azure: Put Blob with ``If-Match``: :func:`fastload.s3.conditional.write_if`), the way appends
publish. Either way a changed index refuses the write, and nothing is written.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

from fastload.config import S3Config
from fastload.errors import AppendConflictError, PreconditionFailedError
from fastload.storage import access as storage
from fastload.storage.locks import FileLock, LockHeld
from fastload.storage.manifest import JOURNAL_DIR, read_manifest

INDEX_LOCK = f"{JOURNAL_DIR}/index.lock"  # held by a local append while it publishes (packing.append)
LOCK_WAIT_S = 120.0
Put = Callable[[str, bytes], None]


def _changed(root: str, what: str) -> AppendConflictError:
    return AppendConflictError(
        f"{root}: index.json changed while {what} ran (an append published a new version?); nothing was "
        f"written: run {what} again",
        url=root,
    )


def publish_if_unchanged(
    root: str,
    seen: tuple[str, bytes] | None,
    write: Callable[[Put | None], None],
    *,
    what: str,
    s3_config: S3Config | None = None,
) -> None:
    """Call ``write(put)`` if the manifest under ``root`` is still ``seen`` (``(url, bytes)`` as
    :func:`~fastload.storage.manifest.read_manifest` gave it at the start of ``what``), else raise
    :class:`AppendConflictError` naming ``what``. ``put(url, data)``, given on ``s3://``, ``gs://`` and
    ``az://``, writes an object (the manifest at ``seen``'s URL only if it is still the object checked);
    locally ``write`` writes as it would, under the lock."""
    if root.startswith(("s3://", "gs://", "az://")):
        _on_store(root, seen, write, what=what, config=s3_config or S3Config.from_env())
        return
    if storage.is_remote(root):  # (a store fastload does not write to: the write itself will say so)
        if read_manifest(root, s3_config=s3_config) != seen:
            raise _changed(root, what)
        write(None)
        return
    lock = FileLock(os.path.join(root, INDEX_LOCK), timeout_s=LOCK_WAIT_S)
    try:
        lock.acquire()
    except LockHeld as held:
        raise AppendConflictError(
            f"{root}: {held.holder} has held the index lock for {LOCK_WAIT_S:.0f}s; nothing was written: run "
            f"{what} again once it is done",
            url=root,
            holder=held.holder,
        ) from None
    try:
        if read_manifest(root) != seen:
            raise _changed(root, what)
        write(None)
    finally:
        lock.release(remove=True)
        with contextlib.suppress(OSError):  # leave no .fastload-pack/ behind (an append's journal keeps it)
            os.rmdir(os.path.join(root, JOURNAL_DIR))


def _on_store(
    root: str,
    seen: tuple[str, bytes] | None,
    write: Callable[[Put | None], None],
    *,
    what: str,
    config: S3Config,
) -> None:
    from fastload.s3 import conditional

    if seen is None:
        raise _changed(root, what)
    found = conditional.read_versioned(seen[0], config=config)
    if found is None or found[0] != seen[1]:
        raise _changed(root, what)

    def put(url: str, data: bytes) -> None:
        if url != seen[0]:  # the manifest moved (Parquet's older layout): over what is there now
            now = conditional.read_versioned(url, config=config)
            conditional.write_if(url, data, tag=None if now is None else now[1], config=config)
            return
        try:
            conditional.write_if(url, data, tag=found[1], config=config)
        except PreconditionFailedError:
            raise _changed(root, what) from None

    write(put)


__all__ = ["INDEX_LOCK", "publish_if_unchanged"]
