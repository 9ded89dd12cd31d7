"""``fastload.verify``: re-read every shard and check it against ``index.json``; lint foreign tars.

With an index: for index v2, each shard's sample table first (its sidecar present, of the size and CRC32C
``index.json`` records, decoding, describing a shard of the format:
:meth:`fastload.formats.DatasetEntries.entry`); then the file size here, and the shard's format checks the
rest (:meth:`ShardFormat.verify`: CRC32C, sample count, keys in index order, each sample's byte range; tar:
each sample's CRC32C, members of a sample adjacent and well named; Parquet: every page's checksum; TFRecord:
every record's two CRCs). A shard whose table cannot be used still has its whole-file CRC32C checked. Without
an index, each file of a format that can be read without one is linted by its format
(:meth:`ShardFormat.lint`; tar: duplicate members, keys whose members are not adjacent, names WebDataset would
split differently or ignore; TFRecord: every record's CRCs and Example).
"""

from __future__ import annotations

import dataclasses
import io
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from fastload import formats
from fastload.config import S3Config
from fastload.core.index import INDEX_NAME, DatasetIndex, ShardEntry, parse_index
from fastload.errors import FastloadError, NotFoundError, VerifyError
from fastload.formats import ShardFormat
from fastload.formats.checks import crc_problem
from fastload.formats.shard import ChecksumReader
from fastload.packing.progress import Progress
from fastload.storage import access as storage
from fastload.storage.manifest import dataset_of_file, is_one_file, read_manifest, refuse_unfinished


@dataclass
class VerifyReport:
    """Result of a verify run: ``ok`` only when no problem was found."""

    target: str
    shards: int = 0
    samples: int = 0
    bytes: int = 0
    indexed: bool = True
    problems: list[VerifyError] = field(default_factory=list)
    linted: str = "tar"  # without an index: which kind of files were linted

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        what = (
            "shards checked against index.json"
            if self.indexed
            else f"{self.linted} file(s) linted (no index.json)"
        )
        head = f"{self.shards} {what}: {self.samples:,} samples, {self.bytes:,} bytes"
        if self.ok:
            return f"OK: {head}"
        lines = [f"FAILED: {head}; {len(self.problems)} problem(s). First: {self.problems[0]}"]
        lines += [f"  {p}" for p in self.problems[1:20]]
        if len(self.problems) > 20:
            lines.append(f"  ... and {len(self.problems) - 20} more")
        return "\n".join(lines)


def verify(
    target: str | os.PathLike[str],
    *,
    workers: int | None = None,
    s3_config: S3Config | None = None,
    progress: bool | None = False,
) -> VerifyReport:
    """Verify a dataset (a folder or ``s3://`` prefix holding ``index.json``) or one shard of it (a file or
    object that the ``index.json`` of its folder, or a folder above, lists), or lint a foreign tar file or
    folder/prefix of tars. ``progress``: a bar of shards' bytes checked (None: when on a terminal)."""
    root = storage.normalise(target)
    pool_size = workers or os.cpu_count() or 1
    single = _single_file(root, s3_config)
    if single:  # one shard: against the index of the dataset that lists it, else linted
        found = dataset_of_file(root, s3_config=s3_config)
        if found is not None:
            base, listing, entry = found
            one = dataclasses.replace(listing, shards=[entry])
            return _check_index(base, one, storage.join(base, INDEX_NAME), 1, s3_config, progress, root)
    index_url = storage.join(root, INDEX_NAME)
    index: DatasetIndex | None = None
    if storage.is_folder(root) and not single:
        found_index = read_manifest(root, s3_config=s3_config)
        if found_index is not None:
            index_url = found_index[0]
            index = parse_index(found_index[1], where=index_url)
        else:
            refuse_unfinished(root, s3_config=s3_config, what="verified")
    if index is not None:
        return _check_index(root, index, index_url, pool_size, s3_config, progress, root)
    if not storage.is_remote(root) and not os.path.exists(root):
        raise NotFoundError(f"{root} does not exist", path=root)
    tars = (
        [
            t
            for t in storage.list_files(root, "", config=s3_config)
            if formats.foreign_format(t) is not None and not _left_out(root, t)
        ]
        if storage.is_folder(root) and not single
        else [root]
    )
    kinds = {_lint_format(t).label for t in tars}
    report = VerifyReport(root, indexed=False, linted=" and ".join(sorted(kinds)) or "tar")

    def lint(path: str) -> tuple[list[VerifyError], int, int]:
        return _lint_format(path).lint(path, s3_config=s3_config)

    with ThreadPoolExecutor(max_workers=pool_size) as pool:
        for problems, samples, size in pool.map(lint, tars):
            report.problems += problems
            report.samples += samples
            report.bytes += size
    report.shards = len(tars)
    if not tars:
        report.problems.append(VerifyError("no index.json and no .tar or TFRecord files here", shard=root))
    return report


def _single_file(url: str, s3_config: S3Config | None) -> bool:
    """Whether ``url`` is one file: a local file, or an S3 object named like a shard (a prefix is not)."""
    if storage.is_remote(url):
        return formats.for_path(url) is not None and is_one_file(url, s3_config=s3_config)
    return os.path.isfile(url)


def _check_index(
    root: str,
    idx: DatasetIndex,
    index_url: str,
    pool_size: int,
    s3_config: S3Config | None,
    progress: bool | None,
    target: str,
) -> VerifyReport:
    """Every shard of ``idx`` (a dataset at ``root``, or the one shard asked for) against the index."""
    fmt = formats.check_index(idx, where=index_url)
    dataset = formats.DatasetEntries(root, idx, s3_config=s3_config)
    report = VerifyReport(target)
    bar = Progress(total=idx.bytes, enabled=progress, desc=f"verifying {len(idx.shards)} shards")
    with bar, ThreadPoolExecutor(max_workers=pool_size) as pool:
        checked = pool.map(lambda i: _check_shard(dataset, fmt, i), range(len(idx.shards)))
        for shard, (problems, samples) in zip(idx.shards, checked, strict=True):
            report.problems += problems
            report.samples += samples
            bar.advance(shard.bytes, 1)
    report.shards = len(idx.shards)
    report.bytes = idx.bytes
    return report


def _left_out(root: str, url: str) -> bool:
    """A Parquet file under a ``_``/``.`` folder (Spark's ``_temporary/``), which datasets leave out too."""
    from fastload.formats.parquet.foreign import ignored

    return formats.foreign_format(url) is formats.by_name("parquet") and ignored(url[len(root) :].lstrip("/"))


def _lint_format(path: str) -> ShardFormat:
    """The format that lints ``path``: by its name; a file named otherwise is linted as a tar (as given)."""
    return formats.foreign_format(path) or formats.by_name("tar")


def _check_shard(dataset: formats.DatasetEntries, fmt: ShardFormat, i: int) -> tuple[list[VerifyError], int]:
    """Shard number ``i`` of ``dataset``: its problems, and its count of samples."""
    root, shard, s3_config = dataset.root, dataset.index.shards[i], dataset.s3_config
    problems: list[VerifyError] = []
    full: ShardEntry | None = shard
    if shard.detached:
        try:
            full = dataset.entry(i)
        except (OSError, FastloadError) as exc:
            problems.append(VerifyError(f"its sample table cannot be used: {exc}", shard=shard.name))
            full = None
    url = storage.join(root, shard.name)
    try:
        f = storage.open_read(url, config=s3_config)
    except (OSError, FastloadError) as exc:
        problems.append(
            VerifyError(f"cannot read the shard ({exc}); re-run `fastload pack`", shard=shard.name)
        )
        return problems, 0
    with f:
        size = f.seek(0, io.SEEK_END)
        f.seek(0)
        if size != shard.bytes:
            problems.append(
                VerifyError(
                    f"file is {size} bytes, index says {shard.bytes} (truncated or replaced)",
                    shard=shard.name,
                    offset=min(size, shard.bytes),
                )
            )
        if full is None:  # no usable sample table: the whole file's CRC32C is all there is to check
            reader = ChecksumReader(f)
            reader.drain()
            problems += crc_problem(reader, shard)
        else:
            found = fmt.verify(f, full)
            if shard.detached and size == shard.bytes and any(p.key is not None for p in found):
                found = _blame_the_table(root, shard, found, s3_config)
            problems += found
    return problems, shard.samples


def _blame_the_table(
    root: str, shard: ShardEntry, found: list[VerifyError], s3_config: S3Config | None
) -> list[VerifyError]:
    """``found`` (a shard's problems, some naming samples), or one problem naming its sample table when the
    shard's whole-file CRC32C matches ``index.json``: then the shard is intact and the samples failed
    against a stale or damaged table (an index written before tables had a content checksum cannot tell a
    stale table at fetch). Reads the shard again, only on this failure path."""
    with storage.open_read(storage.join(root, shard.name), config=s3_config) as again:
        reader = ChecksumReader(again)
        reader.drain()
    if crc_problem(reader, shard):
        return found
    samples = [p for p in found if p.key is not None]
    table = storage.join(root, shard.table.name) if shard.table is not None else "its sample table"
    return [
        VerifyError(
            f"stale or damaged sample table {table}: {len(samples)} sample(s) fail against it (first: "
            f"{samples[0]}), but the shard's size and CRC32C match index.json, so the shard is intact; run "
            f"`fastload index --upgrade {root}` (it rebuilds the table from the shard)",
            shard=shard.name,
        ),
        *[p for p in found if p.key is None],
    ]
