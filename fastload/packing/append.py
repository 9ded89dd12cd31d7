"""Appending to a dataset (``fastload pack --append``): a driver plan around the plan of what is appended.

:class:`AppendPlan` overrides :meth:`Plan.open` (the dataset's index read, the options checked against it,
its own journal in ``.fastload-pack/append-<tag>``, where ``tag`` comes from the inputs' fingerprint) and
:meth:`Plan.index`/:meth:`Plan.publish` (the new shards joined to the index as it is *when published*, as
a new version). Shards are named after the existing ones and tagged (``shard-000013-1a2b3c4d.tar``), so two
appenders never write the same name, and existing shard and table files are never rewritten.

Publishing (``docs/pack.md``, "Growing datasets"): locally under a lock file (:mod:`fastload.storage.locks`)
the index is read, joined and renamed into place; on S3 it is read with its ETag and PUT with ``If-Match``
(``If-None-Match: *`` when creating), read again and joined again when another appender published first;
on GCS and Azure the same with the object's generation (``ifGenerationMatch``) or ETag (``If-Match``)
(:func:`fastload.s3.conditional.write_if`).
Either way both appends land, in the order they published; an append of inputs the dataset already holds
as a version is refused, naming it.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from fastload.core.index import DatasetIndex, parse_index
from fastload.core.versions import Version, appended_name, fingerprint_digest, input_tag, joined, versions_of
from fastload.errors import AppendConflictError, ConfigError, PackError, PreconditionFailedError, Skip
from fastload.formats import index_name, table_path
from fastload.formats.shard import ShardResult
from fastload.packing.dest import STORES, Destination, dest_url, destination, read_index_bytes
from fastload.packing.driver import Plan, R, run
from fastload.packing.engine import Advance, Engine, ShardJob
from fastload.packing.guarded import INDEX_LOCK
from fastload.packing.journal import STATE_DIR, PackJournal, kept_shards
from fastload.packing.options import append_problems
from fastload.storage.locks import FileLock, LockHeld

PUBLISH_ATTEMPTS = 20  # conditional PUTs lost to other appenders before giving up
LOCK_WAIT_S = 120.0  # how long a local append waits for another's publishing of index.json


def now_utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class AppendedJob:
    """A job of the appended plan under its appended ``name`` (its result's entry renamed to match)."""

    job: Any
    name: str

    @property
    def number(self) -> int:
        return int(self.job.number)

    @property
    def shard_format(self) -> str:
        return str(self.job.shard_format)

    @property
    def config(self) -> Any:
        return getattr(self.job, "config", None)

    def write(self, tmp_path: str, *, on_sample: Advance, open_threads: int) -> ShardResult:
        result: ShardResult = self.job.write(tmp_path, on_sample=on_sample, open_threads=open_threads)
        return replace(result, entry=replace(result.entry, name=self.name))

    def local_folders(self) -> set[str]:
        return set(self.job.local_folders())

    def discard(self) -> None:
        discard = getattr(self.job, "discard", None)
        if discard is not None:
            discard()


class AppendPlan(Plan[R]):
    """``inner`` (a plan of files or table rows) appended to the dataset at its target as a new version."""

    def __init__(self, inner: Plan[R]) -> None:
        options = inner.output_options()
        if options is None:
            raise ConfigError(f"{type(inner).__name__}: this kind of pack cannot append yet; pack afresh")
        self.inner = inner
        self.options = options
        self.target = inner.target
        self.progress_items = inner.progress_items
        self.tag = input_tag(self.target.fingerprint)
        # what the version records of its inputs (a plan that knows them only at the end sets it then)
        self.digest = fingerprint_digest(self.target.fingerprint)
        self.folder = f"{STATE_DIR}/append-{self.tag}"
        self.first = 0  # the number of the first appended shard (the dataset's shard count when it began)
        self.base: DatasetIndex | None = None  # the index when the append began (None: creating one)
        self.added: DatasetIndex | None = None
        self.version: Version | None = None
        self._run_lock: FileLock | None = None
        self._run_lock_path = ""
        # where the dataset's index.json is (None: where its format keeps it)
        self.index_at: str | None = None

    # -- naming and the journal ---------------------------------------------------------------------------

    def name_of(self, number: int) -> str | None:
        name = self.inner.name_of(number)
        return None if name is None else appended_name(name, self.first + number, self.tag)

    def _is_mine(self, key: str) -> bool:
        return f"-{self.tag}" in key.rsplit("/", 1)[-1] or f"/append-{self.tag}/" in key

    def open(self) -> tuple[Destination, PackJournal, dict[int, ShardResult] | None]:
        t = self.target
        url = dest_url(t.url)  # (a store's index.json is published by a conditional write)
        dest = destination(url, self.folder, config=t.s3_config)
        if dest.exists_as_file():
            raise PackError(f"destination {dest.url} is a file; choose a dataset's folder")
        if hasattr(dest, "owns"):
            dest.owns = self._is_mine  # abort only this append's stale uploads, never another appender's
        journal = PackJournal(dest, self.folder)
        if not url.startswith(STORES):
            self._run_lock_path = os.path.join(url, self.folder + ".lock")
            self._run_lock = FileLock(self._run_lock_path)
            try:
                self._run_lock.acquire(0)
            except LockHeld as held:
                raise AppendConflictError(
                    f"another run is appending the same inputs to {url} now ({held.holder}); wait for it "
                    "to finish (or, if it was killed, run this command again with --resume)",
                    url=url,
                    holder=held.holder,
                ) from None
        found = read_index_bytes(dest)
        self.base = None if found is None else parse_index(found[1], where=found[0])
        if found is not None:  # (an older Parquet dataset keeps it at the root, not in _fastload/)
            self.index_at = found[0][len(dest.url) :].lstrip("/")
        if self.base is None:
            self._check_creatable(dest, journal)
        else:
            self._check_joins(self.base, where=found[0] if found else url)
            earlier = self._same_inputs(self.base)
            if earlier is not None and not journal.exists():
                if t.resume:
                    return dest, journal, None  # already appended: nothing to do
                raise AppendConflictError(
                    f"{url} already holds these inputs as version {earlier.version} (appended "
                    f"{earlier.created or 'by its first pack'}); nothing was written. Appending the same "
                    "files again would repeat their samples: change or add inputs, or pack afresh",
                    url=url,
                    version=earlier.version,
                )
        if journal.exists():
            if not t.resume:
                raise PackError(
                    f"an append of these inputs to {url} was interrupted; finish it by running the same "
                    "command with --resume (its finished shards are kept)"
                )
            state = journal.state()
            if state["fingerprint"] != t.fingerprint:
                raise PackError(
                    f"the inputs or options changed since the interrupted append to {url}; restore them "
                    f"and --resume, or delete {url}/{self.folder} and append afresh"
                )
            self.first = int(state.get("first", 0))
            dest.prepare()
            return dest, journal, kept_shards(dest, journal, self.name_of)
        self.first = 0 if self.base is None else len(self.base.shards)
        dest.prepare()
        journal.start(t.fingerprint, t.shards, first=self.first, append=self.tag)
        return dest, journal, {}

    def _check_creatable(self, dest: Destination, journal: PackJournal) -> None:
        """An append to a folder without an index creates the dataset (version 1): only where nothing but
        appends' journals is."""
        if journal.exists() or dest.is_empty():
            return
        url = dest.url
        if url.startswith(("gs://", "az://")):
            if all(name.startswith(f"{STATE_DIR}/append-") for name in dest.list("")):
                return
        elif not url.startswith("s3://"):
            if set(os.listdir(url)) <= {STATE_DIR} and not os.path.exists(
                os.path.join(url, STATE_DIR, "state.json")
            ):
                return
        else:
            from fastload.s3.listing import ObjectInfo, list_objects

            s3 = dest  # an S3Destination
            other = next(
                (
                    o
                    for o in list_objects(s3.bucket, s3.prefix, config=s3.config)  # type: ignore[attr-defined]
                    if isinstance(o, ObjectInfo)
                    and not o.key[len(s3.prefix) :].startswith(f"{STATE_DIR}/append-")  # type: ignore[attr-defined]
                ),
                None,
            )
            if other is None:
                return
        raise PackError(
            f"{url} holds files but no index.json, so there is no dataset to append to; append to a dataset "
            "(or an empty folder, to start one), or finish an interrupted pack there with --resume "
            "(without --append)"
        )

    def _check_joins(self, index: DatasetIndex, *, where: str) -> None:
        problems = append_problems(index.options, index.shard_format, self.options, self._format())
        if problems:
            raise ConfigError(
                f"cannot append to {where}: these options differ from the dataset's:\n  "
                + "\n  ".join(problems)
                + "\nPass the dataset's options (`fastload inspect` shows its format; index.json its options)"
            )

    def _format(self) -> str:
        return str(self.options.get("shard_format", ""))

    def _same_inputs(self, index: DatasetIndex) -> Version | None:
        """The version of ``index`` made of exactly this append's inputs (same fingerprint; for a version
        that recorded none, the same layout: names, sizes and options), if any."""
        for v in versions_of(index):
            if v.fingerprint == self.digest or (v.fingerprint is None and v.layout == self.target.layout):
                return v
        return None

    # -- the inner plan's work, renamed -------------------------------------------------------------------

    def engine(self, dest: Destination, journal: PackJournal, todo: int | None) -> Engine:
        return self.inner.engine(dest, journal, todo)

    def jobs(self, dest: Destination, kept: Mapping[int, ShardResult]) -> Iterable[ShardJob]:
        return self._renamed(self.inner.jobs(dest, kept))

    def _renamed(self, jobs: Iterable[ShardJob]) -> Iterator[ShardJob]:
        inner = iter(jobs)
        try:
            for job in inner:
                yield AppendedJob(job, self.name_of(job.number) or job.name)
        finally:
            close = getattr(inner, "close", None)
            if close is not None:
                close()

    def progress_total(self) -> int | None:
        return self.inner.progress_total()

    def progress_desc(self) -> str:
        return "appending" if self.target.shards is None else f"appending {self.target.shards} shards"

    def output_options(self) -> dict[str, Any] | None:
        return self.options

    def late_skips(self, results: Mapping[int, ShardResult]) -> list[Skip]:
        return self.inner.late_skips(results)

    def index(self, results: Mapping[int, ShardResult]) -> DatasetIndex:
        self.added = self.inner.index(results)
        return self.added

    # -- publishing ---------------------------------------------------------------------------------------

    def _checked_current(
        self, current: DatasetIndex | None, added: DatasetIndex, dest: Destination
    ) -> DatasetIndex | None:
        """``current`` (the index as it is now), once it is still the dataset this append began on, grown
        only by other appends; None when this append already landed (a retried PUT that had succeeded). When
        another run appended the same inputs first, this run's shards are removed from ``dest``."""
        base, url = self.base, dest.url
        if current is None:
            if base is not None:
                raise PackError(f"{url}: index.json was removed while appending; nothing was published")
            return None
        names = {s.name for s in current.shards}
        if all(s.name in names for s in added.shards) and added.shards:
            return None  # ours is in: our own earlier attempt landed
        if base is not None and [s.name for s in current.shards[: len(base.shards)]] != [
            s.name for s in base.shards
        ]:
            raise PackError(
                f"{url} was replaced (not appended to) while this append ran; its new shards are left "
                "unlisted there: append again"
            )
        self._check_joins(current, where=url)
        earlier = self._same_inputs(current)
        if earlier is not None:  # (two runs of one append at once, on S3 or hosts without shared locks)
            for shard in added.shards:
                if shard.name not in names:
                    dest.remove(shard.name)
                    dest.remove(table_path(shard.name, added.shard_format))
            dest.remove_tree(self.folder)
            raise AppendConflictError(
                f"another run appended these inputs to {url} first (version {earlier.version}); this run's "
                "shards were removed unpublished",
                url=url,
                version=earlier.version,
            )
        return current

    def publish(self, dest: Destination, index: DatasetIndex) -> DatasetIndex:
        name = self.index_at or index_name(index.shard_format)
        if dest.url.startswith(STORES):
            return self._publish_remote(dest, index, name)
        lock = FileLock(os.path.join(dest.url, INDEX_LOCK), timeout_s=LOCK_WAIT_S)
        try:
            lock.acquire()
        except LockHeld as held:
            raise AppendConflictError(
                f"could not publish the append to {dest.url}: {held.holder} has held the index lock for "
                f"{LOCK_WAIT_S:.0f}s; its shards are kept: run this command again with --resume",
                url=dest.url,
                holder=held.holder,
            ) from None
        try:
            raw = dest.read_bytes(name)
            current = None if raw is None else parse_index(raw, where=f"{dest.url}/{name}")
            merged, landed = self._join(current, index, dest)
            if landed:
                return self._landed(merged)
            dest.write_bytes(name, merged.to_json())
        finally:
            lock.release(remove=True)
        return self._landed(merged)

    def _join(
        self, current: DatasetIndex | None, index: DatasetIndex, dest: Destination
    ) -> tuple[DatasetIndex, bool]:
        """``index`` joined to ``current`` (the dataset's index as it is now) as the next version, or
        ``(current, True)`` when this append has landed there already."""
        checked = self._checked_current(current, index, dest)
        if checked is None and current is not None:
            return current, True
        merged = joined(checked, index, created=now_utc(), fingerprint=self.digest, layout=self.target.layout)
        if checked is None:
            return merged, False
        return replace(merged, options=self.inner.joined_options(checked.options, index.options)), False

    def _publish_remote(self, dest: Destination, index: DatasetIndex, name: str) -> DatasetIndex:
        from fastload.s3 import conditional

        scheme, bucket, prefix = dest.url[:5], dest.bucket, dest.prefix  # type: ignore[attr-defined]
        config, url = dest.config, f"{scheme}{bucket}/{prefix}{name}"  # type: ignore[attr-defined]
        for _ in range(PUBLISH_ATTEMPTS):
            found = conditional.read_versioned(url, config=config)
            current = None if found is None else parse_index(found[0], where=url)
            merged, landed = self._join(current, index, dest)
            if landed:
                return self._landed(merged)
            try:
                tag = None if found is None else found[1]
                conditional.write_if(url, merged.to_json(), tag=tag, config=config)
            except PreconditionFailedError:
                continue  # another appender published first: join its version and try again
            return self._landed(merged)
        raise AppendConflictError(
            f"could not publish the append to {dest.url}: other writers published index.json first "
            f"{PUBLISH_ATTEMPTS} times; its shards are kept: run this command again with --resume",
            url=dest.url,
        )

    def _landed(self, index: DatasetIndex) -> DatasetIndex:
        self.version = next((v for v in versions_of(index) if v.fingerprint == self.digest), None)
        return index

    def release(self) -> None:
        """Let go of the lock on these inputs (held from :meth:`open` to the end of the run)."""
        if self._run_lock is not None:
            self._run_lock.release(remove=True)
            self._run_lock = None
            with contextlib.suppress(OSError):  # leave no .fastload-pack/ behind once no append uses it
                os.rmdir(os.path.dirname(self._run_lock_path))

    # -- reports ------------------------------------------------------------------------------------------

    def report(
        self, url: str, index: DatasetIndex, results: Mapping[int, ShardResult], *, kept: int, seconds: float
    ) -> R:
        report = self.inner.report(url, self.added or index, results, kept=kept, seconds=seconds)
        if hasattr(report, "appended"):
            report = replace(report, appended=(self.version, index))  # type: ignore[type-var]
        return report

    def complete(self, url: str, index: DatasetIndex, *, skipped: list[Skip], seconds: float) -> R:
        self._landed(index)
        return self.inner.complete(url, index, skipped=skipped, seconds=seconds)


def run_append(inner: Plan[R]) -> R:
    """Run ``inner`` as an append (:class:`AppendPlan`) to the dataset at its target; its report."""
    plan = AppendPlan(inner)
    try:
        return run(plan)
    finally:
        plan.release()


__all__ = ["AppendPlan", "AppendedJob", "run_append"]
