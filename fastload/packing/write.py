"""Writing one planned shard of files: :class:`FileShard`, the :class:`~fastload.packing.engine.ShardJob` of
``fastload pack``, which writes its samples with the shard format's writer (``fastload.formats``)."""

from __future__ import annotations

from collections.abc import Container, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from fastload import formats
from fastload.config import PackConfig
from fastload.core.keys import Sample
from fastload.core.plan import ShardPlan
from fastload.formats.shard import ShardResult
from fastload.gcpause import gc_paused
from fastload.packing.engine import Advance
from fastload.packing.plan import PackPlan
from fastload.storage.inputs import Input
from fastload.storage.listing import FileEntry, LocalSource


@dataclass(frozen=True, kw_only=True)
class FileShard:
    """One shard of a file pack: its plan, its samples (whole, in write order), the dataset's fields and
    the pack's options. Pickles as plain columns (see :class:`_Columns`)."""

    plan: ShardPlan
    samples: Sequence[Sample[Input]]
    fields: list[str]
    config: PackConfig

    @property
    def number(self) -> int:
        return self.plan.number

    @property
    def name(self) -> str:
        return self.plan.name

    def write(self, tmp_path: str, *, on_sample: Advance, open_threads: int) -> ShardResult:
        config, name = self.config, self.plan.name
        result = formats.by_name(config.shard_format).write(
            name,
            self.samples,
            tmp_path,
            fields=self.fields,
            config=config,
            on_sample=on_sample,
            open_threads=open_threads,
        )
        result.entry.partition = self.plan.partition
        return result

    @property
    def shard_format(self) -> str:
        return self.config.shard_format

    def local_folders(self) -> set[str]:
        return {
            it.source.root for s in self.samples for _, it in s.members if isinstance(it.source, LocalSource)
        }

    def __reduce__(self) -> tuple[Any, ...]:
        return (_from_columns, (self.plan, _Columns.of(self.samples), self.fields, self.config))


def file_shards(plan: PackPlan, config: PackConfig, *, skip: Container[int] = ()) -> Iterator[FileShard]:
    """The jobs of ``plan``, leaving out the shard numbers in ``skip`` (kept from an interrupted run)."""
    for shard in plan.shards:
        if shard.number not in skip:
            samples = plan.samples[shard.start : shard.stop]
            yield FileShard(plan=shard, samples=samples, fields=plan.fields, config=config)


def _from_columns(plan: ShardPlan, columns: _Columns, fields: list[str], config: PackConfig) -> FileShard:
    with gc_paused():  # many small objects, no cycles: collections would take 3/4 of the time
        samples = columns.samples()
    return FileShard(plan=plan, samples=samples, fields=fields, config=config)


@dataclass(frozen=True)
class _Columns:
    """A shard's samples as plain columns, each source once: pickled ~20x faster than the samples' objects
    (0.04 s instead of 0.7 s for 20,000 files, and as much again to unpickle)."""

    sources: list[Any]
    keys: list[str]
    counts: list[int]  # members per sample
    fields: list[str]
    source_ids: list[int]
    relpaths: list[str]
    paths: list[str]
    sizes: list[int]

    @classmethod
    def of(cls, samples: Sequence[Sample[Input]]) -> _Columns:
        out = cls([], [], [], [], [], [], [], [])
        ids: dict[int, int] = {}
        for sample in samples:
            out.keys.append(sample.key)
            out.counts.append(len(sample.members))
            for name, item in sample.members:
                source = ids.get(id(item.source))
                if source is None:
                    source = ids[id(item.source)] = len(out.sources)
                    out.sources.append(item.source)
                out.fields.append(name)
                out.source_ids.append(source)
                out.relpaths.append(item.entry.relpath)
                out.paths.append(item.entry.path)
                out.sizes.append(item.entry.size)
        return out

    def samples(self) -> list[Sample[Input]]:
        """The samples again (entries without versions: writers do not use them)."""
        out: list[Sample[Input]] = []
        i = 0
        for key, n in zip(self.keys, self.counts, strict=True):
            out.append(
                Sample(
                    key,
                    tuple(
                        (
                            self.fields[j],
                            Input(
                                self.sources[self.source_ids[j]],
                                FileEntry(self.relpaths[j], self.paths[j], self.sizes[j], ""),
                            ),
                        )
                        for j in range(i, i + n)
                    ),
                )
            )
            i += n
        return out
