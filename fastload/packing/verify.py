"""``fastload.verify``: re-read every shard and check it against ``index.json``; lint foreign tars.

With an index: file size and CRC32C, sample count, keys in index order, each sample's byte range, members
of a sample adjacent and well named; for TFRecord shards every record's two CRCs. Without one (foreign
WebDataset tars): duplicate members, keys whose members are not adjacent, names WebDataset would split
differently or ignore, and archive structure; foreign TFRecord files: every record's CRCs and Example.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import BinaryIO

from fastload.config import S3Config
from fastload.core.index import INDEX_NAME, DatasetIndex, ShardEntry, parse_index
from fastload.core.keys import KeyRuleError, lint_member_name, split_key
from fastload.errors import FastloadError, NotFoundError, VerifyError
from fastload.formats.tar.header import Member, TarFormatError
from fastload.formats.tar.scan import ChecksumReader, iter_members
from fastload.formats.tfrecord.codec import is_tfrecord_name
from fastload.formats.tfrecord.reader import check_against_index, lint_tfrecord
from fastload.storage import access as storage


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
    target: str | os.PathLike[str], *, workers: int | None = None, s3_config: S3Config | None = None
) -> VerifyReport:
    """Verify a dataset (a folder or ``s3://`` prefix holding ``index.json``), or lint a foreign tar file
    or folder/prefix of tars."""
    root = storage.normalise(target)
    pool_size = workers or os.cpu_count() or 1
    index_url = storage.join(root, INDEX_NAME)
    index: DatasetIndex | None = None
    if storage.is_folder(root):
        try:
            raw = storage.read_bytes(index_url, config=s3_config)
        except (NotFoundError, FileNotFoundError):
            raw = None
        if raw is not None:
            index = parse_index(raw, where=index_url)
    if index is not None:
        idx = index
        report = VerifyReport(root)
        with ThreadPoolExecutor(max_workers=pool_size) as pool:
            for problems, samples in pool.map(lambda s: _check_shard(root, idx, s, s3_config), idx.shards):
                report.problems += problems
                report.samples += samples
        report.shards = len(idx.shards)
        report.bytes = idx.bytes
        return report
    if not storage.is_remote(root) and not os.path.exists(root):
        raise NotFoundError(f"{root} does not exist", path=root)
    tars = (
        [
            t
            for t in storage.list_files(root, "", config=s3_config)
            if t.endswith(".tar") or is_tfrecord_name(t)
        ]
        if storage.is_folder(root)
        else [root]
    )
    kinds = {"TFRecord" if is_tfrecord_name(t) else "tar" for t in tars}
    report = VerifyReport(root, indexed=False, linted=" and ".join(sorted(kinds)) or "tar")

    def lint(path: str) -> tuple[list[VerifyError], int, int]:
        return lint_tfrecord(path, s3_config) if is_tfrecord_name(path) else _lint_tar(path, s3_config)

    with ThreadPoolExecutor(max_workers=pool_size) as pool:
        for problems, samples, size in pool.map(lint, tars):
            report.problems += problems
            report.samples += samples
            report.bytes += size
    report.shards = len(tars)
    if not tars:
        report.problems.append(VerifyError("no index.json and no .tar or TFRecord files here", shard=root))
    return report


def _check_shard(
    root: str, index: DatasetIndex, shard: ShardEntry, s3_config: S3Config | None
) -> tuple[list[VerifyError], int]:
    url = storage.join(root, shard.name)
    try:
        f = storage.open_read(url, config=s3_config)
    except (OSError, FastloadError) as exc:
        return [VerifyError(f"cannot read the shard ({exc}); re-run `fastload pack`", shard=shard.name)], 0
    problems: list[VerifyError] = []
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
        reader = ChecksumReader(f)
        if index.shard_format == "tar":
            problems += _check_tar_samples(reader, shard)
        elif index.shard_format == "tfrecord":
            problems += check_against_index(reader, shard)
        reader.drain()
        if reader.crc != int(shard.checksum, 16):
            problems.append(
                VerifyError(
                    f"CRC32C is {reader.crc:08x}, index says {shard.checksum}: the shard's bytes "
                    "changed; re-download or re-pack it",
                    shard=shard.name,
                )
            )
        if index.shard_format == "parquet" and not problems:
            f.seek(0)
            problems += _check_parquet(f, shard)
    return problems, shard.samples


def _samples_of(members: Iterator[Member]) -> Iterator[tuple[str, list[Member]]]:
    """Group consecutive members by key (members that break the key rule come as key ``""``)."""
    key: str | None = None
    group: list[Member] = []
    for m in members:
        try:
            k = split_key(m.name)[0]
        except KeyRuleError:
            k = ""
        if k != key and group:
            yield key or "", group
            group = []
        key = k
        group.append(m)
    if group:
        yield key or "", group


def _check_tar_samples(reader: ChecksumReader, shard: ShardEntry) -> list[VerifyError]:
    problems: list[VerifyError] = []
    i = 0
    try:
        for key, members in _samples_of(iter_members(reader)):
            first = members[0]

            def problem(message: str, key: str = key, offset: int = first.header_offset) -> VerifyError:
                return VerifyError(message, shard=shard.name, key=key, offset=offset)

            if i >= shard.samples:
                problems.append(problem("sample not in the index (extra data in the shard)"))
                break
            expected = shard.keys[i]
            if key != expected:
                problems.append(
                    problem(
                        f"expected sample {expected!r} here (index position {i}); members "
                        "reordered, renamed or missing"
                    )
                )
                break
            names = [m.name for m in members]
            if len(set(names)) != len(names):
                problems.append(problem("duplicate member names in the sample"))
            span = (first.header_offset, members[-1].end - first.header_offset)
            if span != (shard.offsets[i], shard.sizes[i]):
                problems.append(
                    problem(
                        f"sample spans bytes {span[0]}+{span[1]}, index says "
                        f"{shard.offsets[i]}+{shard.sizes[i]}"
                    )
                )
            if shard.member_fields:
                found = [(m.name[len(key) + 1 :], m.size) for m in members]
                listed = list(zip(shard.member_fields, shard.member_sizes[i], strict=True))
                if found != listed:
                    problems.append(
                        problem(f"members (field, size) are {found}, the index's layout says {listed}")
                    )
            i += 1
    except TarFormatError as exc:
        problems.append(
            VerifyError(str(exc), shard=shard.name, key=shard.keys[i] if i < shard.samples else None)
        )
        return problems
    if not problems and i != shard.samples:
        problems.append(
            VerifyError(
                f"holds {i} samples, index says {shard.samples}",
                shard=shard.name,
                key=shard.keys[i] if i < shard.samples else None,
            )
        )
    return problems


def _check_parquet(path: BinaryIO, shard: ShardEntry) -> list[VerifyError]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
        meta = parquet.metadata
        keys = parquet.read(columns=["__key__"]).column(0).to_pylist()
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        return [VerifyError(f"not a readable Parquet file: {exc}", shard=shard.name)]
    problems: list[VerifyError] = []
    rows = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    if rows != [rg[2] for rg in shard.row_groups]:
        problems.append(
            VerifyError(
                f"row groups hold {rows} rows, index says {[rg[2] for rg in shard.row_groups]}",
                shard=shard.name,
            )
        )
    if keys != shard.keys:
        bad = next(
            (i for i, (a, b) in enumerate(zip(keys, shard.keys, strict=False)) if a != b),
            min(len(keys), shard.samples),
        )
        problems.append(
            VerifyError(
                f"row {bad} holds key {keys[bad] if bad < len(keys) else None!r}, index says "
                f"{shard.keys[bad] if bad < shard.samples else None!r}",
                shard=shard.name,
                key=shard.keys[bad] if bad < shard.samples else None,
            )
        )
    return problems


def _lint_tar(path: str, s3_config: S3Config | None) -> tuple[list[VerifyError], int, int]:
    problems: list[VerifyError] = []
    seen_keys: dict[str, int] = {}
    seen_names: set[str] = set()
    samples = 0
    name = path.rsplit("/", 1)[-1]
    with storage.open_read(path, config=s3_config) as f:
        size = f.seek(0, io.SEEK_END)
        f.seek(0)
        reader = ChecksumReader(f)
        try:
            for key, members in _samples_of(iter_members(reader)):
                for m in members:

                    def problem(message: str, m: Member = m, key: str = key) -> VerifyError:
                        return VerifyError(message, shard=name, key=key or None, offset=m.header_offset)

                    if m.typeflag not in ("0", "\0", "7"):
                        problems.append(
                            problem(
                                f"member {m.name!r} is not a regular file (type {m.typeflag!r}); "
                                "WebDataset skips it"
                            )
                        )
                        continue
                    if m.name in seen_names:
                        problems.append(problem(f"duplicate member {m.name!r}"))
                    seen_names.add(m.name)
                    why = lint_member_name(m.name)
                    if why:
                        problems.append(problem(f"member {m.name!r}: {why}"))
                if not key:
                    continue
                if key in seen_keys:
                    problems.append(
                        VerifyError(
                            f"members of sample {key!r} are not adjacent (also at byte {seen_keys[key]}); "
                            "WebDataset would yield it as two samples",
                            shard=name,
                            key=key,
                            offset=members[0].header_offset,
                        )
                    )
                else:
                    seen_keys[key] = members[0].header_offset
                    samples += 1
        except TarFormatError as exc:
            problems.append(VerifyError(str(exc), shard=name))
    return problems, samples, size
