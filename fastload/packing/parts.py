"""One dataset written by several writers (``ShardWriter(dst, part=i, parts=n)`` in n processes or ranks)
and the merge that publishes it.

Writer ``part`` names its shards ``{prefix}-p{part:05d}-{n:06d}{suffix}`` (no two parts' names collide),
keeps its journal in ``.fastload-pack/part-{part:05d}/`` (and marks the folder unfinished with
``.fastload-pack/state.json``), aborts only its own stale S3 uploads, and writes
its index, once closed, to ``.fastload-pack/parts/part-{part:05d}.json`` instead of ``index.json``. While
``.fastload-pack/`` is there without ``index.json`` readers refuse the folder (an unfinished pack).
:func:`merge_parts` checks every part finished, joins their indexes in part order into ``index.json``,
written last, and removes ``.fastload-pack/``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

from fastload import formats
from fastload.config import S3Config
from fastload.core.index import DatasetIndex, parse_index
from fastload.errors import PackError
from fastload.formats.shard import ShardResult
from fastload.packing.dest import STORES, Destination, dest_url, destination, read_index_bytes
from fastload.packing.driver import Target
from fastload.packing.journal import STATE_DIR, PackJournal, kept_shards

PARTS_DIR = f"{STATE_DIR}/parts"


def part_state(part: int) -> str:
    """Where writer ``part`` keeps its journal and temporary files."""
    return f"{STATE_DIR}/part-{part:05d}"


def part_index_name(part: int) -> str:
    """Where writer ``part`` writes its index, to be merged."""
    return f"{PARTS_DIR}/part-{part:05d}.json"


def shard_name(prefix: str, number: int, suffix: str, part: int | None = None) -> str:
    """Shard ``number``'s name (of writer ``part``, where several write one dataset)."""
    return f"{prefix}-{number:06d}{suffix}" if part is None else f"{prefix}-p{part:05d}-{number:06d}{suffix}"


class NotifyingJournal(PackJournal):
    """The pack journal, telling the writer of each shard recorded (published)."""

    def __init__(
        self, dest: Destination, state_dir: str, on_record: Callable[[dict[str, Any]], None]
    ) -> None:
        super().__init__(dest, state_dir)
        self._on_record = on_record

    def record(self, record: dict[str, Any]) -> None:
        super().record(record)
        self._on_record(record)


def open_part(
    t: Target,
    *,
    part: int,
    parts: int,
    prefix: str,
    shard_format: str,
    name_of: Callable[[int], str | None],
    on_record: Callable[[dict[str, Any]], None],
) -> tuple[Destination, PackJournal, dict[int, ShardResult]]:
    """The destination, journal and kept shards of writer ``part`` of a dataset written by several (the
    driver's ``Plan.open`` for it): the folder may hold the other parts, not ``index.json`` nor this part
    finished; an interrupted attempt at this part is resumed (``t.resume``, same fingerprint) or removed
    and begun again. ``on_record``: told of each shard journaled (published)."""
    state = part_state(part)
    dest = destination(t.url, state, config=t.s3_config)
    if t.url.startswith("s3://"):  # the other parts' uploads are live: abort only this part's
        from fastload.packing.s3dest import S3Destination

        if isinstance(dest, S3Destination):
            dest.uploads_prefix = dest.prefix + shard_name(prefix, 0, "", part)[:-6]
    journal = NotifyingJournal(dest, state, on_record)
    if dest.exists_as_file():
        raise PackError(f"destination {dest.url} is a file; choose a folder")
    if read_index_bytes(dest) is not None:
        raise PackError(
            f"{dest.url} holds a finished dataset (index.json); write the parts into an empty folder"
        )
    if dest.read_bytes(part_index_name(part)) is not None:
        raise PackError(
            f"part {part} of {dest.url} is written already; merge the parts "
            "(fastload.ShardWriter.merge), or write into an empty folder"
        )
    if t.resume and journal.exists():
        if journal.fingerprint() != t.fingerprint:
            raise PackError(f"part {part} of {dest.url} was begun with other options; it cannot resume")
        dest.prepare()
        return dest, journal, kept_shards(dest, journal, name_of)
    if journal.exists():  # an interrupted attempt at this part: start it again
        for name in journal.finished().values():
            shard = str(name["entry"]["name"])
            dest.remove(shard)
            dest.remove(formats.table_path(shard, shard_format))
        dest.remove_tree(state)
    dest.prepare()
    journal.start(t.fingerprint, None)
    # readers refuse the folder until the merge (storage.manifest.refuse_unfinished looks for this)
    dest.write_bytes(f"{STATE_DIR}/state.json", json.dumps({"parts": parts}).encode())
    return dest, journal, {}


def merge_parts(url: str, *, check_keys: bool = True, s3_config: S3Config | None = None) -> DatasetIndex:
    """Join the parts written into ``url`` (each ``SampleWriter(part=i, parts=n)``, all finished) into one
    dataset: their indexes in part order become ``index.json``, written last; the parts' state is removed.
    ``check_keys``: every shard's sample table is read and a key in two parts refused (each writer checked
    its own). Raises :class:`PackError` naming the parts missing or unfinished, or the repeated key."""
    url = dest_url(url)
    if url.startswith(STORES):
        s3_config = s3_config or S3Config.from_env()
    dest = destination(url, STATE_DIR, config=s3_config)
    if read_index_bytes(dest) is not None and not dest.list(PARTS_DIR):
        raise PackError(f"{dest.url} holds a finished dataset already (index.json); nothing to merge")
    indexes: dict[int, DatasetIndex] = {}
    for name in dest.list(PARTS_DIR):
        base = name.rsplit("/", 1)[-1]
        if not (base.startswith("part-") and base.endswith(".json")):
            continue
        raw = dest.read_bytes(name) or b""
        indexes[int(base[5:-5])] = parse_index(raw, where=f"{dest.url}/{name}")
    if not indexes:
        raise PackError(
            f"{dest.url} holds no finished parts to merge; write them with ShardWriter(dst, part=i, parts=n)"
        )
    first = indexes[min(indexes)]
    parts = first.options.get("parts")
    want = range(parts) if isinstance(parts, int) else range(max(indexes) + 1)
    missing = [p for p in want if p not in indexes]
    if missing:
        running = [p for p in missing if PackJournal(dest, part_state(p)).exists()]
        more = f" ({', '.join(map(str, running))} begun but not finished)" if running else ""
        raise PackError(
            f"{dest.url}: part(s) {', '.join(map(str, missing[:20]))} of {len(want)} are not finished{more}; "
            "merge once every part's writer has closed"
        )
    extra = [p for p in indexes if p not in want]
    counts = {ix.options.get("parts") for ix in indexes.values()}
    if extra or len(counts) > 1:
        raise PackError(
            f"{dest.url}: the parts were written as parts of datasets of different sizes (parts= "
            f"{', '.join(map(str, sorted(counts, key=str)))}); write every part with the same parts=n"
        )
    kinds = {ix.shard_format for ix in indexes.values()}
    if len(kinds) > 1:
        raise PackError(f"{dest.url}: the parts are of different formats ({', '.join(sorted(kinds))})")
    ordered = [indexes[p] for p in sorted(indexes)]
    columns = {tuple(ix.fields) for ix in ordered if ix.shards}
    if getattr(formats.by_name(first.shard_format), "read_as_folder", False) and len(columns) > 1:
        raise PackError(
            f"{dest.url}: the Parquet parts have different columns "
            f"({' vs '.join(map(str, sorted(columns)))}); pass every part the same fields=[...]"
        )
    fields = sorted({f for ix in ordered for f in ix.fields})
    options = {k: v for k, v in first.options.items() if k != "part"}
    index = DatasetIndex(
        shard_format=first.shard_format,
        fields=fields,
        shards=[s for ix in ordered for s in ix.shards],
        options=options,
        payload_bytes=sum(ix.payload_bytes for ix in ordered),
    )
    if not index.shards:
        raise PackError(f"{dest.url}: the parts hold no samples; nothing to publish")
    if check_keys:
        _check_keys(dest.url, index, s3_config)
    dest.prepare()
    dest.write_bytes(formats.index_name(index.shard_format), index.to_json())
    dest.remove_tree(STATE_DIR)
    with contextlib.suppress(OSError):
        dest.cleanup()
    return index


def _check_keys(root: str, index: DatasetIndex, s3_config: S3Config | None) -> None:
    """Refuse a key held by two shards of ``index`` (their sample tables read, a set of every key)."""
    full = formats.attach_tables(root, index, s3_config=s3_config)
    where: dict[str, str] = {}
    for shard in full.shards:
        for key in shard.keys:
            other = where.setdefault(key, shard.name)
            if other != shard.name:
                raise PackError(
                    f"{root}: key {key!r} is in {other} and in {shard.name}: two parts wrote it; keys must "
                    "be unique in a dataset (nothing was published: fix the writers, write the parts again)"
                )
