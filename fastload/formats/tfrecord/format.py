"""The TFRecord shard format (``.tfrecord``, ``.tfrecords``, ``.tfrec``, each also ``.gz``): planning sizes,
the writer, foreign-file indexing, the read path, verify and lint, over the modules of this package."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

from fastload.core.index import DatasetIndex, ShardEntry
from fastload.core.readplan import runs
from fastload.errors import VerifyError
from fastload.formats.checks import crc_problem, offsets_problem
from fastload.formats.registry import ShardFormat
from fastload.formats.shard import ChecksumReader
from fastload.formats.tfrecord.codec import SUFFIXES, is_gzip_name, is_tfrecord_name

if TYPE_CHECKING:
    from fastload.config import PackConfig, S3Config
    from fastload.core.keys import Sample
    from fastload.formats.shard import ShardResult
    from fastload.formats.tfrecord.reader import TFRecordSamples
    from fastload.storage.inputs import Input

RawSample = dict[str, Any]


class TFRecordSource:
    """The read path of one indexed TFRecord shard (:class:`~.reader.TFRecordSamples` behind it)."""

    def __init__(self, samples: TFRecordSamples, fd: int | None) -> None:
        self._samples = samples
        self._fd = fd

    def close(self) -> None:
        self._samples.close()

    def load(
        self, positions: Sequence[int], columns: Sequence[str] | None = None, *, defer: bool = False
    ) -> Callable[[], Iterable[RawSample]]:
        tfr, fd = self._samples, self._fd
        if defer and fd is not None and tfr.direct:
            spans = runs(positions)
            return lambda: (s for first, stop in spans for s in tfr.direct_run(fd, first, stop))
        samples = [s for chunk in tfr.read_samples(positions) for s in chunk]
        return lambda: samples


class TFRecordFormat(ShardFormat):
    """``shard_format="tfrecord"``: one ``tf.train.Example`` record per sample (no per-shard data beyond
    core's: byte ranges and CRC32Cs, so no payload)."""

    name = "tfrecord"
    label = "TFRecord"
    suffixes: tuple[str, ...] = SUFFIXES  # and each of them + ".gz" (see matches)
    pack_options: tuple[str, ...] = ()
    foreign = True
    projects_columns = False

    def matches(self, name: str) -> bool:
        return is_tfrecord_name(name)

    def sample_sizes(
        self, samples: Sequence[Sample[Input]], *, n_fields: int, config: PackConfig
    ) -> tuple[list[int], int]:
        from fastload.formats.tfrecord.writer import sample_record_size

        return [sample_record_size(s.key, [(f, it.entry.size) for f, it in s.members]) for s in samples], 0

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
        from fastload.formats.tfrecord.writer import write_tfrecord_shard

        return write_tfrecord_shard(
            name, samples, tmp_path, fsync=config.fsync, on_sample=on_sample, open_threads=open_threads
        )

    def check_entry(self, entry: ShardEntry) -> str | None:
        return offsets_problem(entry)

    def table(
        self,
        named: Sequence[tuple[str, str]],
        *,
        threads: int,
        s3_config: S3Config | None,
        key_column: str | None = None,
    ) -> tuple[DatasetIndex, list[VerifyError]]:
        from fastload.formats.tfrecord.index import scan_tfrecord_files

        return scan_tfrecord_files(named, threads=threads, s3_config=s3_config)

    def samples(
        self, entry: ShardEntry, *, read: Callable[[int, int], bytes], file: BinaryIO, fd: int | None
    ) -> TFRecordSource:
        from fastload.formats.tfrecord.reader import TFRecordSamples

        return TFRecordSource(TFRecordSamples(entry, read=read, file=file), fd)

    def verify(self, file: BinaryIO, shard: ShardEntry) -> list[VerifyError]:
        from fastload.formats.tfrecord.reader import check_against_index

        reader = ChecksumReader(file)
        problems = check_against_index(reader, shard)
        reader.drain()
        return problems + crc_problem(reader, shard)

    def lint(self, url: str, *, s3_config: S3Config | None) -> tuple[list[VerifyError], int, int]:
        from fastload.formats.tfrecord.reader import lint_tfrecord

        return lint_tfrecord(url, s3_config)

    def describe(self, index: DatasetIndex) -> list[str]:
        gz = sum(1 for s in index.shards if is_gzip_name(s.name))
        if not gz:
            return []
        return [f"gzip:     {gz} shard(s); read as whole streams, offsets count decompressed bytes"]


TFRECORD = TFRecordFormat()
