"""The tar shard format (WebDataset convention) as a :class:`~fastload.formats.registry.ShardFormat`: a thin
adapter over the functions of this package (writer, header scan, index, check), so that their insides can
change beneath it."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

from fastload.core.index import DatasetIndex, ShardEntry
from fastload.core.readplan import runs
from fastload.errors import VerifyError
from fastload.formats.checks import offsets_problem
from fastload.formats.registry import ShardFormat
from fastload.formats.tar.header import END_OF_ARCHIVE, member_size
from fastload.formats.tar.layout import TarLayout, layout_of, read_layout
from fastload.formats.tar.reader import pieces as tar_pieces
from fastload.formats.tar.reader import read_run, span

if TYPE_CHECKING:
    from fastload.config import PackConfig, S3Config
    from fastload.core.keys import Sample
    from fastload.formats.shard import ShardResult
    from fastload.storage.inputs import Input

RawSample = dict[str, Any]


class TarSamples:
    """The read path of one indexed tar shard: runs of consecutive samples, each read with one ranged read
    (from S3) or in pieces of whole samples (local), made into samples by :func:`.reader.read_run`."""

    def __init__(self, entry: ShardEntry, read: Callable[[int, int], bytes], fd: int | None) -> None:
        self.entry = entry
        self._read = read
        self._fd = fd

    def close(self) -> None:
        pass  # the file belongs to the caller

    def load(
        self, positions: Sequence[int], columns: Sequence[str] | None = None, *, defer: bool = False
    ) -> Callable[[], Iterable[RawSample]]:
        """The I/O now; parsing (pure Python) in the returned function, so prefetch threads spend their time
        in I/O that releases the GIL. ``defer`` with a local shard whose index has the member layout: the
        I/O too (the direct reader reads each big member straight into its own bytes)."""
        entry, fd, name = self.entry, self._fd, self.entry.name
        if defer and fd is not None and layout_of(entry) is not None:
            spans = runs(positions)
            return lambda: itertools.chain.from_iterable(
                read_run(fd, entry, first, stop, shard=name) for first, stop in spans
            )
        read = self._read
        pieces: list[tuple[int, int, bytes]] = []
        for first, stop in runs(positions):
            for a, b in [(first, stop)] if fd is None else tar_pieces(entry, first, stop):
                pieces.append((a, b, read(*span(entry, a, b))))
        return lambda: [s for a, b, data in pieces for s in read_run(data, entry, a, b, shard=name)]


class TarFormat(ShardFormat):
    """``shard_format="tar"``: each sample's members ``key.field`` adjacent in a tar archive."""

    name = "tar"
    label = "tar"
    suffixes: tuple[str, ...] = (".tar",)
    pack_options: tuple[str, ...] = ()
    foreign = True
    projects_columns = False

    def matches(self, name: str) -> bool:
        return name.endswith(self.suffixes)

    def sample_sizes(
        self, samples: Sequence[Sample[Input]], *, n_fields: int, config: PackConfig
    ) -> tuple[list[int], int]:
        sizes = [sum(member_size(f"{s.key}.{f}", it.entry.size) for f, it in s.members) for s in samples]
        return sizes, len(END_OF_ARCHIVE)

    def write(
        self,
        name: str,
        samples: Sequence[Sample[Input]],
        tmp_path: str,
        *,
        fields: Sequence[str],
        config: PackConfig,
        on_sample: Callable[[int, int], None] | None = None,
        open_threads: int = 0,
    ) -> ShardResult:
        from fastload.formats.tar.writer import write_tar_shard

        return write_tar_shard(
            name, samples, tmp_path, fsync=config.fsync, on_sample=on_sample, open_threads=open_threads
        )

    def check_entry(self, entry: ShardEntry) -> str | None:
        return offsets_problem(entry)

    def read_payload(self, entry: ShardEntry) -> TarLayout | None:
        return read_layout(entry)  # the member layout (fields, each sample's member sizes), checked

    def table(
        self,
        named: Sequence[tuple[str, str]],
        *,
        threads: int,
        s3_config: S3Config | None,
        key_column: str | None = None,
    ) -> tuple[DatasetIndex, list[VerifyError]]:
        from fastload.formats.tar.index import index_tar_shards

        try:
            _, index = index_tar_shards([u for u, _ in named], config=s3_config, threads=threads)
        except VerifyError as exc:
            return DatasetIndex(self.name, [], []), [exc]
        for entry, (_, name) in zip(index.shards, named, strict=True):
            entry.name = name  # relative to the folder that gets index.json
        index.options = {"shard_format": self.name, "indexed_by": "fastload index"}
        return index, []

    def samples(
        self, entry: ShardEntry, *, read: Callable[[int, int], bytes], file: BinaryIO, fd: int | None
    ) -> TarSamples:
        return TarSamples(entry, read, fd)

    def verify(self, file: BinaryIO, shard: ShardEntry) -> list[VerifyError]:
        from fastload.formats.tar.check import verify_tar

        return verify_tar(file, shard)

    def lint(self, url: str, *, s3_config: S3Config | None) -> tuple[list[VerifyError], int, int]:
        from fastload.formats.tar.check import lint_tar

        return lint_tar(url, s3_config)

    def describe(self, index: DatasetIndex) -> list[str]:
        return []


TAR = TarFormat()
