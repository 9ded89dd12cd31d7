"""The loaders ``fastload bench`` compares, each as a factory ``num_workers -> iterable of batches``.

- ``per-file``: a map-style ``torch.utils.data.Dataset`` that reads each sample's files (``open().read()``
  locally, one boto3 ``get_object`` per file on S3) in ``__getitem__``, with torch's ``DataLoader`` — the
  way most training scripts start;
- ``fastload``: ``fastload.loader(fastload.ShardDataset(...))`` (``fastload.DataLoader`` underneath) over
  the packed shards (ranged reads planned from the index, prefetch, optional local shard cache), with
  ``prefetch_factor=2`` like the others;
- ``webdataset``: ``webdataset.WebDataset`` over the same tar shards (local paths, or ``pipe:curl`` from the
  embedded endpoint) with ``WebLoader``.

All decode and collate with :mod:`fastload.bench.pipeline`, so only the way bytes arrive differs.
"""

from __future__ import annotations

import inspect
import os
import shutil
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils.data

from fastload.bench.pipeline import Decode, collate
from fastload.bench.workload import BUCKET, FileSample, Workload
from fastload.config import S3Config
from fastload.storage import access as storage

Loader = Iterable[dict[str, Any]]


@dataclass(frozen=True)
class Variant:
    """One way of loading the data. ``sweep``: measured at every ``num_workers`` of the sweep (else only
    at the training setting). ``prepare`` runs, untimed, before each measurement."""

    name: str
    tool: str
    where: str
    make: Callable[[int], Loader]
    sweep: bool = True
    prepare: Callable[[], None] | None = None
    note: str = ""


class PerFileDataset(torch.utils.data.Dataset[dict[str, Any]]):
    """Sample ``i`` = its files read one by one from ``root`` (a folder or ``s3://`` prefix), decoded."""

    def __init__(
        self, samples: list[FileSample], root: str, transform: Decode, *, config: S3Config | None = None
    ) -> None:
        self.samples, self.root, self.transform, self.config = samples, root, transform, config
        self.remote = storage.is_remote(root)
        if self.remote:
            from fastload.s3.client import parse_s3_url

            self.bucket, prefix = parse_s3_url(root + "/")
            self.prefix = prefix

    def __len__(self) -> int:
        return len(self.samples)

    def _read(self, rel: str) -> bytes:
        if self.remote:
            from fastload.s3.client import get_client  # one client per process, created after fork

            client = get_client(self.config or S3Config())
            body = client.get_object(Bucket=self.bucket, Key=self.prefix + rel)["Body"]
            try:
                return bytes(body.read())
            finally:
                body.close()
        with open(os.path.join(self.root, rel), "rb") as f:
            return f.read()

    def __getitem__(self, i: int) -> dict[str, Any]:
        sample = self.samples[i]
        raw: dict[str, Any] = {"__key__": sample.key}
        for name, rel in sample.members:
            raw[name] = self._read(rel)
        return self.transform(raw)


def per_file_loader(
    samples: list[FileSample], root: str, transform: Decode, batch_size: int, *, config: S3Config | None
) -> Callable[[int], Loader]:
    def make(workers: int) -> Loader:
        dataset = PerFileDataset(samples, root, transform, config=config)
        return torch.utils.data.DataLoader(
            dataset, batch_size=batch_size, num_workers=workers, collate_fn=collate, shuffle=False
        )

    return make


def shard_dataset_options() -> set[str]:
    """Keyword options this fastload's ``ShardDataset`` accepts (prefetch and cache arrived later)."""
    from fastload.train.dataset import ShardDataset

    return set(inspect.signature(ShardDataset).parameters)


def fastload_loader(
    url: str, transform: Decode, batch_size: int, *, config: S3Config | None, **options: Any
) -> Callable[[int], Loader]:
    def make(workers: int) -> Loader:
        import fastload
        from fastload.train.dataset import ShardDataset
        from fastload.train.loader import DataLoader

        dataset = ShardDataset(url, decode=False, map=transform, s3_config=config, **options)
        face = getattr(fastload, "loader", None)
        if face is None:  # a fastload without fastload.loader()
            return DataLoader(dataset, batch_size=batch_size, num_workers=workers, collate_fn=collate)
        # the same prefetch depth as the other variants' DataLoaders (torch's default), fresh workers per run
        extra = {"prefetch_factor": 2, "persistent_workers": False} if workers else {}
        loader: Loader = face(dataset, batch_size, num_workers=workers, collate_fn=collate, **extra)
        return loader

    return make


class _QuietWebLoader:
    """A ``WebLoader`` iterated with webdataset's advisory warnings silenced (not the benchmark's)."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[dict[str, Any]]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield from self.loader


def webdataset_loader(urls: list[str], transform: Decode, batch_size: int) -> Callable[[int], Loader]:
    def make(workers: int) -> Loader:
        import webdataset as wds

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dataset = (
                wds.WebDataset(urls, shardshuffle=False, empty_check=False)
                .map(transform)
                .batched(batch_size, collation_fn=collate, partial=True)
            )
            return _QuietWebLoader(wds.WebLoader(dataset, batch_size=None, num_workers=workers))

    return make


def _shard_urls(work: Workload, packed: str, *, remote: bool) -> list[str]:
    from fastload.storage.manifest import load_index

    index = load_index(work.packed_local or packed)
    names = [s.name for s in index.shards]
    if not remote:
        return [os.path.join(packed, n) for n in names]
    assert work.endpoint is not None
    base = f"{work.endpoint.endpoint_url}/{BUCKET}/packed"
    return [f"pipe:curl -s -f {base}/{n}" for n in names]


def _reset_folder(path: str) -> Callable[[], None]:
    def reset() -> None:
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)

    return reset


def _fill_once(url: str, config: S3Config | None, cache_dir: str) -> Callable[[], None]:
    filled: list[bool] = []

    def fill() -> None:
        if filled:
            return
        from fastload.train.dataset import ShardDataset

        for _ in ShardDataset(url, decode=False, s3_config=config, cache_dir=cache_dir):
            pass
        filled.append(True)

    return fill


def not_measured(work: Workload, options: Any, chosen: list[Variant]) -> list[str]:
    """Why a peer asked for with ``--compare`` is not in ``chosen`` (one note each, saying which reason)."""
    notes = []
    tools = {v.tool for v in chosen}
    if "webdataset" in options.compare and "webdataset" not in tools:
        if not _webdataset_installed():
            why = "it is not installed (pip install webdataset)"
        elif not _is_tar(work):
            why = "the data is not tar shards (webdataset reads tar only)"
        else:
            why = "there are no packed shards to give it"
        notes.append(f"webdataset not measured: {why}")
    if "naive" in options.compare and "per-file" not in tools:
        notes.append(
            "the per-file Dataset (--compare naive) not measured: the source is a packed dataset, not a "
            "folder of files, so there are no files to read one by one"
        )
    return notes


def build(work: Workload, options: Any, *, scratch: str) -> list[Variant]:
    """The variants that apply to ``work`` with ``options`` (resolved), in table order."""
    transform = Decode(options.image_px, work.classes)
    bs = options.batch_size
    out: list[Variant] = []
    per_file = "naive" in options.compare and work.samples is not None
    if per_file and work.files_local and work.samples is not None:
        out.append(
            Variant(
                "per-file local",
                "per-file",
                "local",
                per_file_loader(work.samples, work.files_local, transform, bs, config=None),
            )
        )
    if work.packed_local:
        out.append(
            Variant(
                "fastload local",
                "fastload",
                "local",
                fastload_loader(work.packed_local, transform, bs, config=None),
            )
        )
    wds_ok = "webdataset" in options.compare and _webdataset_installed() and _is_tar(work)
    if wds_ok and work.packed_local:
        urls = _shard_urls(work, work.packed_local, remote=False)
        out.append(Variant("webdataset local", "webdataset", "local", webdataset_loader(urls, transform, bs)))
    if per_file and work.files_s3 and work.samples is not None:
        out.append(
            Variant(
                "per-file s3",
                "per-file",
                "s3",
                per_file_loader(work.samples, work.files_s3, transform, bs, config=work.s3_config),
            )
        )
    if per_file and work.user_files_s3 and work.samples is not None:
        out.append(
            Variant(
                "per-file s3 (your endpoint)",
                "per-file",
                "s3-user",
                per_file_loader(work.samples, work.user_files_s3, transform, bs, config=work.user_config),
            )
        )
    if work.packed_s3:
        out.append(
            Variant(
                "fastload s3",
                "fastload",
                "s3",
                fastload_loader(work.packed_s3, transform, bs, config=work.s3_config),
            )
        )
    if wds_ok and work.packed_s3 and work.endpoint is not None and work.packed_local and shutil.which("curl"):
        urls = _shard_urls(work, work.packed_local, remote=True)
        out.append(
            Variant(
                "webdataset s3", "webdataset", "s3", webdataset_loader(urls, transform, bs), note="pipe:curl"
            )
        )
    if work.packed_s3:
        known = shard_dataset_options()
        if "prefetch_bytes" in known:
            out.append(
                Variant(
                    "fastload s3 prefetch off",
                    "fastload",
                    "s3",
                    fastload_loader(work.packed_s3, transform, bs, config=work.s3_config, prefetch_bytes=0),
                    sweep=False,
                )
            )
        if "cache_dir" in known:
            cold, warm = os.path.join(scratch, "cache-cold"), os.path.join(scratch, "cache-warm")
            os.makedirs(warm, exist_ok=True)
            out.append(
                Variant(
                    "fastload s3 cache cold",
                    "fastload",
                    "s3",
                    fastload_loader(work.packed_s3, transform, bs, config=work.s3_config, cache_dir=cold),
                    sweep=False,
                    prepare=_reset_folder(cold),
                )
            )
            out.append(
                Variant(
                    "fastload s3 cache warm",
                    "fastload",
                    "s3",
                    fastload_loader(work.packed_s3, transform, bs, config=work.s3_config, cache_dir=warm),
                    sweep=False,
                    prepare=_fill_once(work.packed_s3, work.s3_config, warm),
                )
            )
    return out


def _is_tar(work: Workload) -> bool:
    """webdataset reads tar shards only (the packed data is local whenever webdataset can be measured)."""
    if work.packed_local is None:
        return False
    from fastload.storage.manifest import load_index

    return load_index(work.packed_local).shard_format == "tar"


def _webdataset_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("webdataset") is not None
