"""fastload: keep GPUs fed. Pack small files into shards and read them fast, locally or from S3.

Heavy dependencies (pyarrow, boto3) are imported where first needed, so ``fastload`` starts quickly.
"""

from fastload import collate, errors
from fastload.config import PackConfig, S3Config
from fastload.copy import copy
from fastload.core.index import DatasetIndex, ShardEntry
from fastload.packing.optimize import optimize
from fastload.packing.optimize_report import OptimizeReport
from fastload.packing.pack import PackReport, pack
from fastload.packing.shardwriter import ShardWriter, WriteReport
from fastload.packing.tokens import pack_tokens
from fastload.packing.verify import VerifyReport, verify
from fastload.raydata import from_ray, to_ray
from fastload.stats import s3_stats
from fastload.storage.opener import open

__version__ = "0.1.0"

__all__ = [
    "AutotuneConfig",
    "DataLoader",
    "DatasetIndex",
    "DevicePrefetcher",
    "Loader",
    "LoaderStats",
    "MapDataset",
    "Mix",
    "OptimizeReport",
    "PackConfig",
    "PackReport",
    "PackedSequences",
    "S3Config",
    "ShardDataset",
    "ShardEntry",
    "ShardWriter",
    "VerifyReport",
    "WriteReport",
    "__version__",
    "collate",
    "copy",
    "errors",
    "from_ray",
    "loader",
    "open",
    "optimize",
    "pack",
    "pack_tokens",
    "s3_stats",
    "serve",
    "to_ray",
    "verify",
]


def __getattr__(name: str) -> object:
    """The training-side names import torch, so they load on first use."""
    if name == "ShardDataset":
        from fastload.train import dataset

        return dataset.ShardDataset
    if name == "MapDataset":
        from fastload.train import mapview

        return mapview.MapDataset
    if name == "AutotuneConfig":
        from fastload.train import autotune

        return autotune.AutotuneConfig
    if name == "DataLoader":
        from fastload.train import loader

        return loader.DataLoader
    if name == "Mix":
        from fastload.train import mix

        return mix.Mix
    if name == "PackedSequences":
        from fastload.train import packed

        return packed.PackedSequences
    if name == "serve":
        from fastload.train import serve

        return serve.serve
    if name in ("loader", "Loader", "LoaderStats", "DevicePrefetcher"):
        from fastload.train import feed

        return getattr(feed, name)
    raise AttributeError(f"module 'fastload' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names, the lazily loaded ones included (``dir(fastload)``, tab completion)."""
    return sorted(set(globals()) | set(__all__))
