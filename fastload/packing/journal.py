"""The resume journal of a pack run, kept in the destination under ``.fastload-pack/``: the plan's
fingerprint, and one small record per finished shard (its manifest entry, which names its sample table's
sidecar with size and CRC32C, and its skips); the decision, at the start of a run, whether a
destination is fresh, resumed or already complete (:func:`open_pack`), and the turning of a finished pack
back into an interrupted one to retry its skipped inputs (:func:`reopen_pack`). The pack driver
(``packing.driver``) calls them, and removes the journal once ``index.json`` is written."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastload.config import S3Config
from fastload.core.index import INDEX_NAMES, DatasetIndex, ShardEntry, parse_index
from fastload.errors import PackError, Skip
from fastload.formats.shard import ShardResult
from fastload.packing.dest import Destination, dest_url, destination, read_index_bytes
from fastload.storage.manifest import JOURNAL_DIR, OPTIMIZE_HOW, OPTIMIZE_STATE
from fastload.storage.tables import table_problem

STATE_DIR = JOURNAL_DIR  # (readers refuse a folder holding it: storage.manifest.refuse_unfinished)


class PackJournal:
    """State kept while a pack runs; removed once the index is written. ``folder``: where in the destination
    (an append keeps its own, ``.fastload-pack/append-<tag>``, beside other appends' and the dataset)."""

    def __init__(self, dest: Destination, folder: str = STATE_DIR) -> None:
        self.dest = dest
        self.folder = folder
        self._state = f"{folder}/state.json"
        self._done = f"{folder}/done"

    def exists(self) -> bool:
        return self.dest.read_bytes(self._state) is not None

    def start(self, fingerprint: str, shards: int | None, **extra: Any) -> None:
        """Begin a fresh run (``extra``: more the run keeps in its state, read back by :meth:`state`)."""
        state = {"fingerprint": fingerprint, "shards": shards, **extra}
        self.dest.write_bytes(self._state, json.dumps(state).encode())

    def state(self) -> dict[str, Any]:
        """What :meth:`start` recorded."""
        raw = self.dest.read_bytes(self._state)
        try:
            state = json.loads(raw or b"")
            str(state["fingerprint"])
        except (ValueError, KeyError, TypeError) as exc:
            raise PackError(
                f"the resume state in {self.dest.url}/{self.folder} is unreadable ({exc}); delete the "
                "destination and pack again"
            ) from None
        return dict(state)

    def fingerprint(self) -> str:
        return str(self.state()["fingerprint"])

    def finished(self) -> dict[int, dict[str, Any]]:
        """Shard number -> recorded result, for every complete record (records are written atomically)."""
        out: dict[int, dict[str, Any]] = {}
        for name in self.dest.list(self._done):
            raw = self.dest.read_bytes(name)
            try:
                record = json.loads(raw or b"")
                out[int(record["number"])] = record
            except (ValueError, KeyError, TypeError):
                continue
        return out

    def record(self, record: dict[str, Any]) -> None:
        """Store one finished shard's record (after the shard itself is published)."""
        self.dest.write_bytes(
            f"{self._done}/{int(record['number']):06d}.json", json.dumps(record, ensure_ascii=False).encode()
        )

    def remove(self) -> None:
        self.dest.remove_tree(self.folder)
        self.dest.cleanup()


def prepare_destination(
    dest: Destination,
    journal: PackJournal,
    *,
    fingerprint: str,
    layout: str,
    resume: bool,
    shards: int | None,
) -> bool:
    """Set up ``dest`` for a run; False when ``resume`` finds it already holds this pack (``index.json``
    with the same ``layout``). A resumed run keeps its journal (see :func:`kept_shards`); a fresh run needs
    an empty destination and starts one. Raises :class:`PackError` saying what to do otherwise."""
    if dest.exists_as_file():
        raise PackError(f"destination {dest.url} is a file; choose a folder")
    if resume:
        if journal.exists():
            if journal.fingerprint() != fingerprint:
                raise PackError(
                    f"the source files or pack options changed since the interrupted pack in {dest.url}, so "
                    "its shards cannot be reused; delete the destination and pack again, or restore the "
                    "source"
                )
            dest.prepare()
            return True
        found = read_index_bytes(dest)
        if found is not None:
            done = parse_index(found[1], where=found[0])
            if done.options.get("layout") == layout:
                return False
            if done.skipped:
                names = "\n  ".join(f"{s['path']}: {s['reason']}" for s in done.skipped[:20])
                more = f"\n  ... and {len(done.skipped) - 20} more" if len(done.skipped) > 20 else ""
                raise PackError(
                    f"{dest.url} holds a pack that left out {len(done.skipped)} input(s), and the files "
                    f"listed today are not the ones it planned (so its shards cannot be completed in "
                    f"place):\n  {names}{more}\nPack into an empty destination to include them."
                )
            raise PackError(
                f"{dest.url} holds a finished pack of other files or options; pack into an empty "
                "destination instead of resuming"
            )
    if not dest.is_empty():
        hint = "pass --resume to continue the interrupted pack there, or " if journal.exists() else ""
        if hint and dest.read_bytes(OPTIMIZE_STATE) is not None:
            hint = f"{OPTIMIZE_HOW}; or "
        found = None if hint else read_index_bytes(dest)
        if found is not None:
            with contextlib.suppress(ValueError):  # not an index we can read: the plain message
                left_out = len(parse_index(found[1], where=found[0]).skipped)
                if left_out:
                    hint = (
                        f"it holds a pack that left out {left_out} input(s): pass --resume to retry them "
                        "(with --allow-skip to accept any that still fail), or "
                    )
        raise PackError(f"destination {dest.url} is not empty; {hint}choose an empty or new folder")
    dest.prepare()
    journal.start(fingerprint, shards)
    return True


def open_pack(
    target: str,
    *,
    fingerprint: str,
    layout: str,
    resume: bool,
    shards: int | None,
    name_of: Callable[[int], str | None],
    s3_config: S3Config | None,
) -> tuple[Destination, PackJournal, dict[int, ShardResult] | None]:
    """A pack run's destination (a local folder, made absolute, or ``s3://``) set up by
    :func:`prepare_destination`, its journal, and the shards an interrupted run finished that are kept
    (:func:`kept_shards`, with ``resume``); None for those when the destination already holds this pack."""
    url = dest_url(target)
    dest = destination(url, STATE_DIR, config=s3_config)
    journal = PackJournal(dest)
    if not prepare_destination(
        dest, journal, fingerprint=fingerprint, layout=layout, resume=resume, shards=shards
    ):
        return dest, journal, None
    return dest, journal, kept_shards(dest, journal, name_of) if resume else {}


def kept_shards(
    dest: Destination, journal: PackJournal, name_of: Callable[[int], str | None], *, threads: int = 16
) -> dict[int, ShardResult]:
    """The journal's finished shards that are still whole in ``dest`` under the name the plan gives them:
    the shard of the recorded size, its sample table of the recorded size and CRC32C (checked ``threads``
    at a time). A record of an older fastload (no sample table) keeps nothing: that shard is written again."""

    def check(item: tuple[int, dict[str, Any]]) -> tuple[int, ShardResult] | None:
        number, record = item
        raw = record.get("entry")
        if not isinstance(raw, dict) or "table" not in raw:
            return None
        try:
            entry = ShardEntry.from_manifest(raw)
        except (KeyError, TypeError, ValueError):
            return None
        ref = entry.table
        if ref is None or name_of(number) != entry.name or dest.size(entry.name) != entry.bytes:
            return None
        table = dest.read_bytes(ref.name)
        if table is None or table_problem(table, ref, url=ref.name, shard=entry.name) is not None:
            return None
        skipped = [Skip(s["path"], s["reason"]) for s in record["skipped"]]
        return number, ShardResult(entry, skipped, int(record["payload_bytes"]), int(record["files"]))

    records = sorted(journal.finished().items())
    if not records:
        return {}
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(records)))) as pool:
        return dict(kept for kept in pool.map(check, records) if kept is not None)


def reopen_pack(
    dest: Destination,
    journal: PackJournal,
    index: DatasetIndex,
    *,
    numbers: Sequence[int],
    retry: Collection[int],
    totals: Callable[[int], tuple[int, int]],
    name_of: Callable[[int], str | None],
    fingerprint: str,
) -> dict[int, ShardResult]:
    """Turn a finished pack that skipped inputs (held by the shards numbered ``retry``) back into an
    interrupted one, so that ``--resume`` writes those shards again: the journal started afresh with every
    other shard of ``index`` (in plan order ``numbers``) recorded as finished, whole (``totals``: its payload
    bytes and files), then ``index.json`` removed (the shards to write are about to be replaced; a reader
    must not meet them under the old index). Returns the shards kept, checked as :func:`kept_shards` checks
    an interrupted run's; a killed retry resumes like any interrupted pack."""
    dest.prepare()
    journal.start(fingerprint, len(numbers))
    for number, entry in zip(numbers, index.shards, strict=True):
        if number not in retry:
            payload, files = totals(number)
            journal.record(shard_record(number, ShardResult(entry, [], payload, files)))
    for name in INDEX_NAMES:  # (where this pack wrote it, or where an older fastload did)
        dest.remove(name)
    return kept_shards(dest, journal, name_of)


def shard_record(number: int, result: ShardResult) -> dict[str, Any]:
    """What the journal keeps of a published shard: its manifest entry (``result.entry``, detached: it
    names the sample table), skips and totals."""
    return {
        "number": number,
        "entry": result.entry.manifest_dict(),
        "skipped": [{"path": s.path, "reason": s.reason} for s in result.skipped],
        "payload_bytes": result.payload_bytes,
        "files": result.files,
    }
